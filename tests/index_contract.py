"""One behavioural contract for every ``Index`` backend (subclass ``IndexContract``, define ``make_index``).

The fixture corpus is built by hand so that lexical and dense retrieval disagree and the hybrid
(RRF, k=60) order is known exactly: see ``CORPUS``.
"""

from __future__ import annotations

import asyncio
import uuid
import zlib
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from pipeline.access.scope import EVERYTHING, AccessScope
from pipeline.errors import IndexError_, IndexMismatchError, InputError
from pipeline.index.common import dbsf_fuse, rrf_fuse
from pipeline.protocols import Index
from pipeline.types import Evidence, IndexPoint, SearchRequest, SparseVector

DIM = 16
EMBEDDER = "test-embedder"

_rng = np.random.default_rng(7)
QUERY_DENSE = _rng.normal(size=DIM)
QUERY_DENSE /= np.linalg.norm(QUERY_DENSE)
QUERY_SPARSE = SparseVector((1, 2), (1.0, 1.0))


def vector_with_cosine(c: float, seed: int) -> tuple[float, ...]:
    """A unit vector whose cosine with QUERY_DENSE is exactly ``c``."""
    r = np.random.default_rng(seed).normal(size=DIM)
    r -= r.dot(QUERY_DENSE) * QUERY_DENSE
    r /= np.linalg.norm(r)
    v = c * QUERY_DENSE + np.sqrt(1 - c * c) * r
    return tuple(float(x) for x in v)


def evidence_id(page_id: str, position: int) -> str:
    """Position-based ids, so two versions of a page share evidence ids (the hard case)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{page_id}#{position}"))


def make_point(
    page_id: str,
    position: int,
    page_hash: str,
    text: str,
    *,
    cosine: float = 0.0,
    sparse: dict[int, float] | None = None,
    space: str = "ENG",
    kind: str = "passage",
) -> IndexPoint:
    ev = Evidence(
        id=evidence_id(page_id, position),
        page_id=page_id,
        title=f"Title {page_id}",
        url=f"https://wiki/{page_id}",
        space=space,
        kind=kind,
        position=position,
        text=text,
        headings=("H1", "H2"),
        before="b",
        after="a",  # type: ignore[arg-type]
        breadcrumb=("Root",),
        table_index=1 if kind in ("table", "row") else None,
        row_index=position + 1 if kind == "row" else None,
    )
    terms = sparse or {99: 1.0}
    return IndexPoint(
        evidence=ev,
        content=f"ctx: {text}",
        dense=vector_with_cosine(cosine, seed=zlib.crc32(f"{page_id}#{position}".encode())),
        sparse=SparseVector(tuple(terms), tuple(terms.values())),
        page_hash=page_hash,
    )


# name -> (space, lexical TF weights, cosine with the query). Six pages of one evidence each.
# Lexical (IDF over N=6): A 1.72 > B 1.03 > D 0.69 > E 0.35 ; C, F no match.
# Dense: C .95 > B .90 > D .50 > E .30 > F .0 > A -.2
# RRF k=60 (1/(60+rank)): B .03226 > D .03175 > A .03155 > E .03125 > C .01639 > F .01538
CORPUS: dict[str, tuple[str, dict[int, float], float]] = {
    "A": ("ENG", {1: 1.0, 2: 1.0}, -0.2),
    "B": ("ENG", {1: 1.0}, 0.9),
    "C": ("ENG", {3: 1.0}, 0.95),
    "D": ("HR", {2: 1.0}, 0.5),
    "E": ("HR", {2: 0.5}, 0.3),
    "F": ("HR", {4: 1.0}, 0.0),
}
LEXICAL_ORDER = ["A", "B", "D", "E"]
DENSE_ORDER = ["C", "B", "D", "E", "F", "A"]
HYBRID_ORDER = ["B", "D", "A", "E", "C", "F"]


def corpus_point(name: str) -> IndexPoint:
    space, terms, cosine = CORPUS[name]
    return make_point(name, 0, f"hash-{name}", f"text {name}", cosine=cosine, sparse=terms, space=space)


def page_version(page_id: str, version: str, n: int) -> list[IndexPoint]:
    """``n`` evidence of one page version; texts say which version they came from."""
    return [
        make_point(page_id, i, f"hash-{version}", f"{version} {i}", cosine=0.99 - 0.01 * i, sparse={7: 1.0})
        for i in range(n)
    ]


def names(hits: Sequence[Any]) -> list[str]:
    return [h.evidence.page_id for h in hits]


class FailingPoints(Sequence[IndexPoint]):
    """A point sequence whose iteration raises after ``fail_after`` items: a crash mid-write."""

    def __init__(self, points: list[IndexPoint], fail_after: int) -> None:
        self._points, self._fail_after = points, fail_after

    def __len__(self) -> int:
        return len(self._points)

    def __getitem__(self, i: Any) -> Any:
        return self._points[i]

    def __iter__(self) -> Iterator[IndexPoint]:
        for i, p in enumerate(self._points):
            if i == self._fail_after:
                raise RuntimeError("simulated crash while writing")
            yield p


class IndexContract:
    """Behaviour every ``Index`` must show. Subclasses implement ``make_index``."""

    # Whether readers never see a page missing during replace_page (Edge: yes; server: brief gap).
    gapless: ClassVar[bool] = True
    # Whether replace_page consumes the points as it writes them (a process proxy takes them all first,
    # so a sequence that fails while iterated never reaches the index).
    streams_points: ClassVar[bool] = True

    def make_index(self, tmp_path: Path) -> Any:
        """A new, unopened index instance on storage rooted at ``tmp_path`` (same path = same data)."""
        raise NotImplementedError

    @pytest.fixture
    async def index(self, tmp_path: Path) -> AsyncIterator[Any]:
        idx = self.make_index(tmp_path)
        await idx.open(dense_dim=DIM, embedder=EMBEDDER)
        yield idx
        await idx.close()

    @pytest.fixture
    async def corpus_index(self, index: Any) -> Any:
        for name in CORPUS:
            await index.replace_page(name, f"hash-{name}", [corpus_point(name)])
        return index

    # ------------------------------------------------------------------ open / persistence

    async def test_satisfies_protocol_and_opens_empty(self, index: Any) -> None:
        assert isinstance(index, Index)
        assert await index.count() == 0
        assert await index.page_hashes() == {}
        stats = await index.stats()
        assert stats["points"] == 0 and stats["pages"] == 0
        assert stats["embedder"] == EMBEDDER and stats["dim"] == DIM

    async def test_ready_and_export_round_trip_into_another_index(
        self, corpus_index: Any, tmp_path: Path
    ) -> None:
        """What readiness checks and `evident index migrate` use of every backend."""
        await corpus_index.ready()
        exported = [p async for p in corpus_index.export_points(batch=1)]
        assert sorted(p.evidence.page_id for p in exported) == sorted(CORPUS)
        assert all(p.dense and p.page_hash == f"hash-{p.evidence.page_id}" for p in exported)
        copy = self.make_index(tmp_path / "copy")
        await copy.open(dense_dim=DIM, embedder=EMBEDDER)
        try:
            for p in exported:
                await copy.replace_page(p.evidence.page_id, p.page_hash, [p])
            req = SearchRequest(
                dense=QUERY_DENSE_T, sparse=QUERY_SPARSE, mode="dense", limit=5, scope=EVERYTHING
            )
            assert names(await copy.search(req)) == names(await corpus_index.search(req))
        finally:
            await copy.close()

    async def test_reopen_sees_the_data(self, tmp_path: Path) -> None:
        idx = self.make_index(tmp_path)
        await idx.open(dense_dim=DIM, embedder=EMBEDDER)
        await idx.replace_page("P", "hash-v1", page_version("P", "v1", 3))
        await idx.close()
        again = self.make_index(tmp_path)
        await again.open(dense_dim=DIM, embedder=EMBEDDER)
        try:
            assert await again.count() == 3
            assert await again.page_hashes() == {"P": "hash-v1"}
            hits = await again.search(
                SearchRequest(dense=QUERY_DENSE_T, sparse=SparseVector((7,), (1.0,)), scope=EVERYTHING)
            )
            assert len(hits) == 3
        finally:
            await again.close()

    @pytest.mark.parametrize(
        ("embedder", "dim", "fragment"),
        [("other-model", DIM, "this run uses 'other-model' (dim 16)"),
         (EMBEDDER, 32, f"this run uses '{EMBEDDER}' (dim 32)")],
    )
    async def test_other_embedder_or_dim_is_refused(
        self, tmp_path: Path, embedder: str, dim: int, fragment: str
    ) -> None:
        idx = self.make_index(tmp_path)
        await idx.open(dense_dim=DIM, embedder=EMBEDDER)
        await idx.close()
        other = self.make_index(tmp_path)
        with pytest.raises(IndexMismatchError) as err:
            await other.open(dense_dim=dim, embedder=embedder)
        msg = str(err.value)
        assert f"was built with embedder '{EMBEDDER}' (dim {DIM})" in msg
        assert fragment in msg and "--rebuild" in msg
        # the refused open left the index usable for the right model
        ok = self.make_index(tmp_path)
        await ok.open(dense_dim=DIM, embedder=EMBEDDER)
        await ok.close()

    async def test_recipe_is_recorded_and_another_is_refused(self, tmp_path: Path) -> None:
        idx = self.make_index(tmp_path)
        await idx.open(dense_dim=DIM, embedder=EMBEDDER, recipe={"max_tokens": 128})
        await idx.close()
        other = self.make_index(tmp_path)
        with pytest.raises(IndexMismatchError) as err:
            await other.open(dense_dim=DIM, embedder=EMBEDDER, recipe={"max_tokens": 64})
        msg = str(err.value)
        assert "made with max_tokens 128" in msg and "with max_tokens 64" in msg
        assert "evident ingest --rebuild" in msg and "evident sync --rebuild" in msg
        for recipe in ({"max_tokens": 128}, None):  # the same recipe, or a caller that does not say
            again = self.make_index(tmp_path)
            await again.open(dense_dim=DIM, embedder=EMBEDDER, recipe=recipe)
            assert await again.recipe() == {"max_tokens": 128}
            await again.close()

    async def test_an_index_without_a_recipe_records_the_first_one_given(self, tmp_path: Path) -> None:
        """An index made before recipes were recorded (or by a caller that gave none) adopts the first recipe
        it is opened with, and refuses another one from then on."""
        idx = self.make_index(tmp_path)
        await idx.open(dense_dim=DIM, embedder=EMBEDDER)
        assert await idx.recipe() is None
        await idx.close()
        adopting = self.make_index(tmp_path)
        await adopting.open(dense_dim=DIM, embedder=EMBEDDER, recipe={"max_tokens": 128})
        assert await adopting.recipe() == {"max_tokens": 128}
        await adopting.close()
        other = self.make_index(tmp_path)
        with pytest.raises(IndexMismatchError, match="made with max_tokens 128"):
            await other.open(dense_dim=DIM, embedder=EMBEDDER, recipe={"max_tokens": 64})

    @pytest.mark.parametrize("idf", [True, False])
    async def test_learned_sparse_weights_get_no_idf(self, tmp_path: Path, idf: bool) -> None:
        """bge-m3's sparse weights already encode importance: with ``sparse_idf`` False, scores are raw dot
        products."""
        idx = self.make_index(tmp_path)
        await idx.open(dense_dim=DIM, embedder=EMBEDDER, recipe={"sparse": "s", "sparse_idf": idf})
        try:
            await idx.replace_page(
                "P",
                "h",
                [make_point("P", i, "h", f"t{i}", sparse={5: 0.5, 6: 1.0}) for i in range(4)]
                + [make_point("P", 9, "h", "rare", sparse={6: 1.0, 8: 2.0})],
            )
            hits = await idx.search(
                SearchRequest(dense=None, sparse=SparseVector((8,), (1.5,)), mode="lexical", scope=EVERYTHING)
            )
            assert [h.evidence.text for h in hits] == ["rare"]
            if idf:
                assert hits[0].score != pytest.approx(3.0)  # term 8 is rare: IDF scales it
            else:
                assert hits[0].score == pytest.approx(3.0)  # 2.0 x 1.5, nothing on top
        finally:
            await idx.close()

    async def test_drop_removes_the_data(self, tmp_path: Path) -> None:
        idx = self.make_index(tmp_path)
        await idx.open(dense_dim=DIM, embedder=EMBEDDER)
        await idx.replace_page("P", "hash-v1", page_version("P", "v1", 3))
        await idx.close()
        await self.make_index(tmp_path).drop()  # a closed index, as `--rebuild` finds it
        fresh = self.make_index(tmp_path)
        await fresh.open(dense_dim=DIM * 2, embedder="another-model")  # no mismatch left behind
        try:
            assert await fresh.count() == 0
        finally:
            await fresh.close()

    # ------------------------------------------------------------------ writes

    async def test_upsert_count_stats(self, corpus_index: Any) -> None:
        await corpus_index.replace_page(
            "T", "hash-T", [make_point("T", i, "hash-T", f"row {i}", kind="row") for i in range(3)]
        )
        assert await corpus_index.count() == 9
        stats = await corpus_index.stats()
        assert stats["points"] == 9 and stats["pages"] == 7
        assert stats["by_kind"] == {"passage": 6, "list": 0, "table": 0, "row": 3}
        assert stats["staged"] == 0

    async def test_payload_round_trips(self, index: Any) -> None:
        p = make_point("T", 2, "hash-T", "a row", kind="row", sparse={5: 2.0})
        await index.replace_page("T", "hash-T", [p])
        [ev] = await index.get([p.evidence.id], scope=EVERYTHING)
        assert ev == p.evidence
        [hit] = await index.search(
            SearchRequest(dense=None, sparse=SparseVector((5,), (1.0,)), mode="lexical", scope=EVERYTHING)
        )
        assert hit.evidence == p.evidence and hit.content == p.content and hit.rank == 1

    async def test_replace_page_swaps_the_whole_version(self, index: Any) -> None:
        await index.replace_page("P", "hash-v1", page_version("P", "v1", 3))
        await index.replace_page("Q", "hash-q", page_version("Q", "q", 1))
        await index.replace_page("P", "hash-v2", page_version("P", "v2", 2))
        assert await index.count() == 3
        assert await index.page_hashes() == {"P": "hash-v2", "Q": "hash-q"}
        hits = await index.search(
            SearchRequest(
                dense=None, sparse=SparseVector((7,), (1.0,)), mode="lexical", limit=20, scope=EVERYTHING
            )
        )
        assert sorted(h.evidence.text for h in hits) == ["q 0", "v2 0", "v2 1"]
        # position 2 existed only in v1: gone
        assert await index.get([evidence_id("P", 2)], scope=EVERYTHING) == []

    async def test_reingest_same_version_is_idempotent(self, index: Any) -> None:
        for _ in range(2):
            await index.replace_page("P", "hash-v1", page_version("P", "v1", 3))
        assert await index.count() == 3
        # same hash, fewer evidence (e.g. other settings): the stale one is dropped in place
        await index.replace_page("P", "hash-v1", page_version("P", "v1", 2))
        assert await index.count() == 2
        assert (await index.stats())["staged"] == 0

    async def test_replace_with_no_points_empties_the_page(self, index: Any) -> None:
        await index.replace_page("P", "hash-v1", page_version("P", "v1", 2))
        await index.replace_page("P", "hash-v2", [])
        assert await index.count() == 0 and await index.page_hashes() == {}

    async def test_delete_pages(self, corpus_index: Any) -> None:
        await corpus_index.delete_pages(["A", "D", "missing"])
        await corpus_index.delete_pages([])
        assert set(await corpus_index.page_hashes()) == {"B", "C", "E", "F"}
        assert await corpus_index.count() == 4

    async def test_rejects_points_of_another_version(self, index: Any) -> None:
        with pytest.raises(IndexError_, match="page hash"):
            await index.replace_page("P", "hash-v2", page_version("P", "v1", 1))
        with pytest.raises(IndexError_, match="expects 16"):
            bad = page_version("P", "v1", 1)[0]
            await index.replace_page(
                "P", "hash-v1", [IndexPoint(bad.evidence, "", (1.0, 0.0), bad.sparse, "hash-v1")]
            )
        assert await index.count() == 0

    # ------------------------------------------------------------------ reads

    async def test_get_keeps_the_requested_order(self, corpus_index: Any) -> None:
        ids = [evidence_id(n, 0) for n in ("E", "A", "C")]
        got = await corpus_index.get([ids[0], "no-such-id", ids[1], ids[2]], scope=EVERYTHING)
        assert [e.page_id for e in got] == ["E", "A", "C"]
        assert await corpus_index.get([], scope=EVERYTHING) == []

    async def test_lexical_dense_hybrid_orders(self, corpus_index: Any) -> None:
        lex = await corpus_index.search(
            SearchRequest(dense=None, sparse=QUERY_SPARSE, mode="lexical", scope=EVERYTHING)
        )
        dense = await corpus_index.search(
            SearchRequest(dense=QUERY_DENSE_T, sparse=None, mode="dense", scope=EVERYTHING)
        )
        hybrid = await corpus_index.search(
            SearchRequest(dense=QUERY_DENSE_T, sparse=QUERY_SPARSE, mode="hybrid", scope=EVERYTHING)
        )
        assert names(lex) == LEXICAL_ORDER
        assert names(dense) == DENSE_ORDER
        assert names(hybrid) == HYBRID_ORDER
        assert [h.rank for h in hybrid] == list(range(1, 7))
        predicted = rrf_fuse([names(lex), names(dense)], k=60)
        assert [n for n, _ in predicted] == HYBRID_ORDER
        assert [h.score for h in hybrid] == pytest.approx([s for _, s in predicted], rel=1e-5)
        assert hybrid[0].score == pytest.approx(1 / 62 + 1 / 62, rel=1e-5)
        assert dense[0].score == pytest.approx(0.95, abs=1e-4)

    async def test_candidate_limits_and_final_limit(self, corpus_index: Any) -> None:
        req = SearchRequest(
            dense=QUERY_DENSE_T, sparse=QUERY_SPARSE, lexical_k=1, dense_k=2, limit=10, scope=EVERYTHING
        )
        # candidates: lexical {A}, dense {C, B} -> fused A(1/61), C(1/61), B(1/62)
        assert set(names(await corpus_index.search(req))) == {"A", "B", "C"}
        assert (
            len(
                await corpus_index.search(
                    SearchRequest(dense=QUERY_DENSE_T, sparse=QUERY_SPARSE, limit=2, scope=EVERYTHING)
                )
            )
            == 2
        )

    async def test_weighted_rrf(self, corpus_index: Any) -> None:
        weights = (0.2, 1.0)
        hybrid = await corpus_index.search(
            SearchRequest(dense=QUERY_DENSE_T, sparse=QUERY_SPARSE, weights=weights, scope=EVERYTHING)
        )
        predicted = rrf_fuse([LEXICAL_ORDER, DENSE_ORDER], k=60, weights=weights)
        assert names(hybrid) == [n for n, _ in predicted]
        assert names(hybrid)[:2] == ["A", "B"]  # differs from the unweighted order
        assert [h.score for h in hybrid] == pytest.approx([s for _, s in predicted], rel=1e-5)

    async def test_score_pooling_fuses_normalized_scores(self, corpus_index: Any) -> None:
        """DBSF: the engine's order and scores are the client-side formula's, from each leg's own scores."""
        legs = []
        for mode in ("lexical", "dense"):
            hits = await corpus_index.search(
                SearchRequest(
                    dense=QUERY_DENSE_T,
                    sparse=QUERY_SPARSE,
                    mode=mode,
                    lexical_k=4,
                    dense_k=6,
                    limit=6,
                    scope=EVERYTHING,
                )
            )
            legs.append([(h.evidence.page_id, h.score) for h in hits])
        pooled = await corpus_index.search(
            SearchRequest(
                dense=QUERY_DENSE_T,
                sparse=QUERY_SPARSE,
                fusion="dbsf",
                lexical_k=4,
                dense_k=6,
                limit=6,
                scope=EVERYTHING,
            )
        )
        predicted = dbsf_fuse(legs)
        assert [h.score for h in pooled] == pytest.approx([s for _, s in predicted], abs=1e-4)
        assert names(pooled)[0] == predicted[0][0]
        rrf = await corpus_index.search(SearchRequest(dense=QUERY_DENSE_T, sparse=QUERY_SPARSE, lexical_k=4,
                                                      dense_k=6, limit=6, scope=EVERYTHING))
        assert names(pooled) != names(rrf)  # scores, not ranks: B's strong dense score carries it

    async def test_page_spaces_says_where_each_live_page_was_indexed(self, corpus_index: Any) -> None:
        assert await corpus_index.page_spaces() == {name: space for name, (space, _, _) in CORPUS.items()}
        await corpus_index.delete_pages(["A"])
        assert "A" not in await corpus_index.page_spaces()

    async def test_spaces_filter_applies_to_every_leg(self, corpus_index: Any) -> None:
        hr = ("HR",)
        lex = await corpus_index.search(
            SearchRequest(dense=None, sparse=QUERY_SPARSE, mode="lexical", scope=AccessScope.space_only(hr))
        )
        dense = await corpus_index.search(
            SearchRequest(dense=QUERY_DENSE_T, sparse=None, mode="dense", scope=AccessScope.space_only(hr))
        )
        hybrid = await corpus_index.search(
            SearchRequest(dense=QUERY_DENSE_T, sparse=QUERY_SPARSE, scope=AccessScope.space_only(hr))
        )
        assert names(lex) == ["D", "E"]
        assert names(dense) == ["D", "E", "F"]
        assert names(hybrid) == ["D", "E", "F"]
        both = await corpus_index.search(
            SearchRequest(
                dense=QUERY_DENSE_T, sparse=QUERY_SPARSE, scope=AccessScope.space_only(("HR", "ENG"))
            )
        )
        assert names(both) == HYBRID_ORDER
        assert (
            await corpus_index.search(
                SearchRequest(
                    dense=QUERY_DENSE_T, sparse=QUERY_SPARSE, scope=AccessScope.space_only(("NONE",))
                )
            )
            == []
        )

    async def test_empty_sparse_query_falls_back_to_dense_leg(self, corpus_index: Any) -> None:
        empty = SparseVector((), ())
        assert (
            await corpus_index.search(
                SearchRequest(dense=None, sparse=empty, mode="lexical", scope=EVERYTHING)
            )
            == []
        )
        hybrid = await corpus_index.search(SearchRequest(dense=QUERY_DENSE_T, sparse=empty, scope=EVERYTHING))
        assert names(hybrid) == DENSE_ORDER

    async def test_missing_query_vector_is_an_input_error(self, corpus_index: Any) -> None:
        with pytest.raises(InputError):
            await corpus_index.search(
                SearchRequest(dense=None, sparse=None, mode="lexical", scope=EVERYTHING)
            )
        with pytest.raises(InputError):
            await corpus_index.search(
                SearchRequest(dense=None, sparse=QUERY_SPARSE, mode="hybrid", scope=EVERYTHING)
            )

    # ------------------------------------------------------------------ atomicity

    async def test_crash_mid_write_keeps_the_old_version(self, index: Any) -> None:
        await index.replace_page("P", "hash-v1", page_version("P", "v1", 3))
        index.batch_size = 2  # so some new points reach the index before the crash
        with pytest.raises(RuntimeError, match="simulated crash"):
            await index.replace_page("P", "hash-v2", FailingPoints(page_version("P", "v2", 5), fail_after=4))
        assert (await index.stats())["staged"] == (4 if self.streams_points else 0)  # leftovers are invisible
        assert await index.count() == 3
        assert await index.page_hashes() == {"P": "hash-v1"}
        hits = await index.search(
            SearchRequest(dense=QUERY_DENSE_T, sparse=SparseVector((7,), (1.0,)), limit=20, scope=EVERYTHING)
        )
        assert sorted(h.evidence.text for h in hits) == ["v1 0", "v1 1", "v1 2"]
        assert [
            e.text for e in await index.get([evidence_id("P", i) for i in range(5)], scope=EVERYTHING)
        ] == [
            "v1 0",
            "v1 1",
            "v1 2",
        ]
        await index.replace_page("P", "hash-v2", page_version("P", "v2", 5))
        assert await index.count() == 5
        assert (await index.stats())["staged"] == 0

    async def test_open_cleans_crash_leftovers(self, tmp_path: Path) -> None:
        idx = self.make_index(tmp_path)
        await idx.open(dense_dim=DIM, embedder=EMBEDDER)
        await idx.replace_page("P", "hash-v1", page_version("P", "v1", 2))
        idx.batch_size = 1
        with pytest.raises(RuntimeError):
            await idx.replace_page("P", "hash-v2", FailingPoints(page_version("P", "v2", 3), fail_after=2))
        await idx.close()
        again = self.make_index(tmp_path)
        await again.open(dense_dim=DIM, embedder=EMBEDDER)
        try:
            stats = await again.stats()
            assert stats["staged"] == 0 and stats["points"] == 2
        finally:
            await again.close()

    async def test_search_many_answers_each_request_as_search_does(self, corpus_index: Any) -> None:
        requests = [
            SearchRequest(dense=QUERY_DENSE_T, sparse=QUERY_SPARSE, limit=5, scope=EVERYTHING),
            SearchRequest(dense=None, sparse=QUERY_SPARSE, mode="lexical", limit=1, scope=EVERYTHING),
            SearchRequest(dense=QUERY_DENSE_T, sparse=None, mode="dense", limit=3, scope=EVERYTHING),
            SearchRequest(dense=QUERY_DENSE_T, sparse=QUERY_SPARSE, limit=0, scope=EVERYTHING),
        ]
        together = await corpus_index.search_many(requests)
        alone = [await corpus_index.search(r) for r in requests]
        assert [names(h) for h in together] == [names(h) for h in alone]
        assert [len(h) for h in together][1:] == [1, 3, 0] and together[0]
        assert await corpus_index.search_many([]) == []

    async def test_a_batch_with_a_hybrids_rankers_ranks_and_scores_as_the_engine(self, index: Any) -> None:
        """A question's batch (hybrid + each ranker's top hit) may run each ranker once and fuse it itself
        (Edge does): the same evidence in the same order, with the engine's scores, for both fusions. The
        first evidence's dense score lies past the mean + 3 sd of its list, which DBSF does not clip."""
        points = [make_point("O", i, "hash-o", f"o {i}", cosine=0.95 if i == 0 else 0.1 + 0.01 * i,
                             sparse={1: 1.0 + 0.1 * ((i * 7) % 20), 2: 0.5}) for i in range(20)]
        await index.replace_page("O", "hash-o", points)
        for fusion in ("dbsf", "rrf"):
            hybrid = SearchRequest(dense=QUERY_DENSE_T, sparse=QUERY_SPARSE, fusion=fusion, lexical_k=8,
                                   dense_k=8, limit=12, scope=EVERYTHING)
            batch = [replace(hybrid, mode="dense", limit=12),  # deeper than the hybrid's prefetch
                     hybrid, replace(hybrid, mode="lexical", limit=1), replace(hybrid, mode="dense", limit=2)]
            together = await index.search_many(batch)
            alone = [await index.search(r) for r in batch]
            for got, want in zip(together, alone, strict=True):
                assert [h.evidence.id for h in got] == [h.evidence.id for h in want]
                assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-5)
                assert [h.rank for h in got] == list(range(1, len(want) + 1))
            assert [len(hits) for hits in together] == [12, 12, 1, 2]
        deep = replace(batch[1], fusion="dbsf", lexical_k=20, dense_k=20)  # all 20: the outlier past 3 sd
        dbsf = (await index.search_many([deep, batch[3]]))[0]
        assert dbsf[0].evidence.id == evidence_id("O", 0) and dbsf[0].score > 1.0

    async def test_concurrent_searches_never_see_a_mix(self, index: Any) -> None:
        await index.replace_page("P", "hash-v1", page_version("P", "v1", 6))
        await index.replace_page("Q", "hash-q", page_version("Q", "q", 2))
        index.batch_size = 1  # many awaits inside the replace, so searches interleave with it
        req = SearchRequest(
            dense=QUERY_DENSE_T,
            sparse=SparseVector((7,), (1.0,)),
            limit=20,
            lexical_k=20,
            dense_k=20,
            scope=EVERYTHING,
        )
        seen: list[set[str]] = []

        async def one_search() -> None:
            hits = await index.search(req)
            seen.append({h.evidence.text.split()[0] for h in hits if h.evidence.page_id == "P"})

        async def searches() -> None:
            for _ in range(60):
                await one_search()
                await asyncio.sleep(0)

        await asyncio.gather(
            searches(), searches(), index.replace_page("P", "hash-v2", page_version("P", "v2", 6))
        )
        assert all(len(versions) <= 1 for versions in seen), seen
        if self.gapless:
            assert all(len(versions) == 1 for versions in seen), seen
        assert set().union(*seen) == {"v1", "v2"}, "the searches did not overlap the replace"
        assert await index.page_hashes() == {"P": "hash-v2", "Q": "hash-q"}


QUERY_DENSE_T: tuple[float, ...] = tuple(float(x) for x in QUERY_DENSE)
