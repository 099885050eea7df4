"""The attribution area: the default explain method and its parameters. ``MethodName`` lists the methods of
``pipeline.attribution.methods.METHODS`` (a test keeps the two in step)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pipeline.attribution.params import UNCHANGED
from pipeline.runtime.config import Area, Lower, setting

MethodName = Literal[
    "naive", "cfa", "cfa_clusters", "page", "cfa_citation_prior", "sufficiency", "early_stop", "logprob"
]


class AttributionSettings(Area):
    title = "Attribution"

    method: Annotated[MethodName, Lower] = setting(
        "cfa_clusters",
        "EVIDENT_ATTRIBUTION_METHOD",
        "Default explain method: naive | cfa | cfa_clusters | page | "
        "cfa_citation_prior | sufficiency | early_stop | logprob.",
    )
    samples: int = setting(1, "EVIDENT_ATTRIBUTION_SAMPLES", "Monte Carlo samples per counterfactual.", ge=1)
    temperature: float = setting(0.05, "EVIDENT_ATTRIBUTION_TEMPERATURE", "Softmax temperature.", gt=0)
    eps: float = setting(0.005, "EVIDENT_ATTRIBUTION_EPS", "DBSCAN eps (cosine distance).", ge=0)
    min_pts: int = setting(2, "EVIDENT_ATTRIBUTION_MIN_PTS", "DBSCAN minPts.", ge=1)
    unchanged: float | None = setting(
        None, "EVIDENT_ATTRIBUTION_UNCHANGED", "Similarity (mean) at or above which an answer regenerated "
        "without a source counts as the same answer: that source's contribution is 0. Default: 0.98 when an "
        "LLM writes the answers (it rewords them a little whenever the sources shown change), 1 (identical "
        "answers only) for extractive answers, which change only where a quote changes.",
        gt=0, le=1,
    )

    def params(self, *, llm: bool) -> dict[str, Any]:
        """The attribution parameters these settings configure (``pipeline.attribution.params``), for
        answers an ``llm`` writes or extractive ones."""
        unchanged = self.unchanged if self.unchanged is not None else UNCHANGED if llm else 1.0
        return {"samples": self.samples, "temperature": self.temperature, "eps": self.eps,
                "min_samples": self.min_pts, "unchanged": unchanged}
