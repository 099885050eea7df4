"""Block Kit rendering of answers and explanations (built with slack_sdk's Block Kit models).

All foreign text is escaped (see :mod:`bot.slack.mrkdwn`) before our own links are inserted. Long answers are
split into several section blocks because Slack rejects a section whose text exceeds 3000 characters.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slack_sdk.models.blocks import (
    ActionsBlock,
    ButtonElement,
    ContextActionsBlock,
    ContextBlock,
    FeedbackButtonObject,
    FeedbackButtonsElement,
    MarkdownTextObject,
    SectionBlock,
)

from bot.core.contracts import ExplainResultLike, TurnResultLike
from bot.core.explanation import view_of
from bot.core.messages import certainty_note
from bot.slack.mrkdwn import bar, escape, link
from pipeline.answer.citations import WORD_JOINER
from pipeline.types import Citation

SECTION_LIMIT = 3000
MAX_BLOCKS = 50
PLACEHOLDER = "Searching the wiki…"
FEEDBACK_ACTION = "evident_feedback"
EXPLAIN_ACTION = "evident_explain"
ASK_ACTION_PREFIX = "evident_ask_"  # + the suggestion's position
_MARKER = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")
_LINK = re.compile(r"<[^<>\n]*>")

Block = dict[str, Any]


@dataclass(frozen=True)
class Rendered:
    """A message body: notification fallback ``text`` plus ``blocks``."""

    text: str
    blocks: list[Block]


def _section(text: str) -> Block:
    """A mrkdwn section (slack_sdk validates the 3000-character limit)."""
    return SectionBlock(text=MarkdownTextObject(text=text)).to_dict()


def _context(text: str) -> Block:
    return ContextBlock(elements=[MarkdownTextObject(text=_truncate(text, SECTION_LIMIT))]).to_dict()


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = _safe_cut(text, limit - 1)
    return text[:cut].rstrip() + "…"


def _safe_cut(text: str, pos: int) -> int:
    """Move a cut position left so it does not split a ``<...>`` link or an ``&amp;`` entity."""
    for m in _LINK.finditer(text):
        if m.start() < pos < m.end():
            pos = m.start()
            break
        if m.start() >= pos:
            break
    amp = text.rfind("&", max(0, pos - 5), pos)
    if amp != -1 and ";" not in text[amp:pos]:
        pos = amp
    return pos


def split_text(text: str, limit: int = SECTION_LIMIT) -> list[str]:
    """Split mrkdwn into chunks of at most ``limit`` chars at paragraph, line or word breaks."""
    chunks: list[str] = []
    rest = text
    while len(rest) > limit:
        window = rest[: limit + 1]
        cut = -1
        for sep in ("\n\n", "\n", " "):
            cut = window.rfind(sep, 0, limit)
            if cut > 0:
                cut = _safe_cut(rest, cut)
                if cut > 0:
                    break
        if cut <= 0:
            cut = _safe_cut(rest, limit) or limit
        chunks.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if rest.strip() or not chunks:
        chunks.append(rest)
    return chunks


def link_markers(escaped_text: str, citations: Sequence[Citation]) -> str:
    """Turn ``[n]`` (and ``[1, 2]``) markers into ``<url|[n]>`` links; unknown numbers stay text."""
    by_number = {c.number: c for c in citations}

    def one(n: int) -> str:
        c = by_number.get(n)
        return link(c.url, f"[{n}]") if c else f"[{n}]"

    def repl(m: re.Match[str]) -> str:
        return "".join(one(int(n)) for n in re.split(r"\s*,\s*", m.group(1)))

    return _MARKER.sub(repl, escaped_text)


def sources_line(c: Citation) -> str:
    title = link(c.url, c.title or c.url)
    return f"[{c.number}] {title} · {escape(c.space)}" if c.space else f"[{c.number}] {title}"


def explain_hint(emojis: Sequence[str]) -> str:
    names = [f":{e}:" for e in emojis if e]
    if not names:
        return ""
    return "React with " + " or ".join(names) + " to see why"


def answer_buttons(turn_id: int) -> list[Block]:
    """👍/👎 (Slack's feedback buttons) and "Why this answer?" under an answer; the values carry the turn."""
    feedback = FeedbackButtonsElement(
        action_id=FEEDBACK_ACTION,
        positive_button=FeedbackButtonObject(text="Good answer", value=f"up:{turn_id}",
                                             accessibility_label="Mark this answer as helpful"),
        negative_button=FeedbackButtonObject(text="Bad answer", value=f"down:{turn_id}",
                                             accessibility_label="Mark this answer as not helpful"))
    explain = ButtonElement(text="Why this answer?", action_id=EXPLAIN_ACTION, value=str(turn_id))
    return [ContextActionsBlock(elements=[feedback]).to_dict(), ActionsBlock(elements=[explain]).to_dict()]


def suggestion_buttons(questions: Sequence[str]) -> Block:
    """Next questions as buttons; a click asks it in the same thread (plain text: no mrkdwn to escape)."""
    return ActionsBlock(block_id="evident_suggestions", elements=[
        ButtonElement(text=q[:75], action_id=f"{ASK_ACTION_PREFIX}{i}", value=q[:2000])
        for i, q in enumerate(questions[:3])]).to_dict()


def render_answer(result: TurnResultLike, *, explain_emojis: Sequence[str] = ("explain", "mag"),
                  asked_by: str | None = None, question: str | None = None, buttons: bool = True) -> Rendered:
    """The Block Kit message that replaces the placeholder."""
    answer = result.answer
    blocks: list[Block] = []
    if asked_by and question:
        blocks.append(_context(f"<@{asked_by}> asked: {escape(question)}"))
    if result.is_followup and result.completed_question:
        blocks.append(_context(f"Answering: _{escape(result.completed_question)}_"))
    if result.notice:  # e.g. "your message was shortened"
        blocks.append(_context(f":information_source: {escape(result.notice)}"))
    # page text quoted as written ("regs[0]") keeps its brackets unlinked; shown without the joiner that kept
    # it apart, so it copies as written
    body = link_markers(escape(answer.text.strip()), answer.citations).replace(WORD_JOINER, "")
    body = body or "_(empty answer)_"
    sections = [_section(chunk) for chunk in split_text(body)]
    note = certainty_note(answer)
    blocks_tail = [_context(f":warning: {note}")] if note else []
    if answer.extractive:
        blocks_tail.append(_context(":information_source: extractive answer (no LLM configured)"))
    if answer.citations:
        lines = "\n".join(sources_line(c) for c in sorted(answer.citations, key=lambda c: c.number))
        blocks_tail.append(_context("*Sources*\n" + lines))
        hint = explain_hint(explain_emojis)
        if hint:
            blocks_tail.append(_context(hint))
    if buttons and answer.text.strip() and not answer.out_of_scope:
        blocks_tail.extend(answer_buttons(result.turn_id))
    room = MAX_BLOCKS - len(blocks) - len(blocks_tail)
    if len(sections) > room:
        sections = [*sections[: room - 1], _section("_(answer truncated)_")]
    blocks.extend(sections)
    blocks.extend(blocks_tail)
    return Rendered(text=_truncate(body, SECTION_LIMIT), blocks=blocks)


def render_explanation(result: ExplainResultLike, *, max_clusters: int = 5) -> str:
    """The one Slack rendering of an explanation: a share bar per source, its linked (escaped) title,
    duplicates collapsed, why it got its share, and low-confidence / partial notes."""
    view = view_of(result, max_clusters)
    if not view.sources:
        text = escape(result.text.strip()) if result.text.strip() else ""
        return text or "I couldn't attribute this answer to any particular source."
    lines = ["*Why this answer?* How much each source contributed:"]
    for s in view.sources:
        label = link(s.url, s.title or s.url or "untitled") if s.url else escape(s.title or "(untitled)")
        share = "`?`" if s.percent is None else f"`{bar(s.percent)}` {s.percent:.0f}%"
        quote = f" _“{escape(s.quote)}”_" if s.quote else ""
        lines.append(f"{share}  {label}{s.extra}{quote}" + (f" — {escape(s.reason)}" if s.reason else ""))
    if view.more:
        lines.append(f"_… and {view.more} more ({view.more_percent:.0f}% in total)_")
    lines.extend(f"_{escape(note)}_" for note in view.notes)
    return _truncate("\n".join(lines), 3900)
