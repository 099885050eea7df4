"""What the bot needs from the engine and its store, as structural types.

The bot codes against these Protocols instead of importing ``pipeline.answer.engine`` so that it can be tested
with a small deterministic engine and so the dependency stays one-way (bot -> pipeline).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from pipeline.access.scope import AccessScope
from pipeline.protocols import ConversationStore
from pipeline.types import Answer, Hit


class TurnResultLike(Protocol):
    turn_id: int
    answer: Answer
    completed_question: str
    is_followup: bool
    error: str | None
    notice: str | None


class ExplainResultLike(Protocol):
    turn_id: int
    text: str
    error: str | None
    cached: bool
    partial: bool
    result: Any  # the structured AttributionResult, or None


class EngineLike(Protocol):
    @property
    def store(self) -> ConversationStore: ...

    async def ask(
        self, conversation_key: str, question: str, *, scope: AccessScope, user_id: str | None = None,
        history: list[tuple[str, str]] | None = None, on_text: Callable[[str], Awaitable[None]] | None = None,
        on_retrieved: Callable[[Sequence[Hit]], Awaitable[None]] | None = None,
    ) -> TurnResultLike: ...

    async def explain(self, turn_id: int, *, scope: AccessScope) -> ExplainResultLike: ...

    async def visible(self, evidence_ids: list[str], scope: AccessScope) -> set[str]:
        """Those of ``evidence_ids`` that ``scope`` may see."""

    async def evidence_count(self) -> int: ...

    async def followups(self, result: Any) -> list[str]: ...
