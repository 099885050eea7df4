"""What evident does with each Teams activity: route it to the conversation core, answer invokes at once.

message          a question (personal chat: always; group chats: only when @mentioned, since a group chat is
                 one running conversation and people talk among themselves there; channels: when @mentioned,
                 or a reply without a mention in a reply chain evident already answered in, like a Slack
                 thread) or the "Why this answer?" button (``value.action``)
messageReaction  an explain reaction (``EVIDENT_TEAMS_EXPLAIN_REACTIONS``) on one of evident's answers
invoke           ``message/submitAction``: Teams' feedback buttons (👍/👎 with optional text)

Work runs after the HTTP response (Teams retries a request that takes over ~15 s) and at most once per
activity id, across restarts.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from bot.core.access import AccessPolicy, Asker
from bot.core.contracts import EngineLike
from bot.core.conversations import Conversations, Question
from bot.core.dedup import Deduper
from bot.core.ratelimit import UserRateLimiter
from bot.core.settings import ChatSettings
from bot.core.work import BackgroundWork
from bot.teams.activity import Activity
from bot.teams.connector import ConnectorClient
from bot.teams.people import TeamsPeople
from bot.teams.render import ASK_ACTION, EXPLAIN_ACTION
from bot.teams.settings import TeamsSettings
from bot.teams.surface import TeamsReply

log = logging.getLogger("evident.teams")

FEEDBACK_VALUES = {"like": 1, "dislike": -1}
InvokeResponse = tuple[int, dict[str, Any] | None]


class TeamsBot:
    def __init__(
        self,
        teams: TeamsSettings,
        chat: ChatSettings,
        engine: EngineLike,
        connector: ConnectorClient,
        policy: AccessPolicy,
        *,
        limiter: UserRateLimiter | None = None,
    ) -> None:
        self.connector = connector
        self.work = BackgroundWork(Deduper(engine.store))
        self.people = TeamsPeople(connector, teams.tenant_id)
        self.core = Conversations.from_settings(engine, chat, policy, self.people, limiter)
        self.explain_reactions = {r.strip().lower() for r in teams.explain_reactions}

    @property
    def in_flight(self) -> int:
        return self.work.in_flight

    async def drain(self, timeout_s: float = 30.0) -> int:
        return await self.work.drain(timeout_s)

    def on_activity(self, activity: Activity) -> InvokeResponse:
        """Decide at once what to do; the work itself runs in the background. Returns the HTTP response:
        503 while shutting down, so the Bot Framework delivers the activity again instead of it being lost."""
        if self.work.closing:
            return 503, {"error": "shutting down"}
        # another Bot Framework channel (Web Chat, Direct Line): not ours
        if activity.bot_channel != "msteams":
            log.info("ignored an activity from the %r channel", activity.bot_channel)
            return 200, None
        event_id = f"teams:{activity.conversation_id}:{activity.id}" if activity.id else None
        self.people.saw(activity)  # verified: its service URL may be asked about its members
        reply = TeamsReply(self.connector, activity)
        if activity.type == "message":
            action = activity.value.get("action")
            if action == EXPLAIN_ACTION:
                self._spawn(
                    self._explain_turn(activity, reply, activity.value.get("turn")), "explain", event_id
                )
            elif action == ASK_ACTION and isinstance(activity.value.get("question"), str):
                # a suggested question, clicked: asked by whoever clicked, where they clicked
                q = Question.of(_asker(activity), str(activity.value["question"]).strip()[:500],
                                activity.conversation_key)
                self._spawn(self.core.answer(q, reply), "answer", event_id)
            elif activity.text:
                self._question(activity, reply, event_id)
        elif activity.type == "conversationUpdate":  # members added or removed: the roster is read again
            self.core.policy.forget_place(activity.scope)
        elif activity.type == "messageReaction":
            if self.explain_reactions & {r.lower() for r in activity.reactions_added}:
                self._spawn(self._explain_message(activity, reply), "explain", event_id)
        elif activity.type == "invoke":
            if activity.name == "message/submitAction" and activity.value.get("actionName") == "feedback":
                self._spawn(self._feedback(activity), "feedback", event_id)
                return 200, {}
            return 200, {}  # other invokes (card refresh, …): nothing to do, but never an error in the client
        return 200, None

    def _spawn(self, coro: Any, what: str, event_id: str | None) -> None:
        self.work.spawn(coro, f"teams-{what}", event_id)

    def _question(self, activity: Activity, reply: TeamsReply, event_id: str | None) -> None:
        q = Question.of(_asker(activity), activity.question(), activity.conversation_key)
        if activity.conversation_type == "personal" or activity.mentions_bot:
            self._spawn(self.core.answer(q, reply), "answer", event_id)
        # a reply in a chain without a mention (RSC permissions)
        elif activity.conversation_type == "channel":
            self._spawn(self.core.follow_up(q, reply, lambda: True), "followup", event_id)
        # a group chat message without a mention is people talking among themselves: not for evident

    async def _explain_message(self, activity: Activity, reply: TeamsReply) -> None:
        turn = await self.core.turn_for(activity.conversation_key, activity.reply_to_id)
        if turn is not None:
            await self.core.explain(turn, reply, _asker(activity))

    async def _explain_turn(self, activity: Activity, reply: TeamsReply, turn_id: Any) -> None:
        turn = await self.core.turn_by_id(turn_id)
        if turn is None or turn.conversation_key != activity.conversation_key:
            log.info("ignored an explain button for turn %r from another conversation", turn_id)
            return
        await self.core.explain(turn, reply, _asker(activity))

    async def _feedback(self, activity: Activity) -> None:
        action = activity.value.get("actionValue")
        action = action if isinstance(action, dict) else {}
        value = FEEDBACK_VALUES.get(str(action.get("reaction", "")).lower())
        if value is None:
            return
        turn = await self.core.turn_for(activity.conversation_key, activity.reply_to_id)
        if turn is not None:
            await self.core.feedback(
                turn, activity.user_id, value, platform="teams", comment=_comment(action)
            )


def _asker(activity: Activity) -> Asker:
    """Who asks and where the reply is read: the chat or channel's members, or the asker alone."""
    return Asker(activity.user_id, activity.scope, activity.team_id, activity.shared_in)


def _comment(action: dict[str, Any]) -> str | None:
    """The free text of Teams' feedback form (``feedback`` is a JSON string holding ``feedbackText``)."""
    raw = action.get("feedback")
    try:
        text = json.loads(raw).get("feedbackText") if isinstance(raw, str) else None
    except (ValueError, AttributeError):
        text = None
    return text.strip()[:2000] or None if isinstance(text, str) else None
