"""The one place that decides whose eyes an answer is for: every question, follow-up, suggestion button,
suggested prompt and explanation of every platform gets its ``AccessScope`` here.

The place's space mapping (``EVIDENT_CHANNEL_SPACES``/``EVIDENT_DEFAULT_SPACES``, ``bot.core.scope``) is an
upper bound. With ``EVIDENT_ACCESS=per-user`` the readers are:

- a DM, an assistant thread, a personal chat or an ephemeral reply: the asker;
- a private channel or a group chat of at most ``EVIDENT_ACCESS_AUDIENCE_MAX`` people: every member, the
  asker included (an evidence is used only when every one of them may read it);
- a public channel: its members (guests included) and "the whole site" (anonymous access and
  ``EVIDENT_ACCESS_SITE_GROUPS``), because anyone in the company may read it later;
- a place with more members than the limit, or one whose members cannot be listed: the asker and the whole
  site;
- a place shared with another organisation (Slack Connect): the asker and anonymous access only.

A person is mapped to Confluence by ``pipeline.access.people``; a lookup that fails counts as a guest (the
narrowest rule), never as the broadest.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from bot.core.scope import NO_SPACE, Scope
from bot.core.settings import ChatSettings
from pipeline.access.people import Directory, People
from pipeline.access.scope import EVERYONE, AccessScope, Reader
from pipeline.access.settings import AccessSettings
from pipeline.errors import EvidentError

log = logging.getLogger("evident.access")

LOOKUPS_AT_ONCE = 8  # members looked up concurrently (the first question in a channel of 100 waits less)

PlaceKind = Literal["private", "public", "external"]


@dataclass(frozen=True)
class Asker:
    """Who asks, and where the answer will be read."""

    user: str
    scope: str  # the channel whose space mapping applies
    team: str = ""  # the team whose mapping applies when the channel has none (Teams)
    shared_in: str | None = None  # the place others read the answer in; None: the asker alone


@dataclass(frozen=True)
class Person:
    email: str | None  # None: not known (no e-mail scope, anonymous)
    guest: bool = False  # a guest, external or anonymous account
    bot: bool = False  # bots read nothing themselves: left out of audiences


@dataclass(frozen=True)
class Place:
    kind: PlaceKind
    members: tuple[str, ...] | None  # None: more than the audience limit, or not listed


class PeopleSource(Protocol):
    """What a platform tells about its people and places (Slack: users.info, conversations.members; Teams:
    the Bot Connector's conversation members)."""

    async def person(self, user_id: str, where: str) -> Person:
        """``where``: a conversation the person is in (Teams looks members up per conversation)."""

    async def place(self, place_id: str, limit: int) -> Place:
        """The place's kind and members (None when it has more than ``limit``)."""


class AccessPolicy:
    def __init__(self, settings: AccessSettings, spaces: Scope, people: People) -> None:
        self.settings = settings
        self.spaces = spaces
        self.people = people
        self._cache: dict[tuple[str, str], tuple[float, object]] = {}

    @classmethod
    def from_settings(cls, access: AccessSettings, chat: ChatSettings, directory: Directory) -> AccessPolicy:
        return cls(access, Scope(chat.channel_spaces, chat.default_spaces), People(directory, access))

    def spaces_for(self, asker: Asker) -> tuple[str, ...] | None:
        return self.spaces(asker.scope, asker.team)

    def connected(self, asker: Asker) -> bool:
        """Whether the place is mapped to any space at all."""
        return self.spaces_for(asker) != NO_SPACE

    async def scope(self, asker: Asker, source: PeopleSource) -> AccessScope:
        """The access scope of an answer to ``asker``: the only way the core obtains one."""
        spaces = self.spaces_for(asker)
        audience = asker.shared_in or asker.user
        if self.settings.mode == "space":
            return AccessScope.space_only(spaces, audience)
        readers = [await self._reader(asker.user, asker.shared_in or asker.scope, source)
                   or frozenset({EVERYONE})]
        if asker.shared_in is not None:
            readers += await self._audience(asker.shared_in, source)
        return AccessScope.for_readers(readers, spaces, audience)

    def forget_place(self, place_id: str) -> None:
        """The place's members changed (a platform said so): list them again at the next question."""
        self._cache.pop(("place", place_id), None)

    async def _audience(self, place_id: str, source: PeopleSource) -> list[Reader]:
        place = await self._cached("place", place_id, lambda: self._place(place_id, source))
        assert isinstance(place, Place)
        if place.kind == "external":
            return [frozenset({EVERYONE})]
        if place.members is None:
            return [self.people.site]
        limit = asyncio.Semaphore(LOOKUPS_AT_ONCE)

        async def one(member: str) -> Reader | None:
            async with limit:
                return await self._reader(member, place_id, source)

        readers = await asyncio.gather(*(one(m) for m in place.members))
        # a public place: also anyone in the company who opens it later
        return [r for r in readers if r is not None] + ([self.people.site] if place.kind == "public" else [])

    async def _place(self, place_id: str, source: PeopleSource) -> Place:
        try:
            return await source.place(place_id, self.settings.audience_max)
        except (EvidentError, OSError) as exc:
            log.warning("members of %s not listed (%s): answering with anonymous access only", place_id, exc)
            return Place("external", None)

    async def _reader(self, user_id: str, where: str, source: PeopleSource) -> Reader | None:
        """A person's principals; None for a bot (it reads nothing itself; a bot asking gets anonymous
        access)."""
        person = await self._cached("person", user_id, lambda: self._person(user_id, where, source))
        assert isinstance(person, Person)
        if person.bot:
            return None
        identity = await self.people.identity(person.email, guest=person.guest)
        return identity.reader

    async def _person(self, user_id: str, where: str, source: PeopleSource) -> Person:
        try:
            return await source.person(user_id, where)
        except (EvidentError, OSError) as exc:
            log.warning("user %s not looked up (%s): treated as a guest", user_id, exc)
            return Person(None, guest=True)

    async def _cached(self, kind: str, key: str, load: Callable[[], Awaitable[object]]) -> object:
        now = time.monotonic()
        hit = self._cache.get((kind, key))
        if hit is not None and now - hit[0] < self.settings.identity_ttl_s:
            return hit[1]
        value = await load()
        self._cache[(kind, key)] = (now, value)
        if len(self._cache) > 50_000:  # bounded: forget the oldest half
            for k, _ in sorted(self._cache.items(), key=lambda kv: kv[1][0])[:25_000]:
                del self._cache[k]
        return value
