"""Reranker plumbing (with a tiny deterministic reranker) and the real cross-encoders when present."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

import pytest

from pipeline.errors import ConfigError, EmbeddingError
from pipeline.models.rerank import (
    DenseScorer,
    SentenceReranker,
    apply_scores,
    hit_text,
    make_reranker,
    sentences,
)
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
    assert str(err.value) == (
        "unknown reranker 'colbert': choose none, bge-reranker-v2-m3, st:<cross-encoder>, "
        "sentences:<one of those or dense>"
    )
    for bad in ("sentences:", "sentences:colbert", "sentences:sentences:dense"):
        with pytest.raises(ConfigError, match="unknown reranker"):
            make_reranker(bad)
    with pytest.raises(ConfigError, match="needs the embedder"):
        make_reranker("sentences:dense")


class OverlapScorer:
    """A ``PairScorer``: the share of the query's words a text contains (deterministic, model-free)."""

    name = "overlap"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        self.calls.append(list(texts))
        words = set(query.lower().replace("?", "").split())
        return [
            len(words & set(t.lower().replace(".", " ").replace(":", " ").split())) / len(words)
            for t in texts
        ]


def test_sentence_reranking_scores_evidence_by_its_best_sentence() -> None:
    long = ("The canary runs for twenty minutes. Error rates are watched. Latency is watched. "
            "Rollback restores billing quickly.")
    hits = [
        hit(0, "billing rollback rollback is a word that appears in many places of this page", score=0.9),
        Hit(
            evidence=Evidence(
                id="ev-1",
                page_id="p2",
                title="Runbook",
                url="u",
                space="S",
                kind="passage",
                position=0,
                text=long,
                headings=("Rollback",),
            ),
            score=0.5,
            rank=2,
        ),
    ]
    scorer = OverlapScorer()
    out = SentenceReranker(scorer).rerank("rollback restores billing quickly", hits)
    assert [h.evidence.id for h in out] == ["ev-1", "ev-0"]  # one sentence of ev-1 answers it all
    assert out[0].score == 1.0
    (texts,) = scorer.calls
    assert texts[0] == hit_text(hits[0]) and "Runbook › Rollback: Rollback restores billing quickly." in texts
    assert len(texts) == 2 + 4  # each whole text, and the 4 sentences of the one with several
    assert SentenceReranker(scorer).rerank("q", []) == []


def test_sentences_split_at_sentence_ends_and_lines_and_are_bounded() -> None:
    assert sentences("Version 2.1 is out. See v2.1.0 notes.\nNext line! ok? Yes.") == [
        "Version 2.1 is out.", "See v2.1.0 notes.", "Next line! ok?", "Yes."]  # no split before lower case
    assert len(sentences(" ".join(f"Sentence {i}." for i in range(40)))) == 12


def test_dense_scorer_is_the_embedders_cosine_and_sentences_dense_builds() -> None:
    from tests.test_keyword_expansion import TrigramEmbedder

    scorer = DenseScorer(TrigramEmbedder())
    same, other = scorer.score("kestrel rollback", ["kestrel rollback", "unrelated words"])
    assert same == pytest.approx(1.0) and other < 0.5
    reranker = make_reranker("sentences:dense", embedder=TrigramEmbedder())
    assert isinstance(reranker, SentenceReranker) and reranker.name == "sentences:dense:test-trigram-256"
    out = reranker.rerank("roll back billing", HITS)
    assert out[0].evidence.id in {"ev-1", "ev-2"} and [h.rank for h in out] == [1, 2, 3, 4]


@pytest.mark.skipif(importlib.util.find_spec("FlagEmbedding") is not None,
                    reason="FlagEmbedding is installed")
def test_bge_reranker_without_extra_names_it() -> None:
    with pytest.raises(ConfigError, match=r"pip install 'evident-bot\[bge\]'"):
        make_reranker("bge-reranker-v2-m3")


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is not None, reason="st is installed")
def test_st_reranker_without_extra_names_it() -> None:
    for name in (
        "st:cross-encoder/ms-marco-MiniLM-L-6-v2",
        "sentences:st:cross-encoder/ms-marco-MiniLM-L-6-v2",
    ):
        with pytest.raises(ConfigError, match=r"pip install 'evident-bot\[st\]'"):
            make_reranker(name)


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
