"""Per-user access through Slack's real HTTP transport: people from users.info (e-mail, guests), audiences
from conversations.info/members, the same scope for typed questions, follow-ups and explanations."""
# ruff: noqa: F811  (the harness fixtures are imported from test_bot_http and shadowed by parameters)

from __future__ import annotations

from test_bot_http import Factory, Harness, make_harness, slack_stream  # noqa: F401  (the fixtures)

from pipeline.access.people import Account
from pipeline.access.scope import EVERYONE, group, user

SITE = group("confluence-users")


def _people(h: Harness) -> None:
    h.slack.users.update({
        "U1": {"profile": {"email": "ann@acme.io"}},
        "U2": {"profile": {"email": "ben@acme.io"}},
        "U3": {"profile": {"email": "cat@partner.io"}, "is_restricted": True},  # a guest
        "U4": {"profile": {}},  # no e-mail visible (users:read.email missing)
    })
    h.slack.channels.update({
        "G1": {"id": "G1", "is_group": True, "is_private": True, "members": ["U1", "U2", "UBOT"]},
        "C1": {"id": "C1", "is_channel": True, "is_private": False, "members": ["U1", "U2"]},
        "C2": {"id": "C2", "is_channel": True, "is_private": True, "is_ext_shared": True, "members": ["U1"]},
    })


async def _harness(make_harness: Factory) -> Harness:
    h = await make_harness(access="per-user")
    _people(h)
    await h.engine.store.replace_directory("site", [Account("a-ann", "ann@acme.io", ("g-eng",)),
                                                    Account("a-ben", "ben@acme.io", ("g-hr",))])
    return h


ANN = frozenset({EVERYONE, SITE, user("a-ann"), group("g-eng")})
BEN = frozenset({EVERYONE, SITE, user("a-ben"), group("g-hr")})


async def test_each_place_gets_its_audiences_readers(make_harness: Factory) -> None:
    h = await _harness(make_harness)
    await h.send.event(h.send.message("vpn?", channel="D1", channel_type="im"))  # a DM: Ann alone
    await h.send.event(h.send.mention("vpn?", channel="G1"))  # a private channel: Ann and Ben
    await h.send.event(h.send.mention("vpn?", channel="C1"))  # public: the whole site, and Ann
    await h.send.event(h.send.mention("vpn?", channel="C2"))  # shared with another organisation
    await h.send.event(h.send.mention("vpn?", channel="G1", user="U3"))  # a guest asks in G1
    await h.answered(5)
    scopes = {(a.key.split(":")[1], a.user_id): a.scope for a in h.engine.asks}
    assert scopes[("D1", "U1")].readers == (ANN,)
    assert set(scopes[("G1", "U1")].readers or ()) == {ANN, BEN}
    assert scopes[("C1", "U1")].readers == (frozenset({EVERYONE, SITE}),)
    assert scopes[("C2", "U1")].readers == (frozenset({EVERYONE}),)
    assert scopes[("G1", "U3")].readers == (frozenset({EVERYONE}),)  # the guest constrains the answer


async def test_a_follow_up_and_an_explanation_by_someone_else_take_the_places_scope(
        make_harness: Factory) -> None:
    h = await _harness(make_harness)
    ev = h.send.mention("vpn?", channel="G1")
    await h.send.event(ev)
    (first,) = await h.answered()
    await h.send.event(h.send.message("and linux?", channel="G1", user="U2", thread_ts=ev["ts"]))
    await h.answered(2)
    assert set(h.engine.asks[1].scope.readers or ()) == {ANN, BEN}  # Ben's follow-up: the channel's rule
    await h.send.event(h.send.reaction("explain", "G1", first["ts"], user="U2"))
    await h.slack.wait_for(lambda: bool(h.engine.explain_scopes))
    assert set(h.engine.explain_scopes[0].readers or ()) == {ANN, BEN}


async def test_a_member_joining_is_reflected_at_once(make_harness: Factory) -> None:
    h = await _harness(make_harness)
    await h.send.event(h.send.mention("vpn?", channel="G1"))
    await h.answered()
    h.slack.channels["G1"]["members"].append("U3")  # a guest joins
    await h.send.event({"type": "member_joined_channel", "user": "U3", "channel": "G1", "team": "T1",
                        "event_ts": h.send.new_ts()})
    await h.send.event(h.send.mention("vpn again?", channel="G1"))
    await h.answered(2)
    assert h.engine.asks[1].scope.readers == (frozenset({EVERYONE}),)  # not the cached roster


async def test_guests_in_public_channels_and_other_organisations_people_narrow_the_answer(
        make_harness: Factory) -> None:
    """Found in review: a public channel counted only the asker and the whole site, though guests read it; a
    Slack Connect person of another organisation counted as an unmapped employee."""
    h = await _harness(make_harness)
    h.slack.channels["C3"] = {"id": "C3", "is_channel": True, "is_private": False, "members": ["U1", "U3"]}
    h.slack.users["U5"] = {"profile": {"email": "eve@other.io"}, "team_id": "T9"}  # Slack Connect
    await h.send.event(h.send.mention("vpn?", channel="C3"))
    await h.send.event(h.send.message("vpn?", channel="D5", channel_type="im", user="U5"))
    await h.answered(2)
    scopes = {a.user_id: a.scope for a in h.engine.asks}
    assert scopes["U1"].readers == (frozenset({EVERYONE}),)  # the guest in the channel
    assert scopes["U5"].readers == (frozenset({EVERYONE}),)
