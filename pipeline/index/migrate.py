"""Copy one index into another (any backends: ``Index.export_points`` into ``Index.replace_page``), and
compare
two indexes' rankings.

``migrate_index`` copies the live points of the source (vectors, sparse vectors and payloads
exactly as stored, no re-embedding) through the destination's ``replace_page``, page by page, so it is
resumable: pages already there with the same content hash are skipped. Afterwards sample queries are run
against both and compared up to ties (``same_ranking``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from pipeline.access.scope import EVERYTHING
from pipeline.errors import IndexError_, IndexMismatchError, InputError
from pipeline.protocols import Index
from pipeline.types import Hit, IndexPoint, SearchRequest

VERIFY_K = 10



@dataclass
class MigrateReport:
    source: str
    destination: str
    pages_copied: int = 0
    pages_skipped: int = 0  # already in the destination with the same content hash
    pages_deleted: int = 0  # in the destination but not in the source (only with --force)
    points_copied: int = 0
    source_points: int = 0
    destination_points: int = 0
    verified: list[bool] = field(default_factory=list)  # per sample query: same top-k up to ties

    def summary(self) -> str:
        same = sum(self.verified)
        return (
            f"migrated {self.source} -> {self.destination}: {self.pages_copied} pages copied "
            f"({self.points_copied} points), {self.pages_skipped} unchanged, {self.pages_deleted} deleted; "
            f"points: source {self.source_points}, destination {self.destination_points}; "
            f"same top-{VERIFY_K} for {same}/{len(self.verified)} sample queries"
        )


async def migrate_index(source: Index, dest: Index, *, dim: int, embedder: str, batch: int = 256,
                        force: bool = False, verify: int = 5, source_name: str = "",
                        progress: Callable[[str], None] | None = None) -> MigrateReport:
    """Copy every live page of ``source`` (an ``Index`` of any backend, opened) into ``dest`` (unopened;
    opened with ``dim``, ``embedder`` and the recipe the source records, so the destination refuses vectors
    made differently as the source does; closed afterwards), then compare counts and sample rankings."""
    report = MigrateReport(source=source_name or str(getattr(source, "where", source)),
                           destination=str(getattr(dest, "where", dest)))
    recipe = await source.recipe()
    try:
        await dest.open(dense_dim=dim, embedder=embedder, recipe=recipe)
    except IndexMismatchError as exc:
        raise IndexMismatchError(f"{report.destination} holds vectors made otherwise than the source's; "
                                 f"migrate into another --collection or delete that one ({exc})") from exc
    try:
        src_pages = await source.page_hashes()
        dst_pages = await dest.page_hashes()
        extra = sorted(set(dst_pages) - set(src_pages))
        if extra and not force:
            raise InputError(f"{report.destination} has {len(extra)} pages that the source lacks; "
                             "pass --force to delete them")
        todo = {pid for pid, h in src_pages.items() if dst_pages.get(pid) != h}
        report.pages_skipped = len(src_pages) - len(todo)
        await _copy_pages(source, dest, sorted(todo), batch, report, progress)
        if extra:
            await dest.delete_pages(extra)
            report.pages_deleted = len(extra)
        report.source_points = await source.count()
        report.destination_points = await dest.count()
        if report.source_points != report.destination_points:
            raise IndexError_(f"after migrating, the source has {report.source_points} points but "
                              f"{report.destination} has {report.destination_points}")
        report.verified = await _verify_top_k(source, dest, verify, batch)
    finally:
        await dest.close()
    return report


async def _copy_pages(source: Index, dest: Index, pages: list[str], batch: int, report: MigrateReport,
                      progress: Callable[[str], None] | None) -> None:
    """Page by page, through ``dest.replace_page`` (one page in memory at a time)."""
    page: list[IndexPoint] = []

    async def flush() -> None:
        if page:
            await dest.replace_page(page[0].evidence.page_id, page[0].page_hash, list(page))
            report.pages_copied += 1
            report.points_copied += len(page)
            page.clear()
            if progress and report.pages_copied % 100 == 0:
                progress(f"{report.pages_copied}/{len(pages)} pages")

    async for point in source.export_points(batch=batch, page_ids=pages):
        if page and point.evidence.page_id != page[0].evidence.page_id:
            await flush()
        page.append(point)
    await flush()


async def _verify_top_k(source: Index, dest: Index, n: int, batch: int) -> list[bool]:
    """Query both indexes with the vectors of ``n`` stored points; True where both legs rank alike.

    The lexical and dense legs are compared separately: hybrid results fuse their ranks, so a tie that
    the two backends break differently in one leg shifts fused scores without anything being wrong.
    """
    if n <= 0:
        return []
    pages = sorted(await source.page_hashes())
    picked = pages[:: max(1, len(pages) // n)][:n]
    out: list[bool] = []
    for pid in picked:
        async for point in source.export_points(batch=batch, page_ids=[pid]):
            base = SearchRequest(dense=point.dense, sparse=point.sparse, scope=EVERYTHING, lexical_k=VERIFY_K,
                                 dense_k=VERIFY_K,
                                 limit=VERIFY_K)
            same = True
            for mode in ("lexical", "dense"):
                req = replace(base, mode=mode)  # type: ignore[arg-type]
                same = same and same_ranking(await source.search(req), await dest.search(req))
            out.append(same)
            break
    return out


def _tie_groups(hits: Sequence[Hit], rel: float) -> list[tuple[float, set[str]]]:
    groups: list[tuple[float, set[str]]] = []
    for h in hits:
        if groups and abs(h.score - groups[-1][0]) <= rel * max(1.0, abs(h.score)):
            groups[-1][1].add(h.evidence.id)
        else:
            groups.append((h.score, {h.evidence.id}))
    return groups


def same_ranking(a: Sequence[Hit], b: Sequence[Hit], *, rel: float = 1e-4) -> bool:
    """Whether two result lists rank alike up to ties.

    Qdrant orders equal scores arbitrarily (differently per backend, even between two opens of one Edge
    index), so ids are compared per group of (nearly) equal scores; the last group, which the limit may
    cut anywhere, is compared by its score only.
    """
    ga, gb = _tie_groups(a, rel), _tie_groups(b, rel)
    if len(a) != len(b) or len(ga) != len(gb):
        return False
    for i, ((sa, ida), (sb, idb)) in enumerate(zip(ga, gb, strict=True)):
        if abs(sa - sb) > rel * max(1.0, abs(sa)) or (i < len(ga) - 1 and ida != idb):
            return False
    return True
