"""The Slack bot driven with the REAL engine: signed Events API payloads -> Bolt -> Engine (sample-space Edge
index, real store and prompts, OpenAILLM against the stub LLM server) -> fake Slack Web API."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fake_slack import SIGNING_SECRET, EventSender, EventsServer, FakeSlack
from helpers import (
    RAG_MEETING_URL,
    EngineParts,
    make_engine,
    make_llm,
    open_copy,
    sample_index_fixture,  # noqa: F401
)
from slack_sdk.web.async_client import AsyncWebClient
from stub_llm import StubLLMServer

from bot.slack.app import build_bot
from bot.slack.handlers import EvidentBot
from evident.platforms import access_policy
from evident.settings import Settings

BOT_TOKEN = "xoxb-test-token-e2e"
QUESTION = "When is the next RAG meeting in November?"
REPHRASED = "What is Bruno's task from the RAG meeting in October?"


def _user(body: dict[str, Any]) -> str:
    return str(body["messages"][-1]["content"])


def _is_rephrase(body: dict[str, Any]) -> bool:
    return "rewrite the last message" in str(body["messages"][0]["content"])


def responder(body: dict[str, Any]) -> str:
    """Rephrases follow-ups; answers the meeting date only when its passage is among the sources."""
    if _is_rephrase(body):
        return REPHRASED
    prompt = _user(body)
    if "Question: " + REPHRASED in prompt:
        return "Bruno collects 50 real questions from the support team [Source 1]."
    if "12 November 2024" in prompt:
        return "The next RAG meeting is on 12 November 2024 [Source 1]."
    return "The sources do not say."


@dataclass
class Harness:
    slack: FakeSlack
    bot: EvidentBot
    send: EventSender
    parts: EngineParts

    async def answered(self, n: int = 1) -> list[dict[str, Any]]:
        return await self.slack.wait_calls("chat.update", n, within_s=15)


def _text(args: dict[str, Any]) -> str:
    parts = [args.get("text", "")]
    for b in args.get("blocks") or []:
        if b["type"] == "section":
            parts.append(b["text"]["text"])
        elif b["type"] == "context":  # buttons (actions, context_actions) carry no answer text
            parts.extend(e["text"] for e in b.get("elements", []))
    return "\n".join(parts)


Factory = Callable[[str], Awaitable[Harness]]


@pytest.fixture
async def make_harness(sample_index_template: Path, tmp_path: Path) -> AsyncIterator[Factory]:
    cleanups: list[Callable[[], Awaitable[None]]] = []

    async def factory(llm_url: str) -> Harness:
        slack = await FakeSlack().start()
        index, embedder = await open_copy(sample_index_template, tmp_path / "index")
        parts = make_engine(index, embedder, tmp_path / "evident.db", llm=make_llm(llm_url, max_retries=0))
        settings = Settings.load(env={}, slack_bot_token=BOT_TOKEN, slack_signing_secret=SIGNING_SECRET,
                                 slack_transport="http", http_port=0)
        bot = build_bot(
            settings.slack,
            settings.chat,
            parts.engine,
            access_policy(settings, parts.engine),
            client=AsyncWebClient(token=BOT_TOKEN, base_url=slack.base_url),
        )
        transport = await EventsServer(bot.app).start()
        sender = await EventSender(f"http://127.0.0.1:{transport.port}/slack/events").__aenter__()

        async def cleanup() -> None:
            await bot.drain(5)
            await sender.__aexit__()
            await transport.close()
            await slack.stop()
            await parts.close()

        cleanups.append(cleanup)
        return Harness(slack, bot, sender, parts)

    yield factory
    for c in cleanups:
        await c()


@pytest.fixture
async def stub() -> AsyncIterator[StubLLMServer]:
    async with StubLLMServer(responder=responder) as server:
        yield server


async def _linked(h: Harness, turn_id: int) -> bool:
    turn = await h.parts.store.get_turn(turn_id)
    return bool(turn and turn.message_ref)


async def test_mention_is_answered_with_page_links(make_harness: Factory, stub: StubLLMServer) -> None:
    h = await make_harness(stub.base_url)
    ev = h.send.mention(QUESTION)
    assert await h.send.event(ev) == 200
    (update,) = await h.answered()
    assert not h.slack.of("chat.postMessage")  # no placeholder: the answer streamed into the thread
    (start,) = h.slack.of("chat.startStream")
    assert start["thread_ts"] == ev["ts"] and start["recipient_user_id"] == "U1"
    (stop,) = h.slack.of("chat.stopStream")
    assert update["ts"] == stop["ts"]  # the streamed message, re-rendered with linked markers
    text = _text(update)
    assert f"The next RAG meeting is on 12 November 2024 <{RAG_MEETING_URL}|[1]>." in text
    assert f"[1] <{RAG_MEETING_URL}|RAG meeting October> · ACME" in text
    assert "React with :explain: or :mag: to see why" in text
    assert "Answering:" not in text  # turn 1 is not rephrased
    (turn,) = await h.parts.store.history(f"T1:C1:{ev['ts']}")
    assert turn.user_id == "U1" and turn.question == QUESTION
    assert await h.slack.wait_for(lambda: _linked(h, turn.id))


async def test_followup_without_mention_shows_the_completed_question(make_harness: Factory,
                                                                    stub: StubLLMServer) -> None:
    h = await make_harness(stub.base_url)
    first = h.send.mention("What is Alice's todo from the RAG meeting in October?")
    await h.send.event(first)
    await h.answered(1)
    await h.send.event(h.send.message("and Bruno?", thread_ts=first["ts"]))
    updates = await h.answered(2)
    text = _text(updates[1])
    assert f"Answering: _{REPHRASED}_" in text
    assert f"Bruno collects 50 real questions from the support team <{RAG_MEETING_URL}|[1]>." in text
    rephrase = [r for r in stub.requests if _is_rephrase(r)]
    assert len(rephrase) == 1 and "User: What is Alice's todo from the RAG meeting in October?" in _user(
        rephrase[0]
    )
    assert [t.turn_no for t in await h.parts.store.history(f"T1:C1:{first['ts']}")] == [1, 2]


async def test_explain_reaction_posts_the_attribution(make_harness: Factory, stub: StubLLMServer) -> None:
    h = await make_harness(stub.base_url)
    ev = h.send.mention(QUESTION)
    await h.send.event(ev)
    (update,) = await h.answered()
    (turn,) = await h.parts.store.history(f"T1:C1:{ev['ts']}")
    await h.slack.wait_for(lambda: _linked(h, turn.id))
    calls = stub.calls
    await h.send.event(h.send.reaction("explain", "C1", update["ts"]))
    (explanation,) = await h.slack.wait_calls("chat.postMessage", 1, within_s=15)
    assert explanation["thread_ts"] == ev["ts"]
    lines = explanation["text"].splitlines()
    assert lines[0] == "*Why this answer?* How much each source contributed:"
    assert f"<{RAG_MEETING_URL}|RAG meeting October › " in lines[1]  # the causal page (› its section) first
    assert "_“" in lines[1]  # with the first words of the evidence
    assert stub.calls > calls  # counterfactual answers were generated


async def test_llm_down_gives_a_visible_error(make_harness: Factory) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    h = await make_harness(f"http://127.0.0.1:{port}/v1")
    ev = h.send.mention(QUESTION)
    await h.send.event(ev)
    (stop,) = await h.slack.wait_calls("chat.stopStream")
    said = "I couldn't reach the language model, please try again."
    assert stop["markdown_text"] == f":warning: {said}"  # said in the streamed message, which it ends
    assert not stop.get("chunks")  # the search card was completed when the pages were read
    (turn,) = await h.parts.store.history(f"T1:C1:{ev['ts']}")
    assert turn.error == said
