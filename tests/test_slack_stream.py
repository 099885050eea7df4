"""Answers streamed into channel threads (``chat.startStream`` with the asker as recipient): the work as task
cards, then the text, then the sources; the placeholder path where Slack refuses; every stream ends."""
# ruff: noqa: F811  (the harness fixtures are imported from test_bot_http and shadowed by parameters)

from __future__ import annotations

import time

import pytest
from fake_slack import LLM_DOWN, FakeEngine, default_answer
from test_bot_http import Factory, Harness, h, make_harness  # noqa: F401  (the fixtures)

from bot.core.messages import RESTARTING
from bot.slack.blocks import PLACEHOLDER
from bot.slack.mrkdwn import escape_markdown
from bot.slack.stream import StreamRefusals
from pipeline.errors import TransientError
from pipeline.types import Answer


@pytest.fixture
def slack_stream() -> bool:
    return True  # the production default


def _streamed_text(question: str) -> str:
    return escape_markdown(default_answer(question).text)  # what the fake engine streams, word by word


def _message(h: Harness, ts: str) -> dict:
    (message,) = [m for m in h.slack.messages.values() if m["ts"] == ts]
    return message


async def test_a_mention_streams_the_work_then_the_answer_into_its_thread(h: Harness) -> None:
    ev = h.send.mention("How do I get VPN access?", channel="C7", user="U5")
    await h.send.event(ev)
    (update,) = await h.answered()
    await h.settle()
    assert not h.slack.of("chat.postMessage")  # no placeholder message
    (start,) = h.slack.of("chat.startStream")
    assert (start["channel"], start["thread_ts"]) == ("C7", ev["ts"])
    assert (start["recipient_team_id"], start["recipient_user_id"]) == ("T1", "U5")
    assert start["chunks"] == [
        {"type": "task_update", "id": "search", "title": "Searching the wiki", "status": "in_progress"}
    ]
    appends = h.slack.of("chat.appendStream")
    search, read = appends[0]["chunks"]  # the pages read complete the search card, before any text
    assert (search["id"], search["status"], search["details"]) == ("search", "complete", "in HR, IT")
    assert read["title"] == "Read 2 pages of the wiki" and len(read["sources"]) == 2
    assert not appends[0].get("markdown_text") and appends[1]["markdown_text"]
    message = _message(h, update["ts"])
    assert message["streaming"] is False and message["streamed"] == _streamed_text("How do I get VPN access?")
    assert any(b["type"] == "actions" for b in message["blocks"])  # stopped with the buttons under it
    assert "|[1]>" in update["text"] and update["ts"] == message["ts"]  # then linked markers in place
    turn = await h.engine.store.get_turn(1)
    assert turn is not None and turn.message_ref == update["ts"]  # reactions on it explain this turn


async def test_someone_from_another_organisation_is_streamed_to_in_their_own_workspace(h: Harness) -> None:
    ev = h.send.mention("How do I get VPN access?", channel="C7", user="U9")
    ev["user_team"] = "T9"  # Slack Connect: the asker's workspace is not the one the event came to
    await h.send.event(ev)
    (start,) = await h.slack.wait_calls("chat.startStream")
    assert (start["recipient_team_id"], start["recipient_user_id"]) == ("T9", "U9")


async def test_a_failure_before_any_page_is_read_ends_the_search_card_as_failed(
    make_harness: Factory,
) -> None:
    engine = FakeEngine(answer_for=lambda q: Answer(text=""))  # no pages read, no text
    engine.fail_with = TransientError("upstream 503 from llm")
    h = await make_harness(engine)
    await h.send.event(h.send.mention("vpn?"))
    (stop,) = await h.slack.wait_calls("chat.stopStream")
    await h.settle()
    search, said = stop["chunks"]  # the card failed, then the error said, in that order
    assert (search["id"], search["status"]) == ("search", "error")
    assert said["type"] == "markdown_text" and said["text"].startswith(":warning: ")  # no blank lines first
    assert not h.slack.of("chat.postMessage") and not h.slack.of("chat.update")


async def test_an_llm_failure_mid_answer_is_said_in_the_streamed_message(make_harness: Factory) -> None:
    engine = FakeEngine(delay_s=0.2)
    engine.stream_fails_after = 3
    h = await make_harness(engine)
    await h.send.event(h.send.mention("How do I get VPN access?"))
    (stop,) = await h.slack.wait_calls("chat.stopStream")
    await h.settle()
    message = _message(h, stop["ts"])
    assert message["streaming"] is False and message["text"].endswith(f"\n\n:warning: {LLM_DOWN}")
    assert not h.slack.of("chat.postMessage")


async def test_where_slack_refuses_to_stream_the_placeholder_path_answers_and_is_remembered(
    h: Harness,
) -> None:
    h.slack.no_stream_channels.add("C3")
    for i in range(2):
        await h.send.event(h.send.mention(f"vpn {i}?", channel="C3"))
        await h.answered(i + 1)
        await h.settle()
    assert len(h.slack.of("chat.startStream")) == 1  # refused once, not asked again
    assert [p["text"] for p in h.slack.of("chat.postMessage")] == [PLACEHOLDER, PLACEHOLDER]
    await h.send.event(h.send.mention("vpn elsewhere?", channel="C4"))  # other channels still stream
    await h.slack.wait_calls("chat.stopStream")


async def test_a_rate_limited_append_holds_the_text_back_and_loses_none(make_harness: Factory) -> None:
    h = await make_harness(FakeEngine(delay_s=0.3))
    for _ in range(3):  # more than the client's own two retries
        h.slack.fail_next("chat.appendStream", status=429, error="ratelimited", headers={"Retry-After": "0"})
    await h.send.event(h.send.mention("How do I get VPN access?"))
    (stop,) = await h.slack.wait_calls("chat.stopStream")
    await h.settle()
    message = _message(h, stop["ts"])
    assert message["streamed"] == _streamed_text("How do I get VPN access?")  # every word, in order
    assert len(h.slack.of("chat.appendStream")) > 3 and not h.slack.of("chat.postMessage")


async def test_network_failures_while_streaming_hold_the_text_back_and_lose_none(
    make_harness: Factory,
) -> None:
    h = await make_harness(FakeEngine(delay_s=0.3))
    h.slack.drops["chat.appendStream"] = 2  # the connection drops: the cards, then the first text
    await h.send.event(h.send.mention("How do I get VPN access?"))
    (stop,) = await h.slack.wait_calls("chat.stopStream")
    await h.settle()
    message = _message(h, stop["ts"])
    assert message["streamed"] == _streamed_text("How do I get VPN access?")
    cards = [(c["id"], c["status"]) for c in message["chunks"] if c["type"] == "task_update"]
    assert cards == [("search", "in_progress"), ("search", "complete"), ("read", "complete")]
    assert not h.slack.of("chat.postMessage")  # one message, no "something went wrong"


async def test_a_refused_append_still_ends_the_stream_and_the_answer_replaces_it(
    make_harness: Factory,
) -> None:
    h = await make_harness(FakeEngine(delay_s=0.3))
    h.slack.fail_next("chat.appendStream", error="invalid_chunks")
    await h.send.event(h.send.mention("How do I get VPN access?"))
    (update,) = await h.answered()
    await h.settle()
    (stop,) = h.slack.of("chat.stopStream")
    assert stop["ts"] == update["ts"] and _message(h, update["ts"])["streaming"] is False
    assert "open the VPN portal" in update["text"] and not h.slack.of("chat.postMessage")


async def test_an_answer_that_did_not_stream_stops_the_stream_with_its_text(make_harness: Factory) -> None:
    engine = FakeEngine()
    engine.streams = False  # e.g. the extractive answerer: the answer comes whole
    h = await make_harness(engine)
    await h.send.event(h.send.mention("How do I get VPN access?"))
    (stop,) = await h.slack.wait_calls("chat.stopStream")
    assert stop["markdown_text"] == _streamed_text("How do I get VPN access?")  # not only its sources
    assert stop["blocks"] and all(b["type"] != "section" for b in stop["blocks"])


async def test_streamed_text_cannot_form_a_markdown_link(make_harness: Factory) -> None:
    engine = FakeEngine(answer_for=lambda q: Answer(text="Reset it [here](https://evil.example) ![x](https://e)"))
    engine.stream_fails_after = 5  # the failure path keeps the streamed text as it is
    h = await make_harness(engine)
    await h.send.event(h.send.mention("vpn?"))
    (stop,) = await h.slack.wait_calls("chat.stopStream")
    await h.settle()
    streamed = _message(h, stop["ts"])["streamed"]
    assert "[here](" not in streamed and "\\[here\\](https://evil.example)" in streamed


async def test_a_question_asked_at_the_top_of_a_channel_with_ask_gets_the_placeholder(h: Harness) -> None:
    await h.send.command("vpn?", channel="C1")
    await h.answered()
    assert not h.slack.of("chat.startStream")


async def test_shutdown_ends_an_open_stream_saying_so(make_harness: Factory) -> None:
    h = await make_harness(FakeEngine(delay_s=5))
    await h.send.event(h.send.mention("slow?"))
    await h.slack.wait_calls("chat.startStream")
    assert await h.bot.drain(0.2) == 1
    (stop,) = await h.slack.wait_calls("chat.stopStream")
    said = stop.get("markdown_text") or "".join(c.get("text", "") for c in stop.get("chunks") or [])
    assert RESTARTING.split(".")[0] in said
    cards = [(c.get("id"), c.get("status")) for c in stop.get("chunks") or [] if c["type"] == "task_update"]
    assert cards in ([], [("search", "error")])


def test_refusals_are_remembered_for_a_while_transient_errors_not_at_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    refusals = StreamRefusals(ttl_s=60, max_entries=2)
    refusals.refused("C1", "ratelimited")
    refusals.refused("C1", "HTTP 503")
    refusals.refused("C1", "missing_recipient_user_id")  # one question's fault, not the channel's
    refusals.refused("C1", "no_permission")  # may be the recipient's (Slack Connect), not the channel's
    assert refusals.allowed("C1")
    refusals.refused("C1", "channel_type_not_supported")
    assert not refusals.allowed("C1")
    refusals.refused("C2", "missing_scope")
    refusals.refused("C3", "not_allowed_token_type")  # bounded: the oldest goes
    assert refusals.allowed("C1") and not refusals.allowed("C3")
    now[0] += 61
    assert refusals.allowed("C2") and refusals.allowed("C3")
