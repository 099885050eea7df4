"""Permissions in every ``Index`` backend: the access filter on searches and reads by id, payload writes that
change who may read a page without re-embedding it, and the count of evidence without permissions. Mixed into
each backend's contract class next to ``IndexContract``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pipeline.access.scope import EVERYTHING, AccessScope, group, page_access, user
from pipeline.types import IndexPoint, SearchRequest, SparseVector
from tests.index_contract import make_point

ALICE = frozenset({user("alice"), group("eng")})
BOB = frozenset({user("bob"), group("eng"), group("hr")})
CAROL = frozenset({user("carol")})
QUERY = SparseVector((5,), (1.0,))

# page -> (space, levels): the space's view permission, then restricted levels
SITE = {
    "PUB": ("ENG", [["*"]]),  # anyone, anonymous included
    "ENG": ("ENG", [[group("eng")]]),
    "HR": ("HR", [[group("hr"), group("eng")], [group("hr")]]),  # space admits eng+hr, page restricted to hr
    "ALICE": ("ENG", [[group("eng")], [user("alice"), user("bob")], [user("alice")]]),
}


def points(page: str, access: Any) -> list[IndexPoint]:
    space, _ = SITE[page]
    p = make_point(page, 0, f"hash-{page}", f"text of {page}", sparse={5: 1.0}, space=space)
    return [replace(p, evidence=replace(p.evidence, access=access))]


def found(hits: Any) -> set[str]:
    return {h.evidence.page_id for h in hits}


class IndexAccessContract:
    async def _site(self, index: Any) -> None:
        for page, (_, levels) in SITE.items():
            await index.replace_page(page, f"hash-{page}", points(page, page_access(levels)))

    async def _search(self, index: Any, scope: AccessScope) -> set[str]:
        return found(await index.search(SearchRequest(dense=None, sparse=QUERY, scope=scope, mode="lexical",
                                                      limit=10)))

    async def test_search_and_get_show_each_reader_only_what_they_may_read(self, index: Any) -> None:
        await self._site(index)
        one = {name: AccessScope.for_readers([r], None) for name, r in
               (("alice", ALICE), ("bob", BOB), ("carol", CAROL))}
        assert await self._search(index, one["alice"]) == {"PUB", "ENG", "ALICE"}
        assert await self._search(index, one["bob"]) == {"PUB", "ENG", "HR"}
        assert await self._search(index, one["carol"]) == {"PUB"}
        both = AccessScope.for_readers([ALICE, BOB], None)  # a channel with both: what both may read
        assert await self._search(index, both) == {"PUB", "ENG"}
        assert await self._search(index, AccessScope.for_readers([BOB], ("HR",))) == {"HR"}
        assert await self._search(index, EVERYTHING) == set(SITE)
        ids = [points(page, None)[0].evidence.id for page in SITE]
        assert {e.page_id for e in await index.get(ids, both)} == {"PUB", "ENG"}
        assert await index.get(ids, AccessScope.for_readers([], None)) == []  # no audience, nothing

    async def test_space_mode_never_shows_pages_with_read_restrictions(self, index: Any) -> None:
        """Found in review: pages a per-user sync indexed with their restrictions were shown to every mapped
        place after switching back to EVIDENT_ACCESS=space."""
        await self._site(index)
        await index.replace_page(
            "OLD", "hash-OLD", [make_point("OLD", 0, "hash-OLD", "old", sparse={5: 1.0})]
        )
        assert await self._search(index, AccessScope.space_only(None)) == {"PUB", "ENG", "OLD"}
        assert await self._search(index, EVERYTHING) == {*SITE, "OLD"}  # the operator's tools see all
        ids = [points(page, None)[0].evidence.id for page in SITE]
        assert {e.page_id for e in await index.get(ids, AccessScope.space_only(None))} == {"PUB", "ENG"}

    async def test_access_changes_by_payload_write_without_re_embedding(self, index: Any) -> None:
        await self._site(index)
        hashes, count = await index.page_hashes(), await index.count()
        alice = AccessScope.for_readers([ALICE], None)
        await index.set_access({"ENG": page_access([[group("eng")], [user("bob")]]),  # restricted to bob
                                "HR": page_access([["*"]])})  # opened to everyone
        assert await self._search(index, alice) == {"PUB", "HR", "ALICE"}
        [ev] = await index.get([points("ENG", None)[0].evidence.id], EVERYTHING)
        assert ev.access == ((group("eng"),), (user("bob"),))
        assert await index.page_hashes() == hashes and await index.count() == count

    async def test_evidence_without_permissions_is_counted_and_never_shown_per_user(self, index: Any) -> None:
        await index.replace_page("PUB", "hash-PUB", points("PUB", None))  # indexed before permissions
        await index.replace_page("ENG", "hash-ENG", points("ENG", page_access([[group("eng")]])))
        assert await index.missing_access() == 1 and (await index.stats())["without_permissions"] == 1
        assert await self._search(index, AccessScope.for_readers([ALICE], None)) == {"ENG"}
        assert await self._search(index, AccessScope.space_only(None)) == {"PUB", "ENG"}
        await index.set_access({"ENG": None})  # permissions forgotten: unknown again
        assert await index.missing_access() == 2
