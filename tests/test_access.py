"""Who sees what: page permissions as clauses, people mapped to principals, and the one policy that builds
every answer's access scope (audiences, fallbacks, failures, caching)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_people import StaticPeople

from bot.core.access import AccessPolicy, Asker, Person, Place
from evident.settings import Settings
from pipeline.access.people import Account, People, parse_identity_map
from pipeline.access.scope import (
    EVERYONE,
    AccessScope,
    access_from_payload,
    acl_payload,
    admits,
    fold,
    group,
    page_access,
    user,
)
from pipeline.errors import ConfigError
from pipeline.store import Store

SITE_GROUP = group("confluence-users")


def test_page_access_is_every_restricted_level_and_folding_never_widens() -> None:
    access = page_access([[EVERYONE, group("x")], [group("eng"), user("a")], [user("a"), user("b")]])
    # an anonymous space stays first as "*" (it constrains nothing; space mode tells restricted pages by it)
    assert access == ((EVERYONE,), (group("eng"), user("a")), (user("a"), user("b")))
    assert page_access([[EVERYONE], [EVERYONE, user("a")]]) == ()  # nothing restricts: anyone
    # space mode: the space clause is no bar
    assert AccessScope.space_only(None).admits("S", ((group("g"),),))
    assert not AccessScope.space_only(None).admits("S", ((group("g"),), (user("a"),)))  # restricted: never
    assert admits(access, frozenset({EVERYONE, user("a")})) and not admits(
        access, frozenset({EVERYONE, group("eng")})
    )
    assert admits((), frozenset()) and not admits(None, frozenset({EVERYONE}))  # unknown: nobody
    deep = ((group("s"),), (user("a"), user("b")), (user("b"), user("c")), (user("b"), user("d")))
    folded = fold(deep)
    assert len(folded) == 3 and folded[2] == (user("b"),)
    for reader in (frozenset({group("s"), user(x)}) for x in "abcd"):
        assert not admits(folded, reader) or admits(deep, reader)  # folded admits a subset
    assert access_from_payload(acl_payload(access)) == access
    # space mode: the space clause is no bar
    assert AccessScope.space_only(None).admits("S", ((group("g"),),))
    assert not AccessScope.space_only(None).admits("S", ((group("g"),), (user("a"),)))  # restricted: never
    assert access_from_payload(acl_payload(())) == () and access_from_payload({}) is None


def test_scope_conditions_and_minimal_readers() -> None:
    a, b = frozenset({user("a"), group("g")}), frozenset({user("a"), group("g"), group("h")})
    scope = AccessScope.for_readers([a, b, a], ("ENG",))
    assert scope.readers == (a | {EVERYONE},)  # b may read whatever a may: it adds no constraint
    assert scope.conditions()[0] == ("space", ["ENG"])
    assert [k for k, _ in scope.conditions()[1:]] == ["acl0", "acl1", "acl2"]
    assert not scope.admits("HR", ()) and scope.admits("ENG", ((group("g"),),))
    assert AccessScope.space_only(None).admits("ANY", None)  # space mode: no per-person filter


async def test_people_are_mapped_by_identity_map_then_directory(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "s.db")
    await store.replace_directory("site", [Account("acc-1", "Ann@Example.com", ("g-eng",)),
                                           Account("acc-2", "", ("g-hr",))])
    csv = tmp_path / "map.csv"
    csv.write_text("email,account,groups\nbob@example.com,acc-2\ncid@example.com,acc-3,g-ops;g-eng\n")
    settings = Settings.load(env={}, access_identity_map=str(csv)).access
    people = People(store, settings)
    ann = await people.identity("ann@example.com")
    assert ann.how == "directory" and ann.reader == {EVERYONE, SITE_GROUP, user("acc-1"), group("g-eng")}
    bob = await people.identity("BOB@example.com")  # mapped; its groups from the directory
    assert bob.how == "identity map" and group("g-hr") in bob.reader
    cid = await people.identity("cid@example.com")
    assert {group("g-ops"), group("g-eng"), user("acc-3")} <= cid.reader
    assert (await people.identity("nobody@example.com")).reader == {EVERYONE, SITE_GROUP}
    assert (await people.identity(None)).how == "no e-mail: site-wide"
    guest = await people.identity("ann@example.com", guest=True)  # a guest is not matched by e-mail
    assert guest.reader == {EVERYONE} and guest.how.startswith("guest")
    await store.close()


def test_a_bad_identity_map_line_is_named() -> None:
    with pytest.raises(ConfigError, match=r"map\.csv line 2: expected email,account"):
        parse_identity_map("a@x.io,acc\nnot-an-email,acc\n", "map.csv")


def _policy(store: Store, **overrides: str) -> AccessPolicy:
    settings = Settings.load(env={}, access="per-user", **overrides)
    return AccessPolicy.from_settings(settings.access, settings.chat, store)


async def test_the_audience_decides_the_readers(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "s.db")
    await store.replace_directory("site", [Account(a, f"{a}@x.io", (f"g-{a}",)) for a in ("u1", "u2", "u3")])
    people = StaticPeople(
        {u: Person(f"{u}@x.io") for u in ("u1", "u2", "u3")} | {"B": Person(None, bot=True),
                                                                 "G": Person("u3@x.io", guest=True)},
        {"G0PRIV": Place("private", ("u1", "u2", "B")), "C0PUB": Place("public", None),
         "C0EXT": Place("external", None), "G0BIG": Place("private", ("u1", "u2", "u3", "B"))})
    policy = _policy(store, access_audience_max="3", channel_spaces="G0PRIV=ENG")
    me = frozenset({EVERYONE, SITE_GROUP, user("u1"), group("g-u1")})
    dm = await policy.scope(Asker("u1", "D1"), people)
    assert dm.readers == (me,) and dm.spaces is None
    private = await policy.scope(Asker("u1", "G0PRIV", shared_in="G0PRIV"), people)
    assert set(private.readers or ()) == {me, frozenset({EVERYONE, SITE_GROUP, user("u2"), group("g-u2")})}
    assert private.spaces == ("ENG",)  # the mapping stays an upper bound
    site = frozenset({EVERYONE, SITE_GROUP})
    assert (await policy.scope(Asker("u1", "C0PUB", shared_in="C0PUB"), people)).readers == (site,)
    assert (await policy.scope(Asker("u1", "G0BIG", shared_in="G0BIG"), people)).readers == (site,)  # > max
    assert (await policy.scope(Asker("u1", "C0EXT", shared_in="C0EXT"), people)).readers == (
        frozenset({EVERYONE}),
    )
    assert (await policy.scope(Asker("G", "D2"), people)).readers == (frozenset({EVERYONE}),)
    await store.close()


async def test_failed_lookups_narrow_and_lookups_are_cached(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "s.db")
    await store.replace_directory("site", [Account("u1", "u1@x.io", ())])
    people = StaticPeople({"u1": Person("u1@x.io")})
    people.failing = {"u2", "CH"}
    policy = _policy(store)
    assert (await policy.scope(Asker("u2", "D1"), people)).readers == (frozenset({EVERYONE}),)
    failed_place = await policy.scope(Asker("u1", "CH", shared_in="CH"), people)
    assert failed_place.readers == (frozenset({EVERYONE}),)  # unknown members: anonymous access only
    for _ in range(3):
        await policy.scope(Asker("u1", "D1"), people)
    assert people.lookups["u1"] == 1  # within EVIDENT_ACCESS_IDENTITY_TTL_S
    zero_ttl = _policy(store, access_identity_ttl_s="0")
    await zero_ttl.scope(Asker("u1", "D1"), people)
    await zero_ttl.scope(Asker("u1", "D1"), people)
    assert people.lookups["u1"] == 3
    await store.close()


async def test_space_mode_keeps_todays_behaviour(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "s.db")
    settings = Settings.load(env={}, channel_spaces="C9=ENG")
    policy = AccessPolicy.from_settings(settings.access, settings.chat, store)
    people = StaticPeople()
    scope = await policy.scope(Asker("u1", "C9", shared_in="C9"), people)
    assert scope == AccessScope.space_only(("ENG",), "C9") and not people.lookups  # nobody looked up
    await store.close()
