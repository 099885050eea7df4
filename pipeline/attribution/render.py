"""Human-readable explanations (RAGonite Figure 4, extended): a platform-neutral view, and plain text.

``explanation_view`` turns an ``AttributionResult`` into what any chat platform shows: per source its
share (or "unknown"), title, link, how many similar evidence it stands for, and one line on why; plus
notes (low confidence, partial) and how much the hidden tail holds. Each platform formats the view
once (Slack: ``bot.blocks.render_explanation``); ``render_text`` is the CLI's plain text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pipeline.attribution.params import SAME, UNCHANGED
from pipeline.attribution.types import AttributionResult, ClusterAttribution

BAR_WIDTH = 8
_NOT_COUNTERFACTUAL = frozenset({"naive", "logprob"})  # their similarities are not answers after a removal


@dataclass(frozen=True)
class SourceShare:
    """One source (an evidence cluster) as a reader sees it. Title and URL are untrusted page data."""

    percent: float | None  # None: unknown (its counterfactual calls failed)
    title: str
    url: str
    extra: str = ""  # " (+2 similar)", " (+1 more from this page)"
    reason: str = ""  # why it got its share, in the method's terms ("" when only shares are known)
    quote: str = ""  # the evidence's first words (untrusted page text)


@dataclass(frozen=True)
class ExplanationView:
    sources: list[SourceShare]
    notes: list[str] = field(default_factory=list)  # low confidence, partial
    more: int = 0  # sources beyond the shown ones
    more_percent: float = 0.0
    method: str = ""


def explanation_view(result: AttributionResult, *, max_clusters: int = 5) -> ExplanationView:
    shown = result.clusters[:max_clusters]
    sources = [
        SourceShare(
            None if c.unknown else c.percent,
            c.members[0].label or c.members[0].title,
            c.members[0].url,
            _extra(c),
            reason(result, c, top=i == 0),
            c.members[0].quote,
        )
        for i, c in enumerate(shown)
    ]
    rest = result.clusters[max_clusters:]
    return ExplanationView(
        sources, _footer_notes(result), len(rest), sum(c.percent for c in rest), result.method
    )


def unchanged(result: AttributionResult) -> float:
    """The similarity from which a counterfactual answer is called "essentially unchanged": 0.98, or lower
    where the result's shares counted answers as the same from lower (its own parameter)."""
    value = result.params.get("unchanged", UNCHANGED)
    return min(float(value), UNCHANGED) - SAME if isinstance(value, int | float) else UNCHANGED - SAME


def is_flat(result: AttributionResult, *, ratio: float = 1.5, entropy: float = 0.95) -> bool:
    """True when no source stands out: top share < ratio × uniform; and for counterfactual methods when no
    removal changed the answer (every similarity ≥ ``unchanged``), for the others when the normalised entropy
    is ≥ ``entropy``. Entropy alone misjudges counterfactuals: two quoted sources at 17 % and 15 % among eight
    unchanged ones at 8.5 % score 0.97 although the counterfactuals singled both out."""
    known = [c for c in result.clusters if not c.unknown]
    shares = [c.percent / 100.0 for c in known]
    k = len(shares)
    if k < 2:
        return False
    if max(shares) < ratio / k:
        return True
    sims = [c.mean_similarity for c in known if c.mean_similarity is not None]
    if result.method not in _NOT_COUNTERFACTUAL and sims:
        return min(sims) >= unchanged(result)
    h = -sum(p * math.log(p) for p in shares if p > 0)
    return h / math.log(k) >= entropy


def reason(result: AttributionResult, cluster: ClusterAttribution, *, top: bool) -> str:
    """One line on why this cluster got its share, in the method's own terms."""
    if cluster.unknown:
        return "its counterfactual calls failed, so its share is unknown"
    sim = cluster.mean_similarity
    if result.method == "naive":
        text = (
            f"the answer is {'most ' if top else ''}similar to its text (cosine {sim:.2f})"
            if sim is not None
            else "similarity to the answer"
        )
    elif result.method == "logprob":
        most = "most " if top else ""
        text = (f"removing it {most}lowered the answer's likelihood (ratio {sim:.2f})" if sim is not None
                else "log-prob drop")
    elif sim is None:
        text = "no counterfactual answer"
    elif sim >= unchanged(result):
        text = f"removing it left the answer essentially unchanged (similarity {sim:.2f})"
    else:
        text = f"removing it changed the answer{' most' if top else ''} (similarity {sim:.2f})"
    for check in result.details.get("sufficiency", []) or []:
        if check.get("cluster_id") == cluster.cluster_id and check.get("sufficient"):
            text += f"; alone it reproduces the answer (similarity {check['similarity']:.2f})"
    cited = set(result.details.get("cited", []) or [])
    if cited and any(m.rank in cited for m in cluster.members):
        text += "; cited in the answer"
    return text


def _extra(cluster: ClusterAttribution) -> str:
    more = len(cluster.members) - 1
    if more <= 0:
        return ""
    if len({m.url for m in cluster.members}) == 1:
        return f" (+{more} more from this page)"
    return f" (+{more} similar)"


def _footer_notes(result: AttributionResult) -> list[str]:
    notes = []
    if is_flat(result):
        tied = result.method != "naive" and _equal_shares_by_likeness(result)
        notes.append(
            "Low confidence: the shares are nearly even, no single source clearly produced this answer."
            + (" Sources with equal shares are listed by how closely they match the answer." if tied else "")
        )
    if result.partial:
        notes.append(
            f"(partial: {result.failed_calls} counterfactual call{'s' if result.failed_calls != 1 else ''} "
            "failed)"
        )
    return notes


def _equal_shares_by_likeness(result: AttributionResult) -> bool:
    """Two known clusters share a percent and were ordered by their likeness to the answer."""
    shares = [round(c.percent, 6) for c in result.clusters if not c.unknown and math.isfinite(c.likeness)]
    return len(set(shares)) < len(shares)


def render_text(result: AttributionResult, *, max_clusters: int = 5) -> str:
    """Plain text, one line per cluster, e.g. ``Attributed 67.3% to cluster 1 [Evidence 1, 2]: T (url) —
    ...``."""
    if not result.clusters:
        return "No evidence to attribute."
    lines = []
    shown = result.clusters[:max_clusters]
    for i, cluster in enumerate(shown):
        numbers = ", ".join(str(m.rank) for m in cluster.members)
        target = (f"cluster {cluster.cluster_id} [Evidence {numbers}]" if len(cluster.members) > 1
                  else f"[Evidence {numbers}]")
        first = cluster.members[0]
        share = "Unknown share for" if cluster.unknown else f"Attributed {cluster.percent:.1f}% to"
        quote = f' "{first.quote}"' if first.quote else ""
        lines.append(
            f"{share} {target}: {first.label or first.title or 'untitled'} ({first.url}){_extra(cluster)}"
            f"{quote} — {reason(result, cluster, top=i == 0)}"
        )
    rest = result.clusters[max_clusters:]
    if rest:
        lines.append(f"… and {len(rest)} more ({sum(c.percent for c in rest):.1f}% in total)")
    return "\n".join([*lines, *_footer_notes(result)])
