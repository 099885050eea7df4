"""Is an explanation *true*? Faithfulness of attribution methods, measured by removing what they credit.

Accuracy (the top-credited evidence is on the gold page) rewards retrieval rank as much as explanation. An
explanation promises something causal: the credited evidence is what the answer rests on. That is tested by
regenerating the answer (the same generator, greedy) from changed evidence and comparing it with the answer
being explained (cosine of the "question + answer" embeddings, as the counterfactual methods do):

- **comprehensiveness** = 1 − similarity after removing the top-credited group: high when the answer needed
  what was credited;
- **sufficiency** = similarity when only the top-credited group is shown: high when it alone carries the
  answer;
- **deletion AUC** = the mean of 1 − similarity as the credited groups are removed cumulatively in credit
  order (up to ``DELETION_STEPS``): high when the answer falls apart fastest along the credit order.

Those three remove a method's whole groups, so a method that credits larger groups (a page, a cluster of
near-copies) removes more evidence per step and is favoured by construction. **Evidence deletion AUC** is the
size-matched curve: the evidence removed one at a time in credit order (groups in their order, a group's
evidence in the order shown), up to ``DELETION_STEPS``, so every method removes the same number at each step.

Regenerations are shared by every method of a question (the same evidence subset is generated once), and
``first_source`` (credit the first evidence shown, then the next…) is scored beside the methods as the
baseline that retrieval rank alone would give. ``paired`` compares each method with ``naive`` per question
with a sign-flip permutation test (two-sided, 10,000 draws, fixed seed).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from statistics import mean
from typing import Any

import numpy as np

from pipeline.attribution.scoring import embed, only, qa_text, without
from pipeline.attribution.types import AttributionResult
from pipeline.protocols import Embedder
from pipeline.types import Hit

DELETION_STEPS = 5
METRICS = ("comprehensiveness", "sufficiency", "deletion_auc", "evidence_deletion_auc")
Generate = Callable[[Sequence[Hit]], Awaitable[str]]


@dataclass(frozen=True)
class Faithfulness:
    comprehensiveness: float
    sufficiency: float
    deletion_auc: float
    evidence_deletion_auc: float

    def as_dict(self) -> dict[str, float]:
        return {m: round(getattr(self, m), 4) for m in METRICS}


def credit_order(result: AttributionResult, hits: Sequence[Hit]) -> list[list[int]]:
    """The shown evidence's positions, grouped as the method credited them, most credited first (unknown
    clusters and evidence the explanation does not name are left out)."""
    position = {h.evidence.id: i for i, h in enumerate(hits)}
    groups: list[list[int]] = []
    for cluster in result.clusters:
        if cluster.unknown:
            continue
        rows = sorted(position[m.evidence_id] for m in cluster.members if m.evidence_id in position)
        if rows:
            groups.append(rows)
    return groups


def first_source_order(hits: Sequence[Hit]) -> list[list[int]]:
    """The baseline: credit the evidence in the order it was shown."""
    return [[i] for i in range(len(hits))]


class Regenerations:
    """Answers regenerated from evidence subsets for one question, each subset generated once, and their
    similarity to the answer being explained."""

    def __init__(self, question: str, answer: str, hits: Sequence[Hit], generate: Generate,
                 embedder: Embedder) -> None:
        self.question, self.answer, self.hits = question, answer, list(hits)
        self.generate, self.embedder = generate, embedder
        self._similarity: dict[tuple[tuple[str, int], ...], float] = {}
        self._original: np.ndarray | None = None
        self.calls = 0

    async def similarity(self, subset: Sequence[Hit]) -> float:
        """Of the answer regenerated from ``subset`` to the one explained (each subset generated and embedded
        once: the metrics and the methods' curves ask for the same subsets)."""
        key = tuple((h.evidence.id, hash(h.evidence.text)) for h in subset)
        if key not in self._similarity:
            self.calls += 1
            answer = await self.generate(subset)
            if self._original is None:
                self._original = (await embed(self.embedder, [qa_text(self.question, self.answer)]))[0]
            vec = (await embed(self.embedder, [qa_text(self.question, answer)]))[0]
            self._similarity[key] = float(np.clip(vec @ self._original, -1.0, 1.0))
        return self._similarity[key]

    async def measure(self, order: Sequence[Sequence[int]]) -> Faithfulness | None:
        """The three metrics for one credit order (None when it credits nothing)."""
        if not order:
            return None
        top = list(order[0])
        comprehensiveness = 1.0 - await self.similarity(without(self.hits, top))
        sufficiency = await self.similarity(only(self.hits, top))
        return Faithfulness(comprehensiveness, sufficiency,
                            await self._deletion([list(g) for g in order[:DELETION_STEPS]]),
                            await self._deletion([[i] for g in order for i in g][:DELETION_STEPS]))

    async def _deletion(self, steps: Sequence[Sequence[int]]) -> float:
        """Mean of 1 − similarity as ``steps`` are removed cumulatively."""
        removed: list[int] = []
        curve = []
        for step in steps:
            removed.extend(step)
            curve.append(1.0 - await self.similarity(without(self.hits, removed)))
        return mean(curve)


def sign_flip_p(differences: Sequence[float], *, draws: int = 10_000, seed: int = 13) -> float:
    """Two-sided p-value of a paired sign-flip permutation test that the mean difference is 0."""
    diffs = [d for d in differences if d != 0.0]
    if not diffs:
        return 1.0
    observed = abs(sum(diffs))
    rng = random.Random(seed)
    hits = sum(abs(sum(d if rng.random() < 0.5 else -d for d in diffs)) >= observed - 1e-12
               for _ in range(draws))
    return (hits + 1) / (draws + 1)


def paired(
    per_question: dict[str, dict[Any, Faithfulness]], reference: str = "naive"
) -> list[dict[str, Any]]:
    """Each method against ``reference`` on the questions both measured: mean difference and p per metric."""
    ref = per_question.get(reference) or {}
    rows = []
    for method, measured in per_question.items():
        if method == reference:
            continue
        common = [k for k in measured if k in ref]
        row: dict[str, Any] = {"method": method, "reference": reference, "n": len(common)}
        for metric in METRICS:
            diffs = [getattr(measured[k], metric) - getattr(ref[k], metric) for k in common]
            row[f"{metric}_diff"] = round(mean(diffs), 4) if diffs else None
            row[f"{metric}_p"] = round(sign_flip_p(diffs), 4) if diffs else None
        rows.append(row)
    return rows


def summary(measured: Sequence[Faithfulness]) -> dict[str, float | None]:
    return {m: round(mean(getattr(f, m) for f in measured), 4) if measured else None for m in METRICS}
