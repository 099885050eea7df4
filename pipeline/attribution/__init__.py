"""Which evidence produced an answer: counterfactual attribution (RAGonite, WSDM 2025) and variants."""

from pipeline.attribution.methods import METHODS, Method, attribute, cited_positions
from pipeline.attribution.params import AttributionParams, Generate, Score, parse_params
from pipeline.attribution.render import ExplanationView, SourceShare, explanation_view, is_flat, render_text
from pipeline.attribution.types import AttributionResult, ClusterAttribution, EvidenceRef

__all__ = [
    "METHODS",
    "AttributionParams",
    "AttributionResult",
    "ClusterAttribution",
    "EvidenceRef",
    "ExplanationView",
    "Generate",
    "Method",
    "Score",
    "SourceShare",
    "attribute",
    "cited_positions",
    "explanation_view",
    "is_flat",
    "parse_params",
    "render_text",
]
