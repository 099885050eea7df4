"""Slack's AI-app surface ("Agents & AI Apps" side panel), on Bolt's ``AsyncAssistant``.

- ``assistant_thread_started``: a greeting and suggested prompts drawn from the pages answers cite most in
  the spaces in scope (generic ones until there is history).
- ``assistant_thread_context_changed``: the channel the user is looking at is remembered (in the store, so
  it survives restarts); questions in the thread are answered from that channel's spaces, within the mapping.
- a message in the thread: the question is answered with a live status ("is searching the wiki…") instead of
  a placeholder message; the thread gets the first question as its title.

Bolt hands this listener every threaded DM message, also replies in a thread under an ordinary DM answer.
Only threads Slack opened as assistant threads (``assistant_thread_started`` was seen, or the message says
so) take the assistant path; any other DM thread is answered as a thread (placeholder, then the answer).
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import Any, Protocol

from slack_bolt.context.assistant.thread_context import AssistantThreadContext
from slack_bolt.context.assistant.thread_context_store.async_store import AsyncAssistantThreadContextStore
from slack_bolt.middleware.assistant.async_assistant import AsyncAssistant
from slack_sdk.errors import SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from bot.core.access import Asker
from bot.core.contracts import EngineLike
from bot.core.conversations import Conversations, Question
from bot.core.dedup import Deduper
from bot.slack.people import SlackPlaces
from bot.slack.surface import SlackThread
from bot.slack.threads import clean_question, conversation_key
from pipeline.errors import EvidentError, StoreError
from pipeline.protocols import ConversationStore

log = logging.getLogger("evident.bot")

GREETING = "Hi! Ask me anything about the wiki. I answer with links to the pages I used."
GENERIC_PROMPTS = (
    {"title": "How do I get access?", "message": "How do I request access to a system?"},
    {"title": "Who is on call?", "message": "Who is on call this week?"},
    {"title": "Where is the runbook?", "message": "Where is the deployment runbook?"},
)
MAX_PROMPTS = 4


class ThreadContexts(AsyncAssistantThreadContextStore):
    """The channel each assistant thread is looking at, kept with the conversation in the store."""

    def __init__(self, store: ConversationStore) -> None:
        self.store = store

    @staticmethod
    def _key(channel_id: str, thread_ts: str) -> str:
        """Bolt names a thread by channel and ts only (no team), so contexts have a key space of their own."""
        return f"assistant-context:{channel_id}:{thread_ts}"

    async def save(self, *, channel_id: str, thread_ts: str, context: dict[str, str]) -> None:
        meta = await self.store.conversation_meta(self._key(channel_id, thread_ts))
        await self.store.set_conversation_meta(
            self._key(channel_id, thread_ts), {**meta, "assistant_context": context}
        )

    async def find(self, *, channel_id: str, thread_ts: str) -> AssistantThreadContext | None:
        context = (await self.store.conversation_meta(self._key(channel_id, thread_ts))).get(
            "assistant_context"
        )
        return (
            AssistantThreadContext(context)
            if isinstance(context, dict) and context.get("channel_id")
            else None
        )

    async def started(self, channel_id: str, thread_ts: str, context: dict[str, str]) -> None:
        """Remember that Slack opened this thread as an assistant thread, and the channel it looks at (one
        write: a question right behind the event finds both or neither)."""
        meta = await self.store.conversation_meta(self._key(channel_id, thread_ts))
        viewed = {"assistant_context": context} if context.get("channel_id") else {}
        await self.store.set_conversation_meta(self._key(channel_id, thread_ts),
                                               {**meta, "assistant_thread": True, **viewed})

    async def viewed_channel(self, channel_id: str, thread_ts: str) -> str | None:
        """The channel an assistant thread is looking at (its space mapping applies), or None."""
        found = await self.find(channel_id=channel_id, thread_ts=thread_ts)
        return str(found.channel_id) if found is not None else None

    async def is_assistant_thread(self, channel_id: str, thread_ts: str) -> bool:
        meta = await self.store.conversation_meta(self._key(channel_id, thread_ts))
        return bool(meta.get("assistant_thread") or meta.get("assistant_context"))


async def suggested_prompts(core: Conversations, asker: Asker) -> list[dict[str, str]]:
    """Prompts about the pages answers cite most that ``asker`` may read (within the place's spaces); generic
    ones without history."""
    try:
        titles = await core.popular_titles(asker)
    except EvidentError as exc:
        log.warning("suggested prompts without history: %s", exc)
        titles = []
    prompts = [{"title": f"About {title}"[:70], "message": f"What does the wiki say about {title}?"}
               for title in titles]
    return (prompts or list(GENERIC_PROMPTS))[:MAX_PROMPTS]


class AssistantHost(Protocol):
    """What the assistant listeners use of the Slack bot (``bot.slack.handlers.EvidentBot``)."""

    engine: EngineLike
    client: AsyncWebClient
    core: Conversations
    dedup: Deduper
    places: SlackPlaces

    def spawn(self, coro: Coroutine[Any, Any, None], name: str, event_id: str | None = None) -> Any: ...

    def event_id(self, context: dict[str, Any]) -> str | None: ...

    def thread_surface(self, team: str, channel: str, user: str, question: str, thread_ts: str | None,
                       context: dict[str, Any], **extra: Any) -> SlackThread: ...


class AssistantListeners:
    def __init__(self, bot: AssistantHost) -> None:
        self.bot = bot
        self.contexts = ThreadContexts(bot.engine.store)

    def assistant(self) -> AsyncAssistant:
        assistant = AsyncAssistant(thread_context_store=self.contexts)
        assistant.thread_started(self.on_thread_started)
        assistant.user_message(self.on_user_message)
        return assistant

    async def on_thread_started(self, payload: dict[str, Any]) -> None:
        thread = payload.get("assistant_thread") or {}
        channel, ts = str(thread.get("channel_id") or ""), str(thread.get("thread_ts") or "")
        context = thread.get("context") or {}
        if channel and ts:
            await self.contexts.started(channel, ts, context)
            asker = Asker(str(thread.get("user_id") or ""), str(context.get("channel_id") or channel))
            self.bot.spawn(self._greet(channel, ts, asker), f"greet:{channel}:{ts}")

    async def _greet(self, channel: str, thread_ts: str, asker: Asker) -> None:
        client = self.bot.client
        try:
            await client.chat_postMessage(channel=channel, thread_ts=thread_ts, text=GREETING)
            prompts = await suggested_prompts(self.bot.core, asker)
            await client.assistant_threads_setSuggestedPrompts(channel_id=channel, thread_ts=thread_ts,
                                                                title="Try asking", prompts=prompts)
        except SlackClientError as exc:
            log.warning("could not greet in assistant thread %s: %s", thread_ts, exc)

    async def on_user_message(
        self, payload: dict[str, Any], body: dict[str, Any], context: dict[str, Any]
    ) -> None:
        channel, ts = str(payload.get("channel") or ""), str(payload.get("ts") or "")
        thread = str(payload.get("thread_ts") or "")
        if not channel or not ts or not thread or not self.bot.dedup.claim_message(channel, ts):
            return
        user = str(payload.get("user") or "")
        question = clean_question(str(payload.get("text") or ""), context.get("bot_user_id"))
        team = str(body.get("team_id") or payload.get("team") or context.get("team_id") or "T")
        q = Question(user, question, channel, conversation_key(team, channel, thread))
        flagged = isinstance(payload.get("assistant_thread"), dict)
        self.bot.spawn(self._route(q, team, thread, context, flagged), f"assistant:{channel}:{ts}",
                       self.bot.event_id(context))

    async def _route(
        self, q: Question, team: str, thread_ts: str, context: dict[str, Any], flagged: bool
    ) -> None:
        """An assistant thread's question on the assistant path; any other DM thread's as a thread."""
        try:
            assistant = flagged or await self.contexts.is_assistant_thread(q.scope, thread_ts)
        except StoreError:
            log.exception(
                "could not tell whether %s is an assistant thread; answering it as a thread", thread_ts
            )
            assistant = False
        surface = self.bot.thread_surface(
            team, q.scope, q.user, q.text, thread_ts, context, assistant=assistant
        )
        if assistant:
            await self._answer(q, surface, thread_ts)
        else:
            await self.bot.core.answer(q, surface)

    async def _answer(self, q: Question, surface: Any, thread_ts: str) -> None:
        # the asker alone reads it; the spaces are those of the channel the user is looking at
        q = Question.of(await self.bot.places.asker(q.user, surface.channel, thread_ts), q.text, q.key)
        if q.key and not await self.bot.core.known(q.key) and q.text:
            try:
                await self.bot.client.assistant_threads_setTitle(
                    channel_id=surface.channel, thread_ts=thread_ts, title=q.text[:80]
                )
            except SlackClientError as exc:
                log.info("could not title assistant thread %s: %s", thread_ts, exc)
        await self.bot.core.answer(q, surface)
