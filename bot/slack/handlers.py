"""Slack listeners: mentions, DMs, thread follow-ups, /ask, explain and feedback reactions.

Listeners only decide *whether* to act and then hand the work to a tracked background task, so Slack
gets its ack within milliseconds and a graceful shutdown can wait for answers still in flight.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from bot.core.contracts import EngineLike, TurnResultLike
from bot.core.dedup import Deduper, SeenSet
from bot.core.messages import EXPLAIN_FAILED, GENERIC, rate_limited_message, user_message
from bot.core.ratelimit import UserRateLimiter
from bot.slack.blocks import PLACEHOLDER, Rendered, render_answer, render_explanation
from bot.slack.mrkdwn import escape
from bot.slack.threads import (
    DM_MAIN,
    backfill,
    clean_question,
    conversation_key,
    is_from_bot,
    mentions,
    thread_of_key,
)
from pipeline.errors import StoreError
from pipeline.settings import Settings

log = logging.getLogger("evident.bot")

# Message subtypes that carry a new human question; everything else (edits, deletes, joins, ...) is ignored.
_QUESTION_SUBTYPES = {None, "file_share", "thread_broadcast", "bot_message"}
_FEEDBACK = {"+1": 1, "thumbsup": 1, "-1": -1, "thumbsdown": -1}
_EVENT_ID = "evident_event_id"  # context key set by the de-dup middleware
_USER_ID = re.compile(r"^[UW][A-Z0-9]+$")

Respond = Callable[..., Awaitable[Any]]


@dataclass
class Job:
    """One question to answer and where the answer goes."""

    team: str
    channel: str
    user: str
    question: str
    thread_ts: str | None  # reply in this thread; None: top level
    key: str | None  # None: the placeholder's ts starts the thread (in-channel /ask)
    backfill_thread: str | None = None  # thread to read earlier messages from
    before_ts: str = ""
    respond: Respond | None = None  # /ask: response_url for ephemeral replies
    ephemeral: bool = False
    asked_by: str | None = None  # /ask in channel: show who asked what
    history: list[tuple[str, str]] | None = field(default=None)
    placeholder: str | None = None  # ts of our "Searching the wiki…" message once posted


def _reaction_name(name: str) -> str:
    return name.split("::", 1)[0]  # drop skin tone: "+1::skin-tone-3"


class EvidentBot:
    """The bot's behaviour, independent of transport. Construct via :func:`bot.slack.app.build_bot`."""

    app: AsyncApp  # set by register()

    def __init__(self, settings: Settings, engine: EngineLike, client: AsyncWebClient, *,
                 limiter: UserRateLimiter | None = None) -> None:
        self.settings = settings
        self.engine = engine
        self.client = client
        self.dedup = Deduper(engine.store)
        self.limiter = limiter or UserRateLimiter(settings.user_rate_per_min)
        self._tasks: set[asyncio.Task[None]] = set()
        self._explained = SeenSet()
        self._closing = False

    # ------------------------------------------------------------------ task bookkeeping

    def spawn(self, coro: Coroutine[Any, Any, None], name: str,
              event_id: str | None = None) -> asyncio.Task[None] | None:
        """Run ``coro`` after the ack (once per ``event_id`` across restarts); keep the task referenced."""
        if self._closing:
            coro.close()
            log.warning("shutting down: dropped %s", name)
            return None
        task = asyncio.create_task(self._once(event_id, coro) if event_id else coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _once(self, event_id: str, coro: Coroutine[Any, Any, None]) -> None:
        try:
            first = await self.dedup.first_ever(event_id)
        except StoreError:
            log.exception("event store failed; processing %s anyway", event_id)
            first = True
        if not first:
            coro.close()
            log.info("ignored event %s: an earlier process handled it", event_id)
            return
        await coro

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def drain(self, timeout_s: float = 30.0) -> int:
        """Stop taking work and wait for in-flight answers; returns how many had to be cancelled."""
        self._closing = True
        pending = set(self._tasks)
        if not pending:
            return 0
        _done, still = await asyncio.wait(pending, timeout=timeout_s)
        for t in still:
            t.cancel()
        if still:
            await asyncio.gather(*still, return_exceptions=True)
        return len(still)

    # ------------------------------------------------------------------ registration

    def register(self, app: AsyncApp) -> None:
        self.app = app
        app.middleware(self._dedupe_events)
        app.event("app_mention")(self.on_app_mention)
        app.event("message")(self.on_message)
        app.event("reaction_added")(self.on_reaction_added)
        app.event("reaction_removed")(self.on_reaction_removed)
        app.command("/ask")(self.on_ask)
        app.error(self.on_error)

    async def _dedupe_events(self, body: dict[str, Any], context: dict[str, Any],
                             next: Callable[[], Awaitable[None]]) -> BoltResponse | None:
        """Drop Slack's redeliveries (same ``event_id``) seen by this process before any listener runs.

        The persistent check (earlier processes) happens in :meth:`spawn`, after the ack.
        """
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

    def _is_self(self, event: dict[str, Any], context: dict[str, Any]) -> bool:
        return is_from_bot(event, context.get("bot_user_id"), context.get("bot_id"))

    def _is_other_bot(self, event: dict[str, Any]) -> bool:
        return bool(event.get("bot_id")) or event.get("subtype") == "bot_message"

    def _spaces(self, channel: str) -> tuple[str, ...] | None:
        spaces = self.settings.channel_spaces.get(channel)
        return tuple(spaces) if spaces else None

    @staticmethod
    def _team(body: dict[str, Any], event: dict[str, Any], context: dict[str, Any]) -> str:
        return str(body.get("team_id") or event.get("team") or context.get("team_id") or "T")

    # ------------------------------------------------------------------ listeners

    async def on_app_mention(self, body: dict[str, Any], event: dict[str, Any], context: dict[str, Any]) -> None:
        if self._is_self(event, context) or (self.settings.ignore_bots and self._is_other_bot(event)):
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
            job = Job(team, channel, user, question, thread_ts=thread,
                      key=conversation_key(team, channel, thread or DM_MAIN))
        elif thread and thread != ts:
            job = Job(team, channel, user, question, thread_ts=thread,
                      key=conversation_key(team, channel, thread), backfill_thread=thread, before_ts=ts)
        else:
            job = Job(team, channel, user, question, thread_ts=ts, key=conversation_key(team, channel, ts))
        self.spawn(self._answer(job, context), f"answer:{channel}:{ts}", context.get(_EVENT_ID))

    async def on_message(self, body: dict[str, Any], event: dict[str, Any], context: dict[str, Any]) -> None:
        if event.get("subtype") not in _QUESTION_SUBTYPES or self._is_self(event, context):
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
            job = Job(team, channel, user, clean_question(text, bot_user), thread_ts=thread,
                      key=conversation_key(team, channel, thread or DM_MAIN))
            self.spawn(self._answer(job, context), f"answer:{channel}:{ts}", context.get(_EVENT_ID))
            return
        if mentions(text, bot_user) or not thread or thread == ts:
            return  # mentions arrive as app_mention too; top-level chatter is not for us
        question = clean_question(text, bot_user)
        if not question:
            return  # e.g. an image dropped into the thread: nothing to answer, and no need to nag
        key = conversation_key(team, channel, thread)
        job = Job(team, channel, user, question, thread_ts=thread, key=key)
        self.spawn(self._follow_up(job, ts, context), f"followup:{channel}:{ts}", context.get(_EVENT_ID))

    async def _follow_up(self, job: Job, ts: str, context: dict[str, Any]) -> None:
        """Answer a thread reply without a mention, but only in threads evident already answered in."""
        assert job.key is not None
        try:
            known = await self.engine.store.conversation_exists(job.key)
        except StoreError:
            log.exception("conversation lookup failed for a thread reply")
            return
        if known and self.dedup.claim_message(job.channel, ts):
            await self._answer(job, context)

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
        if ephemeral:
            key: str | None = conversation_key(team, channel, f"ask-{body.get('trigger_id', '')}")
        else:
            key = None
        job = Job(team, channel, user, question, thread_ts=None, key=key, respond=respond,
                  ephemeral=ephemeral, asked_by=user if _USER_ID.match(user) else None)
        self.spawn(self._answer(job, context), f"ask:{channel}:{user}")

    async def on_reaction_added(self, event: dict[str, Any], context: dict[str, Any]) -> None:
        target = self._reaction_target(event, context)
        if target is None:
            return
        channel, ts = target
        name = _reaction_name(str(event.get("reaction", "")))
        user = str(event.get("user") or "")
        if name in self.settings.explain_emojis:
            self.spawn(self._explain(channel, ts), f"explain:{channel}:{ts}", context.get(_EVENT_ID))
        elif name in _FEEDBACK:
            self.spawn(self._feedback(channel, ts, user, _FEEDBACK[name]), f"feedback:{channel}:{ts}",
                       context.get(_EVENT_ID))

    async def on_reaction_removed(self, event: dict[str, Any], context: dict[str, Any]) -> None:
        target = self._reaction_target(event, context)
        if target is None or _reaction_name(str(event.get("reaction", ""))) not in _FEEDBACK:
            return
        channel, ts = target
        self.spawn(self._feedback(channel, ts, str(event.get("user") or ""), None), f"unfeedback:{channel}:{ts}",
                   context.get(_EVENT_ID))

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

    async def _answer(self, job: Job, context: dict[str, Any]) -> None:
        """Answer ``job``; whatever goes wrong, the user gets a short message (never silence)."""
        try:
            await self._answer_unguarded(job, context)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("unexpected failure while answering in %s", job.channel)
            await self._tell(job, job.placeholder, GENERIC)

    async def _answer_unguarded(self, job: Job, context: dict[str, Any]) -> None:
        if not job.question:
            await self._tell(job, None, "Ask me a question about the wiki, e.g. _how do I request VPN access?_")
            return
        if not self.limiter.allow(job.user):
            await self._tell_rate_limited(job)
            return
        placeholder: str | None = None
        if not job.ephemeral:
            try:
                resp = await self.client.chat_postMessage(channel=job.channel, thread_ts=job.thread_ts,
                                                          text=PLACEHOLDER)
            except SlackClientError as exc:
                log.error("could not post the placeholder in %s: %s", job.channel, _slack_error(exc))
                if job.respond is not None:
                    await self._respond(job, "I couldn't post in this channel. Invite me first (`/invite @evident`).")
                return
            placeholder = job.placeholder = str(resp["ts"])
        key = job.key or conversation_key(job.team, job.channel, placeholder or "")
        history = job.history
        if job.backfill_thread and not await self._known(key):
            history = await self._backfill(job, context)
        try:
            result = await self.engine.ask(key, job.question, user_id=job.user or None,
                                           spaces=self._spaces(job.channel), history=history)
        except Exception as exc:  # every failure must reach the user; details only to the log
            log.exception("answering failed in %s", job.channel)
            await self._tell(job, placeholder, user_message(exc))
            return
        await self._deliver(job, placeholder, result)

    async def _known(self, key: str) -> bool:
        try:
            return bool(await self.engine.store.conversation_exists(key))
        except StoreError:
            log.exception("conversation lookup failed")
            return False

    async def _backfill(self, job: Job, context: dict[str, Any]) -> list[tuple[str, str]] | None:
        assert job.backfill_thread is not None
        try:
            return await backfill(self.client, job.channel, job.backfill_thread, job.before_ts,
                                  bot_user_id=context.get("bot_user_id"), bot_id=context.get("bot_id"))
        except SlackClientError as exc:
            log.warning("thread backfill failed in %s: %s", job.channel, _slack_error(exc))
            return None

    async def _deliver(self, job: Job, placeholder: str | None, result: TurnResultLike) -> None:
        if result.error and not result.answer.text.strip():
            await self._tell(job, placeholder, result.error)
            return
        rendered = render_answer(result, explain_emojis=self.settings.explain_emojis,
                                 asked_by=job.asked_by if not job.ephemeral else None,
                                 question=job.question)
        if result.error:
            rendered.blocks.append({"type": "context",
                                    "elements": [{"type": "mrkdwn", "text": f":warning: {escape(result.error)}"}]})
        if job.ephemeral:
            await self._respond(job, rendered.text, rendered)
            return
        assert placeholder is not None
        try:
            await self.client.chat_update(channel=job.channel, ts=placeholder, text=rendered.text,
                                          blocks=rendered.blocks)
        except SlackClientError as exc:
            log.error("could not update the answer in %s: %s", job.channel, _slack_error(exc))
            await self._tell(job, placeholder, "I found an answer but Slack wouldn't let me show it, sorry.")
            return
        try:
            await self.engine.store.set_turn_slack_ts(result.turn_id, placeholder)
        except StoreError:
            log.exception("could not link turn %s to its Slack message", result.turn_id)

    async def _tell(self, job: Job, placeholder: str | None, message: str) -> None:
        """Show a short plain message where the answer would have gone (never silent)."""
        text = escape(message)
        if job.ephemeral:
            await self._respond(job, text)
            return
        try:
            if placeholder:
                await self.client.chat_update(channel=job.channel, ts=placeholder, text=text, blocks=[])
            else:
                await self.client.chat_postMessage(channel=job.channel, thread_ts=job.thread_ts, text=text)
        except SlackClientError as exc:
            log.error("could not tell the user in %s: %s", job.channel, _slack_error(exc))

    async def _tell_rate_limited(self, job: Job) -> None:
        text = rate_limited_message(self.limiter.retry_after_s(job.user))
        if job.respond is not None:
            await self._respond(job, text)
            return
        try:
            await self.client.chat_postEphemeral(channel=job.channel, user=job.user, thread_ts=job.thread_ts,
                                                 text=text)
        except SlackClientError as exc:
            log.warning("could not send the rate-limit notice: %s", _slack_error(exc))

    async def _respond(self, job: Job, text: str, rendered: Rendered | None = None) -> None:
        assert job.respond is not None
        kwargs: dict[str, Any] = {"text": text, "response_type": "ephemeral", "replace_original": True}
        if rendered is not None:
            kwargs["blocks"] = rendered.blocks
        try:
            await job.respond(**kwargs)
        except (TimeoutError, SlackClientError, OSError) as exc:
            log.error("could not respond to /ask: %s", type(exc).__name__)

    async def _explain(self, channel: str, ts: str) -> None:
        turn = await self._turn(channel, ts)
        if turn is None:
            return
        turn_id = int(turn["id"])
        if not self._explained.add(str(turn_id)):
            return  # already explained (or being explained) in this thread
        thread = thread_of_key(str(turn.get("conversation_key") or "")) or ts
        try:
            result = await self.engine.explain(turn_id)
            text = render_explanation(result)
        except Exception:  # the user asked for something: they must hear back
            log.exception("explaining turn %s failed", turn_id)
            self._explained.discard(str(turn_id))
            text = EXPLAIN_FAILED
        try:
            await self.client.chat_postMessage(channel=channel, thread_ts=thread, text=text,
                                               unfurl_links=False, unfurl_media=False)
        except SlackClientError as exc:
            log.error("could not post the explanation in %s: %s", channel, _slack_error(exc))
            self._explained.discard(str(turn_id))

    async def _feedback(self, channel: str, ts: str, user: str, value: int | None) -> None:
        turn = await self._turn(channel, ts)
        if turn is None or not user:
            return
        try:
            if value is None:
                await self.engine.store.remove_feedback(int(turn["id"]), user)
            else:
                await self.engine.store.set_feedback(int(turn["id"]), user, value)
        except StoreError:
            log.exception("could not record feedback on turn %s", turn["id"])

    async def _turn(self, channel: str, ts: str) -> dict[str, Any] | None:
        try:
            return await self.engine.store.turn_by_slack_ts(channel, ts)
        except StoreError:
            log.exception("turn lookup failed")
            return None


def _slack_error(exc: SlackClientError) -> str:
    """The Slack error code only: response bodies can echo request data, never log them whole."""
    if isinstance(exc, SlackApiError):
        data = exc.response.data
        if isinstance(data, dict):
            return str(data.get("error", "unknown_error"))
        return f"HTTP {exc.response.status_code}"
    return type(exc).__name__
