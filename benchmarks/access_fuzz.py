"""Permission fuzz: does any answer, citation, quote, suggestion or explanation reach someone who may not read
it?

A generated site (``--people`` people, ``--groups`` groups, ``--spaces`` spaces of page trees with read
restrictions at random depths, space permissions by group, by user and anonymous) is served by the fake
Confluence (Cloud or Data Center) and synced by the real connector into a real embedded index; then
``--turns`` random turns go through the real conversation core (``bot.core``) with per-user access: questions
in DMs, private channels, public channels and a channel shared with another organisation; follow-ups,
suggestion clicks and explanation requests by *other* members of the same thread. Halfway, permissions change
(restrictions added, people leave groups, a space grant is revoked) and the site is synced again.

Every page body carries a unique marker. A leak is any page the audience of a place may not read (computed
here from the generated site, not by evident's code) showing up as a cited or shown evidence, a quoted
explanation member, or its marker in any text a surface received. The last line reads
``access fuzz: <turns> turns, <leaks> leaks``; the exit status is 1 on any leak.

    python benchmarks/access_fuzz.py [--turns 1000] [--seed 7] [--mode cloud|dc]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fake_people import StaticPeople  # noqa: E402
from helpers import HashEmbedder, ingest_options, make_engine  # noqa: E402

from bot.core.access import AccessPolicy, Asker, Person, Place  # noqa: E402
from bot.core.conversations import Conversations, Question  # noqa: E402
from connectors.confluence.client import ConfluenceClient  # noqa: E402
from connectors.confluence.permissions import PermissionSweep  # noqa: E402
from connectors.confluence.source import ConfluenceSource  # noqa: E402
from connectors.confluence.sync import sync_confluence  # noqa: E402
from evident.settings import Settings  # noqa: E402
from pipeline.index.edge import EdgeIndex  # noqa: E402
from pipeline.models.sparse import Bm25Encoder  # noqa: E402
from tests.fake_confluence import BASE_TIME, FakeConfluence, FakePage  # noqa: E402
from tests.fake_confluence_people import Person as SitePerson  # noqa: E402
from tests.fake_confluence_people import SiteDirectory  # noqa: E402

WORDS = [
    "deploy",
    "vpn",
    "laptop",
    "payroll",
    "budget",
    "incident",
    "roadmap",
    "hiring",
    "salary",
    "contract",
    "invoice",
    "audit",
    "backup",
    "release",
    "oncall",
    "vendor",
    "security",
    "privacy",
    "customer",
    "churn",
    "pricing",
    "offsite",
    "training",
    "policy",
    "expense",
    "travel",
    "onboarding",
    "review",
    "bonus",
    "reorg",
    "legal",
    "merger",
    "patent",
]
EVERYONE_GROUP = "confluence-users"


@dataclass
class Site:
    """The generated site: who is in which group, who may view each space, each page's restrictions."""

    people: list[str]
    guests: set[str]
    groups: dict[str, set[str]]  # group -> members
    space_grants: dict[str, list[tuple[str, str]]]
    pages: dict[str, FakePage] = field(default_factory=dict)

    def in_grant(self, person: str, kind: str, who: str) -> bool:
        if kind == "anonymous":
            return True
        if kind == "user":
            return person == who
        return person in self.groups.get(who, set())

    def can_read(self, person: str, page_id: str) -> bool:
        page = self.pages[page_id]
        if not any(self.in_grant(person, k, w) for k, w in self.space_grants[page.space]):
            return False
        node: FakePage | None = page
        while node is not None:
            restricted = bool(node.restricted_users or node.restricted_groups)
            if restricted and person not in node.restricted_users and not any(
                    person in self.groups.get(g, set()) for g in node.restricted_groups):
                return False
            node = self.pages.get(node.parent) if node.parent else None
        return True

    def anonymous(self, page_id: str) -> bool:
        page = self.pages[page_id]
        node: FakePage | None = page
        while node is not None:
            if node.restricted_users or node.restricted_groups:
                return False
            node = self.pages.get(node.parent) if node.parent else None
        return ("anonymous", "") in self.space_grants[page.space]


def generate(rng: random.Random, n_people: int, n_groups: int, n_spaces: int) -> Site:
    people = [f"p{i:03d}" for i in range(n_people)]
    guests = set(rng.sample(people, max(2, n_people // 12)))
    groups = {f"g{i:02d}": set(rng.sample(people, rng.randint(3, n_people // 3))) for i in range(n_groups)}
    groups[EVERYONE_GROUP] = set(people) - guests
    site = Site(people, guests, groups, {})
    pid = 1000
    for s in range(n_spaces):
        space = f"S{s:02d}"
        roll = rng.random()
        site.space_grants[space] = (
            [("group", EVERYONE_GROUP)] if roll < 0.4 else [("anonymous", ""), ("group", EVERYONE_GROUP)]
            if roll < 0.5 else [("group", g) for g in rng.sample(sorted(groups), rng.randint(1, 3))]
            + [("user", u) for u in rng.sample(people, rng.randint(0, 2))])
        nodes: list[str] = []
        for _ in range(rng.randint(8, 14)):
            pid += 1
            parent = rng.choice(nodes) if nodes and rng.random() < 0.6 else None
            words = " ".join(rng.sample(WORDS, 4))
            page = FakePage(str(pid), f"{space} {words.split()[0]} page {pid}", space,
                            f"<p>{words} marker-{pid} notes for {words}.</p>",
                            BASE_TIME + timedelta(minutes=pid), parent=parent)
            if rng.random() < 0.3:
                page.restricted_groups = rng.sample(sorted(set(groups) - {EVERYONE_GROUP}), rng.randint(1, 2))
            if rng.random() < 0.15:
                page.restricted_users = rng.sample(people, rng.randint(1, 3))
            site.pages[page.id] = page
            nodes.append(page.id)
    return site


def directory_of(site: Site, rng: random.Random) -> tuple[SiteDirectory, str]:
    """The fake's directory (some e-mails hidden) and the operator's identity map for those."""
    people = {p: SitePerson(p, p, f"{p}@acme.io", email_visible=rng.random() < 0.7,
                            groups={g for g, m in site.groups.items() if p in m}) for p in site.people}
    hidden = "\n".join(f"{p}@acme.io,{p}" for p, who in people.items() if not who.email_visible)
    return SiteDirectory(people, site.space_grants, page_size=50), hidden


def places_of(site: Site, rng: random.Random) -> dict[str, Place]:
    members = [p for p in site.people if p not in site.guests]
    places = {
        f"G{i:02d}": Place("private", tuple(rng.sample(site.people, rng.randint(2, 8)))) for i in range(12)
    }
    places |= {f"C{i:02d}": Place("public", None) for i in range(3)}
    places["CEXT"] = Place("external", None)
    places["GBIG"] = Place("private", tuple(members))  # more than the audience limit
    return places


class Recorder:
    """A surface that keeps everything a place was shown."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.texts: list[str] = []
        self.pages: set[str] = set()
        self.message = 0
        self.suggestions: list[str] = []

    async def progress(self) -> str | None:
        return None

    def conversation_key(self, progress_id: str | None) -> str:
        return self.key

    async def earlier_messages(self) -> None:
        return None

    def text_sink(self) -> None:
        return None

    def retrieval_sink(self) -> Any:
        async def shown(hits: Any) -> None:  # what a platform shows before the answer: counted as shown
            self.pages |= {h.evidence.page_id for h in hits}
            self.texts += [h.evidence.title for h in hits]

        return shown

    async def answer(self, result: Any) -> str:
        a = result.answer
        self.texts += [a.text, *(c.title for c in a.citations)]
        self.pages |= {h.evidence.page_id for h in a.evidence} | {
            c.url.rsplit("/", 1)[-1] for c in a.citations
        }
        self.message += 1
        return f"{self.key}:{self.message}"

    async def suggest(self, message_id: str, questions: list[str]) -> None:
        self.texts += questions
        self.suggestions = questions

    async def say(self, text: str) -> None:
        self.texts.append(text)

    async def rate_limited(self, retry_after_s: int) -> None:
        return None

    async def explanation(self, result: Any) -> None:
        self.texts.append(result.text)
        for c in getattr(result.result, "clusters", []):
            for m in c.members:
                self.pages.add(m.url.rsplit("/", 1)[-1])
                self.texts += [m.title, m.quote, m.label]


def audience(site: Site, place: str, places: dict[str, Place], asker: str) -> list[str] | None:
    """Who reads what is posted in ``place`` (None: everyone in the company)."""
    if place.startswith("D"):
        return [asker]
    p = places[place]
    if p.kind == "external":
        return ["(anonymous)"]
    return None if p.kind == "public" or p.members is None else list(p.members)


def leaks_of(site: Site, shown: Recorder, readers: list[str] | None) -> list[str]:
    marked = {pid for pid in site.pages if any(f"marker-{pid}" in t for t in shown.texts)}
    out = []
    for pid in (shown.pages | marked) & set(site.pages):
        if readers == ["(anonymous)"]:
            ok = site.anonymous(pid)
        else:
            who = readers if readers is not None else [p for p in site.people if p not in site.guests]
            ok = all(site.can_read(p, pid) for p in who)
        if not ok:
            out.append(pid)
    return out


@dataclass
class Thread:
    key: str
    place: str
    members: list[str]
    suggestions: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)


class Fuzz:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp = args, tmp
        self.rng = random.Random(args.seed)
        self.site = generate(self.rng, args.people, args.groups, args.spaces)
        self.directory, hidden = directory_of(self.site, self.rng)
        (tmp / "map.csv").write_text(hidden + "\n")
        self.places = places_of(self.site, self.rng)
        people = {p: Person(f"{p}@acme.io", guest=p in self.site.guests) for p in self.site.people}
        self.people = StaticPeople(people, self.places)
        self.settings = Settings.load(env={}, access=args.access, access_identity_map=str(tmp / "map.csv"),
                                      access_audience_max="20", followup_suggestions="true")
        self.shown = {"cited answers": 0, "suggestions": 0, "explanations": 0}
        self.threads: list[Thread] = []
        self.turns = self.leaks = 0
        self.leaked: list[str] = []

    async def run(self) -> int:
        async with FakeConfluence(
            self.site.pages.values(), mode=self.args.mode, directory=self.directory
        ) as fc:
            client = ConfluenceClient(fc.url, token=fc.token, user=fc.user if fc.mode == "cloud" else None)
            sweep = PermissionSweep(client, site_groups=self.settings.access.site_groups)
            self.source = ConfluenceSource(client, spaces=sorted(fc.spaces()), permissions=sweep)
            embedder = HashEmbedder()
            index = EdgeIndex(self.tmp / "index")
            await index.open(dense_dim=embedder.dim, embedder=embedder.name)
            self.parts = make_engine(index, embedder, self.tmp / "evident.db")
            try:
                await self.sync()
                half = self.args.turns // 2
                for t in range(self.args.turns):
                    if t == half:
                        self.change_permissions()
                        await self.sync()
                    await self.turn(t)
            finally:
                await self.parts.close()
        print(", ".join(f"{n} {what}" for what, n in self.shown.items()))
        print(f"access fuzz: {self.turns} turns, {self.leaks} leaks")
        return 1 if self.leaks else 0

    async def sync(self) -> None:
        t0 = time.perf_counter()
        report = await sync_confluence(
            source=self.source,
            index=self.parts.index,
            embedder=self.parts.embedder,
            sparse=Bm25Encoder(),
            store=self.parts.store,
            options=ingest_options(),
        )
        policy = AccessPolicy.from_settings(self.settings.access, self.settings.chat, self.parts.store)
        self.core = Conversations.from_settings(self.parts.engine, self.settings.chat, policy, self.people)
        print(f"sync: {report.added} added, {report.permissions_changed} permissions written, "
              f"{len(report.failed)} failed, {time.perf_counter() - t0:.1f} s")

    def change_permissions(self) -> None:
        rng, site = self.rng, self.site
        for pid in rng.sample(sorted(site.pages), len(site.pages) // 10):
            site.pages[pid].restricted_users = rng.sample(site.people, 2)  # restrictions added or changed
        for g in rng.sample(sorted(set(site.groups) - {EVERYONE_GROUP}), 4):
            for p in rng.sample(sorted(site.groups[g]), min(2, len(site.groups[g]))):
                site.groups[g].discard(p)  # people leave groups
                self.directory.people[p].groups.discard(g)
        space = rng.choice(sorted(site.space_grants))
        site.space_grants[space] = [("user", rng.choice(site.people))]  # a space grant revoked

    async def turn(self, t: int) -> None:
        roll = self.rng.random()
        if roll < 0.5 or not self.threads:
            await self.new_question(t)
        elif roll < 0.72:
            await self.follow_up(self.rng.choice(self.threads))
        elif roll < 0.86:
            await self.suggestion(self.rng.choice(self.threads))
        else:
            await self.explain(self.rng.choice(self.threads))
        self.turns += 1

    def question(self) -> str:
        page = self.site.pages[self.rng.choice(sorted(self.site.pages))]
        words = page.body.removeprefix("<p>").split()[:4]
        return f"what about {' '.join(self.rng.sample(words, 2))}?"

    async def new_question(self, t: int) -> None:
        asker = self.rng.choice(self.site.people)
        if self.rng.random() < 0.35:
            place, members = f"D{asker}", [asker]
        else:
            place = self.rng.choice(sorted(self.places))
            members = list(self.places[place].members or self.site.people)
            if asker not in members and self.places[place].kind == "private":
                asker = self.rng.choice(members)
        thread = Thread(f"{place}:{t}", place, members)
        self.threads.append(thread)
        await self.ask(thread, asker, self.question())

    def someone(self, thread: Thread) -> str:
        return thread.members[0] if thread.place.startswith("D") else self.rng.choice(thread.members)

    async def follow_up(self, thread: Thread) -> None:
        await self.ask(thread, self.someone(thread), self.question())

    async def suggestion(self, thread: Thread) -> None:
        if thread.suggestions:
            await self.ask(thread, self.someone(thread), self.rng.choice(thread.suggestions))
        else:
            await self.follow_up(thread)

    def asker(self, thread: Thread, user: str) -> Asker:
        return Asker(user, thread.place, shared_in=None if thread.place.startswith("D") else thread.place)

    async def ask(self, thread: Thread, user: str, text: str) -> None:
        shown = Recorder(thread.key)
        shown.message = len(thread.messages)
        await self.core.answer(Question.of(self.asker(thread, user), text, thread.key), shown)
        thread.messages.append(f"{thread.key}:{shown.message}")
        thread.suggestions = shown.suggestions or thread.suggestions
        self.shown["cited answers"] += bool(shown.pages)
        self.shown["suggestions"] += bool(shown.suggestions)
        self.check(thread, user, shown)

    async def explain(self, thread: Thread) -> None:
        user = self.someone(thread)
        turn = (
            await self.parts.store.turn_by_message(thread.key, thread.messages[-1])
            if thread.messages
            else None
        )
        if turn is None:
            await self.follow_up(thread)
            return
        shown = Recorder(thread.key)
        await self.core.explain(turn, shown, self.asker(thread, user))
        self.shown["explanations"] += bool(shown.pages)
        self.check(thread, user, shown)

    def check(self, thread: Thread, user: str, shown: Recorder) -> None:
        leaked = leaks_of(self.site, shown, audience(self.site, thread.place, self.places, user))
        if leaked:
            self.leaks += 1
            self.leaked.append(f"{thread.key} by {user}: pages {sorted(leaked)}")
            print("LEAK", self.leaked[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--people", type=int, default=60)
    ap.add_argument("--groups", type=int, default=12)
    ap.add_argument("--spaces", type=int, default=22)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--mode", choices=("cloud", "dc"), default="cloud")
    ap.add_argument("--access", choices=("per-user", "space"), default="per-user",
                    help="space: today's space-only scopes, to see that the fuzz finds their leaks")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(Fuzz(args, Path(tmp)).run())


if __name__ == "__main__":
    sys.exit(main())
