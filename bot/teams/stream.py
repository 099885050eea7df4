"""Teams' streaming protocol for one answer in a personal chat (Teams streams in personal chats only).

1. an *informative* update ("Searching the wiki…") starts the stream; Teams answers with the stream's id;
2. *streaming* updates carry the answer's text **so far** (each extends the last), at most one a second
   (Teams throttles a stream to one request per second), numbered by ``streamSequence``;
3. the *final* message carries the whole answer with its citations, the AI label, the feedback loop and the
   Explain card (only the final message may carry them).

Every update is a ``typing`` activity with a ``streaminfo`` entity; the final one is a ``message``. When Teams
refuses the stream (403 ``ContentStreamNotAllowed``: not allowed here, too long, too large; 405; 400), the
stream stops and the answer is sent whole instead. When the user pressed *Stop* ("Content stream was
cancelled by user"), nothing more is sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bot.teams.activity import Activity
from bot.teams.connector import ConnectorClient
from bot.teams.render import escape
from pipeline.errors import RemoteError

log = logging.getLogger("evident.teams")

MIN_INTERVAL_S = 1.0  # Teams: one request per second per stream
MAX_INFORMATIVE = 1000  # characters of an informative update
REFUSED = (400, 403, 405)


class TeamsStream:
    def __init__(self, connector: ConnectorClient, activity: Activity, *, interval_s: float = MIN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.connector, self.activity = connector, activity
        self.interval_s, self.clock, self.sleep = interval_s, clock, sleep
        self.stream_id: str | None = None
        self.sequence = 0
        self.text = ""  # the answer so far
        self.sent_text = ""
        self.last_sent = float("-inf")
        self.refused = False  # Teams would not stream: send the answer whole
        self.cancelled = False  # the user stopped it: send nothing more
        self._lock = asyncio.Lock()  # one request at a time, in sequence order
        self._later: asyncio.Task[None] | None = None

    @property
    def open(self) -> bool:
        return self.stream_id is not None and not (self.refused or self.cancelled)

    async def inform(self, text: str) -> None:
        """An informative update. The first starts the stream (sent at once, for its id); later ones are sent
        in the background a second after the previous request, so the answer is not held up."""
        text = text[:MAX_INFORMATIVE]
        if self.stream_id is None:
            async with self._lock:
                await self._update("informative", text)
        elif self.open and self._later is None:
            self._later = asyncio.create_task(self._paced("informative", text))

    async def push(self, piece: str) -> None:
        """More of the answer's text; sent when a second has passed since the last request."""
        self.text += piece
        if (self.open and not self._lock.locked() and self.clock() - self.last_sent >= self.interval_s
                and self.text != self.sent_text):
            async with self._lock:
                await self._update("streaming", self.text)

    async def _paced(self, kind: str, text: str) -> None:
        async with self._lock:
            wait = self.interval_s - (self.clock() - self.last_sent)
            if wait > 0:
                await self.sleep(wait)
            await self._update(kind, text)

    async def finish(self, final: dict[str, Any]) -> str | None:
        """The final message (``final``: the whole answer activity). Its id, or None when the stream was not
        open: the caller then sends the answer whole (or, cancelled, not at all)."""
        if self._later is not None:
            await self._later
        if not self.open:
            return None
        async with self._lock:
            return await self._final(final)

    async def _final(self, final: dict[str, Any]) -> str | None:
        assert self.stream_id is not None
        wait = self.interval_s - (self.clock() - self.last_sent)
        if wait > 0:
            await self.sleep(wait)
        entities = [{"type": "streaminfo", "streamId": self.stream_id, "streamType": "final"},
                    *final.get("entities", [])]
        payload = {**final, "type": "message", "entities": entities,
                   "channelData": {**final.get("channelData", {}), "streamId": self.stream_id,
                                   "streamType": "final"}}
        if await self._send(payload) is None:
            return None
        return self.stream_id

    async def _update(self, kind: str, text: str) -> None:
        if self.refused or self.cancelled:
            return
        self.sequence += 1
        info: dict[str, Any] = {"type": "streaminfo", "streamType": kind, "streamSequence": self.sequence}
        if self.stream_id is not None:
            info["streamId"] = self.stream_id
        # the answer so far is page text as the model wrote it: escaped as the final message escapes it
        # (character by character, so each update still extends the last)
        shown = escape(text) if kind == "streaming" else text
        payload = {"type": "typing", "text": shown, "entities": [info],
                   "channelData": {k: v for k, v in info.items() if k != "type"}}
        if kind == "streaming":
            payload["textFormat"] = "markdown"
        new_id = await self._send(payload)
        if new_id is not None and self.stream_id is None:
            self.stream_id = new_id or None
            if self.stream_id is None:
                self.refused = True  # no id to continue with
        if kind == "streaming":
            self.sent_text = text

    async def _send(self, payload: dict[str, Any]) -> str | None:
        a = self.activity
        self.last_sent = self.clock()
        try:
            return await self.connector.send(a.service_url, a.conversation_id, payload, reply_to=a.id or None)
        except RemoteError as exc:
            if "cancelled by user" in str(exc).lower():
                self.cancelled = True
                log.info("the user stopped the answer in %s", a.scope)
            elif exc.status in REFUSED:
                self.refused = True
                log.info("Teams refused to stream in %s (%s): sending the answer whole", a.scope, exc)
            else:
                self.refused = True
                log.warning("streaming failed in %s: %s", a.scope, exc)
            return None
