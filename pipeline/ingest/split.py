"""One page split into evidence within its bounds (``split_page``): parsed, cut into evidence, capped."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.errors import InputError
from pipeline.ingest.evidence import build_evidence
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.storage import parse_page
from pipeline.types import Evidence, Page


@dataclass
class PageEvidence:
    """One page split into evidence, with what happened on the way."""

    evidence: list[Evidence]
    lost: list[str] = field(default_factory=list)  # text not indexed (partial page)
    recovered: list[str] = field(default_factory=list)  # informational


def page_to_evidence(page: Page, options: IngestOptions) -> list[Evidence]:
    """Parse and split one page. Raises ``EvidentError`` subclasses for unusable pages."""
    return split_page(page, options).evidence


def split_page(page: Page, options: IngestOptions) -> PageEvidence:
    """Parse and split one page within its bounds; ``EvidentError`` for a page that cannot be indexed."""
    size = len(page.body.encode("utf-8", "surrogatepass"))
    if size > options.max_page_bytes:
        raise InputError(
            f"page is too large ({size / 2**20:.1f} MiB > {options.max_page_bytes / 2**20:.1f} MiB limit)"
        )
    if not page.body.strip():
        raise InputError("page has no content")
    parsed = parse_page(page.body, page_id=page.id, limits=options.parse)
    notes: list[str] = []
    evidence = build_evidence(page, parsed.elements, table_indexing=options.table_indexing,
                              linearization=options.linearization, max_chars=options.max_evidence_chars,
                              notes=notes)
    if not evidence:
        raise InputError("page has no text content")
    result = PageEvidence(evidence, lost=notes, recovered=list(parsed.notes))
    if parsed.low_coverage(options.parse):
        result.lost.append(f"only {parsed.coverage:.0%} of the page's visible text could be read "
                           f"({parsed.mode} parse)")
    _cap_evidence(result, options.max_evidence_per_page)
    return result


def _cap_evidence(result: PageEvidence, cap: int) -> None:
    """At most ``cap`` evidence: rows go first (their tables keep the text), then the page's tail."""
    n = len(result.evidence)
    if n <= cap:
        return
    rows = sum(1 for e in result.evidence if e.kind == "row")
    drop_rows = min(rows, n - cap)
    if drop_rows:
        kept: list[Evidence] = []
        dropped = 0
        for e in reversed(result.evidence):
            if e.kind == "row" and dropped < drop_rows:
                dropped += 1
                continue
            kept.append(e)
        result.evidence = kept[::-1]
        result.recovered.append(
            f"{drop_rows} table rows not indexed one by one (EVIDENT_MAX_EVIDENCE_PER_PAGE "
            f"{cap}); their tables are indexed whole"
        )
    if len(result.evidence) > cap:
        result.lost.append(f"only the first {cap} of {len(result.evidence)} evidence indexed "
                           "(EVIDENT_MAX_EVIDENCE_PER_PAGE)")
        result.evidence = result.evidence[:cap]
