"""Slack listeners: mentions, DMs, thread follow-ups, /ask, explain and feedback reactions.

Listeners only decide *whether* to act and then hand the work to a tracked background task, so Slack
gets its ack within milliseconds and a graceful shutdown can wait for answers still in flight.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_bolt.response import BoltResponse
from slack_sdk.web.async_client import AsyncWebClient

from bot.core.access import AccessPolicy
from bot.core.contracts import EngineLike
from bot.core.conversations import Conversations, Question
from bot.core.dedup import Deduper
from bot.core.ratelimit import UserRateLimiter
from bot.core.settings import ChatSettings
from bot.core.work import BackgroundWork
from bot.slack.assistant import AssistantListeners, ThreadContexts
from bot.slack.blocks import ASK_ACTION_PREFIX, EXPLAIN_ACTION, FEEDBACK_ACTION, PLACEHOLDER
from bot.slack.home import publish_home
from bot.slack.people import SlackPeople, SlackPlaces
from bot.slack.settings import SlackSettings
from bot.slack.stream import StreamRefusals
from bot.slack.surface import Respond, SlackExplanation, SlackThread
from bot.slack.threads import (
    DM_MAIN,
    channel_of_key,
    clean_question,
    conversation_key,
    mentions,
    thread_of_key,
)
from pipeline.turns import Turn

log = logging.getLogger("evident.bot")

# Message subtypes that carry a new human question; everything else (edits, deletes, joins, ...) is ignored.
_QUESTION_SUBTYPES = {None, "file_share", "thread_broadcast", "bot_message"}
_FEEDBACK = {"+1": 1, "thumbsup": 1, "-1": -1, "thumbsdown": -1}
_EVENT_ID = "evident_event_id"  # context key set by the de-dup middleware
_USER_ID = re.compile(r"^[UW][A-Z0-9]+$")

def _reaction_name(name: str) -> str:
    return name.split("::", 1)[0]  # drop skin tone: "+1::skin-tone-3"


class EvidentBot:
    """Slack's events and commands, translated for the conversation core. Construct via
    :func:`bot.slack.app.build_bot`."""

    app: AsyncApp  # set by register()

    def __init__(
        self,
        slack: SlackSettings,
        chat: ChatSettings,
        engine: EngineLike,
        client: AsyncWebClient,
        policy: AccessPolicy,
        *,
        limiter: UserRateLimiter | None = None,
    ) -> None:
        self.settings = slack
        self.engine = engine
        self.client = client
        self.dedup = Deduper(engine.store)
        self.work = BackgroundWork(self.dedup)
        self.core = Conversations.from_settings(engine, chat, policy, SlackPeople(client), limiter)
        self.places = SlackPlaces(ThreadContexts(engine.store))
        self.streams = StreamRefusals() if slack.stream else None

    def spawn(self, coro: Coroutine[Any, Any, None], name: str,
              event_id: str | None = None) -> asyncio.Task[None] | None:
        return self.work.spawn(coro, name, event_id)

    @staticmethod
    def event_id(context: dict[str, Any]) -> str | None:
        """The Events API event id the de-dup middleware recorded for this request, if any."""
        value = context.get(_EVENT_ID)
        return value if isinstance(value, str) else None

    @property
    def in_flight(self) -> int:
        return self.work.in_flight

    async def drain(self, timeout_s: float = 30.0) -> int:
        """Stop taking work and wait for in-flight answers; returns how many had to be cancelled."""
        return await self.work.drain(timeout_s)

    # ------------------------------------------------------------------ registration

    def register(self, app: AsyncApp) -> None:
        self.app = app
        app.middleware(self._dedupe_events)
        # DM threads in the AI-app panel (before "message")
        app.assistant(AssistantListeners(self).assistant())
        app.event("app_mention")(self.on_app_mention)
        app.event("message")(self.on_message)
        app.event("reaction_added")(self.on_reaction_added)
        app.event("reaction_removed")(self.on_reaction_removed)
        app.event("app_home_opened")(self.on_home_opened)
        app.event("member_joined_channel")(self.on_membership)
        app.event("member_left_channel")(self.on_membership)
        app.command("/ask")(self.on_ask)
        app.action(FEEDBACK_ACTION)(self.on_feedback_button)
        app.action(EXPLAIN_ACTION)(self.on_explain_button)
        app.action(re.compile(f"^{ASK_ACTION_PREFIX}\\d+$"))(self.on_suggestion)
        app.error(self.on_error)

    async def _dedupe_events(self, body: dict[str, Any], context: dict[str, Any],
                             next: Callable[[], Awaitable[None]]) -> BoltResponse | None:
        """Drop Slack's redeliveries (same ``event_id``) seen by this process before any listener runs, and
        refuse everything while shutting down (not acknowledged: Slack delivers events again, a button shows
        that it failed), so nothing is acknowledged and then dropped.

        The persistent check (earlier processes) happens in :meth:`spawn`, after the ack.
        """
        if self.work.closing:
            return BoltResponse(status=503, body="shutting down", headers={"Retry-After": "5"})
        event_id = body.get("event_id")
        if isinstance(event_id, str) and event_id:
            if not self.dedup.first_in_process(event_id):
                log.info("ignored redelivery of event %s", event_id)
                return BoltResponse(status=200, body="")
            context[_EVENT_ID] = event_id
        await next()
        return None

    async def on_error(self, error: Exception) -> None:
        log.error("unhandled error in a Slack listener: %s", type(error).__name__, exc_info=error)

    # ------------------------------------------------------------------ helpers

    def _is_other_bot(self, event: dict[str, Any]) -> bool:
        return bool(event.get("bot_id")) or event.get("subtype") == "bot_message"

    @staticmethod
    def _team(body: dict[str, Any], event: dict[str, Any], context: dict[str, Any]) -> str:
        return str(body.get("team_id") or event.get("team") or context.get("team_id") or "T")

    # ------------------------------------------------------------------ listeners

    async def on_app_mention(
        self, body: dict[str, Any], event: dict[str, Any], context: dict[str, Any]
    ) -> None:
        if self.settings.ignore_bots and self._is_other_bot(event):  # evident's own: Bolt drops them
            return
        if event.get("subtype") not in _QUESTION_SUBTYPES:
            return
        channel, ts = str(event.get("channel", "")), str(event.get("ts", ""))
        user = str(event.get("user") or "")
        if not channel or not ts or not self.dedup.claim_message(channel, ts):
            return
        team = self._team(body, event, context)
        question = clean_question(str(event.get("text") or ""), context.get("bot_user_id"))
        thread = event.get("thread_ts")
        if channel.startswith("D"):
            key, reply_in, late = conversation_key(team, channel, thread or DM_MAIN), thread, None
        elif thread and thread != ts:
            key, reply_in, late = conversation_key(team, channel, thread), thread, thread
        else:
            key, reply_in, late = conversation_key(team, channel, ts), ts, None
        surface = self.thread_surface(team, channel, user, question, reply_in, context, backfill_thread=late,
                                      before_ts=ts, recipient_team=str(event.get("user_team") or ""))
        q = Question(user, question, channel, key, join_late=late is not None,
                     shared_in=None if channel.startswith("D") else channel)
        self.spawn(self.core.answer(q, surface), f"answer:{channel}:{ts}", context.get(_EVENT_ID))

    async def on_message(self, body: dict[str, Any], event: dict[str, Any], context: dict[str, Any]) -> None:
        if event.get("subtype") not in _QUESTION_SUBTYPES:  # evident's own messages: Bolt drops them
            return
        if self.settings.ignore_bots and self._is_other_bot(event):
            return
        channel, ts = str(event.get("channel", "")), str(event.get("ts", ""))
        user = str(event.get("user") or "")
        text = str(event.get("text") or "")
        bot_user = context.get("bot_user_id")
        team = self._team(body, event, context)
        thread = event.get("thread_ts")
        if event.get("channel_type") == "im":
            if not self.dedup.claim_message(channel, ts):
                return
            question = clean_question(text, bot_user)
            q = Question(user, question, channel, conversation_key(team, channel, thread or DM_MAIN))
            surface = self.thread_surface(team, channel, user, question, thread, context)
            self.spawn(
                self.core.answer(q, surface),
                f"answer:{channel}:{ts}",
                context.get(_EVENT_ID),
            )
            return
        if mentions(text, bot_user) or not thread or thread == ts:
            return  # mentions arrive as app_mention too; top-level chatter is not for us
        question = clean_question(text, bot_user)
        if not question:
            return  # e.g. an image dropped into the thread: nothing to answer, and no need to nag
        q = Question(user, question, channel, conversation_key(team, channel, thread), shared_in=channel)
        surface = self.thread_surface(team, channel, user, question, thread, context,
                                      recipient_team=str(event.get("user_team") or ""))
        self.spawn(self.core.follow_up(q, surface, lambda: self.dedup.claim_message(channel, ts)),
                   f"followup:{channel}:{ts}", context.get(_EVENT_ID))

    async def on_ask(self, ack: Callable[..., Awaitable[Any]], body: dict[str, Any], respond: Respond,
                     context: dict[str, Any]) -> None:
        question = str(body.get("text") or "").strip()
        if not question:
            await ack(text="Usage: `/ask <your question about the wiki>`", response_type="ephemeral")
            return
        ephemeral = self.settings.ask_ephemeral
        if ephemeral:
            await ack(text=PLACEHOLDER, response_type="ephemeral")
        else:
            await ack()  # in channel: the placeholder message follows at once
        team = str(body.get("team_id") or context.get("team_id") or "T")
        channel, user = str(body.get("channel_id", "")), str(body.get("user_id", ""))
        key = conversation_key(team, channel, f"ask-{body.get('trigger_id', '')}") if ephemeral else None
        surface = self.thread_surface(
            team,
            channel,
            user,
            question,
            None,
            context,
            respond=respond,
            ephemeral=ephemeral,
            asked_by=user if _USER_ID.match(user) else None,
        )
        shared = None if ephemeral or channel.startswith("D") else channel
        self.spawn(self.core.answer(Question(user, question, channel, key, shared_in=shared), surface),
                   f"ask:{channel}:{user}")

    async def on_reaction_added(self, event: dict[str, Any], context: dict[str, Any]) -> None:
        target = self._reaction_target(event, context)
        if target is None:
            return
        channel, ts = target
        name = _reaction_name(str(event.get("reaction", "")))
        user = str(event.get("user") or "")
        if name in self.settings.explain_emojis:
            self.spawn(self._explain(channel, ts, user), f"explain:{channel}:{ts}", context.get(_EVENT_ID))
        elif name in _FEEDBACK:
            self.spawn(self._feedback(channel, ts, user, _FEEDBACK[name]), f"feedback:{channel}:{ts}",
                       context.get(_EVENT_ID))

    async def on_reaction_removed(self, event: dict[str, Any], context: dict[str, Any]) -> None:
        target = self._reaction_target(event, context)
        if target is None or _reaction_name(str(event.get("reaction", ""))) not in _FEEDBACK:
            return
        channel, ts = target
        self.spawn(
            self._feedback(channel, ts, str(event.get("user") or ""), None),
            f"unfeedback:{channel}:{ts}",
            context.get(_EVENT_ID),
        )

    async def on_membership(self, event: dict[str, Any]) -> None:
        """Someone joined or left a channel: who reads it changed, so its member list is read again."""
        self.core.policy.forget_place(str(event.get("channel") or ""))

    async def on_home_opened(self, event: dict[str, Any]) -> None:
        user = str(event.get("user") or "")
        if event.get("tab", "home") == "home" and user:
            self.spawn(publish_home(self.client, self.engine, user, admin=user in self.settings.admin_users),
                       f"home:{user}")

    async def on_feedback_button(self, ack: Callable[..., Awaitable[Any]], body: dict[str, Any],
                                 action: dict[str, Any]) -> None:
        await ack()
        kind, _, turn_id = str(action.get("value") or "").partition(":")
        value = {"up": 1, "down": -1}.get(kind)
        channel, user = _where(body)
        if value is not None and turn_id.isdigit():
            self.spawn(
                self._button_feedback(channel, int(turn_id), user, value), f"feedback-button:{turn_id}"
            )

    async def on_suggestion(
        self,
        ack: Callable[..., Awaitable[Any]],
        body: dict[str, Any],
        action: dict[str, Any],
        context: dict[str, Any],
    ) -> None:
        """A suggested next question was clicked: ask it in the answer's thread, as the one who clicked."""
        await ack()
        channel, user = _where(body)
        message = body.get("message") or {}
        thread = str(message.get("thread_ts") or message.get("ts") or "")
        question = str(action.get("value") or "").strip()
        if not (channel and thread and question):
            return
        team = str((body.get("team") or {}).get("id") or context.get("team_id") or "T")
        surface = self.thread_surface(team, channel, user, question, thread, context,
                                      assistant=channel.startswith("D"),
                                      recipient_team=str((body.get("user") or {}).get("team_id") or ""))
        self.spawn(self._suggested(user, question, team, channel, thread, surface),
                   f"suggestion:{channel}:{thread}")

    async def _suggested(self, user: str, question: str, team: str, channel: str, thread: str,
                         surface: SlackThread) -> None:
        """A clicked suggestion, asked where it was shown: the thread's place and space mapping (an assistant
        thread's viewed channel), exactly as a typed question there."""
        asker = await self.places.asker(user, channel, thread)
        q = Question.of(asker, question, conversation_key(team, channel, thread))
        await self.core.answer(q, surface)

    async def on_explain_button(self, ack: Callable[..., Awaitable[Any]], body: dict[str, Any],
                                action: dict[str, Any]) -> None:
        await ack()
        turn_id = str(action.get("value") or "")
        channel, user = _where(body)
        if turn_id.isdigit():
            self.spawn(self._button_explain(channel, int(turn_id), user), f"explain-button:{turn_id}")

    def _reaction_target(self, event: dict[str, Any], context: dict[str, Any]) -> tuple[str, str] | None:
        """(channel, ts) of a reacted-to message that evident wrote; None for anything else."""
        item = event.get("item") or {}
        if item.get("type") != "message" or not item.get("channel") or not item.get("ts"):
            return None
        bot_user = context.get("bot_user_id")
        if bot_user and event.get("item_user") and event.get("item_user") != bot_user:
            return None
        return str(item["channel"]), str(item["ts"])

    # ------------------------------------------------------------------ work (after the ack)

    def thread_surface(self, team: str, channel: str, user: str, question: str, thread_ts: str | None,
                context: dict[str, Any], **extra: Any) -> SlackThread:
        return SlackThread(
            self.client,
            team,
            channel,
            user,
            question,
            thread_ts,
            explain_emojis=self.settings.explain_emojis,
            bot_user_id=context.get("bot_user_id"),
            bot_id=context.get("bot_id"),
            streams=self.streams,
            **extra,
        )

    async def _explain(self, channel: str, ts: str, user: str) -> None:
        turn = await self.core.turn_for(channel, ts)
        if turn is None:
            return
        thread = thread_of_key(turn.conversation_key) or ts
        asker = await self.places.asker(user, channel, thread)
        await self.core.explain(turn, SlackExplanation(self.client, channel, thread), asker)

    async def _button_turn(self, channel: str, turn_id: int) -> Turn | None:
        """The turn a button names, if it was answered in the channel the button was clicked in."""
        turn = await self.core.turn_by_id(turn_id)
        if turn is None or channel_of_key(turn.conversation_key) != channel:
            return None
        return turn

    async def _button_feedback(self, channel: str, turn_id: int, user: str, value: int) -> None:
        turn = await self._button_turn(channel, turn_id)
        if turn is not None:
            await self.core.feedback(turn, user, value, platform="slack")

    async def _button_explain(self, channel: str, turn_id: int, user: str) -> None:
        turn = await self._button_turn(channel, turn_id)
        if turn is not None:
            thread = thread_of_key(turn.conversation_key) or turn.message_ref or ""
            asker = await self.places.asker(user, channel, thread)
            await self.core.explain(turn, SlackExplanation(self.client, channel, thread), asker)

    async def _feedback(self, channel: str, ts: str, user: str, value: int | None) -> None:
        turn = await self.core.turn_for(channel, ts)
        if turn is not None:
            await self.core.feedback(turn, user, value, platform="slack")


def _where(body: dict[str, Any]) -> tuple[str, str]:
    """(channel id, user id) of a block action."""
    channel = body.get("channel") or (body.get("container") or {})
    return str(channel.get("id") or channel.get("channel_id") or ""), str(
        (body.get("user") or {}).get("id") or ""
    )
