"""The Teams adapter end to end: signed activities into the real endpoint, replies to a local Bot
Connector."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from fake_slack import FakeEngine
from fake_teams import APP_ID, APP_PASSWORD, BOT_ID, TENANT, ActivitySender, FakeConnector, FakeIdentity

from bot.teams.activity import Activity
from bot.teams.app import TeamsPlatform
from bot.teams.handlers import TeamsBot
from bot.teams.render import answer_activity, escape
from evident.platforms import access_policy
from evident.settings import Settings
from pipeline.answer.results import TurnResult
from pipeline.store import Store
from pipeline.types import Answer, Citation

CHANNEL = "19:eng@thread.tacv2"


@dataclass
class Harness:
    identity: FakeIdentity
    connector: FakeConnector
    engine: FakeEngine
    bot: TeamsBot
    send: ActivitySender
    store: Store

    async def settle(self) -> None:
        await asyncio.sleep(0.02)
        await self.connector.wait_for(lambda: self.bot.in_flight == 0)

    async def answers(self, n: int = 1) -> list[dict[str, Any]]:
        def found() -> list[dict[str, Any]]:
            return [p.activity for p in self.connector.messages() if p.activity.get("entities")]

        assert await self.connector.wait_for(lambda: len(found()) >= n), (
            f"expected {n} answer(s): {self.connector.posted}"
        )
        return found()


Factory = Callable[..., Awaitable[Harness]]


@pytest.fixture
async def make_harness(tmp_path: Path) -> AsyncIterator[Factory]:
    cleanups: list[Callable[[], Awaitable[None]]] = []

    async def factory(engine: FakeEngine | None = None, **overrides: Any) -> Harness:
        identity = await FakeIdentity().start()
        connector = await FakeConnector().start()
        engine = engine or FakeEngine()
        engine.store = store = await Store.open(tmp_path / f"teams-{len(cleanups)}.db")
        settings = Settings.load(env={}, teams_app_id=APP_ID, teams_app_password=APP_PASSWORD,
                                 teams_tenant_id=TENANT, teams_openid_url=identity.openid_url,
                                 teams_tenant_openid_url=identity.tenant_openid_url,
                                 teams_token_url=identity.token_url, teams_port=0, **overrides)
        platform = TeamsPlatform(settings.teams, settings.chat, engine, access_policy(settings, engine),
                             host="127.0.0.1")
        await platform.start()
        endpoint = f"http://127.0.0.1:{platform.port}/api/messages"
        sender = await ActivitySender(endpoint, identity, connector.url + "/").__aenter__()

        async def cleanup() -> None:
            await platform.drain(5)
            await sender.__aexit__()
            await platform.close()
            await connector.close()
            await identity.close()
            await store.close()

        cleanups.append(cleanup)
        return Harness(identity, connector, engine, platform.bot, sender, store)

    yield factory
    for c in cleanups:
        await c()


@pytest.fixture
async def h(make_harness: Factory) -> Harness:
    return await make_harness()


async def test_channel_mention_is_answered_in_its_reply_chain_with_citations(h: Harness) -> None:
    act = h.send.channel_mention("How do I get VPN access?")
    status, _ = await h.send.send(act)
    assert status == 200
    (answer,) = await h.answers()
    (ask,) = h.engine.asks
    assert ask.question == "How do I get VPN access?"  # the <at>evident</at> mention is stripped
    assert ask.key == f"teams:{TENANT}:{CHANNEL};messageid={act['id']}"
    posted = next(p for p in h.connector.posted if p.activity is answer)
    assert posted.conversation_id == act["conversation"]["id"] and posted.reply_to == act["id"]
    assert any(p.activity["type"] == "typing" for p in h.connector.posted)
    assert "open the VPN portal [1] and follow the guide [2]" in answer["text"]
    (entity,) = answer["entities"]
    assert entity["additionalType"] == ["AIGeneratedContent"]
    assert [(c["position"], c["appearance"]["url"]) for c in entity["citation"]] == [
        (1, "https://wiki.example.com/pages/1"), (2, "https://wiki.example.com/pages/2")]
    assert answer["channelData"] == {"feedbackLoopEnabled": True}
    button = answer["attachments"][0]["content"]["actions"][0]
    assert button["type"] == "Action.Submit" and button["data"]["action"] == "evident.explain"
    await h.settle()
    turn = await h.store.get_turn(button["data"]["turn"])
    assert turn is not None and turn.message_ref == posted.id  # reactions on the answer find the turn
    assert h.identity.token_requests[0]["scope"] == "https://api.botframework.com/.default"


async def test_follow_up_in_the_reply_chain_needs_no_mention(h: Harness) -> None:
    first = h.send.channel_mention("How do I get VPN access?")
    await h.send.send(first)
    await h.answers()
    await h.send.send(h.send.channel_reply("and on Linux?", root=first["id"]))
    await h.answers(2)
    assert [a.key for a in h.engine.asks] == [h.engine.asks[0].key] * 2
    assert h.engine.asks[1].question == "and on Linux?"
    # a reply without a mention in a chain evident never answered in is not for evident
    await h.send.send(h.send.channel_reply("lunch?", root="unrelated-root"))
    await h.settle()
    assert len(h.engine.asks) == 2


async def test_a_group_chat_is_answered_only_when_evident_is_mentioned(h: Harness) -> None:
    await h.send.send(h.send.group_chat("anyone know the VPN portal?"))  # a fresh chat, no mention
    await h.send.send(h.send.group_chat("How do I get VPN access?", mention=True))
    await h.answers()
    await h.send.send(h.send.group_chat("thanks, and lunch at noon?"))  # after an answer, still no mention
    await h.settle()
    assert [a.question for a in h.engine.asks] == ["How do I get VPN access?"]


async def test_personal_chat_is_answered_with_the_default_scope(make_harness: Factory) -> None:
    h = await make_harness(channel_spaces=f"{CHANNEL}=ENG", default_spaces="HR")
    await h.send.send(h.send.personal("How many vacation days do I have?"))
    await h.send.send(h.send.channel_mention("deploy?"))
    await h.answers(2)
    assert {a.question: a.spaces for a in h.engine.asks} == {
        "How many vacation days do I have?": ("HR",), "deploy?": ("ENG",)}


async def test_reaction_and_button_explain_once(h: Harness) -> None:
    act = h.send.channel_mention("How do I get VPN access?")
    await h.send.send(act)
    (answer,) = await h.answers()
    answer_id = next(p.id for p in h.connector.posted if p.activity is answer)
    conv = act["conversation"]["id"]
    await h.send.send(h.send.reaction(conv, answer_id, "surprised"))
    assert await h.connector.wait_for(lambda: len(_cards(h)) == 1)
    card = _cards(h)[0]
    texts = [b["text"] for b in card["body"]]
    assert texts[0].startswith("**Why this answer?**")
    assert any("52%" in t and "(https://wiki.example.com/pages/1)" in t for t in texts)
    turn_id = answer["attachments"][0]["content"]["actions"][0]["data"]["turn"]
    await h.send.send(h.send.explain_button(conv, answer_id, turn_id))
    await h.send.send(h.send.reaction(conv, answer_id, "like"))  # not an explain reaction
    await h.settle()
    assert len(_cards(h)) == 1 and h.engine.explain_computations == [turn_id]


async def test_explain_button_for_another_conversations_turn_is_ignored(h: Harness) -> None:
    act = h.send.channel_mention("How do I get VPN access?")
    await h.send.send(act)
    (answer,) = await h.answers()
    turn_id = answer["attachments"][0]["content"]["actions"][0]["data"]["turn"]
    await h.send.send(h.send.explain_button("a:someone-elses-chat", "x", turn_id))
    await h.send.send(h.send.explain_button(act["conversation"]["id"], "x", "not-a-turn-id"))
    await h.settle()
    assert h.engine.explain_computations == [] and _cards(h) == []


async def test_feedback_invoke_is_acknowledged_and_stored_with_platform_and_comment(
    h: Harness, tmp_path: Path
) -> None:
    act = h.send.personal("How do I get VPN access?")
    await h.send.send(act)
    (answer,) = await h.answers()
    answer_id = next(p.id for p in h.connector.posted if p.activity is answer)
    status, body = await h.send.send(
        h.send.feedback(act["conversation"]["id"], answer_id, "dislike", "wrong page")
    )
    assert status == 200 and body == {}
    await h.settle()
    conn = sqlite3.connect(h.store.path)
    rows = conn.execute("SELECT user_id, value, platform, comment FROM feedback").fetchall()
    conn.close()
    assert rows == [("aad-user-1", -1, "teams", "wrong page")]


async def test_redelivered_activity_is_answered_once(h: Harness) -> None:
    act = h.send.personal("How do I get VPN access?")
    assert (await h.send.send(act))[0] == 200
    assert (await h.send.send(act))[0] == 200
    await h.answers()
    await h.settle()
    assert len(h.engine.asks) == 1


UNSIGNED_CASES = [
    "missing",
    "wrong-key",
    "wrong-audience",
    "expired",
    "other-service-url",
    "garbage",
    "no-service-url-claim",
    "key-endorsed-for-another-channel",
    "no-channel-id-under-an-endorsed-key",
    "tenant-issuer-with-the-bot-framework-key",
    "bot-framework-issuer-with-the-tenant-key",
    "tenant-token-of-another-tenant",
    "untrusted-issuer",
]


@pytest.mark.parametrize("case", UNSIGNED_CASES)
async def test_requests_not_signed_by_the_bot_framework_get_401(h: Harness, case: str) -> None:
    act = h.send.personal("How do I get VPN access?")
    url, ident = act["serviceUrl"], h.identity
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    tenant = {"issuer": ident.TENANT_ISSUER, "key": ident.tenant_key, "kid": ident.tenant_kid}
    kwargs: dict[str, Any] = {
        "missing": {"authorization": ""},
        "wrong-key": {"token": ident.sign(url, key=other)},
        "wrong-audience": {"token": ident.sign(url, audience="someone-else")},
        "expired": {"token": ident.sign(url, expires_in=-3600)},
        "other-service-url": {"token": ident.sign("https://evil.example/")},
        "garbage": {"authorization": "Bearer not.a.jwt"},
        # a genuine token without the claim, on an activity that points at another host
        "no-service-url-claim": {"token": ident.sign(None)},
        "key-endorsed-for-another-channel": {
            "token": ident.sign(url, key=ident.webchat_key, kid=ident.webchat_kid)
        },
        "no-channel-id-under-an-endorsed-key": {"token": ident.sign(url)},
        "tenant-issuer-with-the-bot-framework-key": {"token": ident.sign(url, issuer=ident.TENANT_ISSUER)},
        "bot-framework-issuer-with-the-tenant-key": {
            "token": ident.sign(url, key=ident.tenant_key, kid=ident.tenant_kid)
        },
        "tenant-token-of-another-tenant": {"token": ident.sign(url, tid="tenant-2", **tenant)},
        "untrusted-issuer": {"token": ident.sign(url, issuer="https://sts.windows.net/tenant-2/")},
    }[case]
    if case == "no-service-url-claim":
        act["serviceUrl"] = h.connector.url.replace("127.0.0.1", "localhost") + "/"  # another host, same fake
    if case == "no-channel-id-under-an-endorsed-key":
        del act["channelId"]
    status, _ = await h.send.send(act, **kwargs)
    assert status == 401
    await h.settle()
    assert h.engine.asks == [] and h.connector.posted == []


async def test_a_single_tenant_bot_accepts_its_tenants_tokens_checked_with_the_tenants_keys(
    h: Harness,
) -> None:
    act = h.send.personal("How do I get VPN access?")
    ident = h.identity
    token = ident.sign(
        act["serviceUrl"], issuer=ident.TENANT_ISSUER, key=ident.tenant_key, kid=ident.tenant_kid, tid=TENANT
    )
    assert (await h.send.send(act, token=token))[0] == 200
    (answer,) = await h.answers()
    assert "VPN portal" in answer["text"] and "tenant" in ident.metadata_reads


async def test_an_activity_arriving_during_the_drain_is_refused_for_redelivery(make_harness: Factory) -> None:
    h = await make_harness(FakeEngine(delay_s=0.5))
    await h.send.send(h.send.personal("How do I get VPN access?"))
    await h.connector.wait_for(lambda: len(h.engine.asks) == 1)
    draining = asyncio.create_task(h.bot.drain(5))
    await asyncio.sleep(0.01)
    status, _ = await h.send.send(h.send.personal("and on Linux?"))
    assert status == 503  # not 200-and-dropped: the Bot Framework delivers it again
    assert await draining == 0  # the answer in flight still finished
    await h.answers()
    assert [a.question for a in h.engine.asks] == ["How do I get VPN access?"]


async def test_connector_429_is_retried_after_retry_after(h: Harness) -> None:
    h.connector.throttle, h.connector.retry_after = 2, "0.2"
    await h.send.send(h.send.personal("How do I get VPN access?"))
    (answer,) = await h.answers()
    assert "VPN portal" in answer["text"]


async def test_connector_503_waits_for_its_retry_after(h: Harness) -> None:
    h.connector.throttle, h.connector.throttle_status, h.connector.retry_after = 1, 503, "0.6"
    await h.send.send(h.send.personal("How do I get VPN access?"))
    (answer,) = await h.answers()
    assert "VPN portal" in answer["text"]
    first, second = h.connector.attempts[:2]
    assert second - first >= 0.6  # the jittered backoff alone waits at most 0.5 s on the first retry


async def test_non_activity_bodies_are_400(h: Harness) -> None:
    for body in ([1, 2], {"text": "no type"}):
        status, _ = await h.send.send(body, authorization="")  # type: ignore[arg-type]
        assert status == 400


def _injecting_answer(question: str) -> Answer:
    return Answer(
        text="Ask <at>Boss</at> or see [click](https://evil.example) **now** [1].",
        citations=[Citation(1, "https://wiki.example.com/x", "Title *with* <b>markup</b>", "IT", ("e",))],
    )


async def test_page_text_cannot_mention_link_or_format(make_harness: Factory) -> None:
    h = await make_harness(FakeEngine(answer_for=_injecting_answer))
    await h.send.send(h.send.personal("who?"))
    (answer,) = await h.answers()
    text = answer["text"]
    assert "<at>" not in text and "&lt;at&gt;Boss&lt;/at&gt;" in text
    assert "](https://evil.example)" not in text and "\\[click\\]\\(https://evil.example\\)" in text
    assert "\\*\\*now\\*\\* [1]." in text  # the citation marker survives escaping


def test_mention_stripping_keeps_other_mentions_as_text() -> None:
    act = Activity.parse(
        {
            "type": "message",
            "text": "<at>evident</at> does <at>Bob</at> know about &amp; VPN",
            "recipient": {"id": BOT_ID},
            "conversation": {"id": "c"},
            "entities": [
                {"type": "mention", "text": "<at>evident</at>", "mentioned": {"id": BOT_ID}},
                {"type": "mention", "text": "<at>Bob</at>", "mentioned": {"id": "29:bob"}},
                "not-an-entity",
            ],
            "from": ["wrong", "type"],
        }
    )
    assert act.question() == "does Bob know about & VPN" and act.mentions_bot and act.user_id == ""


def test_answer_rendering_escapes_and_keeps_markers() -> None:
    result = TurnResult(7, Answer(text="a_b [1, 2]", citations=[]), "q", False)
    out = answer_activity(result)
    assert out["text"] == "a\\_b [1, 2]" and escape("<x>") == "&lt;x&gt;"


def _cards(h: Harness) -> list[dict[str, Any]]:
    return [a["content"] for p in h.connector.messages() if not p.activity.get("entities")
            for a in p.activity.get("attachments") or [] if a.get("contentType", "").endswith("adaptive")]


async def test_teams_alone_serves_health_on_the_http_port_and_drains_on_stop(tmp_path: Path) -> None:
    """As `evident serve` runs Teams alone: /api/messages on EVIDENT_TEAMS_PORT, /healthz /readyz /livez
    /metrics on EVIDENT_HTTP_PORT (as docs/deploy.md says), a stop waits for the answer in flight."""
    import functools

    from bot.core.health import add_health_routes
    from evident.serve import serve_platforms
    from pipeline.runtime.metrics import Metrics

    identity, connector = await FakeIdentity().start(), await FakeConnector().start()
    engine = FakeEngine(delay_s=0.3)
    engine.store = store = await Store.open(tmp_path / "serve.db")
    settings = Settings.load(
        env={},
        teams_app_id=APP_ID,
        teams_app_password=APP_PASSWORD,
        teams_tenant_id=TENANT,
        teams_openid_url=identity.openid_url,
        teams_token_url=identity.token_url,
        teams_port=0,
        http_port=0,
    )
    platform = TeamsPlatform(settings.teams, settings.chat, engine, access_policy(settings, engine),
                             host="127.0.0.1")
    stop, ports, checks = asyncio.Event(), [], {}
    health = functools.partial(add_health_routes, checks=checks, metrics=Metrics())
    task = asyncio.create_task(serve_platforms([platform], stop, port=0, host="127.0.0.1", routes=health,
                                               checks=checks, started=ports.append, drain_timeout_s=10))
    try:
        await connector.wait_for(lambda: bool(ports) and platform.port != 0)
        async with ActivitySender(f"http://127.0.0.1:{platform.port}/api/messages", identity,
                                  connector.url + "/") as send:
            assert (await send.send(send.personal("How do I get VPN access?")))[0] == 200
        async with httpx.AsyncClient() as c:
            for path in ("/healthz", "/readyz", "/livez", "/metrics"):
                assert (await c.get(f"http://127.0.0.1:{ports[0]}{path}")).status_code == 200, path
            assert (await c.get(f"http://127.0.0.1:{platform.port}/healthz")).status_code == 404
            ready = (await c.get(f"http://127.0.0.1:{ports[0]}/readyz")).json()
        assert ready["checks"]["teams"]["ok"] is True
        await asyncio.sleep(0.05)
        stop.set()  # the answer is still being computed: shutdown waits for it
        await asyncio.wait_for(task, 10)
        assert any(p.activity.get("entities") for p in connector.posted)
    finally:
        stop.set()
        await connector.close()
        await identity.close()
        await store.close()


def test_serve_needs_a_platform_and_complete_teams_settings() -> None:
    from evident.platforms import configured
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="nothing to serve"):
        configured(Settings.load(env={}))
    both = Settings.load(env={"TEAMS_APP_ID": APP_ID, "TEAMS_APP_PASSWORD": "x", "TEAMS_TENANT_ID": TENANT,
                              "SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1"})
    assert [r.name for r in configured(both)] == ["slack", "teams"]
    with pytest.raises(ConfigError, match="TEAMS_APP_PASSWORD"):
        configured(Settings.load(env={"TEAMS_APP_ID": APP_ID}))
    with pytest.raises(ConfigError, match="TEAMS_TENANT_ID"):
        configured(Settings.load(env={"TEAMS_APP_ID": APP_ID, "TEAMS_APP_PASSWORD": "x"}))


def test_app_package_has_the_bot_id_scopes_and_icons(tmp_path: Path) -> None:
    import json
    import zipfile

    from click.testing import CliRunner

    from evident.cli import main

    out = tmp_path / "pkg.zip"
    res = CliRunner().invoke(main, ["teams", "package", "--out", str(out)], env={"TEAMS_APP_ID": APP_ID})
    assert res.exit_code == 0, res.output
    with zipfile.ZipFile(out) as z:
        assert sorted(z.namelist()) == ["color.png", "manifest.json", "outline.png"]
        manifest = json.loads(z.read("manifest.json"))
    assert manifest["id"] == APP_ID and manifest["bots"][0]["botId"] == APP_ID
    assert manifest["bots"][0]["scopes"] == ["personal", "team", "groupChat"]
    bad = CliRunner().invoke(main, ["teams", "package", "--out", str(out), "--app-id", "not-a-guid"])
    assert bad.exit_code == 2 and "must be the bot's Microsoft App ID" in bad.output


async def test_team_mapping_applies_to_its_unmapped_channels_and_ask_is_a_command_word(
    make_harness: Factory,
) -> None:
    h = await make_harness(channel_spaces="19:team=OPS;19:hr@thread.tacv2=HR")
    await h.send.send(h.send.channel_mention("ask how do I deploy?"))  # channel 19:eng in team 19:team
    await h.send.send(h.send.channel_mention("holidays?", channel="19:hr@thread.tacv2"))
    await h.answers(2)
    assert {a.question: a.spaces for a in h.engine.asks} == {
        "how do I deploy?": ("OPS",),
        "holidays?": ("HR",),
    }
