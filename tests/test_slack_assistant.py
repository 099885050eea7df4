"""Slack's AI-app surface through the real HTTP transport: assistant threads, status, title, prompts,
scope."""
# ruff: noqa: F811  (the harness fixtures are imported from test_bot_http and shadowed by parameters, as
# pytest wants)

from __future__ import annotations

import time
from typing import Any

import pytest
from test_bot_http import Factory, Harness, h, make_harness  # noqa: F401  (the fixtures)

from pipeline.types import Answer, Citation

DM = "D1"


@pytest.fixture
def slack_stream() -> bool:
    return True  # assistant threads stream where Slack allows it


def _started(
    h: Harness, thread_ts: str, kind: str = "assistant_thread_started", context_channel: str = "C9"
) -> dict:
    return {
        "type": kind,
        "event_ts": h.send.new_ts(),
        "assistant_thread": {
            "user_id": "U1",
            "channel_id": DM,
            "thread_ts": thread_ts,
            "context": {"channel_id": context_channel, "team_id": "T1", "enterprise_id": None},
        },
    }


def _ask(h: Harness, text: str, thread_ts: str) -> dict[str, Any]:
    return h.send.message(text, channel=DM, channel_type="im", thread_ts=thread_ts)


async def _answers(h: Harness, n: int) -> list[dict[str, Any]]:
    """Answers streamed into assistant threads, once their stream has stopped (oldest first)."""
    def found() -> list[dict[str, Any]]:
        done = [
            m
            for m in h.slack.messages.values()
            if "|[1]>" in m.get("text", "") and m.get("streaming") is False
        ]
        return sorted(done, key=lambda m: float(m["ts"]))

    await h.slack.wait_for(lambda: len(found()) >= n)
    return found()


async def test_thread_started_greets_and_suggests_prompts(h: Harness) -> None:
    thread = f"{time.time():.6f}"
    await h.send.event(_started(h, thread))
    (prompts,) = await h.slack.wait_calls("assistant.threads.setSuggestedPrompts")
    greeting = h.slack.of("chat.postMessage")[0]
    assert (
        greeting["channel"] == DM
        and greeting["thread_ts"] == thread
        and "Ask me anything" in greeting["text"]
    )
    assert prompts["channel_id"] == DM and prompts["thread_ts"] == thread
    assert len(prompts["prompts"]) >= 1 and all({"title", "message"} <= set(p) for p in prompts["prompts"])


async def test_question_in_a_thread_gets_status_title_and_answer_from_the_viewed_channels_spaces(
        make_harness: Factory) -> None:
    h = await make_harness(channel_spaces="C9=ENG;C8=HR", default_spaces="none")
    thread = f"{time.time():.6f}"
    await h.send.event(_started(h, thread, context_channel="C9"))
    await h.send.event(_ask(h, "How do I get VPN access?", thread))
    (answer,) = await _answers(h, 1)
    assert answer["channel"] == DM and answer["thread_ts"] == thread
    # streamed with plain [n], then shown as an unstreamed answer is: linked markers
    assert answer["text"] == (
        "To how do i get vpn access?, open the VPN portal <https://wiki.example.com/pages/1|[1]>"
        " and follow the guide <https://wiki.example.com/pages/2|[2]>."
    )
    start = h.slack.of("chat.startStream")[0]
    assert start["recipient_user_id"] == "U1" and start["recipient_team_id"] == "T1"
    (stop,) = h.slack.of("chat.stopStream")
    tail = " ".join(str(b) for b in stop["blocks"])
    assert "wiki.example.com/pages/1|VPN access" in tail and "feedback_buttons" in tail  # sources and buttons
    (status,) = h.slack.of("assistant.threads.setStatus")
    assert status["status"] == "is searching the wiki…" and status["thread_ts"] == thread
    (title,) = h.slack.of("assistant.threads.setTitle")
    assert title["title"] == "How do I get VPN access?"
    assert [u["ts"] for u in h.slack.of("chat.update")] == [answer["ts"]]  # no placeholder, only the stream
    await h.settle()
    assert (await h.engine.store.turn_by_message("D1", answer["ts"])) is not None  # reactions find it
    # the user switches to another channel: the scope follows it (Bolt saves the context through our store)
    await h.send.event(_started(h, thread, kind="assistant_thread_context_changed", context_channel="C8"))
    await h.settle()
    await h.send.event(_ask(h, "and holidays?", thread))
    await _answers(h, 2)
    assert [(a.question, a.spaces) for a in h.engine.asks] == [
        ("How do I get VPN access?", ("ENG",)), ("and holidays?", ("HR",))]
    assert len(h.slack.of("assistant.threads.setTitle")) == 1  # titled once, by the first question


async def test_a_workspace_without_streaming_gets_the_answer_whole(h: Harness) -> None:
    h.slack.fail_next("chat.startStream", error="method_not_supported_for_channel_type")
    thread = f"{time.time():.6f}"
    await h.send.event(_started(h, thread))
    await h.send.event(_ask(h, "How do I get VPN access?", thread))
    await h.slack.wait_for(lambda: any("[1]" in m.get("text", "") for m in h.slack.of("chat.postMessage")))
    await h.settle()
    assert not h.slack.of("chat.appendStream") and not h.slack.of("chat.stopStream")


async def test_without_assistant_status_a_dm_thread_falls_back_to_the_placeholder(h: Harness) -> None:
    h.slack.fail_next("assistant.threads.setStatus", error="not_allowed")
    await h.send.event(_started(h, "1500000000.000100"))
    await h.send.event(_ask(h, "How do I get VPN access?", "1500000000.000100"))
    (update,) = await h.answered()
    assert "[1]" in update["text"]


async def test_a_reply_under_a_top_level_dm_answer_is_a_thread_not_an_assistant_thread(h: Harness) -> None:
    await h.send.event(h.send.message("How do I get VPN access?", channel=DM, channel_type="im"))
    (first,) = await h.answered()
    await h.settle()
    await h.send.event(_ask(h, "and on Linux?", first["ts"]))  # Bolt hands it to the assistant listener
    await h.answered(2)
    await h.settle()
    assert not h.slack.of("assistant.threads.setStatus") and not h.slack.of("assistant.threads.setTitle")
    (start,) = h.slack.of("chat.startStream")  # a thread's stream, opened with the search card
    assert [c["id"] for c in start["chunks"]] == ["search"]
    assert h.engine.asks[1].key == f"T1:{DM}:{first['ts']}"


async def _streamed(h: Harness, thread: str, question: str = "How do I get VPN access?") -> None:
    await h.send.event(_started(h, thread))
    await h.send.event(_ask(h, question, thread))
    await h.slack.wait_calls("chat.startStream")


async def test_an_llm_failure_mid_stream_ends_the_stream_saying_so_in_the_same_message(
    make_harness: Factory,
) -> None:
    from fake_slack import LLM_DOWN, FakeEngine

    engine = FakeEngine(delay_s=0.2)
    engine.stream_fails_after = 3
    h = await make_harness(engine)
    await _streamed(h, f"{time.time():.6f}")
    (stop,) = await h.slack.wait_calls("chat.stopStream")
    await h.settle()
    assert len(h.slack.of("chat.startStream")) == 1
    (message,) = [m for m in h.slack.messages.values() if m["ts"] == stop["ts"]]
    assert message["streaming"] is False and message["text"].startswith("To how do")
    assert message["text"].endswith(f":warning: {LLM_DOWN}")
    # not a new message
    assert not [c for c in h.slack.of("chat.postMessage") if LLM_DOWN in c.get("text", "")]


async def test_a_stream_slack_ended_is_replaced_by_the_whole_answer_not_left_beside_it(
    make_harness: Factory,
) -> None:
    from fake_slack import FakeEngine

    h = await make_harness(FakeEngine(delay_s=0.3))
    thread = f"{time.time():.6f}"
    await _streamed(h, thread)
    h.slack.end_streams = True  # e.g. its time limit: every later append and stop is refused
    (update,) = await h.answered()
    await h.settle()
    answers = [m for m in h.slack.messages.values() if m.get("thread_ts") == thread and "[1]" in m["text"]]
    streamed = [m["ts"] for m in h.slack.messages.values() if "streaming" in m]
    assert [a["ts"] for a in answers] == [update["ts"]] == streamed  # the partial became the answer
    assert "open the VPN portal" in update["text"]


async def test_a_cancelled_answer_ends_its_stream(make_harness: Factory) -> None:
    from fake_slack import FakeEngine

    from bot.core.messages import RESTARTING

    h = await make_harness(FakeEngine(delay_s=5))
    await _streamed(h, f"{time.time():.6f}")
    assert await h.bot.drain(0.2) == 1  # shutdown gives up on it
    (stop,) = await h.slack.wait_calls("chat.stopStream")
    assert RESTARTING.split(".")[0] in stop["markdown_text"]


def _cited(question: str) -> Answer:
    return Answer(
        text="See [1].", citations=[Citation(1, "https://w/p/9", "Release versioning policy", "ENG", ("e",))]
    )


async def test_suggested_prompts_come_from_pages_answers_cited_in_scope(make_harness: Factory) -> None:
    from fake_slack import FakeEngine

    h = await make_harness(FakeEngine(answer_for=_cited), channel_spaces="C9=ENG")
    await h.send.event(h.send.mention("how are releases numbered?", channel="C9"))
    await h.answered()
    await h.settle()
    await h.send.event(_started(h, f"{time.time():.6f}", context_channel="C9"))
    (prompts,) = await h.slack.wait_calls("assistant.threads.setSuggestedPrompts")
    assert prompts["prompts"][0]["message"] == "What does the wiki say about Release versioning policy?"


def _home_text(view: dict[str, Any]) -> str:
    parts = []
    for b in view["blocks"]:
        if b["type"] in ("section", "header"):
            parts.append(b["text"]["text"])
        elif b["type"] == "context":
            parts.extend(e["text"] for e in b["elements"])
    return "\n".join(parts)


async def test_app_home_shows_index_status_recent_questions_and_admin_feedback(make_harness: Factory) -> None:
    h = await make_harness(admin_users="UADMIN")
    await h.engine.store.record_sync(
        "confluence", "added 3, failed 1", [("page:42", "table too large <@U9>")]
    )
    await h.send.event(h.send.mention("How do I get VPN <!channel> access?", user="U1"))
    (update,) = await h.answered()
    await h.settle()
    turn_id = int(next(e for b in update["blocks"] if b["type"] == "actions" for e in b["elements"])["value"])
    await h.send.block_action(
        "evident_feedback", f"down:{turn_id}", user="U2", action_type="feedback_buttons"
    )
    await h.settle()
    for user in ("U1", "UADMIN"):
        await h.send.event({"type": "app_home_opened", "user": user, "channel": "D9", "tab": "home",
                            "event_ts": h.send.new_ts()})
    views = await h.slack.wait_calls("views.publish", 2)
    by_user = {v["user_id"]: _home_text(v["view"]) for v in views}
    assert "68 evidence indexed" in by_user["U1"]
    assert ":warning: Last sync" in by_user["U1"] and "page:42" not in by_user["U1"]  # failures: admins only
    assert "page:42: table too large &lt;@U9&gt;" in by_user["UADMIN"]
    assert "How do I get VPN &lt;!channel&gt; access?" in by_user["U1"] and "<!channel>" not in by_user["U1"]
    assert "Feedback" not in by_user["U1"]
    assert "*Feedback* (admins): 0 👍 · 1 👎" in by_user["UADMIN"]
    # Slack's own permalink: the answer is a reply in its thread
    link = f"https://fake.slack.com/archives/C1/p{update['ts'].replace('.', '')}?thread_ts="
    assert link in by_user["UADMIN"] and "https://slack.com/archives" not in by_user["UADMIN"]


async def test_app_home_links_no_answer_in_someone_elses_dm(make_harness: Factory) -> None:
    h = await make_harness(admin_users="UADMIN")
    await h.send.event(h.send.message("How do I get VPN access?", channel=DM, channel_type="im"))
    (update,) = await h.answered()
    await h.settle()
    turn_id = int(next(e for b in update["blocks"] if b["type"] == "actions" for e in b["elements"])["value"])
    await h.send.block_action("evident_feedback", f"down:{turn_id}", user="U1", channel=DM,
                              action_type="feedback_buttons")
    await h.settle()
    await h.send.event({"type": "app_home_opened", "user": "UADMIN", "channel": "D9", "tab": "home",
                        "event_ts": h.send.new_ts()})
    (view,) = await h.slack.wait_calls("views.publish")
    text = _home_text(view["view"])
    assert "How do I get VPN access? _(in a DM)_" in text and "archives/D1" not in text
    assert not h.slack.of("chat.getPermalink")



async def test_a_suggestion_clicked_in_an_assistant_thread_keeps_the_threads_scope(
        make_harness: Factory) -> None:
    """Found from outside: the suggestion button asked without the assistant thread's scope ("isn't connected
    to any wiki space yet"; with the default '*' it would have searched every space)."""
    h = await make_harness(channel_spaces="C0OPSMAP=OPS", default_spaces="none", followup_suggestions=True)
    thread = f"{time.time():.6f}"
    await h.send.event(_started(h, thread, context_channel="C0OPSMAP"))
    await h.send.event(_ask(h, "How do I get VPN access?", thread))
    (answer,) = await _answers(h, 1)

    def row() -> list[dict[str, Any]]:
        return [b for m in h.slack.of("chat.update") for b in m.get("blocks") or []
                if b.get("block_id") == "evident_suggestions"]

    await h.slack.wait_for(lambda: bool(row()))
    button = row()[-1]["elements"][0]
    await h.send.block_action(button["action_id"], button["value"], channel=DM, message_ts=answer["ts"],
                              thread_ts=thread)
    await h.slack.wait_for(lambda: len(h.engine.asks) == 2)
    await h.settle()
    assert [a.spaces for a in h.engine.asks] == [("OPS",), ("OPS",)]
    assert not any("isn't connected" in m.get("text", "") for m in h.slack.of("chat.postMessage"))


async def test_a_streamed_answer_starts_with_a_task_card_of_the_pages_read(h: Harness) -> None:
    thread = f"{time.time():.6f}"
    await h.send.event(_started(h, thread))
    await h.send.event(_ask(h, "How do I get VPN access?", thread))
    await _answers(h, 1)
    (start,) = h.slack.of("chat.startStream")
    chunks = (
        start["chunks"] if isinstance(start["chunks"], list) else __import__("json").loads(start["chunks"])
    )
    (task,) = chunks
    assert (
        task["type"] == "task_update"
        and task["status"] == "complete"
        and task["title"] == "Read 2 pages of the wiki"
    )
    assert [(s["url"], s["text"]) for s in task["sources"]] == [
        ("https://wiki.example.com/pages/1", "VPN access"),
        ("https://wiki.example.com/pages/2", "Remote work guide"),
    ]
    assert not start.get("markdown_text")  # the text follows in appendStream
    assert h.slack.of("chat.appendStream")
