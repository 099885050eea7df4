"""Slack as a ``bot.core.conversations.Surface``: a thread (the answer streamed in where Slack streams, else a
placeholder, then the answer in its place) or an ephemeral ``/ask`` reply through its ``response_url``."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from slack_sdk.errors import SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from bot.core.contracts import ExplainResultLike, TurnResultLike
from bot.core.conversations import SurfaceError
from bot.core.messages import rate_limited_message
from bot.slack.blocks import PLACEHOLDER, Rendered, render_answer, render_explanation, suggestion_buttons
from bot.slack.errors import SLACK_FAILURES, slack_error
from bot.slack.mrkdwn import escape, escape_markdown
from bot.slack.stream import SlackStream, StreamRefusals
from bot.slack.threads import backfill, conversation_key
from pipeline.types import Hit

log = logging.getLogger("evident.bot")

Respond = Callable[..., Awaitable[Any]]


@dataclass
class SlackThread:
    """Where one question's answer goes in Slack."""

    client: AsyncWebClient
    team: str
    channel: str
    user: str
    question: str
    thread_ts: str | None  # reply in this thread; None: top level
    explain_emojis: tuple[str, ...] = ()
    respond: Respond | None = None  # /ask: response_url for ephemeral replies
    ephemeral: bool = False
    asked_by: str | None = None  # /ask in channel: show who asked what
    backfill_thread: str | None = None  # thread to read earlier messages from
    before_ts: str = ""
    bot_user_id: str | None = None
    bot_id: str | None = None
    placeholder: str | None = None  # ts of our "Searching the wiki…" message once posted
    assistant: bool = False  # an AI-app assistant thread: a live status instead of a placeholder message
    stream: SlackStream | None = None  # the answer streaming in, once started
    streams: StreamRefusals | None = None  # stream into a (non-assistant) thread unless refused; None: never
    recipient_team: str = ""  # the asker's own workspace where it is not ``team`` (Slack Connect)
    shown: Rendered | None = None  # the answer as last rendered (suggestions are added to it)

    # ------------------------------------------------------------------ Surface

    async def progress(self) -> str | None:
        if self.ephemeral:
            return None  # the /ask ack already showed the placeholder
        if self.assistant and await self._status("is searching the wiki…"):
            return None
        if (ts := await self._open_stream()) is not None:
            return ts
        try:
            resp = await self.client.chat_postMessage(
                channel=self.channel, thread_ts=self.thread_ts, text=PLACEHOLDER
            )
        except SLACK_FAILURES as exc:
            log.error("could not post the placeholder in %s: %s", self.channel, slack_error(exc))
            if self.respond is not None:
                await self._respond("I couldn't post in this channel. Invite me first (`/invite @evident`).")
            raise SurfaceError(self.channel) from None
        self.placeholder = str(resp["ts"])
        return self.placeholder

    async def _open_stream(self) -> str | None:
        """A channel or DM thread: the answer streams in, opened with a "Searching the wiki" task card in
        place of the placeholder; None where this thread cannot stream (the placeholder path follows)."""
        if self.streams is None or self.assistant or self.thread_ts is None or self.ephemeral:
            return None
        if not self.user and not self.channel.startswith("D"):
            return None  # a channel streams to one recipient: none to name (a bot's message)
        if not self.streams.allowed(self.channel):
            return None
        stream = SlackStream(self.client, self.channel, self.thread_ts, self.recipient_team or self.team,
                             self.user)
        if not await stream.open():
            self.streams.refused(self.channel, stream.error)
            return None
        self.stream = stream
        return stream.ts

    async def _status(self, status: str) -> bool:
        """Show Slack's "<app> is searching…" status in an assistant thread; False where Slack refuses."""
        assert self.thread_ts is not None
        try:
            await self.client.assistant_threads_setStatus(
                channel_id=self.channel, thread_ts=self.thread_ts, status=status,
                loading_messages=["Searching the wiki…", "Reading the pages…", "Writing the answer…"])
            return True
        except SLACK_FAILURES as exc:
            log.info("no assistant status in %s (%s): posting a placeholder", self.channel, slack_error(exc))
            return False

    async def _post(self, rendered: Rendered) -> str | None:
        try:
            resp = await self.client.chat_postMessage(channel=self.channel, thread_ts=self.thread_ts,
                                                      text=rendered.text, blocks=rendered.blocks)
        except SLACK_FAILURES as exc:
            log.error("could not post the answer in %s: %s", self.channel, slack_error(exc))
            return None
        return str(resp["ts"])

    def conversation_key(self, progress_id: str | None) -> str:
        return conversation_key(self.team, self.channel, progress_id or "")

    async def earlier_messages(self) -> list[tuple[str, str]] | None:
        if self.backfill_thread is None:
            return None
        try:
            return await backfill(self.client, self.channel, self.backfill_thread, self.before_ts,
                                  bot_user_id=self.bot_user_id, bot_id=self.bot_id)
        except SLACK_FAILURES as exc:
            log.warning("thread backfill failed in %s: %s", self.channel, slack_error(exc))
            return None

    async def suggest(self, message_id: str, questions: list[str]) -> None:
        """Add next-question buttons to the answer (a streamed answer also gets its linked rendering)."""
        if self.shown is None or self.ephemeral or not questions:
            return
        try:
            await self.client.chat_update(channel=self.channel, ts=message_id, text=self.shown.text,
                                          blocks=[*self.shown.blocks, suggestion_buttons(questions)])
        except SLACK_FAILURES as exc:
            log.info("could not add suggestions in %s: %s", self.channel, slack_error(exc))

    def text_sink(self) -> Callable[[str], Awaitable[None]] | None:
        """Threads stream the answer as it is generated (chat.startStream/appendStream/stopStream)."""
        stream = self._stream()
        return stream.add if stream is not None else None

    def retrieval_sink(self) -> Callable[[Sequence[Hit]], Awaitable[None]] | None:
        """A streamed answer starts with a task card: the pages read, each a source link."""
        stream = self._stream()
        return stream.task if stream is not None else None

    def _stream(self) -> SlackStream | None:
        if self.stream is not None:  # opened in place of the placeholder
            return None if self.stream.failed else self.stream
        if self.streams is None or not self.assistant or self.placeholder is not None or self.ephemeral:
            return None
        if self.thread_ts is not None:
            self.stream = SlackStream(self.client, self.channel, self.thread_ts, self.team, self.user)
        return self.stream

    async def answer(self, result: TurnResultLike) -> str | None:
        rendered = render_answer(
            result,
            explain_emojis=self.explain_emojis,
            asked_by=self.asked_by if not self.ephemeral else None,
            question=self.question,
            buttons=not self.ephemeral,
        )
        if result.error:
            rendered.blocks.append(
                {
                    "type": "context",
                    "elements": [{"type": "mrkdwn", "text": f":warning: {escape(result.error)}"}],
                }
            )
        self.shown = rendered
        if self.ephemeral:
            await self._respond(rendered.text, rendered)
            return None
        if self.stream is not None and self.stream.ts is not None:
            return await self._finish_stream(self.stream, rendered, escape_markdown(result.answer.text))
        if self.placeholder is None:  # assistant thread: the reply also clears the status
            return await self._post(rendered)
        if await self._replace(self.placeholder, rendered):
            return self.placeholder
        await self.say("I found an answer but Slack wouldn't let me show it, sorry.")
        return None

    async def _finish_stream(self, stream: SlackStream, rendered: Rendered, text: str) -> str | None:
        """End the stream with the sources and buttons under the text, then show the same rendering as an
        unstreamed answer (linked ``[n]`` markers). Where Slack ended the stream first, or streaming failed
        midway, the partial message is replaced by the whole answer (or removed, and the answer posted)."""
        assert stream.ts is not None
        tail = [b for b in rendered.blocks if b.get("type") != "section"]  # sources, notes, buttons
        if await stream.stop(tail, silent_text=text):  # the text too, where none streamed in
            await self._replace(stream.ts, rendered, quiet=True)
            return stream.ts
        if await self._replace(stream.ts, rendered):
            return stream.ts
        with contextlib.suppress(*SLACK_FAILURES):
            await self.client.chat_delete(channel=self.channel, ts=stream.ts)
        return await self._post(rendered)

    async def _replace(self, ts: str, rendered: Rendered, *, quiet: bool = False) -> bool:
        try:
            await self.client.chat_update(
                channel=self.channel, ts=ts, text=rendered.text, blocks=rendered.blocks
            )
        except SLACK_FAILURES as exc:
            log.log(logging.INFO if quiet else logging.ERROR, "could not update the answer in %s: %s",
                    self.channel, slack_error(exc))
            return False
        return True

    async def say(self, text: str) -> None:
        message = escape(text)
        if self.ephemeral:
            await self._respond(message)
            return
        stream = self.stream
        if stream is not None and stream.ts is not None and not stream.done:
            # a failure (LLM, cancellation, shutdown) after text streamed in: said in the same message, ended
            if await stream.stop([], closing=f"\n\n:warning: {escape_markdown(text)}"):
                return
            if await self._replace(stream.ts, Rendered(message, [])):
                return
        try:
            if self.placeholder:
                await self.client.chat_update(
                    channel=self.channel, ts=self.placeholder, text=message, blocks=[]
                )
            else:
                await self.client.chat_postMessage(
                    channel=self.channel, thread_ts=self.thread_ts, text=message
                )
        except SLACK_FAILURES as exc:
            log.error("could not tell the user in %s: %s", self.channel, slack_error(exc))

    async def rate_limited(self, retry_after_s: int) -> None:
        text = rate_limited_message(retry_after_s)
        if self.respond is not None:
            await self._respond(text)
            return
        try:
            await self.client.chat_postEphemeral(
                channel=self.channel, user=self.user, thread_ts=self.thread_ts, text=text
            )
        except SLACK_FAILURES as exc:
            log.warning("could not send the rate-limit notice: %s", slack_error(exc))

    async def _respond(self, text: str, rendered: Rendered | None = None) -> None:
        assert self.respond is not None
        kwargs: dict[str, Any] = {"text": text, "response_type": "ephemeral", "replace_original": True}
        if rendered is not None:
            kwargs["blocks"] = rendered.blocks
        try:
            await self.respond(**kwargs)
        except (TimeoutError, SlackClientError, OSError) as exc:
            log.error("could not respond to /ask: %s", type(exc).__name__)


@dataclass
class SlackExplanation:
    """Where an explanation goes: the thread of the explained answer."""

    client: AsyncWebClient
    channel: str
    thread_ts: str

    async def explanation(self, result: ExplainResultLike) -> None:
        await self._post(render_explanation(result))

    async def say(self, text: str) -> None:
        with contextlib.suppress(SurfaceError):  # already logged; nothing more to tell anyone
            await self._post(text)

    async def _post(self, text: str) -> None:
        try:
            await self.client.chat_postMessage(channel=self.channel, thread_ts=self.thread_ts, text=text,
                                               unfurl_links=False, unfurl_media=False)
        except SLACK_FAILURES as exc:
            log.error("could not post the explanation in %s: %s", self.channel, slack_error(exc))
            raise SurfaceError(self.channel) from None
