"""evident's App Home tab: index status, the user's recent questions, and for admins the feedback summary.

Published with ``views.publish`` when a user opens the tab (``app_home_opened``); every number is read
fresh from the index and the store, and every piece of stored text is escaped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from slack_sdk.errors import SlackClientError
from slack_sdk.models.blocks import ContextBlock, DividerBlock, HeaderBlock, MarkdownTextObject, SectionBlock
from slack_sdk.web.async_client import AsyncWebClient

from bot.core.contracts import EngineLike
from bot.slack.mrkdwn import escape
from bot.slack.threads import channel_of_key
from pipeline.errors import EvidentError, StoreError
from pipeline.store.reports import FeedbackSummary, RatedTurn, SpaceSync, SyncRun

log = logging.getLogger("evident.bot")

MAX_SHOWN = 5


def _section(text: str) -> dict[str, Any]:
    return SectionBlock(text=MarkdownTextObject(text=text[:3000])).to_dict()


def _context(text: str) -> dict[str, Any]:
    return ContextBlock(elements=[MarkdownTextObject(text=text[:3000])]).to_dict()


def in_a_dm(conversation_key: str) -> bool:
    """A question asked in a DM: its link would open only for the asker, never for an admin."""
    return channel_of_key(conversation_key).startswith("D")


def home_view(*, evidence: int | None, spaces: list[SpaceSync], recent: list[tuple[int, str, str]],
              feedback: FeedbackSummary | None, last_sync: SyncRun | None = None,
              links: Mapping[int, str] | None = None) -> dict[str, Any]:
    """The Home tab. ``feedback`` is shown only when given (admins), each rated answer linked where ``links``
    (turn id -> Slack permalink, from ``chat.getPermalink``) has one; answers in DMs say so instead."""
    blocks: list[dict[str, Any]] = [HeaderBlock(text="evident").to_dict()]
    indexed = "unavailable" if evidence is None else f"{evidence:,} evidence indexed"
    blocks.append(_section(f"*Wiki index:* {indexed}"))
    if spaces:
        lines = [
            f"• *{escape(s.space)}* synced up to {escape(s.checkpoint_utc)} (run {escape(s.updated_at[:19])})"
            for s in spaces
        ]
        blocks.append(_section("*Confluence spaces*\n" + "\n".join(lines)))
    else:
        blocks.append(
            _context(
                "No Confluence sync has run yet (`evident sync`, or `evident serve` with CONFLUENCE_URL)."
            )
        )
    if last_sync is not None:
        icon = ":warning:" if last_sync.failed else ":white_check_mark:"
        blocks.append(
            _context(f"{icon} Last sync {escape(last_sync.finished_at[:19])}: {escape(last_sync.summary)}")
        )
        # which pages failed (titles, attachment names) is for admins: they may be restricted pages
        for error in last_sync.errors[:MAX_SHOWN] if feedback is not None else ():
            blocks.append(_context(f"• {escape(error[:280])}"))
    blocks.append(DividerBlock().to_dict())
    if recent:
        lines = [f"• {escape(q[:150])} _({escape(at[:10])})_" for _, q, at in recent[:MAX_SHOWN]]
        blocks.append(_section("*Your recent questions*\n" + "\n".join(lines)))
    else:
        blocks.append(_section("*Ask me anything about the wiki*: mention me in a channel, message me here, "
                               "or use `/ask`."))
    if feedback is not None:
        blocks.append(DividerBlock().to_dict())
        blocks.append(_section(f"*Feedback* (admins): {feedback.up} 👍 · {feedback.down} 👎"))
        for t in feedback.worst[:MAX_SHOWN]:
            link = (links or {}).get(t.turn_id)
            label = f"<{link}|{escape(t.question[:120])}>" if link else escape(t.question[:120])
            if in_a_dm(t.conversation_key):
                label += " _(in a DM)_"
            blocks.append(_context(f"{t.down} 👎 · {t.up} 👍 — {label}"))
    return {"type": "home", "blocks": blocks}


async def publish_home(client: AsyncWebClient, engine: EngineLike, user: str, *, admin: bool) -> None:
    """Read everything fresh and publish ``user``'s Home tab (``views.publish``); a failure is logged."""
    store = engine.store
    try:
        evidence: int | None = await engine.evidence_count()
    except EvidentError as exc:
        log.warning("App Home: index unavailable: %s", exc)
        evidence = None
    try:
        feedback = await store.feedback_summary() if admin else None
        view = home_view(
            evidence=evidence,
            spaces=await store.sync_status(),
            last_sync=await store.last_sync(),
            recent=await store.recent_questions(user),
            feedback=feedback,
            links=await permalinks(client, feedback.worst if feedback else ()),
        )
        await client.views_publish(user_id=user, view=view)
    except (StoreError, SlackClientError) as exc:
        log.error("could not publish the App Home of %s: %s", user, exc)


async def permalinks(client: AsyncWebClient, turns: Iterable[RatedTurn]) -> dict[int, str]:
    """Slack's own permalinks (thread replies carry their ``thread_ts``) for answers outside DMs: a DM's
    link would open only for the person who asked."""
    links: dict[int, str] = {}
    for t in turns:
        channel = channel_of_key(t.conversation_key)
        if not channel or not t.message_ref or in_a_dm(t.conversation_key):
            continue
        try:
            resp = await client.chat_getPermalink(channel=channel, message_ts=t.message_ref)
        except SlackClientError as exc:
            log.info("no permalink for turn %s: %s", t.turn_id, exc)
            continue
        if isinstance(resp.get("permalink"), str):
            links[t.turn_id] = str(resp["permalink"])
    return links
