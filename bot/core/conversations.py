"""What evident does with a question, an explain request or feedback, whatever platform it came from.

A platform adapter turns its events into a ``Question`` (or a message reference for reactions) and a
``Surface``: the place the answer goes (a Slack thread, an ephemeral ``/ask`` reply, a Teams reply
chain) and how to show progress, an answer, an explanation or a short message there. ``Conversations``
owns the flow: empty questions, per-user rate limits, conversation memory (including earlier messages
when evident joins a thread late), answering through the engine, linking the answer's message to its
turn, explaining a turn at most once, and recording feedback. Whatever goes wrong, the user hears back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bot.core.access import AccessPolicy, Asker, PeopleSource
from bot.core.contracts import EngineLike, ExplainResultLike, TurnResultLike
from bot.core.dedup import SeenSet
from bot.core.messages import EXPLAIN_FAILED, GENERIC, NOTHING_TO_EXPLAIN, RESTARTING, user_message
from bot.core.ratelimit import UserRateLimiter
from bot.core.scope import NOT_CONNECTED
from bot.core.settings import ChatSettings
from pipeline.access.scope import AccessScope
from pipeline.errors import EvidentError, StoreError
from pipeline.turns import Turn
from pipeline.types import Hit

log = logging.getLogger("evident.bot")
TextSink = Callable[[str], Awaitable[None]]
RetrievedSink = Callable[[Sequence[Hit]], Awaitable[None]]

SAY_ON_SHUTDOWN_S = 5.0  # how long a cancelled answer may take to tell the user
EMPTY_QUESTION = "Ask me a question about the wiki, e.g. _how do I request VPN access?_"


class SurfaceError(Exception):
    """The platform would not let evident post where the answer should go (the adapter told the user)."""


class Surface(Protocol):
    """Where one question's answer goes, in the platform's own terms."""

    async def progress(self) -> str | None:
        """Show that evident is working; the message id to answer in place, or None (nothing shown).
        Raises ``SurfaceError`` when nothing can be posted there at all."""

    def conversation_key(self, progress_id: str | None) -> str:
        """The conversation's key when the question did not come with one (a new thread)."""

    async def earlier_messages(self) -> list[tuple[str, str]] | None:
        """(question, answer) pairs of the conversation before evident joined it, or None."""

    def text_sink(self) -> TextSink | None:
        """Where the answer's text goes while it is generated (a platform stream), or None: shown whole."""

    def retrieval_sink(self) -> RetrievedSink | None:
        """Where the evidence read for the answer is shown before the answer is written (Slack's task card,
        a Teams informative update), or None."""

    async def answer(self, result: TurnResultLike) -> str | None:
        """Show the answer (replacing the progress message or completing the stream); the message id to link
        the turn to, or None."""

    async def say(self, text: str) -> None:
        """A short plain message where the answer would have gone (never silence)."""

    async def suggest(self, message_id: str, questions: list[str]) -> None:
        """Offer ``questions`` as next questions with the answer ``message_id`` (a no-op where
        unsupported)."""

    async def rate_limited(self, retry_after_s: int) -> None:
        """Tell the asker to slow down, in whole seconds (privately where the platform allows)."""


class ExplanationSurface(Protocol):
    async def explanation(self, result: ExplainResultLike) -> None:
        """Post the explanation; ``SurfaceError`` when the platform refuses."""

    async def say(self, text: str) -> None: ...


@dataclass(frozen=True)
class Question:
    """An inbound question, whatever the platform."""

    user: str
    text: str
    scope: str  # the channel / chat whose space mapping applies
    key: str | None  # the conversation; None: it starts with the progress message (in-channel /ask)
    history: list[tuple[str, str]] | None = None
    join_late: bool = False  # read earlier messages when evident has not seen this conversation yet
    team: str = ""  # the team whose mapping applies when the channel has none (Teams)
    shared_in: str | None = None  # the place others read the answer in (a channel); None: the asker alone

    @property
    def asker(self) -> Asker:
        return Asker(self.user, self.scope, self.team, self.shared_in)

    @classmethod
    def of(cls, asker: Asker, text: str, key: str | None, **extra: Any) -> Question:
        return cls(asker.user, text, asker.scope, key, team=asker.team, shared_in=asker.shared_in, **extra)


class Conversations:
    def __init__(
        self,
        engine: EngineLike,
        limiter: UserRateLimiter,
        policy: AccessPolicy,
        people: PeopleSource,
        *,
        suggest: bool = False,
    ) -> None:
        self.engine = engine
        self.limiter = limiter
        self.policy = policy  # the one place an access scope comes from
        self.people = people  # the platform's people and places, for the policy
        self.suggest = suggest  # follow-up question suggestions under answers
        self._explained = SeenSet()

    @classmethod
    def from_settings(cls, engine: EngineLike, chat: ChatSettings, policy: AccessPolicy, people: PeopleSource,
                      limiter: UserRateLimiter | None = None) -> Conversations:
        """The core every platform adapter uses, built from the conversation settings."""
        return cls(engine, limiter or UserRateLimiter(chat.user_rate_per_min), policy, people,
                   suggest=chat.followup_suggestions)

    async def scope(self, asker: Asker) -> AccessScope:
        """What an answer to ``asker`` may draw on (``bot.core.access``)."""
        return await self.policy.scope(asker, self.people)

    async def popular_titles(self, asker: Asker, limit: int = 50) -> list[str]:
        """Titles of the pages answers cited most that ``asker``'s audience may read (suggested prompts)."""
        pages = await self.engine.store.popular_pages(limit)
        visible = await self.engine.visible([eid for *_, eid in pages], await self.scope(asker))
        return [title for title, _, _, eid in pages if eid in visible]

    # ------------------------------------------------------------------ questions

    async def answer(self, q: Question, surface: Surface) -> None:
        """Answer ``q`` on ``surface``; whatever goes wrong, the user gets a short message."""
        try:
            await self._answer(q, surface)
        except asyncio.CancelledError:  # shutdown gave up on this answer: say so rather than leave silence
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(surface.say(RESTARTING)), SAY_ON_SHUTDOWN_S)
            raise
        except SurfaceError:
            return
        except Exception:
            log.exception("unexpected failure while answering in %s", q.scope)
            await surface.say(GENERIC)

    async def follow_up(self, q: Question, surface: Surface, claim: Callable[[], bool]) -> None:
        """A reply without a mention: answered only in conversations evident already answered in."""
        assert q.key is not None
        try:
            known = await self.engine.store.conversation_exists(q.key)
        except StoreError:
            log.exception("conversation lookup failed for a thread reply")
            return
        if known and claim():
            await self.answer(q, surface)

    async def _answer(self, q: Question, surface: Surface) -> None:
        if not q.text:
            await surface.say(EMPTY_QUESTION)
            return
        if not self.limiter.allow(q.user):
            await surface.rate_limited(self.limiter.retry_after_s(q.user))
            return
        if not self.policy.connected(q.asker):
            await surface.say(NOT_CONNECTED)
            return
        progress = await surface.progress()
        key = q.key or surface.conversation_key(progress)
        history = q.history
        if q.join_late and not await self.known(key):
            history = await surface.earlier_messages()
        try:
            result = await self.engine.ask(
                key,
                q.text,
                scope=await self.scope(q.asker),
                user_id=q.user or None,
                history=history,
                on_text=surface.text_sink(),
                on_retrieved=surface.retrieval_sink(),
            )
        except Exception as exc:  # every failure must reach the user; details only to the log
            log.exception("answering failed in %s", q.scope)
            await surface.say(user_message(exc))
            return
        if result.error and not result.answer.text.strip():
            await surface.say(result.error)
            return
        message_id = await surface.answer(result)
        if message_id is None:
            return
        try:
            await self.engine.store.set_message_ref(result.turn_id, message_id)
        except StoreError:
            log.exception("could not link turn %s to its message", result.turn_id)
        if self.suggest:
            await self._suggest(result, surface, message_id)

    async def _suggest(self, result: TurnResultLike, surface: Surface, message_id: str) -> None:
        try:
            questions = await self.engine.followups(result)
            if questions:
                await surface.suggest(message_id, questions)
        except Exception:  # suggestions are a nicety: the answer is already there
            log.exception("follow-up suggestions failed for turn %s", result.turn_id)

    async def known(self, key: str) -> bool:
        try:
            return bool(await self.engine.store.conversation_exists(key))
        except StoreError:
            log.exception("conversation lookup failed")
            return False

    # ------------------------------------------------------------------ reactions

    async def turn_for(self, scope: str, message_id: str) -> Turn | None:
        """The turn whose answer is message ``message_id`` in ``scope``, or None."""
        try:
            return await self.engine.store.turn_by_message(scope, message_id)
        except StoreError:
            log.exception("turn lookup failed")
            return None

    async def turn_by_id(self, turn_id: object) -> Turn | None:
        """A turn named by an id a platform sent back (a button's payload), or None when it is not one."""
        if not isinstance(turn_id, int) or isinstance(turn_id, bool):
            return None
        try:
            return await self.engine.store.get_turn(turn_id)
        except StoreError:
            log.exception("turn lookup failed")
            return None

    async def explain(self, turn: Turn, surface: ExplanationSurface, asker: Asker) -> None:
        """Explain ``turn`` once, to ``asker``'s audience (where the explanation is posted): concurrent
        requests
        and requests for an answer already explained (recorded in the store, so also after a restart) are
        ignored; an answer built from evidence that audience may not read is not explained there."""
        turn_id = turn.id
        if turn.explained_at or not self._explained.add(str(turn_id)):
            return  # already explained (or being explained)
        # no answer from the wiki: shares of evidence that produced nothing mean nothing
        if turn.out_of_scope:
            await surface.say(NOTHING_TO_EXPLAIN)
            await self._mark_explained(turn_id)
            return
        try:
            result = await self.engine.explain(turn_id, scope=await self.scope(asker))
        except EvidentError as exc:  # a known failure (the LLM unreachable): one line; the user hears why
            log.warning("explaining turn %s failed: %s: %s", turn_id, type(exc).__name__, exc)
            self._explained.discard(str(turn_id))
            await surface.say(user_message(exc))
            return
        except Exception:  # the user asked for something: they must hear back
            log.exception("explaining turn %s failed", turn_id)
            self._explained.discard(str(turn_id))
            await surface.say(EXPLAIN_FAILED)
            return
        if result.error:  # e.g. not visible to this audience: someone else may ask where it is
            self._explained.discard(str(turn_id))
            await surface.say(result.text)
            return
        try:
            await surface.explanation(result)
            await self._mark_explained(turn_id)
        except SurfaceError:  # the platform refused (the adapter logged why): a later request may try again
            self._explained.discard(str(turn_id))
        except Exception:  # e.g. rendering failed: still an answer for the user
            log.exception("showing the explanation of turn %s failed", turn_id)
            self._explained.discard(str(turn_id))
            await surface.say(EXPLAIN_FAILED)

    async def _mark_explained(self, turn_id: int) -> None:
        try:
            await self.engine.store.mark_explained(turn_id)
        except StoreError:
            log.exception("could not record that turn %s was explained", turn_id)

    async def feedback(self, turn: Turn, user: str, value: int | None, *, platform: str,
                       comment: str | None = None) -> None:
        """Record (``value`` ±1) or withdraw (None) one user's rating of a turn."""
        if not user:
            return
        try:
            if value is None:
                await self.engine.store.remove_feedback(turn.id, user)
            else:
                await self.engine.store.set_feedback(turn.id, user, value, platform=platform, comment=comment)
        except StoreError:
            log.exception("could not record feedback on turn %s", turn.id)
