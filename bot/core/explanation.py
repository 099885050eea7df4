"""The explanation every platform renders: the engine's structured attribution as an ``ExplanationView``."""

from __future__ import annotations

from bot.core.contracts import ExplainResultLike
from pipeline.attribution import ExplanationView, explanation_view


def view_of(result: ExplainResultLike, max_sources: int = 5) -> ExplanationView:
    """The sources to show (largest share first, at most ``max_sources``), the rest summed, and notes; nothing
    to show when the engine attributed nothing (its ``text`` says why)."""
    if result.result is None:
        return ExplanationView([], [], 0, 0.0)
    return explanation_view(result.result, max_clusters=max_sources)
