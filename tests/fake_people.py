"""A platform's people and places for the access policy, from dictionaries (``bot.core.access.PeopleSource``).

Unknown people are employees without an e-mail address; unknown places are private with no members listed
beyond the asker. ``lookups`` counts the calls, to check caching."""

from __future__ import annotations

from collections import Counter

from bot.core.access import Person, Place
from pipeline.errors import RemoteError


class StaticPeople:
    def __init__(
        self, people: dict[str, Person] | None = None, places: dict[str, Place] | None = None
    ) -> None:
        self.people = dict(people or {})
        self.places = dict(places or {})
        self.failing: set[str] = set()  # ids whose lookup fails (as an API error would)
        self.lookups: Counter[str] = Counter()

    async def person(self, user_id: str, where: str) -> Person:
        self.lookups[user_id] += 1
        if user_id in self.failing:
            raise RemoteError(f"lookup of {user_id} failed", service="fake")
        return self.people.get(user_id, Person(None))

    async def place(self, place_id: str, limit: int) -> Place:
        self.lookups[place_id] += 1
        if place_id in self.failing:
            raise RemoteError(f"members of {place_id} failed", service="fake")
        place = self.places.get(place_id, Place("private", ()))
        if place.members is not None and len(place.members) > limit:
            return Place(place.kind, None)
        return place
