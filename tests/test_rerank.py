"""Reranker plumbing (with a tiny deterministic reranker) and the real cross-encoders when present."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

import pytest

from pipeline.errors import ConfigError, EmbeddingError
from pipeline.models.rerank import apply_scores, hit_text, make_reranker
from pipeline.protocols import Reranker
from pipeline.types import Evidence, Hit


def hit(i: int, text: str, content: str = "", score: float = 0.0) -> Hit:
    ev = Evidence(
        id=f"ev-{i}", page_id="p1", title="Runbook", url="https://acme.example/p1", space="ACME",
        kind="passage", position=i, text=text,
    )
    return Hit(evidence=ev, score=score, rank=i + 1, content=content)


class WordOverlapReranker:
    """Scores a hit by how many query words its text contains: deterministic and model-free."""

    name = "word-overlap"

    def rerank(self, query: str, hits: Sequence[Hit]) -> list[Hit]:
        words = set(query.lower().split())
        return apply_scores(hits, [float(len(words & set(hit_text(h).lower().split()))) for h in hits])


HITS = [
    hit(0, "the canary runs for twenty minutes", score=0.9),
    hit(1, "roll back with kestrel rollback", score=0.8),
    hit(2, "unrelated text", content="Deployment runbook. roll back the billing service", score=0.7),
    hit(3, "another unrelated text", score=0.6),
]


def test_fake_reranker_satisfies_protocol() -> None:
    assert isinstance(WordOverlapReranker(), Reranker)


def test_rerank_reorders_rescores_and_renumbers() -> None:
    out = WordOverlapReranker().rerank("roll back billing", HITS)
    assert [h.evidence.id for h in out] == ["ev-2", "ev-1", "ev-0", "ev-3"]
    assert [h.rank for h in out] == [1, 2, 3, 4]
    assert [h.score for h in out] == [3.0, 2.0, 0.0, 0.0]
    assert out[0].content == HITS[2].content  # everything but score/rank is kept
    assert [h.rank for h in HITS] == [1, 2, 3, 4]  # inputs untouched (frozen dataclasses)


def test_ties_keep_retrieval_order() -> None:
    out = apply_scores(HITS, [1.0, 1.0, 1.0, 1.0])
    assert [h.evidence.id for h in out] == ["ev-0", "ev-1", "ev-2", "ev-3"]


def test_hit_text_prefers_contextualized_content() -> None:
    assert hit_text(HITS[2]) == "Deployment runbook. roll back the billing service"
    assert hit_text(HITS[0]) == "the canary runs for twenty minutes"


def test_score_count_mismatch_is_an_error() -> None:
    with pytest.raises(EmbeddingError, match="returned 1 scores for 4 hits"):
        apply_scores(HITS, [1.0])


def test_empty_hits() -> None:
    assert WordOverlapReranker().rerank("q", []) == []


def test_make_reranker_none_and_unknown() -> None:
    assert make_reranker("none") is None
    assert make_reranker("") is None
    with pytest.raises(ConfigError) as err:
        make_reranker("colbert")
    assert str(err.value) == "unknown reranker 'colbert': choose none, bge-reranker-v2-m3, st:<cross-encoder>"


@pytest.mark.skipif(importlib.util.find_spec("FlagEmbedding") is not None, reason="FlagEmbedding is installed")
def test_bge_reranker_without_extra_names_it() -> None:
    with pytest.raises(ConfigError, match=r"pip install 'evident-bot\[bge\]'"):
        make_reranker("bge-reranker-v2-m3")


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is not None, reason="st is installed")
def test_st_reranker_without_extra_names_it() -> None:
    with pytest.raises(ConfigError, match=r"pip install 'evident-bot\[st\]'"):
        make_reranker("st:cross-encoder/ms-marco-MiniLM-L-6-v2")


def _real(name: str) -> Reranker:
    try:
        reranker = make_reranker(name)
    except EmbeddingError as exc:
        pytest.skip(f"weights absent: {exc}")
    assert reranker is not None
    return reranker


def test_bge_reranker_when_weights_present() -> None:
    pytest.importorskip("FlagEmbedding")
    out = _real("bge-reranker-v2-m3").rerank("how do I roll back billing", HITS)
    assert [h.rank for h in out] == [1, 2, 3, 4]
    assert out[0].evidence.id in {"ev-1", "ev-2"}


def test_st_cross_encoder_when_weights_present() -> None:
    pytest.importorskip("sentence_transformers")
    out = _real("st:cross-encoder/ms-marco-MiniLM-L-6-v2").rerank("how do I roll back billing", HITS)
    assert [h.rank for h in out] == [1, 2, 3, 4]
    assert out[0].evidence.id in {"ev-1", "ev-2"}
