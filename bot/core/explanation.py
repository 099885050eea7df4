"""The explanation every platform renders: the engine's structured attribution as an ``ExplanationView``,
or, for results cached before it existed, the bare cluster shares."""

from __future__ import annotations

from bot.core.contracts import ExplainResultLike
from pipeline.attribution import ExplanationView, SourceShare, explanation_view


def view_of(result: ExplainResultLike, max_sources: int = 5) -> ExplanationView:
    """The sources to show (largest share first, at most ``max_sources``), the rest summed, and notes."""
    if result.result is not None:
        return explanation_view(result.result, max_clusters=max_sources)
    clusters = sorted(result.clusters, key=lambda c: c.percent, reverse=True)
    shown = [
        SourceShare(
            c.percent,
            c.evidence_titles[0] if c.evidence_titles else "",
            c.urls[0] if c.urls else "",
            f" (+{c.size - 1} similar)" if c.size > 1 else "",
        )
        for c in clusters[:max_sources]
    ]
    rest = clusters[max_sources:]
    notes = ["Partial explanation: some counterfactual runs failed."] if result.partial else []
    return ExplanationView(shown, notes, len(rest), sum(c.percent for c in rest))
