"""The bot end to end over the HTTP Events API: signed payloads -> Bolt -> fake Slack Web API."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fake_slack import BOT_USER, SIGNING_SECRET, EventSender, EventsServer, FakeEngine, FakeSlack
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.app import build_bot
from bot.slack.blocks import PLACEHOLDER
from bot.slack.handlers import EvidentBot
from evident.platforms import access_policy
from evident.settings import Settings
from pipeline.errors import TransientError
from pipeline.store import Store
from pipeline.types import Answer, Citation

BOT_TOKEN = "xoxb-test-token-123"


@dataclass
class Harness:
    slack: FakeSlack
    engine: FakeEngine
    bot: EvidentBot
    send: EventSender

    async def settle(self) -> None:
        """Let listeners run and wait until no answer is in flight."""
        await asyncio.sleep(0.02)
        await self.slack.wait_for(lambda: self.bot.in_flight == 0)

    async def answered(self, n: int = 1) -> list[dict[str, Any]]:
        return await self.slack.wait_calls("chat.update", n)


def _text(args: dict[str, Any]) -> str:
    parts = [args.get("text", "")]
    for b in args.get("blocks") or []:
        if b["type"] == "section":
            parts.append(b["text"]["text"])
        elif b["type"] == "context":  # buttons (actions, context_actions) carry no answer text
            parts.extend(e["text"] for e in b.get("elements", []))
    return "\n".join(parts)


Factory = Callable[..., Awaitable[Harness]]


async def _slack_ts(h: Harness, turn_id: int) -> str | None:
    turn = await h.engine.store.get_turn(turn_id)
    return turn.message_ref if turn else None


@pytest.fixture
def slack_stream() -> bool:
    """Answers come the placeholder way here (as where Slack refuses to stream); test_slack_stream.py and the
    assistant tests override this fixture to stream."""
    return False


@pytest.fixture
async def make_harness(tmp_path: Path, slack_stream: bool) -> AsyncIterator[Factory]:
    cleanups: list[Callable[[], Awaitable[None]]] = []

    async def factory(engine: FakeEngine | None = None, **overrides: Any) -> Harness:
        slack = await FakeSlack().start()
        engine = engine or FakeEngine()
        engine.store = store = await Store.open(tmp_path / f"evident-{len(cleanups)}.db")
        # suggestions add a chat.update after each answer; only the test of them turns them on
        settings = Settings.load(
            env={},
            slack_bot_token=BOT_TOKEN,
            slack_signing_secret=SIGNING_SECRET,
            slack_transport="http",
            http_port=0,
            **{"followup_suggestions": False, "slack_stream": slack_stream, **overrides},
        )
        client = AsyncWebClient(token=BOT_TOKEN, base_url=slack.base_url)
        bot = build_bot(settings.slack, settings.chat, engine, access_policy(settings, engine), client=client)
        transport = await EventsServer(bot.app).start()
        sender = await EventSender(f"http://127.0.0.1:{transport.port}/slack/events").__aenter__()

        async def cleanup() -> None:
            await bot.drain(5)
            await sender.__aexit__()
            await transport.close()
            await slack.stop()
            await store.close()

        cleanups.append(cleanup)
        return Harness(slack, engine, bot, sender)

    yield factory
    for c in cleanups:
        await c()


@pytest.fixture
async def h(make_harness: Factory) -> Harness:
    return await make_harness()


async def test_mention_placeholder_then_answer_in_thread_with_links(h: Harness) -> None:
    ev = h.send.mention("How do I get VPN access?")
    assert await h.send.event(ev) == 200
    (update,) = await h.answered()
    (placeholder,) = h.slack.of("chat.postMessage")
    assert placeholder["text"] == PLACEHOLDER and placeholder["thread_ts"] == ev["ts"]
    assert placeholder["channel"] == "C1" and placeholder["_token"] == BOT_TOKEN
    assert h.slack.messages[("C1", update["ts"])]["thread_ts"] == ev["ts"]  # the placeholder was updated
    text = _text(update)
    assert "open the VPN portal <https://wiki.example.com/pages/1|[1]>" in text
    assert "[1] <https://wiki.example.com/pages/1|VPN access> · IT" in text
    assert "[2] <https://wiki.example.com/pages/2|Remote work guide> · HR" in text
    assert "React with :explain: or :mag: to see why" in text
    (ask,) = h.engine.asks
    assert (
        ask.key == f"T1:C1:{ev['ts']}" and ask.question == "How do I get VPN access?" and ask.user_id == "U1"
    )
    assert ask.spaces is None and ask.history is None
    assert await h.slack.wait_for(lambda: _slack_ts(h, 1)) == update["ts"]


async def test_followup_without_mention_shows_completed_question(h: Harness) -> None:
    first = h.send.mention("How do I get VPN access?")
    await h.send.event(first)
    await h.answered(1)
    await h.send.event(h.send.message("and on Linux?", thread_ts=first["ts"]))
    updates = await h.answered(2)
    assert "Answering: _and on Linux? (regarding: How do I get VPN access?)_" in _text(updates[1])
    assert h.slack.of("chat.postMessage")[1]["thread_ts"] == first["ts"]
    assert [a.key for a in h.engine.asks] == [f"T1:C1:{first['ts']}"] * 2


async def test_thread_reply_in_unknown_thread_and_top_level_chatter_are_ignored(h: Harness) -> None:
    await h.send.event(h.send.message("random chat", thread_ts="1500000000.000001"))
    await h.send.event(h.send.message("top-level chatter"))
    await h.settle()
    assert h.engine.asks == [] and h.slack.of("chat.postMessage") == []


async def test_direct_message_answered_top_level(h: Harness) -> None:
    await h.send.event(h.send.message("How do I get VPN access?", channel="D1", channel_type="im"))
    (update,) = await h.answered()
    (placeholder,) = h.slack.of("chat.postMessage")
    assert placeholder["channel"] == "D1" and "thread_ts" not in placeholder
    assert h.engine.asks[0].key == "T1:D1:main"
    assert "<https://wiki.example.com/pages/1|[1]>" in _text(update)


async def test_slash_ask_acks_at_once_and_answers_in_channel(h: Harness) -> None:
    status, body = await h.send.command("How do I get VPN access?", channel="C2", user="U7")
    assert status == 200 and body == ""
    (update,) = await h.answered()
    (placeholder,) = h.slack.of("chat.postMessage")
    assert placeholder["channel"] == "C2" and "thread_ts" not in placeholder
    assert "<@U7> asked: How do I get VPN access?" in _text(update)
    assert h.engine.asks[0].key == f"T1:C2:{update['ts']}"  # the answer starts the thread


async def test_slash_ask_ephemeral_uses_response_url(make_harness: Factory) -> None:
    h = await make_harness(ask_ephemeral=True)
    status, body = await h.send.command("How do I get VPN access?", response_url=f"{h.slack.url}/response/r1")
    assert status == 200 and json.loads(body) == {"text": PLACEHOLDER, "response_type": "ephemeral"}
    (resp,) = await h.slack.wait_calls("response_url")
    assert resp["response_type"] == "ephemeral" and resp["replace_original"] is True
    assert "<https://wiki.example.com/pages/1|[1]>" in _text(resp)
    assert h.slack.of("chat.postMessage") == []


async def test_empty_mention_gets_a_hint(h: Harness) -> None:
    await h.send.event(h.send.mention(""))
    (post,) = await h.slack.wait_calls("chat.postMessage")
    assert post["text"].startswith("Ask me a question about the wiki")
    assert h.engine.asks == []


async def test_slash_ask_without_text_shows_usage(h: Harness) -> None:
    status, body = await h.send.command("   ")
    assert status == 200 and "Usage" in body
    assert h.engine.asks == []


async def _answer_once(h: Harness) -> tuple[dict[str, Any], dict[str, Any]]:
    ev = h.send.mention("How do I get VPN access?")
    await h.send.event(ev)
    (update,) = await h.answered()
    await h.slack.wait_for(lambda: _slack_ts(h, 1))
    return ev, update


async def test_explain_reaction_posts_attribution_once(h: Harness) -> None:
    ev, update = await _answer_once(h)
    await h.send.event(h.send.reaction("explain", "C1", update["ts"]))
    posts = await h.slack.wait_calls("chat.postMessage", 2)
    explanation = posts[1]
    assert explanation["thread_ts"] == ev["ts"]
    assert "`████░░░░` 52%  <https://wiki.example.com/pages/1|VPN access> (+2 similar)" in explanation["text"]
    assert "48%  <https://wiki.example.com/pages/2|Remote work guide>" in explanation["text"]
    await h.send.event(h.send.reaction("mag", "C1", update["ts"], user="U2"))
    await h.send.event(h.send.reaction("explain", "C1", update["ts"], user="U3"))
    await h.settle()
    assert h.engine.explain_computations == [1]
    assert len(h.slack.of("chat.postMessage")) == 2


async def test_explain_on_non_evident_message_is_ignored(h: Harness) -> None:
    _, update = await _answer_once(h)
    await h.send.event(h.send.reaction("explain", "C1", "1600000000.999999"))  # a bot message without turn
    await h.send.event(h.send.reaction("explain", "C1", update["ts"], item_user="U5"))  # someone else's
    await h.settle()
    assert h.engine.explain_computations == []
    assert len(h.slack.of("chat.postMessage")) == 1


async def _n_feedback(store: Store, n: int) -> dict[str, int] | None:
    fb = await store.get_feedback(1)
    return fb if len(fb) == n else None


async def test_feedback_reactions_set_and_remove(h: Harness) -> None:
    _, update = await _answer_once(h)
    store = h.engine.store
    await h.send.event(h.send.reaction("+1", "C1", update["ts"], user="U1"))
    await h.send.event(h.send.reaction("thumbsdown::skin-tone-3", "C1", update["ts"], user="U2"))
    assert await h.slack.wait_for(lambda: _n_feedback(store, 2)) == {"U1": 1, "U2": -1}
    await h.send.event(h.send.reaction("+1", "C1", update["ts"], user="U1", added=False))
    assert await h.slack.wait_for(lambda: _n_feedback(store, 1)) == {"U2": -1}


async def test_retried_event_is_answered_exactly_once(h: Harness) -> None:
    ev = h.send.mention("How do I get VPN access?")
    assert await h.send.event(ev, event_id="EvSAME") == 200
    assert await h.send.event(ev, event_id="EvSAME", headers={"X-Slack-Retry-Num": "1",
                                                             "X-Slack-Retry-Reason": "http_timeout"}) == 200
    await h.answered()
    await h.settle()
    assert len(h.engine.asks) == 1 and len(h.slack.of("chat.postMessage")) == 1


async def test_retry_reaching_a_restarted_process_is_ignored(make_harness: Factory) -> None:
    h = await make_harness()
    engine = h.engine
    await engine.store.mark_event_seen("EvBEFORE")  # the previous process handled the first delivery
    await h.send.event(h.send.mention("vpn?"), event_id="EvBEFORE", headers={"X-Slack-Retry-Num": "2"})
    await h.send.event(h.send.mention("fresh?"), event_id="EvNEW")
    await h.answered()
    await h.settle()
    assert [a.question for a in engine.asks] == ["fresh?"]


async def test_mention_delivered_as_app_mention_and_message_is_answered_once(h: Harness) -> None:
    mention = h.send.mention("How do I get VPN access?")
    as_message = h.send.message(mention["text"], ts=mention["ts"])
    await asyncio.gather(h.send.event(as_message), h.send.event(mention))
    # the same mention inside a thread evident already knows (both listeners would want it)
    await h.answered()
    in_thread = h.send.mention("and on Linux?", thread_ts=mention["ts"])
    await asyncio.gather(h.send.event(h.send.message(in_thread["text"], ts=in_thread["ts"],
                                                     thread_ts=mention["ts"])),
                         h.send.event(in_thread))
    await h.answered(2)
    await h.settle()
    assert len(h.engine.asks) == 2 and len(h.slack.of("chat.postMessage")) == 2


async def test_own_and_other_bot_messages_and_edits_are_ignored(h: Harness) -> None:
    ev, _ = await _answer_once(h)
    thread = ev["ts"]
    await h.send.event(h.send.message("my own answer", user=BOT_USER, thread_ts=thread))
    await h.send.event(
        h.send.message("beep", thread_ts=thread, bot_id="B999", subtype="bot_message", user=None)
    )
    await h.send.event(h.send.message("beep", thread_ts=thread, bot_id="B999", user="U9"))
    await h.send.event(h.send.message("edited", thread_ts=thread, subtype="message_changed"))
    await h.send.event(h.send.message("", thread_ts=thread, subtype="channel_join"))
    await h.send.event(h.send.message("", thread_ts=thread, subtype="file_share"))  # image, no text
    await h.send.event(h.send.message("dm from bot", channel="D1", channel_type="im", bot_id="B999"))
    await h.settle()
    assert len(h.engine.asks) == 1


async def test_other_bots_answered_when_ignore_bots_is_off(make_harness: Factory) -> None:
    h = await make_harness(ignore_bots=False)
    await h.send.event(h.send.message("q?", channel="D1", channel_type="im", bot_id="B999", user="U9"))
    await h.answered()
    assert len(h.engine.asks) == 1


def _injecting_answer(question: str) -> Answer:
    return Answer(
        text="Hi <!channel> & <@U1>, see [1]. <https://evil.example|click>",
        citations=[Citation(1, "https://wiki.example.com/x", "<!channel> & <@U1>", "<!here>", ("e",))],
    )


async def test_mrkdwn_injection_is_escaped(make_harness: Factory) -> None:
    h = await make_harness(FakeEngine(answer_for=_injecting_answer))
    await h.send.event(h.send.mention("<!channel> hi"))
    (update,) = await h.answered()
    text = _text(update)
    assert "<!channel>" not in text and "<@U1>" not in text and "<!here>" not in text
    assert "<https://evil.example" not in text
    assert "[1] <https://wiki.example.com/x|&lt;!channel&gt; &amp; &lt;@U1&gt;> · &lt;!here&gt;" in text
    assert "Hi &lt;!channel&gt; &amp; &lt;@U1&gt;, see <https://wiki.example.com/x|[1]>." in text


def _long_answer(question: str) -> Answer:
    para = "The VPN needs a certificate that IT issues on request [1]. " * 30
    return Answer(text="\n\n".join([para] * 5),
                  citations=[Citation(1, "https://wiki.example.com/1", "VPN", "IT", ("e",))])


async def test_long_answer_is_split_into_sections(make_harness: Factory) -> None:
    h = await make_harness(FakeEngine(answer_for=_long_answer))
    await h.send.event(h.send.mention("vpn?"))
    (update,) = await h.answered()
    sections = [b["text"]["text"] for b in update["blocks"] if b["type"] == "section"]
    assert len(sections) >= 3 and all(len(s) <= 3000 for s in sections)
    assert sum(s.count("<https://wiki.example.com/1|[1]>") for s in sections) == 150


async def test_engine_error_is_shown_and_logged_without_tokens(h: Harness,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    h.engine.fail_with = TransientError("upstream 503 from llm")
    await h.send.event(h.send.mention("How do I get VPN access?"))
    (update,) = await h.answered()
    assert update["text"] == "I couldn't reach the language model, please try again."
    assert "upstream 503" in caplog.text  # details in the logs ...
    assert BOT_TOKEN not in caplog.text and SIGNING_SECRET not in caplog.text  # ... never secrets


async def test_turn_result_error_is_shown(h: Harness) -> None:
    h.engine.error_text = "The wiki index is being rebuilt <@U1>."
    h.engine.answer_for = lambda q: Answer(text="")
    await h.send.event(h.send.mention("vpn?"))
    (update,) = await h.answered()
    assert update["text"] == "The wiki index is being rebuilt &lt;@U1&gt;."


async def test_bad_signature_is_rejected(h: Harness) -> None:
    status = await h.send.event(h.send.mention("vpn?"), secret="wrong-secret")
    assert status == 401
    await h.settle()
    assert h.engine.asks == [] and h.slack.calls == []


async def test_channel_space_mapping_is_passed_to_the_engine(make_harness: Factory) -> None:
    h = await make_harness(channel_spaces="C9=ENG,OPS")
    await h.send.event(h.send.mention("deploy?", channel="C9"))
    await h.send.event(h.send.mention("holidays?", channel="C1"))
    await h.answered(2)
    assert {a.question: a.spaces for a in h.engine.asks} == {"deploy?": ("ENG", "OPS"), "holidays?": None}


async def test_feedback_and_explain_buttons_under_an_answer(h: Harness) -> None:
    ev, update = await _answer_once(h)
    blocks = update["blocks"]
    (feedback,) = [e for b in blocks if b["type"] == "context_actions" for e in b["elements"]]
    (explain,) = [e for b in blocks if b["type"] == "actions" for e in b["elements"]]
    assert feedback["type"] == "feedback_buttons" and explain["action_id"] == "evident_explain"
    turn_id = int(explain["value"])
    assert feedback["positive_button"]["value"] == f"up:{turn_id}"
    assert (
        await h.send.block_action(
            "evident_feedback",
            f"down:{turn_id}",
            user="U7",
            action_type="feedback_buttons",
            message_ts=update["ts"],
        )
        == 200
    )
    assert await h.send.block_action("evident_explain", str(turn_id), message_ts=update["ts"]) == 200
    # not where it was asked
    assert await h.send.block_action("evident_explain", str(turn_id), channel="C2") == 200
    await h.settle()
    assert await h.engine.store.get_feedback(turn_id) == {"U7": -1}
    explanations = [m for m in h.slack.of("chat.postMessage") if "Why this answer?" in m.get("text", "")]
    assert (
        len(explanations) == 1
        and explanations[0]["channel"] == "C1"
        and explanations[0]["thread_ts"] == ev["ts"]
    )
    # a reaction after the button: the answer is already explained
    await h.send.event(h.send.reaction("mag", "C1", update["ts"]))
    await h.settle()
    assert len([m for m in h.slack.of("chat.postMessage") if "Why this answer?" in m.get("text", "")]) == 1


async def test_suggested_next_questions_are_buttons_that_ask_in_the_thread(make_harness: Factory) -> None:
    h = await make_harness(followup_suggestions=True)
    ev = h.send.mention("How do I get VPN access?")
    await h.send.event(ev)
    await h.slack.wait_for(lambda: any(b.get("block_id") == "evident_suggestions"
                                       for m in h.slack.of("chat.update") for b in m.get("blocks") or []))
    last = h.slack.of("chat.update")[-1]
    (row,) = [b for b in last["blocks"] if b.get("block_id") == "evident_suggestions"]
    assert [e["value"] for e in row["elements"]] == ["What about Linux?", "Who approves VPN requests?"]
    assert "[1]" in _text(last)  # the answer itself is still there
    await h.send.block_action(row["elements"][0]["action_id"], "What about Linux?", user="U5",
                              message_ts=last["ts"], thread_ts=ev["ts"])
    await h.answered(2)
    first, second = h.engine.asks
    assert second.question == "What about Linux?" and second.user_id == "U5" and second.key == first.key


async def test_unmapped_channels_and_dms_get_the_default_scope(make_harness: Factory) -> None:
    h = await make_harness(channel_spaces="C9=ENG", default_spaces="HR,IT")
    await h.send.event(h.send.mention("holidays?", channel="C1"))
    await h.send.event(h.send.message("laptop?", channel="D1", channel_type="im"))
    await h.answered(2)
    assert {a.question: a.spaces for a in h.engine.asks} == {
        "holidays?": ("HR", "IT"),
        "laptop?": ("HR", "IT"),
    }


async def test_default_scope_none_answers_nothing_until_mapped(make_harness: Factory) -> None:
    h = await make_harness(channel_spaces="C9=ENG", default_spaces="none")
    await h.send.event(h.send.mention("holidays?", channel="C1"))
    await h.send.event(h.send.mention("deploy?", channel="C9"))
    await h.answered()
    await h.settle()
    assert [a.question for a in h.engine.asks] == ["deploy?"]
    said = [m["text"] for m in h.slack.of("chat.postMessage") if m.get("channel") == "C1"]
    assert said and "isn't connected to any wiki space" in said[0]


async def test_mention_in_unseen_thread_backfills_history(h: Harness) -> None:
    root = "1500000000.000100"
    h.slack.seed_thread("C1", root, [
        {"ts": root, "user": "U2", "text": "Our VPN keeps dropping"},
        {"ts": "1500000000.000200", "user": "U3", "text": "Same here since Monday"},
        {"ts": "1500000000.000300", "bot_id": "B42", "subtype": "bot_message", "text": "Ticket created"},
        {"ts": "1500000000.000350", "user": "U2", "text": "joined", "subtype": "channel_join"},
    ])
    ev = h.send.mention("what does the wiki say?", thread_ts=root, ts="1500000000.000400")
    h.slack.seed_thread("C1", root, [{"ts": ev["ts"], "user": "U1", "text": ev["text"]}])
    await h.send.event(ev)
    await h.answered()
    assert len(h.slack.of("conversations.replies")) == 3  # 5 messages, 2 per page
    assert h.engine.asks[0].history == [
        ("user", "Our VPN keeps dropping"),
        ("user", "Same here since Monday"),
        ("user", "Ticket created"),
    ]
    assert h.engine.asks[0].key == f"T1:C1:{root}"
    assert h.slack.of("chat.postMessage")[0]["thread_ts"] == root


async def test_per_user_rate_limit_is_polite(make_harness: Factory) -> None:
    h = await make_harness(user_rate_per_min=1)
    await h.send.event(h.send.mention("first?"))
    await h.answered()
    await h.send.event(h.send.mention("second?"))
    (eph,) = await h.slack.wait_calls("chat.postEphemeral")
    assert eph["user"] == "U1" and "wait about" in eph["text"]
    await h.send.event(h.send.mention("other user", user="U2"))
    await h.answered(2)
    assert [a.question for a in h.engine.asks] == ["first?", "other user"]


async def test_slack_429_is_retried_honouring_retry_after(h: Harness) -> None:
    h.slack.fail_next("chat.postMessage", status=429, error="ratelimited", headers={"Retry-After": "0"})
    await h.send.event(h.send.mention("vpn?"))
    await h.slack.wait_calls("chat.update", 1, within_s=5)
    assert len(h.slack.of("chat.postMessage")) == 2


async def test_failed_update_falls_back_to_a_visible_message(h: Harness) -> None:
    h.slack.fail_next("chat.update", error="invalid_blocks")
    await h.send.event(h.send.mention("vpn?"))
    updates = await h.answered(2)
    assert "Slack wouldn't let me show it" in updates[1]["text"]


async def test_graceful_drain_waits_for_in_flight_answers(make_harness: Factory) -> None:
    h = await make_harness(FakeEngine(delay_s=0.3))
    await h.send.event(h.send.mention("slow?"))
    await h.slack.wait_calls("chat.postMessage")
    assert h.bot.in_flight == 1
    assert await h.bot.drain(5) == 0
    assert len(h.slack.of("chat.update")) == 1
    assert await h.send.event(h.send.mention("after shutdown?")) == 503  # not acknowledged: Slack redelivers
    await asyncio.sleep(0.02)
    assert len(h.engine.asks) == 1
