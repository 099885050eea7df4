"""Result dataclasses of attribution.

They are plain, JSON-round-trippable values so the store can cache an explanation and the bot can
re-render it later without re-running any counterfactual generation.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.errors import InputError


@dataclass(frozen=True)
class EvidenceRef:
    """One evidence inside a cluster. ``rank`` is its 1-based position in the list shown to the generator."""

    evidence_id: str
    title: str
    url: str
    kind: str
    rank: int
    label: str = ""  # "Page › heading › row 3": where on the page it is (results cached before: "")
    quote: str = ""  # its first words, for a reader to recognise it


@dataclass
class ClusterAttribution:
    """The attribution of one group of evidence that was removed together.

    ``contribution`` is the raw score c_i (1 − mean similarity for counterfactual methods), ``percent``
    its softmax share. ``unknown`` clusters had every call fail: they are excluded from the softmax and
    carry ``percent == 0``.
    """

    cluster_id: int
    members: list[EvidenceRef]
    contribution: float
    percent: float
    counterfactual_answers: list[str] = field(default_factory=list)
    similarities: list[float] = field(default_factory=list)
    unknown: bool = False
    likeness: float = math.nan  # the highest cosine of a member to the answer: orders equal shares

    @property
    def mean_similarity(self) -> float | None:
        return sum(self.similarities) / len(self.similarities) if self.similarities else None


@dataclass
class AttributionResult:
    """A whole explanation: clusters sorted by ``percent`` (highest first), unknown ones last."""

    method: str
    question: str
    answer: str
    clusters: list[ClusterAttribution]
    partial: bool = False
    calls: int = 0  # generation (or scoring) calls made
    params: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    failed_calls: int = 0
    details: dict[str, Any] = field(default_factory=dict)  # method-specific diagnostics (JSON values)

    def top_urls(self, k: int | None = None) -> list[str]:
        """Distinct page URLs in attribution order (for the paper's URL-level top-1 metric)."""
        urls: list[str] = []
        for cluster in self.clusters:
            if cluster.unknown:
                continue
            for member in cluster.members:
                if member.url and member.url not in urls:
                    urls.append(member.url)
        return urls if k is None else urls[:k]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (non-finite floats become None)."""
        return _json_safe(asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttributionResult:
        try:
            clusters = [
                ClusterAttribution(
                    cluster_id=int(c["cluster_id"]),
                    members=[EvidenceRef(**m) for m in c["members"]],
                    contribution=_float(c["contribution"]),
                    percent=_float(c["percent"]),
                    counterfactual_answers=list(c.get("counterfactual_answers", [])),
                    similarities=[_float(s) for s in c.get("similarities", [])],
                    unknown=bool(c.get("unknown", False)),
                    likeness=_float(c.get("likeness")),
                )
                for c in data["clusters"]
            ]
            return cls(
                method=str(data["method"]),
                question=str(data["question"]),
                answer=str(data["answer"]),
                clusters=clusters,
                partial=bool(data.get("partial", False)),
                calls=int(data.get("calls", 0)),
                params=dict(data.get("params", {})),
                seconds=float(data.get("seconds", 0.0)),
                failed_calls=int(data.get("failed_calls", 0)),
                details=dict(data.get("details", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"not a serialised attribution result: {exc!r}") from exc


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def _json_safe(value: Any) -> Any:
    """Keep JSON values only: NaN/inf → None, tuples → lists, anything else (callables, locks) dropped."""
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if _is_json_value(v):
                out[str(k)] = _json_safe(v)
        return out
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value if _is_json_value(v)]
    return None


def _is_json_value(value: Any) -> bool:
    if value is None or isinstance(value, bool | int | float | str):
        return True
    return isinstance(value, dict | list | tuple)
