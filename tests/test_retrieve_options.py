"""Named retrieval options: page-level aggregation and language-aware fusion weights."""

from __future__ import annotations

from pipeline.answer.retrieve import aggregate_pages, query_language
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
