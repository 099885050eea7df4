"""Conversation keys, question cleanup and thread backfill.

A conversation is one Slack thread: ``team:channel:thread_ts`` (the mention's own ts for a new thread).
Top-level DMs form one running conversation per DM channel (``team:channel:main``), which is how people
use a DM with a bot.
"""

from __future__ import annotations

import re
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

DM_MAIN = "main"
_MENTION = re.compile(r"<@[UW][A-Z0-9]+(?:\|[^>]*)?>")
_BACKFILL_MAX_MESSAGES = 200


def conversation_key(team: str, channel: str, thread_ts: str) -> str:
    return f"{team}:{channel}:{thread_ts}"


def thread_of_key(key: str) -> str | None:
    """The thread ts encoded in a conversation key, or None for keys that are not a thread."""
    last = key.rsplit(":", 1)[-1]
    return last if re.fullmatch(r"\d+\.\d+", last) else None


def channel_of_key(key: str) -> str:
    """The channel id in a ``team:channel:thread`` conversation key ("" for other keys)."""
    parts = key.split(":")
    return parts[1] if len(parts) == 3 else ""


def clean_question(text: str, bot_user_id: str | None) -> str:
    """Remove the bot's own mention (and leading punctuation) from a message's text."""
    if bot_user_id:
        text = re.sub(rf"<@{re.escape(bot_user_id)}(?:\|[^>]*)?>", " ", text)
    return re.sub(r"\s+", " ", text).strip(" ,:;\t\n")


def mentions(text: str, user_id: str | None) -> bool:
    return bool(user_id) and f"<@{user_id}" in text


def is_from_bot(message: dict[str, Any], bot_user_id: str | None, bot_id: str | None) -> bool:
    """True for messages evident itself posted."""
    return bool((bot_id and message.get("bot_id") == bot_id)
                or (bot_user_id and message.get("user") == bot_user_id))


async def backfill(client: AsyncWebClient, channel: str, thread_ts: str, before_ts: str, *,
                   bot_user_id: str | None, bot_id: str | None) -> list[tuple[str, str]]:
    """Earlier messages of a thread evident joins late, as ``(role, text)`` oldest first.

    Follows ``response_metadata.next_cursor`` pages; bounded so a huge thread cannot stall the answer.
    """
    out: list[tuple[str, str]] = []
    cursor: str | None = None
    while len(out) < _BACKFILL_MAX_MESSAGES:
        kwargs: dict[str, Any] = {"channel": channel, "ts": thread_ts, "limit": 100}
        if cursor:
            kwargs["cursor"] = cursor
        resp = await client.conversations_replies(**kwargs)
        for m in resp.get("messages") or []:
            ts = str(m.get("ts", ""))
            if not ts or float(ts) >= float(before_ts):
                continue
            if m.get("subtype") not in (None, "bot_message", "thread_broadcast", "file_share"):
                continue
            text = clean_question(str(m.get("text") or ""), bot_user_id)
            if not text:
                continue
            role = "assistant" if is_from_bot(m, bot_user_id, bot_id) else "user"
            out.append((role, text))
        cursor = (resp.get("response_metadata") or {}).get("next_cursor") or None
        if not cursor:
            break
    return out[:_BACKFILL_MAX_MESSAGES]
