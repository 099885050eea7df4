"""LLM question completion: a follow-up rewritten into a self-contained question (the ``rephrase`` prompt),
shared by the engine and the retrieval evaluation so both complete the same way."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from pipeline.answer.prompts import PromptLibrary
from pipeline.answer.query_builder import PriorTurn
from pipeline.errors import RemoteError
from pipeline.types import ChatMessage

log = logging.getLogger("evident.engine")


class Completer(Protocol):
    """An LLM, or the engine's generator that counts its calls."""

    async def complete(self, messages: Sequence[ChatMessage], *, role: str, max_tokens: int | None = None,
                       temperature: float = 0.0) -> list[str]: ...


async def complete_question(llm: Completer, prompts: PromptLibrary, question: str,
                            prior: Sequence[PriorTurn]) -> str | None:
    """The self-contained question, or None where the model gives nothing or cannot be reached (the no-LLM
    plan then stands)."""
    messages = prompts.render(
        "rephrase",
        history=[{"question": p.question, "answer": p.answer} for p in prior],
        question=question,
    )
    try:
        out = await llm.complete(messages, role="completion", max_tokens=120, temperature=0.0)
    except RemoteError as exc:
        log.warning("question completion failed, using the no-LLM query builder: %s", exc)
        return None
    completed = (out[0] if out else "").strip().strip('"').strip()
    return completed.splitlines()[0].strip() if completed else None
