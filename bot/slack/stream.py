"""An answer streamed into a Slack thread (``chat.startStream`` / ``appendStream`` / ``stopStream``): the work
as task cards ("Searching the wiki", then "Read n pages" with the pages as sources), then the text as it is
generated, then the sources and buttons. Also where streaming was refused, so a channel that cannot stream is
not asked again on every question."""

from __future__ import annotations

import copy
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.errors import SLACK_FAILURES, retry_after_s, slack_error, transient
from bot.slack.mrkdwn import escape, escape_markdown
from pipeline.types import Hit

log = logging.getLogger("evident.bot")

MAX_TASK_SOURCES = 6
SEARCH_TASK = "search"
READ_TASK = "read"
# Slack's answers meaning "this channel (or workspace) does not stream": remembered; anything else (a rate
# limit, Slack's 5xx, one bad request) is tried again on the next question
CANNOT_STREAM = frozenset({
    "channel_type_not_supported", "method_not_supported_for_channel_type", "not_allowed_token_type",
    "unknown_method", "missing_scope", "feature_not_enabled",
})


class SlackStream:
    """One answer streamed into a thread: started on the first task card or text, appended in batches,
    stopped with the sources and buttons. A refusal (a workspace without streaming, a channel type Slack does
    not stream to) ends the stream and the answer is posted whole, so nothing is lost. A rate limit, Slack's
    5xx or a network failure only holds the text and cards back (until ``Retry-After``): they go out with the
    next batch or the stop. Stream calls go through a client without the SDK's retry handlers, which would
    sleep out a ``Retry-After`` inside the model's token stream (and could send an append twice)."""

    FLUSH_CHARS = 256  # as slack_sdk's own streamer: appendStream is a Tier 4 method, shared by all answers
    FLUSH_S = 1.0

    def __init__(self, client: AsyncWebClient, channel: str, thread_ts: str, team: str, user: str) -> None:
        self.client = _without_retries(client)
        self.channel, self.thread_ts, self.team, self.user = channel, thread_ts, team, user
        self.ts: str | None = None
        self.failed = False  # an append was refused: what it carried is missing from the stream
        self.ended = False  # Slack ended the stream (message_not_in_streaming_state)
        self.error = ""  # Slack's error code when starting failed
        self.done = False  # stopped (or given up on): nothing more goes into it
        self.text_sent = False  # any answer text shown (so far)
        self._open_task: dict[str, Any] | None = None  # "Searching the wiki", until the pages are read
        self._pending = ""
        self._chunks: list[dict[str, Any]] = []  # task cards not sent yet
        self._flushed_at = 0.0
        self._hold_until = 0.0  # rate-limited or failing: no append before this (monotonic)

    async def open(self) -> bool:
        """Start the stream with a "Searching the wiki" task card (in place of a placeholder message)."""
        self._open_task = {"type": "task_update", "id": SEARCH_TASK, "title": "Searching the wiki",
                           "status": "in_progress"}
        if await self._start(chunks=[self._open_task]):
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
        if self.ts is None:
            await self._start(chunks=chunks)
            return
        self._chunks += chunks
        await self._flush(force=True)

    async def add(self, text: str) -> None:
        if self.failed or self.done:
            return
        self._pending += escape_markdown(text)
        if self.ts is None:
            text, self._pending = self._pending, ""
            await self._start(text=text)
            return
        await self._flush()

    async def _start(self, *, text: str = "", chunks: list[dict[str, Any]] | None = None) -> bool:
        try:
            resp = await self.client.chat_startStream(channel=self.channel, thread_ts=self.thread_ts,
                                                      markdown_text=text or None, chunks=chunks,
                                                      task_display_mode="timeline" if chunks else None,
                                                      recipient_team_id=self.team,
                                                      recipient_user_id=self.user or None)
        except SLACK_FAILURES as exc:
            self.failed, self.error = True, slack_error(exc)
            log.info("answer streaming unavailable in %s (%s): posting it whole", self.channel, self.error)
            return False
        self.ts = str(resp["ts"])
        self._flushed_at = time.monotonic()
        self.text_sent = bool(text)
        return True

    async def _flush(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if now < self._hold_until or not (self._pending or self._chunks):
            return
        soon = now - self._flushed_at < self.FLUSH_S
        if not force and self.text_sent and len(self._pending) < self.FLUSH_CHARS and soon:
            return
        text, chunks = self._pending, self._chunks
        self._pending, self._chunks = "", []
        try:
            await self.client.chat_appendStream(channel=self.channel, ts=str(self.ts),
                                                markdown_text=text or None, chunks=chunks or None)
        except SLACK_FAILURES as exc:
            self._append_failed(exc, text, chunks)
            return
        self._flushed_at = now
        self.text_sent = self.text_sent or bool(text)

    def _append_failed(self, exc: BaseException, text: str, chunks: list[dict[str, Any]]) -> None:
        code = slack_error(exc)
        if code == "message_not_in_streaming_state":
            self.failed = self.ended = True
        elif transient(exc):  # held back: sent with the next batch, or the stop
            self._pending, self._chunks = text + self._pending, chunks + self._chunks
            self._hold_until = time.monotonic() + retry_after_s(exc)
            return
        else:
            self.failed = True
        log.info("appending to the answer stream in %s failed (%s): the answer follows whole", self.channel,
                 code)

    async def stop(self, blocks: list[dict[str, Any]], *, closing: str = "", silent_text: str = "") -> bool:
        """Flush what is left (``silent_text`` where no text was streamed, e.g. an extractive answer; then
        ``closing``, a failure said in the same message, the search card, if still open, then failed) and stop
        with ``blocks`` under the text. True when the stream now shows everything it was given; False when it
        had failed or Slack had ended it, or the stop failed. Either way it is done."""
        if self.ts is None or self.done or self.ended:
            return False
        self.done = True
        text = self._pending or ("" if self.text_sent else silent_text)
        text += closing if (self.text_sent or text) else closing.lstrip()
        chunks = list(self._chunks)
        if self._open_task is not None:
            chunks.append({**self._open_task, "status": "error" if closing else "complete"})
        if chunks and text:  # the text after the cards, in one ordered list
            chunks, text = [*chunks, {"type": "markdown_text", "text": text}], ""
        try:
            await self.client.chat_stopStream(channel=self.channel, ts=self.ts, markdown_text=text or None,
                                              chunks=chunks or None, blocks=blocks or None)
        except SLACK_FAILURES as exc:
            log.warning("could not finish the answer stream in %s: %s", self.channel, slack_error(exc))
            return False
        return not self.failed


def _without_retries(client: AsyncWebClient) -> AsyncWebClient:
    """The same client (session, token, base URL) without retry handlers."""
    if not client.retry_handlers:
        return client
    bare = copy.copy(client)
    bare.retry_handlers = []
    return bare


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


def _spaces(hits: Sequence[Hit]) -> str:
    spaces = sorted({h.evidence.space for h in hits if h.evidence.space})
    return f"in {', '.join(escape(s[:40]) for s in spaces[:5])}" if spaces else ""  # ≤ 256 characters


def read_pages_task(hits: Sequence[Hit]) -> dict[str, Any]:
    """A ``task_update`` chunk: the pages an answer is written from (their titles escaped, links only to
    http(s) URLs)."""
    pages: dict[str, str] = {}
    for h in hits:
        url = h.evidence.url
        if url.startswith(("https://", "http://")) and url not in pages:
            pages[url] = h.evidence.title or url
    sources = [{"type": "url", "url": url, "text": escape(title[:150])}
               for url, title in list(pages.items())[:MAX_TASK_SOURCES]]
    n = len({h.evidence.page_id for h in hits})
    return {"type": "task_update", "id": READ_TASK,
            "title": f"Read {n} page{'s' if n != 1 else ''} of the wiki",
            "status": "complete", **({"sources": sources} if sources else {})}
