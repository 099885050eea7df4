"""Which pages each local source folder produced, so pages whose files are gone can leave the index.

A concern of ``pipeline.store.Store`` (table ``source_pages``, migration 6): per source (a folder, by its
resolved path) the page ids it produced and the file each came from.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TypeVar

from pipeline.store.database import Database

T = TypeVar("T")


class StoreSources(Database):
    async def source_pages(self, source: str) -> dict[str, str]:
        """page id -> file for the pages ``source`` produced when it was last read."""
        rows = await self._run(
            lambda: self._rows("SELECT page_id, file FROM source_pages WHERE source=?", (source,))
        )
        return {str(r["page_id"]): str(r["file"]) for r in rows}

    async def claimed_elsewhere(self, source: str, page_ids: Sequence[str]) -> set[str]:
        """Those of ``page_ids`` that another source also produced (they must stay in the index)."""
        def q() -> set[str]:
            found: set[str] = set()
            for chunk in _chunks(list(page_ids), 500):
                marks = ",".join("?" * len(chunk))
                rows = self._rows(
                    f"SELECT DISTINCT page_id FROM source_pages WHERE source != ? AND page_id IN ({marks})",
                    (source, *chunk),
                )
                found.update(str(r["page_id"]) for r in rows)
            return found

        return await self._run(q)

    async def set_source_pages(self, source: str, pages: Mapping[str, str]) -> None:
        """Replace what ``source`` produced with ``pages`` (page id -> file), in one transaction."""
        def q() -> None:
            with self._tx() as conn:
                conn.execute("DELETE FROM source_pages WHERE source=?", (source,))
                conn.executemany("INSERT INTO source_pages(source, page_id, file) VALUES (?, ?, ?)",
                                 [(source, pid, f) for pid, f in pages.items()])

        await self._run(q)


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for n in range(0, len(items), size):
        yield items[n:n + size]
