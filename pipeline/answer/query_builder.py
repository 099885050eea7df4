"""Conversational retrieval queries without an LLM.

Follow-up questions ("And what about TPM?") omit the topic that earlier turns established. Without an
LLM we recover it from the thread itself: earlier questions and the titles of pages the system itself
retrieved before (never gold data). A topic-shift test keeps self-contained questions as they are, so
a new topic is not polluted by the old one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.answer.stopwords import STOPWORDS
from pipeline.errors import ConfigError

STRATEGIES = ("raw", "prev_questions", "topic")

_WORD = re.compile(r"[^\W_]+(?:[.\-][^\W_]+)*", re.UNICODE)

# Words that carry no topic. Small EN+DE list; content words are everything else.
_FOLLOWUP = re.compile(
    r"^\s*(and|also|what about|how about|what else|same for|and for|und|auch|was ist mit|wie ist es mit"
    r"|wie steht es mit|und für|und bei|und was)\b",
    re.IGNORECASE,
)
# words that point back into the conversation (a regex alternation)
PRONOUNS = (r"it|its|they|them|their|that|this|those|these|he|she|his|her|there|es|sie|ihr|ihre|ihrer|dort|"
            r"dessen|deren|diese[rsmn]?|das|dies|er|ihm|ihn")
_PRONOUN = re.compile(rf"\b({PRONOUNS})\b", re.IGNORECASE)


def content_words(text: str, *, single: bool = False) -> list[str]:
    """Lower-cased words without stop words or single characters; ``single`` keeps single digits and capitals
    ("weeks 5 to 6", "Raum B"), never the "s" of "Alice's"."""
    found = (m.group(0) for m in _WORD.finditer(text))
    return [w.lower() for w in found
            if w.lower() not in STOPWORDS and (len(w) > 1 or (single and (w.isdigit() or w.isupper())))]


@dataclass(frozen=True)
class PriorTurn:
    """What the query builder may use of an earlier turn: never gold answers or gold URLs."""

    question: str
    retrieved_titles: tuple[str, ...] = ()
    answer: str = ""
    retrieved_pages: tuple[str, ...] = ()  # page ids of the system's own top evidence, best first


def is_followup(question: str, history: Sequence[PriorTurn], *, min_own_words: int = 4) -> bool:
    """Heuristic topic-shift test: does ``question`` lean on earlier turns?"""
    if not history:
        return False
    words = content_words(question)
    if _FOLLOWUP.search(question):
        return True
    if len(words) < min_own_words:
        return True
    return bool(_PRONOUN.search(question)) and len(words) < 2 * min_own_words


def build_query(
    question: str,
    history: Sequence[PriorTurn],
    *,
    strategy: str,
    max_prev: int = 2,
) -> str:
    """Return the retrieval query for the current turn.

    Strategies (named so evaluation can compare them): ``raw``            the question alone;
      ``prev_questions`` the question plus up to ``max_prev`` previous questions; ``topic``          the
      question plus the first question (which usually sets the topic) and the previous one, plus the title of
      the page the system retrieved last — applied only when ``is_followup`` says the question leans on the
      thread.
    """
    if strategy not in STRATEGIES:
        raise ConfigError(f"unknown query strategy {strategy!r}: choose {', '.join(STRATEGIES)}")
    question = question.strip()
    if strategy == "raw" or not history:
        return question
    if strategy == "prev_questions":
        prev = [t.question for t in history[-max_prev:]]
        return " ".join([question, *reversed(prev)])
    if strategy == "topic":
        if not is_followup(question, history):
            return question
        parts = [question]
        last = history[-1]
        parts.append(last.question)
        first = history[0]
        if first is not last:
            parts.append(first.question)
        if last.retrieved_titles:
            parts.append(last.retrieved_titles[0])
        return " ".join(parts)
    raise AssertionError(strategy)  # pragma: no cover - STRATEGIES is checked above


@dataclass(frozen=True)
class QueryPlan:
    """How one question is asked of the index and the generator."""

    question: str  # as asked
    completed: str  # the self-contained question the answer is generated for
    retrieval_query: str
    followup: bool  # leans on earlier turns
    context_pages: tuple[str, ...] = ()  # pages a follow-up probably continues (boosted in retrieval)
    builder_query: str = ""  # the no-LLM query (kept when an LLM completes the question)

    def retrieval_queries(self, mode: str) -> tuple[str, ...]:
        """What the index is asked: the no-LLM query first and the LLM-completed question second, fused
        (``fused``: ``pipeline.answer.retrieve.retrieve_fused`` weighs the second), the completed question
        alone (``completed``) or the no-LLM query alone (``builder``)."""
        builder = self.builder_query or self.retrieval_query
        if mode == "builder":
            return (builder,)
        if mode == "fused" and builder != self.retrieval_query:
            return (builder, self.retrieval_query)
        return (self.retrieval_query,)


def plan_query(question: str, history: Sequence[PriorTurn], *, strategy: str) -> QueryPlan:
    """The no-LLM plan: the question as asked, a retrieval query carrying the thread's topic when the
    question leans on it, and the previous turn's top page to prefer."""
    followup = is_followup(question, history)
    query = build_query(question, history, strategy=strategy)
    return QueryPlan(
        question=question,
        completed=question,
        retrieval_query=query,
        followup=followup,
        context_pages=context_pages(question, history),
        builder_query=query,
    )


def context_pages(question: str, history: Sequence[PriorTurn], *, top: int = 1) -> tuple[str, ...]:
    """Pages a follow-up probably continues: the previous turn's top pages (none for a new topic)."""
    if not history or not is_followup(question, history):
        return ()
    return tuple(dict.fromkeys(history[-1].retrieved_pages))[:top]


def backfilled_turns(history: Sequence[tuple[str, str]]) -> list[PriorTurn]:
    """(role, text) messages of a conversation evident was not part of, paired into prior turns."""
    prior: list[PriorTurn] = []
    pending_q: str | None = None
    for role, text in history:
        if role == "user":
            if pending_q:
                prior.append(PriorTurn(question=pending_q))
            pending_q = text
        elif pending_q is not None:
            prior.append(PriorTurn(question=pending_q, answer=text))
            pending_q = None
    if pending_q:
        prior.append(PriorTurn(question=pending_q))
    return prior


MAX_QUESTION_CHARS = 2000


def valid_text(text: str) -> str:
    """``text`` with lone surrogates (undecodable input bytes) replaced by U+FFFD: SQLite, JSON and the
    LLM client all need valid UTF-8, and one odd character must not lose the user's turn."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def clean_question(question: str) -> tuple[str, str | None]:
    """The question as evident reads it (valid UTF-8, no NULs, at most MAX_QUESTION_CHARS) and a notice for
    the user when it had to be shortened."""
    question = valid_text(question or "").replace("\x00", "").strip()
    if len(question) <= MAX_QUESTION_CHARS:
        return question, None
    notice = f"Your message was long, so I only read its first {MAX_QUESTION_CHARS} characters."
    return question[:MAX_QUESTION_CHARS], notice
