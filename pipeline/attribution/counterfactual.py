"""Counterfactual attribution (RAGonite Algorithm 1, steps 2-4) and its log-prob variant.

Each group of evidence is removed in turn and the answer regenerated from what is left; the more the
answer moves (1 − cosine of "question + answer" embeddings), the more that group caused it. All
regenerations run concurrently; failed ones degrade the explanation instead of failing it.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.attribution.params import SAME, AttributionParams, Generate, Score
from pipeline.attribution.scoring import answer_likeness, assemble, embed, qa_text, softmax, without
from pipeline.attribution.types import AttributionResult
from pipeline.errors import ConfigError, EvidentError
from pipeline.protocols import Embedder
from pipeline.types import Hit

NEEDS_PROMPT_LOGPROBS = ("logprob attribution needs an endpoint that returns prompt log-probs "
                         "(EVIDENT_LLM_PROMPT_LOGPROBS=true with a vLLM or llama.cpp server)")

# Failures that degrade an explanation. Anything else is a bug and propagates.
RECOVERABLE = (EvidentError, TimeoutError)


async def regenerate(
    generate: Generate, subset: Sequence[Hit], k: int, limiter: AbstractAsyncContextManager[Any]
) -> list[str] | BaseException:
    """One guarded generation call: returns up to ``k`` texts, or the recoverable error it raised."""
    async with limiter:
        try:
            texts = await generate(subset, k)
        except RECOVERABLE as exc:
            return exc
    texts = [str(t) for t in texts][:k]
    return texts if texts else EvidentError("counterfactual generation returned no text")


@dataclass
class _Group:
    rows: Sequence[int]
    answers: list[str] = field(default_factory=list)
    similarities: list[float] = field(default_factory=list)
    drawn: int = 0  # samples requested so far

    def contribution(self, unchanged: float) -> float | None:
        """1 − the mean similarity of its answers to the original; 0 when they are the same answer (mean
        similarity ≥ ``unchanged``): a reworded answer is no evidence that the group was used."""
        if not self.similarities:
            return None
        similarity = float(np.mean(self.similarities))
        return 0.0 if similarity >= unchanged - SAME else 1.0 - similarity


async def counterfactual_attribution(
    *, method: str, question: str, answer: str, hits: Sequence[Hit], groups: Sequence[Sequence[int]],
    generate: Generate, embedder: Embedder, params: AttributionParams, early_stop: bool = False,
) -> AttributionResult:
    """Remove each group, regenerate ``params.samples`` answers, score c_i = 1 − mean similarity.

    With ``early_stop`` the samples are drawn ``round_size`` at a time for every group and drawing
    stops as soon as the top share leads the second by more than ``params.delta``.
    Raises the first error only when every generation call failed.
    """
    started = time.perf_counter()
    state = [_Group(rows) for rows in groups]
    limiter = params.limiter()  # one cap for every call of this explanation

    async def draw(group: _Group, k: int) -> tuple[list[str], np.ndarray] | BaseException:
        out = await regenerate(generate, without(hits, group.rows), k, limiter)
        if isinstance(out, BaseException):
            return out
        return out, await embed(embedder, [qa_text(question, a) for a in out])

    # Embeddings overlap the LLM calls: the original answer is embedded while the calls are in flight,
    # and each counterfactual answer as soon as its own call returns,
    # and so is each evidence's likeness to the answer (it orders groups whose removal did the same).
    original = asyncio.ensure_future(embed(embedder, [qa_text(question, answer)]))
    likeness = asyncio.ensure_future(likeness_or_none(embedder, answer, hits))
    try:
        calls, rounds, errors = await _draw_rounds(state, draw, original, params, early_stop)
        alike = await likeness
    finally:
        for task in (original, likeness):
            if not task.done():
                task.cancel()
            elif not task.cancelled():
                task.exception()  # read, so a failure the draws already raised is not logged as lost
    if state and all(g.contribution(params.unchanged) is None for g in state):
        raise errors[0] if errors else EvidentError("no counterfactual answer was generated")
    return assemble(
        method=method, question=question, answer=answer, hits=hits, groups=groups,
        contributions=[g.contribution(params.unchanged) for g in state], temperature=params.temperature,
        answers=[g.answers for g in state], similarities=[g.similarities for g in state], calls=calls,
        failed_calls=len(errors), params=params.public(), seconds=time.perf_counter() - started,
        details={"rounds": rounds} if early_stop else {}, likeness=alike,
    )


async def likeness_or_none(embedder: Embedder, answer: str, hits: Sequence[Hit]) -> list[float] | None:
    """Each evidence's likeness to the answer, or None when it could not be embedded: it only orders equal
    shares (by rank instead then), so its failure never costs the explanation."""
    try:
        return await answer_likeness(embedder, answer, hits)
    except RECOVERABLE:
        return None


Draw = Callable[[_Group, int], Awaitable[tuple[list[str], np.ndarray] | BaseException]]


async def _draw_rounds(state: list[_Group], draw: Draw, original_task: asyncio.Future[np.ndarray],
                       params: AttributionParams, early_stop: bool) -> tuple[int, int, list[BaseException]]:
    """Draw samples for every group (``round_size`` at a time with ``early_stop``) until each has
    ``params.samples`` or one group clearly leads; (calls, rounds, failed draws)."""
    calls = rounds = 0
    errors: list[BaseException] = []
    original: np.ndarray | None = None
    step = params.round_size if early_stop else params.samples
    while state and any(g.drawn < params.samples for g in state):
        rounds += 1
        todo = [(g, min(step, params.samples - g.drawn)) for g in state if g.drawn < params.samples]
        outcomes = await asyncio.gather(*(draw(g, k) for g, k in todo))
        calls += len(todo)
        if original is None:
            original = (await original_task)[0]
        errors.extend(_record(todo, outcomes, original))
        if early_stop and _decisive(state, params):
            break
    return calls, rounds, errors


def _record(
    todo: Sequence[tuple[_Group, int]],
    outcomes: Sequence[tuple[list[str], np.ndarray] | BaseException],
    original: np.ndarray,
) -> list[BaseException]:
    """Add each group's new answers and their similarity to the original; returns the failed draws."""
    errors: list[BaseException] = []
    for (group, k), outcome in zip(todo, outcomes, strict=True):
        group.drawn += k
        if isinstance(outcome, BaseException):
            errors.append(outcome)
            continue
        batch, vectors = outcome
        for text, vec in zip(batch, vectors, strict=True):
            group.answers.append(text)
            group.similarities.append(float(np.clip(vec @ original, -1.0, 1.0)))
    return errors


def _decisive(state: Sequence[_Group], params: AttributionParams) -> bool:
    known = [c for c in (g.contribution(params.unchanged) for g in state) if c is not None]
    if not known:
        return False
    shares = sorted(softmax(known, params.temperature), reverse=True)
    lead = shares[0] - (shares[1] if len(shares) > 1 else 0.0)
    return lead > params.delta


async def logprob_attribution(
    *,
    method: str,
    question: str,
    answer: str,
    hits: Sequence[Hit],
    groups: Sequence[Sequence[int]],
    params: AttributionParams,
    likeness: Sequence[float] | None = None,
) -> AttributionResult:
    """Teacher-force the original answer with each group removed and read how much less likely it gets.

    ``score(hits, answer)`` must return the mean per-token log-prob of ``answer``. With ratio
    r_i = exp(min(0, lp_i − lp_all)), c_i = 1 − r_i ∈ [0, 1] (0: removing the group does not
    matter; 1: the answer becomes impossible), then the usual softmax(c / t). ``similarities`` holds r_i.
    """
    if params.score is None:
        raise ConfigError(NEEDS_PROMPT_LOGPROBS)
    started = time.perf_counter()
    logprob = _scorer(params.score, answer, params.limiter())
    outcomes = await asyncio.gather(logprob(hits), *(logprob(without(hits, rows)) for rows in groups))
    base, rest = outcomes[0], outcomes[1:]
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if isinstance(base, BaseException):
        raise base
    if groups and all(isinstance(o, BaseException) for o in rest):
        raise errors[0]
    ratios = [None if isinstance(o, BaseException) else math.exp(min(0.0, o - base)) for o in rest]
    return assemble(
        method=method, question=question, answer=answer, hits=hits, groups=groups,
        contributions=[None if r is None else 1.0 - r for r in ratios], temperature=params.temperature,
        similarities=[[] if r is None else [r] for r in ratios], calls=len(outcomes),
        failed_calls=len(errors), params=params.public(), seconds=time.perf_counter() - started,
        details={"base_logprob": base}, likeness=likeness,
    )


Scorer = Callable[[Sequence[Hit]], Awaitable[float | BaseException]]


def _scorer(score: Score, answer: str, limiter: AbstractAsyncContextManager[Any]) -> Scorer:
    """``score`` (sync or async) of ``answer`` given a subset, under the limiter; a failure is returned."""

    async def logprob(subset: Sequence[Hit]) -> float | BaseException:
        async with limiter:
            try:
                if inspect.iscoroutinefunction(score):
                    value = await score(subset, answer)
                else:
                    value = await asyncio.to_thread(score, subset, answer)
                    if inspect.isawaitable(value):
                        value = await value
            except RECOVERABLE as exc:
                return exc
        return float(value)

    return logprob
