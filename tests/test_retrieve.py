"""retrieve() against a real Edge index holding hand-made vectors: fusion when the legs disagree, and a
reranker plugged in."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from evident.settings import Settings
from pipeline.access.scope import EVERYTHING, AccessScope
from pipeline.answer.retrieve import retrieve
from pipeline.answer.settings import RetrievalSettings
from pipeline.index.common import dbsf_fuse
from pipeline.index.edge import EdgeIndex
from pipeline.models.sparse import Bm25Encoder
from pipeline.types import Evidence, Hit, IndexPoint

DIM = 4
QUERY = "alpha"
E1 = (1.0, 0.0, 0.0, 0.0)

# name -> (text, dense vector). Lexically "alpha" ranks A > B (C, D lack it); densely C > B > A > D.
DOCS: dict[str, tuple[str, tuple[float, ...]]] = {
    "A": ("alpha alpha alpha beta", (0.0, 1.0, 0.0, 0.0)),
    "B": ("alpha gamma", (0.9, 0.0, float(np.sqrt(1 - 0.81)), 0.0)),
    "C": ("delta epsilon", E1),
    "D": ("zeta eta", (-1.0, 0.0, 0.0, 0.0)),
}


class QueryVector:
    """Embeds every query as ``E1``: the dense leg's order is then fixed by the documents' vectors."""

    name = "fixed-query"
    dim = DIM

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        raise AssertionError("documents are indexed with hand-made vectors")

    def close(self) -> None:
        pass

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return np.array([E1] * len(texts), dtype=np.float32)


class ShortestFirst:
    """A deterministic reranker: shortest text first (ties by title); records what it was given."""

    name = "shortest-first"

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def rerank(self, query: str, hits: Sequence[Hit]) -> list[Hit]:
        self.seen.append([h.evidence.title for h in hits])
        ordered = sorted(hits, key=lambda h: (len(h.evidence.text), h.evidence.title))
        return [replace(h, rank=i, score=1.0 / i) for i, h in enumerate(ordered, start=1)]


@pytest.fixture
async def index(tmp_path: Path) -> AsyncIterator[EdgeIndex]:
    idx = EdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder="fixed-query")
    sparse = Bm25Encoder()
    for n, (name, (text, vec)) in enumerate(DOCS.items()):
        ev = Evidence(id=f"00000000-0000-0000-0000-00000000000{n}", page_id=f"p{name}", title=name,
                      url=f"https://wiki.example/{name}", space="S", kind="passage", position=0, text=text)
        (sv,) = sparse.encode_documents([text])
        await idx.replace_page(ev.page_id, f"h{name}", [IndexPoint(ev, text, vec, sv, f"h{name}")])
    yield idx
    await idx.close()


def _titles(hits: Sequence[Hit]) -> list[str]:
    return [h.evidence.title for h in hits]


async def test_legs_disagree_and_fusion_rewards_agreement(index: EdgeIndex) -> None:
    cfg = RetrievalSettings(lexical_k=2, dense_k=2, final_k=3)
    r = await retrieve(
        QUERY,
        index=index,
        embedder=QueryVector(),
        sparse=Bm25Encoder(),
        config=cfg,
        trace=True,
        scope=EVERYTHING,
    )
    assert _titles(r.lexical) == ["A", "B"]
    assert _titles(r.dense) == ["C", "B"]
    # B is second in both legs, so RRF puts it ahead of either leg's winner.
    assert _titles(r.hits)[0] == "B" and set(_titles(r.hits)[1:]) == {"A", "C"}
    assert [h.rank for h in r.hits] == [1, 2, 3]
    assert r.hits[0].score > r.hits[1].score >= r.hits[2].score
    assert {"embed_query", "search"} <= set(r.timings_ms)


async def test_score_pooling_setting_reaches_the_index(index: EdgeIndex, tmp_path: Path) -> None:
    """EVIDENT_FUSION=dbsf: the legs' scores are pooled (C's perfect dense score now beats B's agreement)."""
    cfg = Settings.load(
        env={
            "EVIDENT_DATA_DIR": str(tmp_path),
            "EVIDENT_FUSION": "dbsf",
            "EVIDENT_LEXICAL_K": "2",
            "EVIDENT_DENSE_K": "2",
            "EVIDENT_FINAL_K": "3",
        }
    ).retrieval
    assert cfg.fusion == "dbsf"
    r = await retrieve(
        QUERY,
        index=index,
        embedder=QueryVector(),
        sparse=Bm25Encoder(),
        config=cfg,
        trace=True,
        scope=EVERYTHING,
    )
    legs = [[(h.evidence.id, h.score) for h in leg] for leg in (r.lexical, r.dense)]
    assert [h.evidence.id for h in r.hits] == [eid for eid, _ in dbsf_fuse(legs)]
    rrf = await retrieve(QUERY, index=index, embedder=QueryVector(), sparse=Bm25Encoder(),
                         config=cfg.model_copy(update={"fusion": "rrf"}), scope=EVERYTHING)
    assert _titles(rrf.hits)[0] == "B" and _titles(r.hits) != _titles(rrf.hits)


async def test_single_leg_modes(index: EdgeIndex) -> None:
    emb, sparse = QueryVector(), Bm25Encoder()
    lexical = await retrieve(QUERY, index=index, embedder=emb, sparse=sparse,
                             config=RetrievalSettings(mode="lexical", final_k=4), scope=EVERYTHING)
    dense = await retrieve(
        QUERY,
        index=index,
        embedder=emb,
        sparse=sparse,
        config=RetrievalSettings(mode="dense", final_k=4),
        scope=EVERYTHING,
    )
    assert _titles(lexical.hits) == ["A", "B"]  # only documents with the term
    assert _titles(dense.hits) == ["C", "B", "A", "D"]


async def test_space_filter(index: EdgeIndex) -> None:
    r = await retrieve(
        QUERY,
        index=index,
        embedder=QueryVector(),
        sparse=Bm25Encoder(),
        config=RetrievalSettings(),
        scope=AccessScope.space_only(("OTHER",)),
    )
    assert r.hits == []


async def test_reranker_gets_the_pool_and_decides_the_final_order(index: EdgeIndex) -> None:
    reranker = ShortestFirst()
    cfg = RetrievalSettings(lexical_k=4, dense_k=4, final_k=2, rerank_pool=4)
    r = await retrieve(
        QUERY,
        index=index,
        embedder=QueryVector(),
        sparse=Bm25Encoder(),
        config=cfg,
        reranker=reranker,
        scope=EVERYTHING,
    )
    (seen,) = reranker.seen
    assert len(seen) == 4 and set(seen) == set(DOCS)  # rerank_pool candidates, not just final_k
    assert _titles(r.hits) == ["D", "B"]  # "zeta eta" (8 chars) < "alpha gamma" (11)
    assert [h.rank for h in r.hits] == [1, 2]
    assert "rerank" in r.timings_ms


async def test_reranker_pool_never_smaller_than_final_k(index: EdgeIndex) -> None:
    reranker = ShortestFirst()
    cfg = RetrievalSettings(lexical_k=4, dense_k=4, final_k=3, rerank_pool=1)
    r = await retrieve(
        QUERY,
        index=index,
        embedder=QueryVector(),
        sparse=Bm25Encoder(),
        config=cfg,
        reranker=reranker,
        scope=EVERYTHING,
    )
    assert len(reranker.seen[0]) == 3 and len(r.hits) == 3


def test_rank_fusion_puts_evidence_both_queries_found_first_and_keeps_each_lists_best() -> None:
    from pipeline.answer.retrieve import fuse_ranks

    def hits(*ids: str) -> list[Hit]:
        return [Hit(Evidence(id=i, page_id=i, title=i, url="", space="S", kind="passage", position=0, text=i),
                    1.0 / n, n) for n, i in enumerate(ids, start=1)]

    fused = fuse_ranks([hits("a", "b", "c"), hits("x", "b", "y")], rrf_k=60)
    assert [h.evidence.id for h in fused] == ["b", "a", "x", "c", "y"]  # ties: the first list's order
    assert [h.rank for h in fused] == [1, 2, 3, 4, 5]
    assert fused[0].score == pytest.approx(2 / 62)
    weighted = fuse_ranks([hits("a", "b", "c"), hits("x", "b", "y")], rrf_k=60, weights=[1.0, 0.25])
    assert [h.evidence.id for h in weighted] == ["b", "a", "c", "x", "y"]  # the second list counts less
    silent = fuse_ranks([hits("a", "b"), hits("x", "b")], rrf_k=60, weights=[1.0, 0.0])
    assert [h.evidence.id for h in silent][:2] == ["a", "b"]  # weight 0: the first list's ranking


def test_a_plan_retrieves_with_the_queries_its_mode_names() -> None:
    from pipeline.answer.query_builder import QueryPlan

    task = "What is Bruno's task?"
    plan = QueryPlan("and Bruno?", task, task, True, (), "and Bruno? Alice")
    assert plan.retrieval_queries("fused") == ("and Bruno? Alice", "What is Bruno's task?")
    assert plan.retrieval_queries("completed") == ("What is Bruno's task?",)
    assert plan.retrieval_queries("builder") == ("and Bruno? Alice",)
    unchanged = QueryPlan("Who?", "Who?", "Who?", False, (), "Who?")  # no LLM, or turn 1: one query
    assert unchanged.retrieval_queries("fused") == ("Who?",)


def test_score_pooling_does_not_clip_a_score_past_three_deviations() -> None:
    """As the engine's ``distr_norm`` and qdrant-client's fusion: (s - (mean - 3 sd)) / 6 sd, unclipped."""
    leg = [("out", 10.0)] + [(f"p{i}", 1.0 + 0.01 * i) for i in range(19)]
    values = [v for _, v in leg]
    mean = sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    fused = dict(dbsf_fuse([leg, [("p3", 2.0), ("out", 1.0)]]))
    second = (1.0 - (1.5 - 3 * 0.5 ** 0.5)) / (6 * 0.5 ** 0.5)  # the second leg: mean 1.5, sd 0.707
    assert fused["out"] == pytest.approx((10.0 - (mean - 3 * sd)) / (6 * sd) + second)
    assert fused["out"] > 1.5  # 1.59; clipped, it was 1 + 0.38
    assert dbsf_fuse([[("only", 3.0)]]) == [("only", 0.5)]


async def _sole_match_index(tmp_path: Path) -> tuple[EdgeIndex, Bm25Encoder]:
    """Six meaning matches for any query (``QueryVector``) and one passage holding "zqpglekneg"."""
    idx = EdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder="fixed-query")
    sparse = Bm25Encoder()
    docs = {f"M{i}": (f"meaning match number {i}", (1.0, 0.02 * i, 0.0, 0.0)) for i in range(6)}
    docs["Z"] = ("the rotation code word is zqpglekneg", (0.0, 0.0, 1.0, 0.0))
    for n, (name, (text, vec)) in enumerate(docs.items()):
        ev = Evidence(id=f"00000000-0000-0000-0000-0000000000{n:02d}", page_id=f"p{name}", title=name,
                      url=f"https://wiki.example/{name}", space="S", kind="passage", position=0, text=text)
        (sv,) = sparse.encode_documents([text])
        await idx.replace_page(ev.page_id, f"h{name}", [IndexPoint(ev, text, vec, sv, f"h{name}")])
    return idx, sparse


@pytest.mark.parametrize("weight", [1.0, 0.0])
async def test_fused_queries_keep_the_firsts_of_the_queries_that_count(tmp_path: Path, weight: float) -> None:
    """Two queries (a follow-up's completed question and its no-LLM query): the sole match of the second is
    kept, unless the second query does not count (EVIDENT_FUSED_QUERY_WEIGHT=0)."""
    from pipeline.answer.retrieve import retrieve_fused

    idx, sparse = await _sole_match_index(tmp_path)
    try:
        cfg = RetrievalSettings(fusion="dbsf", lexical_k=5, dense_k=6, final_k=3, fused_query_weight=weight)
        r = await retrieve_fused(["meaning", "What is zqpglekneg?"], index=idx, embedder=QueryVector(),
                                 sparse=sparse, config=cfg, scope=EVERYTHING)
    finally:
        await idx.close()
    assert ("Z" in _titles(r.hits)) == (weight > 0) and len(r.hits) == 3


@pytest.mark.parametrize("keep", [True, False])
async def test_a_sole_keyword_match_is_kept_among_the_evidence(tmp_path: Path, keep: bool) -> None:
    """Score pooling maps a keyword search with a single match to 0.5, an average meaning match: an
    identifier only one passage holds was pushed out by meaning matches above their mean ("What is
    zqpglekneg?" answered "cannot be found" in the 50,000-page run)."""
    idx, sparse = await _sole_match_index(tmp_path)
    try:
        cfg = RetrievalSettings(fusion="dbsf", lexical_k=5, dense_k=6, final_k=3, keep_firsts=keep)
        r = await retrieve("What is zqpglekneg?", index=idx, embedder=QueryVector(), sparse=sparse,
                           config=cfg, scope=EVERYTHING)
    finally:
        await idx.close()
    assert [h.evidence.title for h in r.firsts] == ["Z", "M0"]  # each ranker's first
    if not keep:
        assert "Z" not in _titles(r.hits)  # fused below three meaning matches
        return
    assert _titles(r.hits) == ["M0", "M1", "Z"]  # the last place, the fused order before it
    assert [h.rank for h in r.hits] == [1, 2, 3] and r.hits[2].score == r.hits[1].score


async def test_fused_queries_never_lengthen_lists_an_adaptive_cut_shortened(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each query's list cut to its first evidence (no room for another ranker's first there): the fused
    list appended the firsts, up to final_k."""
    from pipeline.answer import retrieve as module

    def hit(name: str) -> Hit:
        ev = Evidence(id=name, page_id=name, title=name, url="", space="S", kind="passage", position=0,
                      text=name)
        return Hit(evidence=ev, score=1.0, rank=1)

    async def cut(query: str, **_: object) -> module.Retrieval:
        return module.Retrieval(query=query, hits=[hit("A")], firsts=[hit("Z"), hit("A")])

    monkeypatch.setattr(module, "retrieve", cut)
    cfg = RetrievalSettings(final_k=3, adaptive_min_k=1)
    r = await module.retrieve_fused(["q1", "q2"], index=None, embedder=None, sparse=None,  # type: ignore[arg-type]
                                    config=cfg, scope=EVERYTHING)
    assert _titles(r.hits) == ["A"]
    wide = await module.retrieve_fused(["q1", "q2"], index=None, embedder=None, sparse=None,  # type: ignore[arg-type]
                                       config=RetrievalSettings(final_k=3), scope=EVERYTHING)
    assert _titles(wide.hits) == ["A", "Z"]  # without a cut: appended while short


def test_keeping_the_rankers_firsts_never_drops_another_first_and_fills_a_short_list() -> None:
    from pipeline.answer.retrieve import keep_firsts

    def hit(name: str, score: float) -> Hit:
        ev = Evidence(id=name, page_id=name, title=name, url="", space="S", kind="passage", position=0,
                      text=name)
        return Hit(evidence=ev, score=score, rank=1)

    lexical, dense = hit("L", 9.0), hit("D", 0.9)
    assert _titles(keep_firsts([dense, hit("X", 0.5)], [lexical, dense], 2)) == ["D", "L"]
    assert _titles(keep_firsts([hit("X", 0.7)], [lexical], 3)) == ["X", "L"]  # appended while short
    assert _titles(keep_firsts([dense], [lexical, dense], 1)) == ["D"]  # no room but another first's
    # the fused first stays, whatever k: a small final_k keeps it and as many firsts as there is room for
    assert _titles(keep_firsts([hit("F1", 0.9)], [lexical, dense], 1)) == ["F1"]
    assert _titles(keep_firsts([hit("F1", 0.9), hit("F2", 0.8)], [lexical, dense], 2)) == ["F1", "L"]
