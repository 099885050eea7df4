"""What the bot needs from the engine and its store, as structural types.

The bot codes against these Protocols instead of importing ``pipeline.answer.engine`` so that it can be tested
with a small deterministic engine and so the dependency stays one-way (bot -> pipeline).
"""

from __future__ import annotations

from typing import Any, Protocol

from pipeline.turns import Turn
from pipeline.types import Answer


class TurnResultLike(Protocol):
    turn_id: int
    answer: Answer
    completed_question: str
    is_followup: bool
    error: str | None


class ClusterShareLike(Protocol):
    percent: float
    evidence_titles: list[str]
    urls: list[str]
    size: int


class ExplainResultLike(Protocol):
    turn_id: int
    text: str
    clusters: list[Any]  # ClusterShareLike items
    cached: bool
    partial: bool
    result: Any  # the structured AttributionResult, or None


class StoreLike(Protocol):
    async def set_message_ref(self, turn_id: int, message_ref: str) -> Any: ...
    async def turn_by_message(self, key_or_channel: str, message_ref: str) -> Turn | None: ...
    async def conversation_exists(self, key: str) -> bool: ...
    async def set_feedback(self, turn_id: int, user_id: str, value: int) -> Any: ...
    async def remove_feedback(self, turn_id: int, user_id: str) -> Any: ...
    async def mark_event_seen(self, event_id: str) -> bool: ...


class EngineLike(Protocol):
    @property
    def store(self) -> StoreLike: ...

    async def ask(self, conversation_key: str, question: str, *, user_id: str | None = None,
                  spaces: tuple[str, ...] | None = None,
                  history: list[tuple[str, str]] | None = None) -> TurnResultLike: ...

    async def explain(self, turn_id: int) -> ExplainResultLike: ...
