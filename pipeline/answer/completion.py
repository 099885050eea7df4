"""LLM question completion: a follow-up rewritten into a self-contained question (the ``rephrase`` prompt),
shared by the engine and the retrieval evaluation so both complete the same way.

A completion adds what the history says; it keeps the message's own words. A small model often does not:
Qwen2.5-0.5B rewrote "Welche QEMU Version wurde für diese Tests genutzt?" into the previous turn's question
and "Welche Farbe bekommt das XT Shield …?" into "Was hat das XT Shield …?" (BENCHMARKS.md, "Follow-up
completions that drop the message"). So a completion missing any content word of the message (in none of
its English or German stems) is not used: the message is answered as asked, as without a model.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Protocol

import Stemmer

from pipeline.answer.prompts import PromptLibrary
from pipeline.answer.query_builder import PRONOUNS, PriorTurn, content_words
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
    completed = completed.splitlines()[0].strip() if completed else ""
    if not completed:
        return None
    dropped = dropped_words(question, completed)
    if dropped:
        log.info("question completion dropped %d of the message's words; answering it as asked", len(dropped))
        return None
    return completed


_STEMMERS = (Stemmer.Stemmer("english"), Stemmer.Stemmer("german"))
# what a completion replaces by what it refers to (the query builder's pronouns, more references, the asker)
_REFERENCES = re.compile(
    rf"({PRONOUNS}|him|here|above|former|latter|one|ihre[rsmn]?|hier|i|me|my|we|us|our|you|your|ich|mir|mich|"
    r"wir|uns|du|dir|dich|man|(?:mein|dein|sein|unser|euer|eur)\w*|"
    r"da(?:r)?(?:von|für|zu|mit|in|an|auf|vor|nach|über|bei|um|aus)|"
    # and what only carries the conversation
    r"thanks?|thx|please|ok|okay|great|cool|hmm+|danke|bitte|gut|prima|super|alles klar)",
    re.IGNORECASE,
)


def _stems(word: str) -> set[str]:
    return {word, *(stemmer.stemWord(word) for stemmer in _STEMMERS)}


def dropped_words(message: str, completed: str) -> list[str]:
    """The content words of ``message`` that ``completed`` has in none of their forms (English or German
    stem, or verbatim)."""
    kept: set[str] = set()
    for word in content_words(completed, single=True):
        for part in {word, *word.split("-")}:  # "TPM-PCR-Werte" keeps "Werte"
            kept |= _stems(part)
    own = [w for w in dict.fromkeys(content_words(message, single=True)) if not _REFERENCES.fullmatch(w)]
    return [w for w in own if not _stems(w) & kept and not all(_stems(p) & kept for p in w.split("-") if p)]
