"""Named retrieval options: page-level aggregation and language-aware fusion weights."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.answer.hub import centrality, hub_rerank
from pipeline.answer.retrieve import aggregate_pages, query_language, steepest_cut
from pipeline.factory import retrieval_config
from pipeline.models.sparse import Bm25Encoder
from pipeline.runtime.settings import Settings
from pipeline.types import Evidence, Hit


def _hit(eid: str, page: str, score: float, rank: int) -> Hit:
    ev = Evidence(id=eid, page_id=page, title=page, url=f"https://w/{page}", space="S", kind="passage",
                  position=0, text=eid)
    return Hit(evidence=ev, score=score, rank=rank)


def test_page_aggregation_promotes_page_with_several_matches() -> None:
    hits = [_hit("a1", "A", 0.030, 1), _hit("b1", "B", 0.029, 2), _hit("b2", "B", 0.020, 3),
            _hit("c1", "C", 0.010, 4)]
    out = aggregate_pages(hits, 0.5)
    assert [h.evidence.id for h in out] == ["b1", "b2", "a1", "c1"]  # b2: 0.020 + 0.5*0.029 > 0.030
    assert [h.rank for h in out] == [1, 2, 3, 4]
    assert abs(out[0].score - (0.029 + 0.5 * 0.020)) < 1e-12


def test_page_aggregation_zero_weight_keeps_order() -> None:
    hits = [_hit("a1", "A", 0.030, 1), _hit("b1", "B", 0.029, 2), _hit("b2", "B", 0.020, 3)]
    assert [h.evidence.id for h in aggregate_pages(hits, 0.0)] == ["a1", "b1", "b2"]


def test_query_language() -> None:
    assert query_language("Welche TPM Version wurde für den Dell genutzt?") == "german"
    assert query_language("Und was ist mit TPM?") == "german"
    assert query_language("What was the TPM version of the Dell?") == "english"


def test_steepest_cut_keeps_the_hits_before_the_largest_drop() -> None:
    scores = [1.9, 1.8, 1.1, 1.0, 0.95, 0.2]
    hits = [_hit(f"e{i}", f"P{i}", s, i + 1) for i, s in enumerate(scores)]
    assert [h.evidence.id for h in steepest_cut(hits, 1)] == ["e0", "e1", "e2", "e3", "e4"]  # 0.95 -> 0.2
    assert [h.evidence.id for h in steepest_cut(hits[:5], 1)] == ["e0", "e1"]  # 1.8 -> 1.1
    assert [h.evidence.id for h in steepest_cut(hits[:5], 3)] == ["e0", "e1", "e2"]  # drops from the 3rd: 0.1, 0.05
    assert steepest_cut(hits[:2], 3) == hits[:2]  # fewer than the minimum: all


def test_adaptive_k_setting(tmp_path: Path) -> None:
    env = {"EVIDENT_DATA_DIR": str(tmp_path)}
    assert retrieval_config(Settings.load(env=env)).adaptive_min_k == 0  # off: always EVIDENT_FINAL_K
    assert retrieval_config(Settings.load(env={**env, "EVIDENT_ADAPTIVE_K": "2"})).adaptive_min_k == 2


def test_hub_centrality_is_the_mean_similarity_to_the_others() -> None:
    same, other = {1: 1.0, 2: 1.0}, {9: 3.0}
    assert centrality([same, dict(same), other]) == pytest.approx([0.5, 0.5, 0.0])
    assert centrality([same]) == [0.0]


def test_hub_rerank_lifts_the_evidence_at_the_centre_of_what_was_retrieved() -> None:
    texts = {"lucky": "quarterly bonus payout calendar", "hub": "vpn gateway setup for the office vpn",
             "near1": "office vpn gateway address", "near2": "vpn setup steps for the gateway"}
    hits = [replace(_hit(name, name, 1.0 - 0.01 * i, i + 1), content=text) for i, (name, text) in enumerate(texts.items())]
    moved = hub_rerank(hits, Bm25Encoder(), 0.5)
    order = [h.evidence.id for h in moved]
    assert order[0] == "hub" and order[-1] == "lucky" and [h.rank for h in moved] == [1, 2, 3, 4]
    assert hub_rerank(hits, Bm25Encoder(), 0.0) == hits  # off: untouched
