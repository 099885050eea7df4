"""Rendering of attribution results: the platform-neutral view and plain text (Slack:
test_slack_explanation.py)."""

from __future__ import annotations

import math

from pipeline.attribution import (
    AttributionResult,
    ClusterAttribution,
    EvidenceRef,
    explanation_view,
    render_text,
)


def ref(rank: int, title: str, url: str) -> EvidenceRef:
    return EvidenceRef(evidence_id=f"e{rank}", title=title, url=url, kind="passage", rank=rank)


def cluster(
    cid: int, percent: float, sim: float, *members: EvidenceRef, unknown: bool = False
) -> ClusterAttribution:
    return ClusterAttribution(
        cluster_id=cid,
        members=list(members),
        contribution=math.nan if unknown else 1 - sim,
        percent=percent,
        counterfactual_answers=[] if unknown else ["cf"],
        similarities=[] if unknown else [sim],
        unknown=unknown,
    )


def result(*clusters: ClusterAttribution, method: str = "cfa_clusters", failed: int = 0) -> AttributionResult:
    return AttributionResult(method=method, question="q?", answer="a.", clusters=list(clusters),
                             partial=failed > 0, calls=len(clusters), failed_calls=failed, seconds=1.25)


PEAKED = result(
    cluster(1, 67.3, 0.41, ref(1, "VPN policy", "https://wiki.example/vpn"),
            ref(2, "Onboarding", "https://wiki.example/onboarding")),
    cluster(2, 20.1, 0.80, ref(3, "Security FAQ", "https://wiki.example/faq")),
    cluster(3, 12.6, 0.99, ref(4, "Lunch", "https://wiki.example/lunch")),
)


def test_text_lists_clusters_with_reasons() -> None:
    lines = render_text(PEAKED).splitlines()
    assert lines[0] == (
        "Attributed 67.3% to cluster 1 [Evidence 1, 2]: VPN policy (https://wiki.example/vpn) "
        "(+1 similar) — removing it changed the answer most (similarity 0.41)"
    )
    assert lines[1] == ("Attributed 20.1% to [Evidence 3]: Security FAQ (https://wiki.example/faq) — "
                        "removing it changed the answer (similarity 0.80)")
    assert "essentially unchanged" in lines[2]
    assert len(lines) == 3  # peaked, complete: no notes


def test_view_collapses_clusters_and_keeps_reasons() -> None:
    view = explanation_view(PEAKED)
    assert [(v.percent, v.title, v.extra) for v in view.sources] == [
        (67.3, "VPN policy", " (+1 similar)"), (20.1, "Security FAQ", ""), (12.6, "Lunch", "")]
    assert view.sources[0].reason == "removing it changed the answer most (similarity 0.41)"
    assert view.notes == [] and view.method == "cfa_clusters"


def test_flat_distribution_gets_a_low_confidence_note() -> None:
    flat = result(*(cluster(i, 25.0, 1.0, ref(i, f"P{i}", f"https://w.example/{i}")) for i in range(1, 5)))
    assert any("Low confidence" in n for n in explanation_view(flat).notes)
    assert "Low confidence" in render_text(flat)
    single = result(cluster(1, 100.0, 0.3, ref(1, "Only", "https://w.example/1")))
    assert not explanation_view(single).notes
    assert "how closely they match" not in render_text(flat)  # cached before likeness was kept
    for c, like in zip(flat.clusters, (0.9, 0.7, 0.5, 0.2), strict=True):
        c.likeness = like
    assert "Sources with equal shares are listed by how closely they match the answer." in render_text(flat)
    for c, percent in zip(flat.clusters, (26.0, 25.0, 24.5, 24.5 - 1e-3), strict=True):
        c.percent = percent  # flat, but no two shares equal: nothing was ordered by likeness
    assert "Low confidence" in render_text(flat) and "how closely they match" not in render_text(flat)


def test_partial_and_unknown_clusters() -> None:
    partial = result(
        cluster(1, 100.0, 0.3, ref(1, "Kept", "https://w.example/1")),
        cluster(2, 0.0, 0.0, ref(2, "Lost", "https://w.example/2"), unknown=True),
        failed=2,
    )
    view = explanation_view(partial)
    assert "(partial: 2 counterfactual calls failed)" in view.notes
    assert view.sources[1].percent is None and "failed, so its share is unknown" in view.sources[1].reason
    assert render_text(partial).splitlines()[1].startswith("Unknown share for [Evidence 2]: Lost")


def test_max_clusters_and_empty() -> None:
    many = result(*(cluster(i, p, 0.5, ref(i, f"P{i}", f"https://w.example/{i}"))
                    for i, p in enumerate([60.0, 20.0, 10.0, 6.0, 4.0], start=1)))
    view = explanation_view(many, max_clusters=3)
    assert [v.title for v in view.sources] == ["P1", "P2", "P3"] and (view.more, view.more_percent) == (
        2,
        10.0,
    )
    assert render_text(many, max_clusters=2).splitlines()[-1] == "… and 3 more (20.0% in total)"
    assert render_text(result()) == "No evidence to attribute."
    assert explanation_view(result()).sources == []


def test_naive_and_method_specific_reasons() -> None:
    naive = result(cluster(1, 80.0, 0.9, ref(1, "A", "https://w.example/1")),
                   cluster(2, 20.0, 0.6, ref(2, "B", "https://w.example/2")), method="naive")
    assert "the answer is most similar to its text (cosine 0.90)" in render_text(naive)
    cited = result(cluster(1, 100.0, 0.4, ref(1, "A", "https://w.example/1")), method="cfa_citation_prior")
    cited.details["cited"] = [1]
    assert "; cited in the answer" in render_text(cited)
    suff = result(cluster(1, 100.0, 0.4, ref(1, "A", "https://w.example/1")), method="sufficiency")
    suff.details["sufficiency"] = [{"cluster_id": 1, "similarity": 0.97, "sufficient": True, "answers": []}]
    assert "alone it reproduces the answer (similarity 0.97)" in explanation_view(suff).sources[0].reason
    same_page = result(
        cluster(1, 100.0, 0.4, ref(1, "A", "https://w.example/1"), ref(2, "A", "https://w.example/1")),
        method="page",
    )
    assert "(+1 more from this page)" in render_text(same_page)


def test_evidence_is_named_by_page_heading_and_row_with_its_first_words() -> None:
    from pipeline.attribution.scoring import evidence_label, evidence_quote
    from pipeline.types import Evidence

    row = Evidence(
        id="r",
        page_id="p",
        title="RAG meeting October",
        url="u",
        space="S",
        kind="row",
        position=3,
        text="Row 2 in Table 1: Member is Bruno, and Task is Collect 50 real questions from the support "
        "team before the next meeting in November",
        headings=("Minutes", "Action items"),
        table_index=1,
        row_index=2,
    )
    assert evidence_label(row) == "RAG meeting October › Action items › row 2 of table 1"
    quote = evidence_quote(row)
    assert (
        quote.startswith("Member is Bruno, and Task is Collect") and quote.endswith("…") and len(quote) <= 91
    )
    passage = Evidence(id="x", page_id="p", title="Runbook", url="u", space="S", kind="passage", position=1,
                       text="Deploys go out on Tuesdays.")
    assert (evidence_label(passage), evidence_quote(passage)) == ("Runbook", "Deploys go out on Tuesdays.")


def test_slack_escapes_the_quoted_page_text() -> None:
    from bot.slack.blocks import render_explanation
    from pipeline.answer.results import ExplainResult

    bad = EvidenceRef("e1", "Page", "https://wiki/x/1", "passage", 1, label="Page › Intro",
                      quote="<!channel> see <https://evil|here> & more")
    text = render_explanation(ExplainResult(1, "", [], result=result(cluster(1, 100.0, 0.4, bad))))
    assert "<!channel>" not in text and "<https://evil" not in text and "&lt;!channel&gt;" in text
    assert "Page › Intro" in text
