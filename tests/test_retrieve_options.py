"""Named retrieval options: adaptive k and graph (hub) reranking."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from evident.settings import Settings
from pipeline.answer.hub import centrality, hub_rerank
from pipeline.answer.retrieve import steepest_cut
from pipeline.models.sparse import Bm25Encoder
from pipeline.types import Evidence, Hit


def _hit(eid: str, page: str, score: float, rank: int) -> Hit:
    ev = Evidence(id=eid, page_id=page, title=page, url=f"https://w/{page}", space="S", kind="passage",
                  position=0, text=eid)
    return Hit(evidence=ev, score=score, rank=rank)


def test_steepest_cut_keeps_the_hits_before_the_largest_drop() -> None:
    scores = [1.9, 1.8, 1.1, 1.0, 0.95, 0.2]
    hits = [_hit(f"e{i}", f"P{i}", s, i + 1) for i, s in enumerate(scores)]
    assert [h.evidence.id for h in steepest_cut(hits, 1)] == ["e0", "e1", "e2", "e3", "e4"]  # 0.95 -> 0.2
    assert [h.evidence.id for h in steepest_cut(hits[:5], 1)] == ["e0", "e1"]  # 1.8 -> 1.1
    # drops from the 3rd: 0.1, 0.05
    assert [h.evidence.id for h in steepest_cut(hits[:5], 3)] == ["e0", "e1", "e2"]
    assert steepest_cut(hits[:2], 3) == hits[:2]  # fewer than the minimum: all


def test_adaptive_k_setting(tmp_path: Path) -> None:
    env = {"EVIDENT_DATA_DIR": str(tmp_path)}
    assert Settings.load(env=env).retrieval.adaptive_min_k == 0  # off: always EVIDENT_FINAL_K
    assert Settings.load(env={**env, "EVIDENT_ADAPTIVE_K": "2"}).retrieval.adaptive_min_k == 2


def test_hub_centrality_is_the_mean_similarity_to_the_others() -> None:
    same, other = {1: 1.0, 2: 1.0}, {9: 3.0}
    assert centrality([same, dict(same), other]) == pytest.approx([0.5, 0.5, 0.0])
    assert centrality([same]) == [0.0]


def test_hub_rerank_lifts_the_evidence_at_the_centre_of_what_was_retrieved() -> None:
    texts = {"lucky": "quarterly bonus payout calendar", "hub": "vpn gateway setup for the office vpn",
             "near1": "office vpn gateway address", "near2": "vpn setup steps for the gateway"}
    hits = [
        replace(_hit(name, name, 1.0 - 0.01 * i, i + 1), content=text)
        for i, (name, text) in enumerate(texts.items())
    ]
    moved = hub_rerank(hits, Bm25Encoder(), 0.5)
    order = [h.evidence.id for h in moved]
    assert order[0] == "hub" and order[-1] == "lucky" and [h.rank for h in moved] == [1, 2, 3, 4]
    assert hub_rerank(hits, Bm25Encoder(), 0.0) == hits  # off: untouched
