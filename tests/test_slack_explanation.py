"""The one Slack rendering of an explanation (bot.slack.blocks.render_explanation) from the engine's
structured result."""

from __future__ import annotations

from test_attribution_render import PEAKED, cluster, ref, result

from bot.slack.blocks import render_explanation
from pipeline.answer.engine import ExplainResult


def explained(attribution):  # type: ignore[no-untyped-def]
    return ExplainResult(turn_id=1, text="", result=attribution, partial=attribution.partial)


def test_bars_links_reasons_and_collapsed_clusters() -> None:
    text = render_explanation(explained(PEAKED))
    lines = text.splitlines()
    assert lines[0] == "*Why this answer?* How much each source contributed:"
    assert lines[1].startswith(
        "`█████░░░` 67%  <https://wiki.example/vpn|VPN policy> (+1 similar) — removing it"
    )
    assert "Onboarding" not in text  # the duplicate is collapsed into its cluster's line
    assert lines[2].startswith("`██░░░░░░` 20%  <https://wiki.example/faq|Security FAQ> — ")
    assert "Low confidence" not in text and "partial" not in text
    even = render_explanation(explained(result(cluster(1, 52.0, 0.5, ref(1, "T", "https://x.example")),
                                               cluster(2, 48.0, 0.5, ref(2, "U", "https://y.example")))))
    assert even.count("`████░░░░` 52%") == 1


def test_page_text_is_escaped() -> None:
    evil = result(cluster(1, 100.0, 0.2, ref(1, "<!channel> Q&A <b>", "https://wiki.example/a|b>c")))
    text = render_explanation(explained(evil))
    assert "<!channel>" not in text and "<b>" not in text
    assert "&lt;!channel&gt; Q&amp;A &lt;b&gt;" in text
    assert "https://wiki.example/a%7Cb%3Ec|" in text
    unsafe = render_explanation(
        explained(result(cluster(1, 100.0, 0.2, ref(1, "click", "javascript:alert(1)"))))
    )
    assert "<javascript" not in unsafe and "click" in unsafe


def test_low_confidence_partial_unknown_and_more() -> None:
    flat = result(*(cluster(i, 25.0, 1.0, ref(i, f"P{i}", f"https://w.example/{i}")) for i in range(1, 5)))
    assert "_Low confidence" in render_explanation(explained(flat))
    partial = result(cluster(1, 100.0, 0.3, ref(1, "Kept", "https://w.example/1")),
                     cluster(2, 0.0, 0.0, ref(2, "Lost", "https://w.example/2"), unknown=True), failed=2)
    text = render_explanation(explained(partial))
    assert "_(partial: 2 counterfactual calls failed)_" in text
    assert "`?`  <https://w.example/2|Lost>" in text and "failed, so its share is unknown" in text
    many = result(*(cluster(i, p, 0.5, ref(i, f"P{i}", f"https://w.example/{i}"))
                    for i, p in enumerate([60.0, 20.0, 10.0, 6.0, 4.0], start=1)))
    text = render_explanation(explained(many), max_clusters=3)
    assert "P4" not in text and "_… and 2 more (10% in total)_" in text
