"""A conversation turn as the store keeps it, and the evidence it was answered from.

``TurnRecord`` is what the engine writes after answering; ``Turn`` is what the store gives back (the
record plus its id, number in the conversation and creation time). Callers read attributes, never
string keys: the column layout and its JSON encoding stay inside ``pipeline.store``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.types import Citation, Hit


@dataclass(frozen=True)
class RetrievedRef:
    """One evidence a turn was answered from (in the order the generator saw it)."""

    evidence_id: str
    score: float = 0.0
    rank: int = 0
    page_id: str = ""
    url: str = ""
    title: str = ""

    @classmethod
    def of(cls, hit: Hit) -> RetrievedRef:
        ev = hit.evidence
        return cls(ev.id, hit.score, hit.rank, ev.page_id, ev.url, ev.title)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RetrievedRef:
        return cls(
            evidence_id=str(d.get("evidence_id", "")),
            score=float(d.get("score") or 0.0),
            rank=int(d.get("rank") or 0),
            page_id=str(d.get("page_id") or ""),
            url=str(d.get("url") or ""),
            title=str(d.get("title") or ""),
        )

    def to_json(self) -> dict[str, Any]:
        return {"evidence_id": self.evidence_id, "score": self.score, "rank": self.rank,
                "page_id": self.page_id, "url": self.url, "title": self.title}


def citation_from_json(d: Mapping[str, Any]) -> Citation:
    return Citation(
        number=int(d.get("number") or 0),
        url=str(d.get("url") or ""),
        title=str(d.get("title") or ""),
        space=str(d.get("space") or ""),
        evidence_ids=tuple(str(x) for x in d.get("evidence_ids") or ()),
    )


def citation_to_json(c: Citation) -> dict[str, Any]:
    return {"number": c.number, "url": c.url, "title": c.title, "space": c.space,
            "evidence_ids": list(c.evidence_ids)}


@dataclass(frozen=True, kw_only=True)
class TurnRecord:
    """One question and what evident did with it, as written to the store."""

    conversation_key: str
    question: str
    user_id: str | None = None
    completed_question: str = ""
    retrieval_query: str = ""
    retrieved: tuple[RetrievedRef, ...] = ()
    answer: str = ""
    citations: tuple[Citation, ...] = ()
    out_of_scope: bool = False
    extractive: bool = False
    model: str = ""
    prompt_template: str = ""
    prompt_version: str | None = None
    timings: Mapping[str, float] = field(default_factory=dict)
    error: str | None = None
    raw_answer: str = ""  # the generator's text before citation parsing: what explain regenerates against
    explained_answer: str = ""  # where explain regenerates against less (the model's words; "" for all of it)
    notice: str | None = None  # e.g. "your message was shortened"
    message_ref: str | None = None  # the platform's id of the posted answer (Slack ts, Teams activity id)
    explained_at: str | None = None  # when an explanation of this answer was posted (it is posted once)

    @property
    def asked(self) -> str:
        """The self-contained question (completed follow-up), or the question as asked."""
        return self.completed_question or self.question

    @property
    def answered(self) -> bool:
        return not self.error and bool(self.answer)


@dataclass(frozen=True, kw_only=True)
class Turn(TurnRecord):
    """A stored turn."""

    id: int
    turn_no: int
    created_at: str
