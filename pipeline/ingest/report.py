"""What an ingest run did: pages added, updated, unchanged; failed, partial and recovered pages, why."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class IngestReport:
    pages_seen: int = 0
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)  # (page id, reason): not indexed
    partial: list[tuple[str, str]] = field(default_factory=list)  # indexed, but not all of its text
    warnings: list[tuple[str, str]] = field(default_factory=list)  # indexed in full after a recovery
    evidence_by_kind: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    slowest_page: tuple[str, float] = ("", 0.0)  # preparing it (parse, evidence, BM25, words), seconds

    @property
    def evidence(self) -> int:
        return sum(self.evidence_by_kind.values())

    @property
    def ok(self) -> bool:
        """No page failed or lost text (what the exit code of `evident ingest` reports)."""
        return not self.failed and not self.partial
