"""Suggested next questions after an answer (``prompts/followups.j2`` with an LLM; without one, questions
about the pages the answer cited). Shown as buttons that ask the suggestion in the same thread."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from pipeline.answer.prompts import PromptLibrary
from pipeline.errors import RemoteError
from pipeline.protocols import LLM
from pipeline.types import Citation

log = logging.getLogger("evident.engine")

MAX_SUGGESTIONS = 3
MAX_CHARS = 120
_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s*")


def parse_suggestions(text: str, question: str) -> list[str]:
    """One question per line, bullets and numbering removed, the asked question and duplicates dropped."""
    out: list[str] = []
    seen = {question.strip().lower()}
    for line in text.splitlines():
        s = _BULLET.sub("", line).strip().strip('"').strip()
        if 3 <= len(s) <= MAX_CHARS and s.lower() not in seen:
            seen.add(s.lower())
            out.append(s)
    return out[:MAX_SUGGESTIONS]


def about_cited_pages(citations: Sequence[Citation]) -> list[str]:
    """The no-LLM suggestions: one question about each cited page (at most two)."""
    titles = list(dict.fromkeys(c.title for c in sorted(citations, key=lambda c: c.number) if c.title))
    return [f"What else does the wiki say about {t[:80]}?" for t in titles[:2]]


async def suggest_followups(llm: LLM | None, prompts: PromptLibrary, question: str, answer: str,
                            citations: Sequence[Citation]) -> list[str]:
    if llm is None:
        return about_cited_pages(citations)
    messages = prompts.render("followups", question=question, answer=answer)
    try:
        out = await llm.complete(messages, role="completion", max_tokens=80, temperature=0.0)
    except RemoteError as exc:
        log.info("no follow-up suggestions: %s", exc)
        return about_cited_pages(citations)
    return parse_suggestions(out[0] if out else "", question) or about_cited_pages(citations)
