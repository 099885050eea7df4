"""Teams renderings: the answer as a markdown message with AI citations and the AI-generated label, an
"Explain" button, and the explanation as an Adaptive Card.

Page text is untrusted: ``escape`` turns ``<``, ``>`` and ``&`` into entities (no ``<at>`` mention, no HTML)
and backslash-escapes markdown, so a page cannot mention people, link elsewhere or inject a card. The
``[n]`` markers the citations point at are put back after escaping.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from adaptive_cards.card import ActionSubmit, AdaptiveCard, TextBlock

from bot.core.contracts import ExplainResultLike, TurnResultLike
from bot.core.explanation import view_of
from bot.core.messages import certainty_note
from pipeline.types import Citation

EXPLAIN_ACTION = "evident.explain"
ASK_ACTION = "evident.ask"  # a suggested next question, clicked
MAX_SUGGESTIONS = 3
MAX_TEXT = 20_000  # the connector rejects activities over ~28 KB
_MD = re.compile(r"([\\`*_\[\]()#~])")  # emphasis, code, links, headings; <, > and & become entities
_ESCAPED_MARKER = re.compile(r"\\\[(\d+(?:\\?,\s*\d+)*)\\\]")


def escape(text: str) -> str:
    """Untrusted text as literal Teams markdown."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD.sub(r"\\\1", text)


def _markers_back(escaped: str) -> str:
    return _ESCAPED_MARKER.sub(lambda m: "[" + m.group(1).replace("\\", "") + "]", escaped)


def citation_entity(citations: Sequence[Citation]) -> dict[str, Any]:
    """Teams' AI message entity: the AI-generated label plus one numbered citation per cited page."""
    return {
        "type": "https://schema.org/Message",
        "@type": "Message",
        "@context": "https://schema.org",
        "@id": "",
        "additionalType": ["AIGeneratedContent"],
        "citation": [
            {"@type": "Claim", "position": c.number,
             "appearance": {"@type": "DigitalDocument", "name": c.title[:80] or c.url, "url": c.url,
                            "abstract": f"{c.title} · {c.space}"[:160] if c.space else c.title[:160]}}
            for c in sorted(citations, key=lambda c: c.number)
        ],
    }


def explain_button(turn_id: int) -> dict[str, Any]:
    card = AdaptiveCard.new().version("1.5").add_action(
        ActionSubmit(title="Why this answer?", data={"action": EXPLAIN_ACTION, "turn": turn_id})).create()
    return {"contentType": "application/vnd.microsoft.card.adaptive", "content": card.to_dict()}


def answer_activity(result: TurnResultLike) -> dict[str, Any]:
    """The reply that carries an answer: text, citations, AI label, feedback buttons, an Explain button."""
    answer = result.answer
    parts = []
    if result.is_followup and result.completed_question:
        parts.append(f"_Answering: {escape(result.completed_question)}_")
    parts.append(_markers_back(escape(answer.text.strip())) or "_(empty answer)_")
    if result.notice:
        parts.append(f"_{escape(result.notice)}_")
    note = certainty_note(answer)
    if note:
        parts.append(f"_⚠ {escape(note)}_")
    if answer.extractive:
        parts.append("_extractive answer (no LLM configured)_")
    text = "\n\n".join(parts)
    return {
        "type": "message",
        "textFormat": "markdown",
        "text": text[:MAX_TEXT],
        "entities": [citation_entity(answer.citations)],
        "channelData": {"feedbackLoopEnabled": True},
        "attachments": [explain_button(result.turn_id)] if answer.text.strip() else [],
    }


def with_suggestions(answer: dict[str, Any], questions: Sequence[str]) -> dict[str, Any]:
    """``answer`` (an ``answer_activity``) with up to three next-question buttons on its card."""
    actions = [ActionSubmit(title=q[:80], data={"action": ASK_ACTION, "question": q[:500]})
               for q in questions[:MAX_SUGGESTIONS]]
    builder = AdaptiveCard.new().version("1.5")
    for card in answer.get("attachments") or []:
        for action in (card.get("content") or {}).get("actions") or []:
            if (action.get("data") or {}).get("action") == EXPLAIN_ACTION:
                builder.add_action(ActionSubmit(title=action.get("title", "Why this answer?"),
                                                data=action["data"]))
    for action in actions:
        builder.add_action(action)
    card = builder.create()
    return {**answer, "attachments": [
        {"contentType": "application/vnd.microsoft.card.adaptive", "content": card.to_dict()}]}


def text_activity(text: str) -> dict[str, Any]:
    return {"type": "message", "textFormat": "markdown", "text": escape(text)}


def explanation_card(result: ExplainResultLike, *, max_sources: int = 5) -> dict[str, Any]:
    """The explanation as an Adaptive Card: each source's share, linked title and why it got it."""
    view = view_of(result, max_sources)
    builder = AdaptiveCard.new().version("1.5").add_item(
        TextBlock(text="**Why this answer?** How much each source contributed:", wrap=True))
    if not view.sources:
        builder.add_item(TextBlock(text=escape(result.text.strip()) or
                                   "I couldn't attribute this answer to any particular source.", wrap=True))
    for s in view.sources:
        title = escape(s.title or s.url or "untitled")
        label = f"[{title}]({s.url})" if s.url.startswith(("https://", "http://")) else title
        share = "?" if s.percent is None else f"{s.percent:.0f}%"
        reason = f" — {escape(s.reason)}" if s.reason else ""
        quote = f" _“{escape(s.quote)}”_" if s.quote else ""
        builder.add_item(TextBlock(text=f"**{share}** {label}{escape(s.extra)}{quote}{reason}", wrap=True))
    if view.more:
        builder.add_item(
            TextBlock(text=f"_… and {view.more} more ({view.more_percent:.0f}% in total)_", wrap=True)
        )
    for note in view.notes:
        builder.add_item(TextBlock(text=f"_{escape(note)}_", wrap=True, is_subtle=True))
    card = builder.create()
    return {"type": "message", "attachments": [
        {"contentType": "application/vnd.microsoft.card.adaptive", "content": card.to_dict()}]}
