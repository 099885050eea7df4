"""Teams as a ``bot.core.conversations.Surface``: a typing indicator while working, then the answer as a
reply in the same personal chat, group chat or channel reply chain."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bot.core.contracts import ExplainResultLike, TurnResultLike
from bot.core.conversations import SurfaceError
from bot.core.messages import rate_limited_message
from bot.teams.activity import Activity
from bot.teams.connector import ConnectorClient
from bot.teams.render import answer_activity, explanation_card, text_activity
from pipeline.errors import RemoteError

log = logging.getLogger("evident.teams")


@dataclass
class TeamsReply:
    connector: ConnectorClient
    activity: Activity

    async def _send(self, payload: dict[str, object]) -> str:
        a = self.activity
        return await self.connector.send(a.service_url, a.conversation_id, payload, reply_to=a.id or None)

    # ------------------------------------------------------------------ Surface

    async def progress(self) -> str | None:
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

    def text_sink(self) -> None:
        return None  # answers arrive whole after the typing indicator

    async def suggest(self, message_id: str, questions: list[str]) -> None:
        return None  # Teams shows suggested actions in personal chats only: not offered yet

    async def answer(self, result: TurnResultLike) -> str | None:
        try:
            return await self._send(answer_activity(result)) or None
        except RemoteError as exc:
            log.error("could not post the answer of turn %s: %s", result.turn_id, exc)
            return None

    async def say(self, text: str) -> None:
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
