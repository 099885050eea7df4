"""RAGAS-style answer metrics computed with the configured judge model and evident's own judge prompts.

- **Faithfulness**: the share of the answer's claims that the sources shown to the generator support
  (``prompts/ragas_faithfulness.j2``); undefined (None) for an answer without claims ("cannot be found").
- **Answer relevancy**: the judge writes ``n`` questions the answer answers (``ragas_questions.j2``); the
  score is their mean cosine similarity to the asked question under the embedder, 0 for a noncommittal answer.
- **Context precision**: the judge marks each shown source useful (1) or not (0) for arriving at the reference
  answer (``ragas_context_precision.j2``); the score is the mean of precision@k over the useful ranks k
  (average precision: useful sources ranked first score higher), 0 when none is useful.
- **Context recall**: the share of the reference answer's statements that the sources contain
  (``ragas_context_recall.j2``).

Every judge reply is JSON; a reply that does not parse, or a failing endpoint, gives None for that metric
(counted as missing, never as 0). How far the judge agrees with people is
``pipeline.evaluation.judge_agreement``.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.answer.prompts import OUT_OF_SCOPE, PromptLibrary
from pipeline.errors import RemoteError
from pipeline.models.loading import normalise_rows
from pipeline.protocols import LLM, Embedder

METRICS = ("faithfulness", "answer_relevancy", "context_precision", "context_recall")
_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


@dataclass(frozen=True)
class RagasScores:
    faithfulness: float | None = None
    answer_relevancy: float | None = None
    context_precision: float | None = None
    context_recall: float | None = None
    # per shown source: useful for the reference answer (1) or not
    verdicts: tuple[int, ...] = field(default=())

    def get(self, metric: str) -> float | None:
        value = getattr(self, metric)
        return None if value is None else float(value)


def parse_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in a judge reply (models wrap it in prose or code fences), or None."""
    match = _OBJECT.search(text or "")
    if not match:
        return None
    candidate = match.group(0)
    for end in range(len(candidate), 0, -1):  # a trailing brace of prose after the object: shrink to fit
        if candidate[end - 1] != "}":
            continue
        try:
            data = json.loads(candidate[:end])
        except ValueError:
            continue
        return data if isinstance(data, dict) else None
    return None


def share(items: Any, flag: str) -> float | None:
    """The share of ``items`` (a list of objects) whose boolean ``flag`` is true; None when malformed or
    empty."""
    if not isinstance(items, list) or not items:
        return None
    flags = [item.get(flag) for item in items if isinstance(item, dict)]
    if not flags or any(not isinstance(f, bool) for f in flags):
        return None
    return sum(bool(f) for f in flags) / len(flags)


def average_precision(verdicts: Sequence[int]) -> float:
    """Mean precision@k over the ranks k whose source is useful; 0 when none is."""
    hits, total = 0, 0.0
    for k, useful in enumerate(verdicts, start=1):
        if useful:
            hits += 1
            total += hits / k
    return total / hits if hits else 0.0


class RagasJudge:
    """The four metrics for one answer; ``llm`` is the judge (``role="judge"``), ``embedder`` compares
    questions."""

    def __init__(self, llm: LLM, prompts: PromptLibrary, embedder: Embedder, *, questions: int = 3,
                 max_tokens: int = 400) -> None:
        self.llm = llm
        self.prompts = prompts
        self.embedder = embedder
        self.questions = questions
        self.max_tokens = max_tokens

    async def _ask(self, template: str, **variables: Any) -> dict[str, Any] | None:
        messages = self.prompts.render(template, **variables)
        try:
            out = await self.llm.complete(messages, role="judge", max_tokens=self.max_tokens, temperature=0.0)
        except RemoteError:
            return None
        return parse_json_object(out[0] if out else "")

    async def faithfulness(self, question: str, answer: str, sources: Sequence[str]) -> float | None:
        if not answer.strip() or answer.strip() == OUT_OF_SCOPE:
            return None
        data = await self._ask("ragas_faithfulness", question=question, answer=answer, sources=list(sources))
        return share(data.get("claims"), "supported") if data else None

    async def answer_relevancy(self, question: str, answer: str) -> float | None:
        if not answer.strip() or answer.strip() == OUT_OF_SCOPE:
            return 0.0
        data = await self._ask("ragas_questions", answer=answer, n=self.questions)
        if not data:
            return None
        if data.get("noncommittal") is True:
            return 0.0
        asked = [q for q in data.get("questions") or [] if isinstance(q, str) and q.strip()]
        if not asked:
            return None
        vectors = await asyncio.to_thread(self.embedder.embed_queries, [question, *asked[: self.questions]])
        v = normalise_rows(vectors)
        return float(np.clip(v[1:] @ v[0], 0.0, 1.0).mean())

    async def context_verdicts(
        self, question: str, gold: str, sources: Sequence[str]
    ) -> tuple[int, ...] | None:
        if not sources:
            return ()
        data = await self._ask("ragas_context_precision", question=question, gold=gold, sources=list(sources))
        raw = data.get("verdicts") if data else None
        if not isinstance(raw, list) or len(raw) != len(sources) or any(v not in (0, 1) for v in raw):
            return None
        return tuple(int(v) for v in raw)

    async def context_recall(self, question: str, gold: str, sources: Sequence[str]) -> float | None:
        if not gold.strip():
            return None
        data = await self._ask("ragas_context_recall", question=question, gold=gold, sources=list(sources))
        return share(data.get("statements"), "attributed") if data else None

    async def score(self, question: str, answer: str, gold: str, sources: Sequence[str]) -> RagasScores:
        """All four metrics (their judge calls run concurrently; the LLM client bounds the concurrency)."""
        faith, relevancy, verdicts, recall = await asyncio.gather(
            self.faithfulness(question, answer, sources), self.answer_relevancy(question, answer),
            self.context_verdicts(question, gold, sources), self.context_recall(question, gold, sources))
        return RagasScores(faithfulness=faith, answer_relevancy=relevancy,
                           context_precision=None if verdicts is None else average_precision(verdicts),
                           context_recall=recall, verdicts=verdicts or ())
