"""What a space's sync handed to ingest, in order, so the checkpoint never passes a page a retry can fix
(``connectors.confluence.sync``'s "safely behind us")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from connectors.confluence.cql import parse_utc, to_utc_iso
from connectors.confluence.listing import rejected_credentials
from pipeline.errors import RemoteError
from pipeline.ingest.report import IngestReport
from pipeline.types import Page

# Failures that another try may fix (a transient embedder or index): the checkpoint waits for them.
RETRYABLE_INGEST_PREFIXES = ("index write failed", "embedding failed")


def retryable(ing: IngestReport) -> set[str]:
    """What failed in a way a retry can fix: not settled, the checkpoint waits for it."""
    return {pid for pid, why in ing.failed if why.startswith(RETRYABLE_INGEST_PREFIXES)}


@dataclass
class Tracker:
    """Remembers what was handed to ingest, in order, and whether fetching stopped early."""

    seen: list[tuple[str, str | None]] = field(default_factory=list)
    extra: list[tuple[str, str | None]] = field(default_factory=list)  # read by id, outside the edit order
    fetch_error: RemoteError | None = None

    async def wrap(self, pages: AsyncIterator[Page], *, order: bool = True) -> AsyncIterator[Page]:
        """``pages``, remembered: in ``seen`` (they count for the checkpoint), or ``extra`` when not in edit
        ``order``."""
        into = self.seen if order else self.extra
        try:
            async for page in pages:
                into.append((page.id, page.updated))
                yield page
        except RemoteError as exc:  # retries exhausted: stop here, keep what was ingested
            self.fetch_error = exc

    def checkpoint(self, blocking: set[str], old: str | None) -> str | None:
        ids = [pid for pid, _ in self.seen]
        if len(ids) != len(set(ids)):
            return old  # unstable paging: a page moved while we paged
        best = parse_utc(old) if old else None
        for pid, updated in self.seen:
            if pid in blocking:
                break
            if updated:
                t = parse_utc(updated)
                best = t if best is None or t > best else best
        return to_utc_iso(best.isoformat()) if best else old


def stopped(key: str, tracker: Tracker, extras: Tracker, failed: list[tuple[str, str]]) -> None:
    """After a space's read: raise a fetch stopped by rejected credentials (every space would fail alike);
    report in ``failed`` one that stopped reading the space's pages."""
    for error in (tracker.fetch_error, extras.fetch_error):
        if error is not None and rejected_credentials(error):
            raise error
    if tracker.fetch_error is not None:
        failed.append((f"space:{key}", f"stopped fetching: {tracker.fetch_error}"))
