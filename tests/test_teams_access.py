"""Per-user access in Teams: people and rosters from the Bot Connector's members API, looked up only at the
service URL of a verified activity."""
# ruff: noqa: F811  (the harness fixtures are imported from test_teams and shadowed by parameters)

from __future__ import annotations

from fake_teams import TENANT
from test_teams import Factory, make_harness  # noqa: F401  (the fixture)

from pipeline.access.people import Account
from pipeline.access.scope import EVERYONE, group, user

SITE = group("confluence-users")
GROUP_CHAT = "19:group-chat-1@thread.v2"


def _member(aad: str, email: str, **extra: str) -> dict[str, str]:
    return {"id": f"29:{aad}", "aadObjectId": aad, "email": email, "userPrincipalName": email,
            "tenantId": TENANT, "userRole": "user", **extra}


async def test_personal_and_group_chats_get_their_members_permissions(make_harness: Factory) -> None:
    h = await make_harness(access="per-user")
    await h.store.replace_directory("site", [Account("a-ann", "ann@acme.io", ("g-eng",)),
                                             Account("a-ben", "ben@acme.io", ())])
    ann, ben = _member("aad-user-1", "ann@acme.io"), _member("aad-user-2", "ben@acme.io")
    guest = _member("aad-guest", "cat_partner.io#EXT#@acme.onmicrosoft.com", userRole="guest")
    h.connector.members = {"a:personal-chat-1": [ann], GROUP_CHAT: [ann, ben]}
    await h.send.send(h.send.personal("vpn?"))
    await h.send.send(h.send.group_chat("vpn?", mention=True))
    await h.answers(2)
    h.connector.members[GROUP_CHAT] = [ann, ben, guest]
    await h.send.send(h.send.group_chat("vpn?", mention=True, user="aad-guest"))
    await h.answers(3)
    personal, group_chat, with_guest = (a.scope for a in h.engine.asks)
    me = frozenset({EVERYONE, SITE, user("a-ann"), group("g-eng")})
    assert personal.readers == (me,)
    assert set(group_chat.readers or ()) == {me, frozenset({EVERYONE, SITE, user("a-ben")})}
    assert with_guest.readers == (frozenset({EVERYONE}),)  # a guest in the chat: anonymous access only
    assert (
        all(p.startswith("/v3/conversations/") for p in h.connector.unauthorized)
        and not h.connector.unauthorized
    )


async def test_activities_of_other_channels_and_people_without_an_address(make_harness: Factory) -> None:
    """Found in review: a Web Chat or Direct Line activity was answered like a Teams one, and a member the
    Connector gives no address for counted as an unmapped employee."""
    h = await make_harness(access="per-user")
    h.connector.members = {"a:personal-chat-1": [{"id": "29:aad-user-1", "aadObjectId": "aad-user-1",
                                                 "tenantId": TENANT, "userRole": "user"}]}
    webchat = h.send.personal("vpn?")
    webchat["channelId"] = "webchat"
    status, _ = await h.send.send(webchat)
    assert status in (200, 401)  # refused (a key endorsed for Teams) or ignored: never answered
    await h.send.send(h.send.personal("vpn?"))
    await h.answers(1)
    (ask,) = h.engine.asks  # the Web Chat one was not answered
    assert ask.scope.readers == (frozenset({EVERYONE}),)
