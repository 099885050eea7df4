"""What the engine returns: a turn's answer (with its retrieval), and an explanation of it."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.answer.retrieve import Retrieval
from pipeline.attribution import AttributionResult
from pipeline.types import Answer


@dataclass
class TurnResult:
    turn_id: int
    answer: Answer
    completed_question: str
    is_followup: bool
    error: str | None = None
    retrieval: Retrieval | None = None
    notice: str | None = None  # e.g. "your message was shortened to 2000 characters"


NOTHING_TO_EXPLAIN = (
    "There is nothing to explain: no answer to this question was found in the wiki, so no source produced it."
)


@dataclass
class ExplainResult:
    turn_id: int
    text: str
    cached: bool = False
    partial: bool = False
    result: AttributionResult | None = None
    error: str | None = None
