"""Teams as a ``bot.core.conversations.Surface``.

In a personal chat the answer streams (``bot.teams.stream``): "Searching the wiki…", then which pages were
read,
then the text as it is generated, then the final message with citations, the AI label, feedback and the
Explain
card. In group chats and channels (where Teams does not stream), and wherever Teams refuses the stream, a
typing
indicator, then the whole answer. Follow-up suggestions are buttons added to the answer's card afterwards."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bot.core.contracts import ExplainResultLike, TurnResultLike
from bot.core.conversations import SurfaceError
from bot.core.messages import rate_limited_message
from bot.teams.activity import Activity
from bot.teams.connector import ConnectorClient
from bot.teams.render import answer_activity, explanation_card, text_activity, with_suggestions
from bot.teams.stream import TeamsStream
from pipeline.errors import RemoteError
from pipeline.types import Hit

log = logging.getLogger("evident.teams")


@dataclass
class TeamsReply:
    connector: ConnectorClient
    activity: Activity
    stream: TeamsStream | None = None  # personal chats: the answer streams
    shown: dict[str, Any] | None = None  # the answer as sent (suggestions are added to it)

    async def _send(self, payload: dict[str, object]) -> str:
        a = self.activity
        return await self.connector.send(a.service_url, a.conversation_id, payload, reply_to=a.id or None)

    # ------------------------------------------------------------------ Surface

    async def progress(self) -> str | None:
        if self.activity.conversation_type == "personal":
            self.stream = TeamsStream(self.connector, self.activity)
            await self.stream.inform("Searching the wiki…")
            if self.stream.open:
                return None
        try:
            await self._send({"type": "typing"})
        except RemoteError as exc:
            log.error("cannot post in %s: %s", self.activity.scope, exc)
            raise SurfaceError(self.activity.scope) from None
        return None

    def conversation_key(self, progress_id: str | None) -> str:
        return self.activity.conversation_key

    async def earlier_messages(self) -> list[tuple[str, str]] | None:
        # reading a channel's earlier replies needs Microsoft Graph permissions evident does not ask for
        return None

    def text_sink(self) -> Callable[[str], Awaitable[None]] | None:
        return self.stream.push if self.stream is not None and self.stream.open else None

    def retrieval_sink(self) -> Callable[[Sequence[Hit]], Awaitable[None]] | None:
        if self.stream is None or not self.stream.open:
            return None
        stream = self.stream

        async def read(hits: Sequence[Hit]) -> None:
            titles = list(dict.fromkeys(h.evidence.title for h in hits if h.evidence.title))
            shown = ", ".join(titles[:4]) + (f" and {len(titles) - 4} more" if len(titles) > 4 else "")
            await stream.inform(f"Reading {shown}…" if shown else "Reading the pages…")

        return read

    async def suggest(self, message_id: str, questions: list[str]) -> None:
        """Next-question buttons on the answer's card (clicked, they ask in the same conversation)."""
        if self.shown is None or not questions:
            return
        a = self.activity
        try:
            await self.connector.update(a.service_url, a.conversation_id, message_id,
                                        with_suggestions(self.shown, questions))
        except RemoteError as exc:
            log.info("could not add suggestions in %s: %s", a.scope, exc)

    async def answer(self, result: TurnResultLike) -> str | None:
        self.shown = answer_activity(result)
        if self.stream is not None:
            streamed = await self.stream.finish(self.shown)
            if streamed is not None or self.stream.cancelled:
                return streamed  # the user stopped it: nothing more
        try:
            return await self._send(self.shown) or None
        except RemoteError as exc:
            log.error("could not post the answer of turn %s: %s", result.turn_id, exc)
            return None

    async def say(self, text: str) -> None:
        """A short message; an open stream ends with it (a stream is never left open)."""
        stream = self.stream
        if stream is not None and (stream.open or stream.cancelled) and (
                await stream.finish(text_activity(text)) is not None or stream.cancelled):
            return
        try:
            await self._send(text_activity(text))
        except RemoteError as exc:
            log.error("could not post a message in %s: %s", self.activity.scope, exc)

    async def rate_limited(self, retry_after_s: int) -> None:
        await self.say(rate_limited_message(retry_after_s))

    async def explanation(self, result: ExplainResultLike) -> None:
        try:
            await self._send(explanation_card(result))
        except RemoteError as exc:
            log.error("could not post the explanation of turn %s: %s", result.turn_id, exc)
            raise SurfaceError(self.activity.scope) from None
