"""What changes what gets indexed (``IngestOptions``, built from the ingest settings by the factory) and
its fingerprint, part of every page's content hash."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pipeline.ingest.evidence import MAX_EVIDENCE_CHARS
from pipeline.ingest.storage import ParseLimits

# part of every page hash: a parser change re-reads pages (the embedding cache keeps it cheap)
PARSER_VERSION = 2


@dataclass(frozen=True)
class IngestOptions:
    """Everything that changes what gets indexed; part of every page's content hash."""

    # From the ingest settings (``pipeline.factory.ingest_options``); no defaults here: declared once, there.
    context_items: tuple[str, ...]
    context_item_max_chars: int
    # Context for the dense text, when it should differ from the lexical one: the dense model reads only
    # its first ~128 tokens, so long neighbours can push the evidence itself out of its window.
    dense_context_items: tuple[str, ...] | None
    table_indexing: str
    linearization: str  # table rows: verbalized | markdown | plain
    max_page_bytes: int
    max_evidence_chars: int
    max_evidence_per_page: int
    parse: ParseLimits
    batch_evidence: int = 256  # evidence embedded per batch (across pages): a tuning constant, not a setting

    def fingerprint(self, embedder: str, sparse: str) -> str:
        cfg: dict[str, Any] = {
            "context_items": list(self.context_items),
            "context_item_max_chars": self.context_item_max_chars,
            "dense_context_items": None
            if self.dense_context_items is None
            else list(self.dense_context_items),
            "table_indexing": self.table_indexing,
            **({"linearization": self.linearization} if self.linearization != "verbalized" else {}),
            "embedder": embedder,
            "sparse": sparse,
            "parser": PARSER_VERSION,
        }
        for name, usual in _FINGERPRINT_USUAL.items():  # named only when not the usual value (older hashes)
            if getattr(self, name) != usual:
                cfg[name] = str(getattr(self, name))
        return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]


# The bounds every index fingerprint was computed with before they became settings: an index built with them
# keeps its fingerprint.
_FINGERPRINT_USUAL: dict[str, object] = {
    "max_evidence_chars": MAX_EVIDENCE_CHARS,
    "max_evidence_per_page": 2_000,
    "parse": ParseLimits(timeout_s=30.0, max_table_cells=500_000, min_coverage=0.9),
}
