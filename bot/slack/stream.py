"""An answer streamed into a Slack thread (``chat.startStream`` / ``appendStream`` / ``stopStream``): the work
as task cards ("Searching the wiki", then "Read n pages" with the pages as sources), then the text as it is
generated, then the sources and buttons. Also where streaming was refused, so a channel that cannot stream is
not asked again on every question."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.errors import slack_error
from bot.slack.mrkdwn import escape
from pipeline.types import Hit

log = logging.getLogger("evident.bot")

MAX_TASK_SOURCES = 6
SEARCH_TASK = "search"
READ_TASK = "read"
_RATE_LIMITED = {"ratelimited", "rate_limited"}
# Slack's answers meaning "this channel (or workspace) does not stream": remembered; anything else (a rate
# limit, Slack's 5xx, one bad request) is tried again on the next question
CANNOT_STREAM = frozenset({
    "channel_type_not_supported", "method_not_supported_for_channel_type", "not_allowed_token_type",
    "unknown_method", "missing_scope", "no_permission", "feature_not_enabled", "not_allowed",
})


class SlackStream:
    """One answer streamed into a thread: started on the first task card or text, appended in batches, stopped
    with the sources and buttons. A refusal (a workspace without streaming, a channel type Slack does not
    stream to) ends the stream and the answer is posted whole, so nothing is lost; a rate limit only holds the
    text back until Slack's ``Retry-After`` has passed (it goes out in the next batch)."""

    FLUSH_CHARS = 60
    FLUSH_S = 0.25

    def __init__(self, client: AsyncWebClient, channel: str, thread_ts: str, team: str, user: str) -> None:
        self.client, self.channel, self.thread_ts = client, channel, thread_ts
        self.team, self.user = team, user
        self.ts: str | None = None
        self.failed = False
        self.error = ""  # Slack's error code when starting failed
        self.done = False  # stopped (or given up on): nothing more goes into it
        self.text_sent = False  # any answer text shown (so far)
        self._open_task: dict[str, Any] | None = None  # "Searching the wiki", until the pages are read
        self._pending = ""
        self._flushed_at = 0.0
        self._hold_until = 0.0  # rate-limited: no append before this (monotonic)

    async def open(self) -> bool:
        """Start the stream with a "Searching the wiki" task card (in place of a placeholder message)."""
        self._open_task = {"type": "task_update", "id": SEARCH_TASK, "title": "Searching the wiki",
                           "status": "in_progress"}
        if await self._send(chunks=[self._open_task]):
            return True
        self._open_task = None
        return False

    async def task(self, hits: Sequence[Hit]) -> None:
        """The pages read, each a source link: starts the stream (assistant threads) or completes the search
        card (a stream opened with one), before any text."""
        if self.failed or self.done or not hits:
            return
        chunks = [read_pages_task(hits)]
        if self._open_task is not None:
            chunks.insert(0, {**self._open_task, "status": "complete", "details": _spaces(hits)})
            self._open_task = None
        await self._send(chunks=chunks)

    async def add(self, text: str) -> None:
        if self.failed or self.done:
            return
        self._pending += escape(text)
        now = time.monotonic()
        if now < self._hold_until:
            return
        if (
            self.ts is not None
            and self.text_sent
            and len(self._pending) < self.FLUSH_CHARS
            and now - self._flushed_at < self.FLUSH_S
        ):
            return
        text, self._pending = self._pending, ""
        if await self._send(text=text):
            self._flushed_at = now
            self.text_sent = self.text_sent or bool(text)

    async def _send(self, *, text: str = "", chunks: list[dict[str, Any]] | None = None) -> bool:
        try:
            if self.ts is None:
                resp = await self.client.chat_startStream(channel=self.channel, thread_ts=self.thread_ts,
                                                          markdown_text=text or None, chunks=chunks,
                                                          task_display_mode="timeline" if chunks else None,
                                                          recipient_team_id=self.team,
                                                          recipient_user_id=self.user or None)
                self.ts = str(resp["ts"])
            elif text or chunks:
                await self.client.chat_appendStream(channel=self.channel, ts=self.ts,
                                                    markdown_text=text or None, chunks=chunks)
            return True
        except SlackClientError as exc:
            return self._refused(exc, text)

    def _refused(self, exc: SlackClientError, text: str) -> bool:
        code = slack_error(exc)
        if self.ts is not None and code in _RATE_LIMITED and isinstance(exc, SlackApiError):
            self._pending = text + self._pending  # kept for the next batch (or the stop)
            retry_after = exc.response.headers.get("Retry-After") or exc.response.headers.get("retry-after")
            self._hold_until = time.monotonic() + _seconds(retry_after)
            return False
        log.info("answer streaming unavailable in %s (%s): posting it whole", self.channel, code)
        self.failed, self.error = True, code
        return False

    async def stop(self, blocks: list[dict[str, Any]], *, closing: str = "") -> bool:
        """Flush what is left (plus ``closing``, a failure said in the same message: the search card, if still
        open, then ends as failed) and stop with ``blocks`` under the text; False when the stream had failed
        or Slack had ended it (``message_not_in_streaming_state``). Either way it is done."""
        if self.ts is None or self.failed or self.done:
            return False
        self.done = True
        text = self._pending + (closing if self.text_sent or self._pending else closing.lstrip())
        chunks = None
        if self._open_task is not None:
            chunks = [{**self._open_task, "status": "error" if closing else "complete"}]
        try:
            await self.client.chat_stopStream(
                channel=self.channel,
                ts=self.ts,
                markdown_text=text or None,
                chunks=chunks,
                blocks=blocks or None,
            )
            return True
        except SlackClientError as exc:
            log.warning("could not finish the answer stream in %s: %s", self.channel, slack_error(exc))
            return False


class StreamRefusals:
    """Channels where Slack refused to start a stream (a channel type it does not stream to, a workspace
    without the feature, a missing scope: ``CANNOT_STREAM``): they get the placeholder path without asking
    again, for ``ttl_s``. Other errors (rate limits, Slack's 5xx) are not remembered. Bounded (oldest out)."""

    def __init__(self, ttl_s: float = 3600.0, max_entries: int = 10_000) -> None:
        self.ttl_s, self.max_entries = ttl_s, max_entries
        self._until: OrderedDict[str, float] = OrderedDict()

    def allowed(self, channel: str) -> bool:
        until = self._until.get(channel)
        if until is None:
            return True
        if until > time.monotonic():
            return False
        del self._until[channel]
        return True

    def refused(self, channel: str, error: str) -> None:
        if error not in CANNOT_STREAM:
            return
        self._until[channel] = time.monotonic() + self.ttl_s
        self._until.move_to_end(channel)
        while len(self._until) > self.max_entries:
            self._until.popitem(last=False)


def _seconds(value: str | None) -> float:
    try:
        return min(max(float(value or 1), 0.0), 30.0)
    except ValueError:
        return 1.0


def _spaces(hits: Sequence[Hit]) -> str:
    spaces = sorted({h.evidence.space for h in hits if h.evidence.space})
    return f"in {', '.join(escape(s) for s in spaces[:8])}" if spaces else ""


def read_pages_task(hits: Sequence[Hit]) -> dict[str, Any]:
    """A ``task_update`` chunk: the pages an answer is written from (their titles escaped, links only to
    http(s) URLs)."""
    pages: dict[str, str] = {}
    for h in hits:
        url = h.evidence.url
        if url.startswith(("https://", "http://")) and url not in pages:
            pages[url] = h.evidence.title or url
    sources = [{"type": "url", "url": url, "text": escape(title)[:150]}
               for url, title in list(pages.items())[:MAX_TASK_SOURCES]]
    n = len({h.evidence.page_id for h in hits})
    return {"type": "task_update", "id": READ_TASK,
            "title": f"Read {n} page{'s' if n != 1 else ''} of the wiki",
            "status": "complete", **({"sources": sources} if sources else {})}
