"""Human-readable explanations (RAGonite Figure 4, extended): plain text and Slack mrkdwn.

Page titles come from the wiki, i.e. from anyone who can edit a page, so every title is escaped for
mrkdwn; a title like ``<!channel>`` must never ping a channel.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from pipeline.attribution.types import AttributionResult, ClusterAttribution

BAR_WIDTH = 8
UNCHANGED = 0.98  # mean similarity at/above which a counterfactual answer counts as "the same"


def escape_mrkdwn(text: str) -> str:
    """Escape Slack's three control characters (``&`` first, so entities are not double-escaped)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def is_flat(result: AttributionResult, *, ratio: float = 1.5, entropy: float = 0.95) -> bool:
    """True when no source stands out: top share < ratio × uniform, or normalised entropy ≥ ``entropy``."""
    shares = [c.percent / 100.0 for c in result.clusters if not c.unknown]
    k = len(shares)
    if k < 2:
        return False
    h = -sum(p * math.log(p) for p in shares if p > 0)
    return max(shares) < ratio / k or h / math.log(k) >= entropy


def reason(result: AttributionResult, cluster: ClusterAttribution, *, top: bool) -> str:
    """One line on why this cluster got its share, in the method's own terms."""
    if cluster.unknown:
        return "its counterfactual calls failed, so its share is unknown"
    sim = cluster.mean_similarity
    if result.method == "naive":
        text = f"the answer is {'most ' if top else ''}similar to its text (cosine {sim:.2f})" if sim is not None \
            else "similarity to the answer"
    elif result.method == "logprob":
        text = f"removing it {'most ' if top else ''}lowered the answer's likelihood (ratio {sim:.2f})" \
            if sim is not None else "log-prob drop"
    elif sim is None:
        text = "no counterfactual answer"
    elif sim >= UNCHANGED:
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
        notes.append("Low confidence: the shares are nearly even, no single source clearly produced this answer.")
    if result.partial:
        notes.append(f"(partial: {result.failed_calls} counterfactual call{'s' if result.failed_calls != 1 else ''} "
                     "failed)")
    return notes


def render_text(result: AttributionResult, *, max_clusters: int = 5) -> str:
    """Plain text, one line per cluster, e.g. ``Attributed 67.3% to cluster 1 [Evidence 1, 2]: T (url) — ...``."""
    if not result.clusters:
        return "No evidence to attribute."
    lines = []
    shown = result.clusters[:max_clusters]
    for i, cluster in enumerate(shown):
        numbers = ", ".join(str(m.rank) for m in cluster.members)
        target = f"cluster {cluster.cluster_id} [Evidence {numbers}]" if len(cluster.members) > 1 \
            else f"[Evidence {numbers}]"
        first = cluster.members[0]
        share = "Unknown share for" if cluster.unknown else f"Attributed {cluster.percent:.1f}% to"
        lines.append(f"{share} {target}: {first.title or 'untitled'} ({first.url}){_extra(cluster)}"
                     f" — {reason(result, cluster, top=i == 0)}")
    rest = result.clusters[max_clusters:]
    if rest:
        lines.append(f"… and {len(rest)} more ({sum(c.percent for c in rest):.1f}% in total)")
    return "\n".join([*lines, *_footer_notes(result)])


def _bar(percent: float) -> str:
    filled = max(0, min(BAR_WIDTH, round(percent / 100.0 * BAR_WIDTH)))
    return "█" * filled + "░" * (BAR_WIDTH - filled)


def _link(url: str, title: str, escape: Callable[[str], str]) -> str:
    label = escape(" ".join(title.split()) or url or "untitled")
    if not url.lower().startswith(("http://", "https://")):
        return label
    safe = url.replace("|", "%7C").replace("<", "%3C").replace(">", "%3E").replace(" ", "%20")
    return f"<{escape(safe)}|{label}>"


def render_mrkdwn(
    result: AttributionResult,
    *,
    escape: Callable[[str], str] = escape_mrkdwn,
    max_clusters: int = 5,
    header: bool = True,
) -> str:
    """Slack mrkdwn: a share bar, linked (escaped) title, collapsed duplicates and a reason per source."""
    lines = []
    if header:
        lines.append(f"*Which evidence produced this answer* (_{escape(result.method)}_, "
                     f"{result.calls} call{'s' if result.calls != 1 else ''}, {result.seconds:.1f}s)")
    if not result.clusters:
        lines.append("_No evidence to attribute._")
        return "\n".join(lines)
    for i, cluster in enumerate(result.clusters[:max_clusters]):
        first = cluster.members[0]
        share = "`?`" if cluster.unknown else f"{_bar(cluster.percent)} {cluster.percent:.0f}%"
        lines.append(f"{share} {_link(first.url, first.title, escape)}{_extra(cluster)}"
                     f" — {escape(reason(result, cluster, top=i == 0))}")
    rest = result.clusters[max_clusters:]
    if rest:
        lines.append(f"_… and {len(rest)} more ({sum(c.percent for c in rest):.0f}% in total)_")
    lines.extend(f"_{escape(note)}_" for note in _footer_notes(result))
    return "\n".join(lines)
