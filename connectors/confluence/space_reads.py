"""The parts of one space's read in a sync cycle that come after its changed pages, and what they are told
by: the index's pages (read once a cycle), and per space, what a listing should bring back and what only an
edit can fix (both kept in the checkpoint store, with no horizon)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass

from connectors.confluence.includes import stale_includers
from connectors.confluence.source import ConfluenceSource
from connectors.confluence.state import load_row, save_row
from connectors.confluence.tracker import Tracker
from pipeline.protocols import CheckpointStore, Index
from pipeline.types import Page


class IndexedPages:
    """The index's page -> space map as it was when first asked this cycle (one read a cycle, only when asked:
    between listings it stands in for the listing; in a listing cycle it tells which pages are back)."""

    def __init__(self, index: Index) -> None:
        self.index = index
        self.spaces: dict[str, str] | None = None
        self._by_space: dict[str, set[str]] | None = None

    async def all(self) -> dict[str, str]:
        if self.spaces is None:
            self.spaces = await self.index.page_spaces()
        return self.spaces

    async def pages(self, key: str) -> set[str]:
        """The ids of the pages (not attachments) indexed under space ``key`` (a copy to change freely)."""
        if self._by_space is None:  # grouped once a cycle, not scanned per space
            self._by_space = {}
            for pid, space in (await self.all()).items():
                if pid.isdigit():
                    self._by_space.setdefault(space, set()).add(pid)
        return set(self._by_space.get(key, ()))


async def load_ids(store: CheckpointStore, source_key: str, name: str, key: str) -> dict[str, str]:
    """A per-space map of id -> version time kept without horizon (``unusable``: what failed for its content,
    which only an edit can fix; ``back``: pages read between listings that were not indexed before)."""
    return {k: str(v) for k, v in (await load_row(store, source_key, name, key)).items()}


@dataclass
class Held:
    """What one space's read starts from besides its known versions (see ``load_ids``)."""

    before: set[str]  # its pages before the read: listed ones, or indexed ones between listings
    unusable_from: int  # where this space's entries in ``SourceStats.unusable`` begin
    unusable: dict[str, str]
    back: dict[str, str]

    @classmethod
    async def load(cls, source: ConfluenceSource, store: CheckpointStore, key: str, before: set[str]) -> Held:
        return cls(set(before), len(source.stats.unusable),
                   await load_ids(store, source.source_key, "unusable", key),
                   await load_ids(store, source.source_key, "back", key))

    def back_pages(self, indexed: dict[str, str]) -> set[str]:
        """In a listing cycle: the listed pages not indexed before it, and those kept as back."""
        return (self.before - indexed.keys()) | self.back.keys()


# failures that an upgrade or more memory may fix, not an edit: not kept as unusable, so a listing reads them
# again once their version has left the known versions (``state.KNOWN_HORIZON``); until then they count as
# settled, as re-reading one every cycle would parse and report it every cycle
NOT_CONTENT = ("too complex to parse", "could not be parsed")


async def settle_held(source: ConfluenceSource, store: CheckpointStore, key: str, held: Held,
                      pages: Sequence[tuple[str, str | None]], read: Sequence[tuple[str, str | None]],
                      failed: Sequence[tuple[str, str]], *, retry: bool, indexed: dict[str, str],
                      listing: set[str] | None) -> None:
    """After the space's read (``pages`` in edit order, ``read``: every item handed to ingest): ``unusable``
    gains what failed for its content now (``failed``: not retryable) and loses what was read fine, read with
    read restrictions (an edit that was not read may have fixed it) or is no longer listed; ``back`` gains the
    pages read between listings that were not indexed before, and is emptied by a listing cycle whose
    attachment and comment listings and reads all answered and nothing waits for a ``retry`` (else it keeps
    every listed page that cycle should have brought back)."""
    when = {pid: w or "" for pid, w in read}
    bad = {pid for pid, why in failed if not why.startswith(NOT_CONTENT)}
    now = {pid: w or "" for pid, w in source.stats.unusable[held.unusable_from:]}
    now |= {pid: when.get(pid, "") for pid in bad}
    gone = source.stats.skipped_restricted
    unusable = {pid: w for pid, w in held.unusable.items() if (pid not in when or pid in bad)
                and pid not in gone and (listing is None or pid in listing)} | now
    await save_row(store, source.source_key, "unusable", key, unusable, before=held.unusable)
    kinds = (f"attachments:{key}", f"comments:{key}")
    if listing is None:
        back = held.back | {pid: w or "" for pid, w in pages if pid.isdigit() and pid not in held.before}
    elif retry or any(k in kinds for k, _ in source.stats.failed) or source.stats.unlisted & set(kinds):
        back = dict.fromkeys(held.back_pages(indexed) & held.before, "")
    else:
        back = {}
    await save_row(store, source.source_key, "back", key, back, before=held.back)


async def noting(pages: AsyncIterator[Page], ids: set[str], source: ConfluenceSource) -> AsyncIterator[Page]:
    """``pages``, each id added to ``ids`` (containers of the attachments and comments read after them); a
    page read with read restrictions (skipped) is no container: its comments and attachments are not read."""
    async for page in pages:
        ids.add(page.id)
        yield page
    ids.difference_update(source.stats.skipped_restricted)


async def still_indexed(indexed: IndexedPages, key: str, pages: list[str]) -> list[str]:
    """Those of ``pages`` indexed under ``key`` now: an includer deleted, moved or restricted since its
    includes were recorded is no longer refreshed (its entry lapses). No index read when ``pages`` is
    empty."""
    if not pages:
        return []
    now = await indexed.pages(key)
    return [pid for pid in pages if pid in now]


async def includers(source: ConfluenceSource, key: str, tracker: Tracker, indexed: IndexedPages,
                    includes: dict[str, dict[str, str]], elsewhere: Mapping[str, str]) -> AsyncIterator[Page]:
    """After the changed pages: the indexed pages showing an older version of one of them, fetched again so
    the included text is current. Runs when ``tracker`` has seen every changed page. Included pages not read
    now count by the version indexed lately (``elsewhere``: the known versions of every synced space); spaces
    synced later in the cycle are caught up by the sync's ``_refresh_includers``."""
    stale = await still_indexed(indexed, key, stale_includers(
        {pid: updated or "" for pid, updated in tracker.seen}, includes, elsewhere))
    if stale:
        async for page in source.iter_ids(key, stale):
            yield page


async def unindexed(source: ConfluenceSource, key: str, tracker: Tracker, indexed: IndexedPages,
                    candidates: set[str]) -> AsyncIterator[Page]:
    """Last: the in-scope pages that are neither indexed nor were read this run nor were settled at their
    current version by an earlier one: pages whose read restriction was lifted, that gained an included label
    or came under the configured ancestor; none of that changes ``lastmodified``. Fetched by id."""
    seen = {pid for pid, _ in tracker.seen}
    now = await indexed.all()
    wanted = sorted(pid for pid in candidates - seen if pid not in now)
    if wanted:
        async for page in source.iter_ids(key, wanted):
            yield page


async def chain(*parts: AsyncIterator[Page] | None) -> AsyncIterator[Page]:
    for part in parts:
        if part is not None:
            async for page in part:
                yield page
