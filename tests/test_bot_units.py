"""Pure parts of the bot: escaping, rendering, splitting, rate limiting, de-duplication, token checks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fake_slack import ExplainResult, MemoryStore, TurnResult

from bot.core.dedup import Deduper, SeenSet
from bot.core.messages import user_message
from bot.core.ratelimit import UserRateLimiter
from bot.slack.blocks import link_markers, render_answer, render_explanation, split_text
from bot.slack.mrkdwn import bar, escape, escape_markdown, link
from bot.slack.threads import clean_question, conversation_key, thread_of_key
from bot.slack.transports import check_tokens
from evident.settings import Settings
from pipeline.attribution import AttributionResult, ClusterAttribution, EvidenceRef
from pipeline.errors import ConfigError, EmbeddingError, RateLimitedError, TransientError
from pipeline.types import Answer, Citation

CIT = [Citation(1, "https://w.example/p/1", "Page <one>", "ENG", ("e",)),
       Citation(2, "https://w.example/p/2?a=1&b=2", "Two", "", ("f",))]


def test_escape_neutralises_control_sequences() -> None:
    assert (
        escape("<!channel> & <@U1> <!here|here>") == "&lt;!channel&gt; &amp; &lt;@U1&gt; &lt;!here|here&gt;"
    )


def test_link_escapes_label_and_url_and_refuses_other_schemes() -> None:
    assert (
        link("https://x.example/a?b=1&c=<2>", "A <b> & c")
        == "<https://x.example/a?b=1&amp;c=%3C2%3E|A &lt;b&gt; &amp; c>"
    )
    assert link("javascript:alert(1)", "x") == "x"
    assert link("https://x.example/a|b", "t") == "<https://x.example/a%7Cb|t>"


def test_bar_rounds_and_clamps() -> None:
    assert bar(52) == "████░░░░"
    assert bar(0) == "░" * 8 and bar(150) == "█" * 8


def test_link_markers_handles_groups_and_unknown_numbers() -> None:
    out = link_markers("See [1] and [1, 2] but not [7].", CIT)
    assert out == (
        "See <https://w.example/p/1|[1]> and "
        "<https://w.example/p/1|[1]><https://w.example/p/2?a=1&amp;b=2|[2]>"
        " but not [7]."
    )


def test_page_text_quoted_as_written_is_never_linked() -> None:
    from bot.teams.render import answer_activity
    from pipeline.answer.citations import WORD_JOINER, as_written

    quoted = as_written("regs[1] as note [2] says") + " [1]"
    assert link_markers(quoted, CIT) == (
        f"regs[{WORD_JOINER}1] as note [{WORD_JOINER}2] says <https://w.example/p/1|[1]>")
    out = answer_activity(TurnResult(7, Answer(text=quoted, citations=[]), "q", False))["text"]
    assert out == f"regs\\[{WORD_JOINER}1\\] as note \\[{WORD_JOINER}2\\] says [1]"
    # Slack shows it without the joiner, unlinked, so it copies as written; a stream's markdown likewise
    shown = _all_text(render_answer(_turn(quoted)).blocks)
    assert "regs[1] as note [2] says <https://w.example/p/1|[1]>" in shown and WORD_JOINER not in shown
    assert escape_markdown(quoted) == "regs\\[1\\] as note \\[2\\] says \\[1\\]"


def test_split_text_respects_limit_and_never_cuts_a_link() -> None:
    piece = "word " * 50 + "<https://w.example/p/1|[1]> "
    text = piece * 40
    chunks = split_text(text, limit=500)
    assert len(chunks) > 1
    for c in chunks:
        assert len(c) <= 500
        assert c.count("<") == c.count(">")  # every link complete
    assert "".join(chunks).replace(" ", "") == text.replace(" ", "")


def test_split_text_hard_cut_for_unbroken_text() -> None:
    chunks = split_text("x" * 7000, limit=3000)
    assert [len(c) for c in chunks] == [3000, 3000, 1000]


def _turn(
    text: str,
    *,
    followup: bool = False,
    extractive: bool = False,
    citations: list[Citation] | None = None,
    completed: str = "",
) -> TurnResult:
    return TurnResult(
        3,
        Answer(text=text, citations=CIT if citations is None else citations, extractive=extractive),
        completed,
        followup,
    )


def _all_text(blocks: list[dict]) -> str:
    parts = []
    for b in blocks:
        if b["type"] == "section":
            parts.append(b["text"]["text"])
        elif b["type"] == "context":  # buttons (actions, context_actions) carry no answer text
            parts.extend(e["text"] for e in b["elements"])
    return "\n".join(parts)


def test_render_answer_sources_followup_extractive_and_hint() -> None:
    r = render_answer(_turn("Do X [1].", followup=True, extractive=True, completed="how to <do> X?"),
                      explain_emojis=("explain", "mag"))
    text = _all_text(r.blocks)
    assert r.blocks[0]["type"] == "context" and "Answering: _how to &lt;do&gt; X?_" in text
    assert "Do X <https://w.example/p/1|[1]>." in text
    assert "[1] <https://w.example/p/1|Page &lt;one&gt;> · ENG" in text
    assert "[2] <https://w.example/p/2?a=1&amp;b=2|Two>" in text
    assert "extractive answer (no LLM configured)" in text
    assert "React with :explain: or :mag: to see why" in text


def test_render_answer_shows_engine_notice_escaped() -> None:
    t = _turn("Ok [1].")
    t.notice = "Your message was long <!here>"  # type: ignore[attr-defined]
    assert ":information_source: Your message was long &lt;!here&gt;" in _all_text(render_answer(t).blocks)


def test_render_answer_without_citations_has_no_hint() -> None:
    r = render_answer(_turn("I don't know.", citations=[]))
    assert "React with" not in _all_text(r.blocks)
    assert [b["type"] for b in r.blocks] == ["section", "context_actions", "actions"]  # 👍/👎 and "Why?" stay
    assert [b["type"] for b in render_answer(_turn("I don't know.", citations=[]), buttons=False).blocks] == [
        "section"
    ]


def test_render_answer_splits_long_answers_into_sections() -> None:
    r = render_answer(_turn(("A sentence about VPN [1]. " * 40 + "\n\n") * 8))
    sections = [b for b in r.blocks if b["type"] == "section"]
    assert len(sections) >= 3
    assert all(len(s["text"]["text"]) <= 3000 for s in sections)
    assert len(r.text) <= 3000


def test_render_explanation_bars_links_clusters_partial() -> None:
    def ref(n: str, rank: int) -> EvidenceRef:
        return EvidenceRef(f"e{n}", n, f"https://w/{n.lower()}", "passage", rank)

    b = ClusterAttribution(
        2, [EvidenceRef("eB", "B <x>", "https://w/b", "passage", 4)], 0.3, 30.0, ["x"], [0.7]
    )
    a = ClusterAttribution(1, [ref("A", 1), ref("A2", 2), ref("A3", 3)], 0.7, 70.0, ["y"], [0.1])
    res = ExplainResult(
        1, "", partial=True, result=AttributionResult("cfa_clusters", "q", "a", [a, b], partial=True)
    )
    text = render_explanation(res)
    lines = text.splitlines()
    assert lines[1].startswith("`██████░░` 70%  <https://w/a|A> (+2 similar)")
    assert lines[2].startswith("`██░░░░░░` 30%  <https://w/b|B &lt;x&gt;>")
    assert "(partial:" in text


def test_render_explanation_falls_back_to_escaped_text() -> None:
    assert render_explanation(ExplainResult(1, "<!here> only text")) == "&lt;!here&gt; only text"


def test_rate_limiter_token_bucket_refills() -> None:
    now = [0.0]
    rl = UserRateLimiter(2, clock=lambda: now[0])
    assert rl.allow("U1") and rl.allow("U1")
    assert not rl.allow("U1")
    assert rl.allow("U2")  # per user
    assert rl.retry_after_s("U1") == 30
    now[0] = 30.0
    assert rl.allow("U1") and not rl.allow("U1")
    assert UserRateLimiter(0).allow("U1")


def test_seen_set_is_bounded() -> None:
    s = SeenSet(capacity=2)
    assert s.add("a") and s.add("b") and not s.add("a")
    assert s.add("c")  # evicts the least recent ("b")
    assert "b" not in s and "a" in s


async def test_deduper_uses_memory_and_store() -> None:
    store = MemoryStore()
    await store.mark_event_seen("Ev-old")  # seen by an earlier process
    d = Deduper(store)
    assert await d.first_delivery("Ev1")
    assert not await d.first_delivery("Ev1")
    assert not await d.first_delivery("Ev-old")
    assert d.claim_message("C1", "1.1") and not d.claim_message("C1", "1.1")


def test_conversation_helpers() -> None:
    key = conversation_key("T1", "C1", "1700.000100")
    assert key == "T1:C1:1700.000100" and thread_of_key(key) == "1700.000100"
    assert thread_of_key("T1:D1:main") is None
    assert clean_question("<@UBOT> how do I  get VPN?", "UBOT") == "how do I get VPN?"
    assert clean_question("<@UBOT|evident>: hi <@U2>", "UBOT") == "hi <@U2>"


@pytest.mark.parametrize(("env", "message"), [
    ({}, "SLACK_BOT_TOKEN missing"),
    ({"SLACK_BOT_TOKEN": "xoxp-user"}, "SLACK_BOT_TOKEN must be a bot token"),
    ({"SLACK_BOT_TOKEN": "xoxb-1"}, "SLACK_APP_TOKEN missing: needed for Socket Mode"),
    ({"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xoxb-2"},
     "SLACK_APP_TOKEN must be an app-level token"),
    ({"SLACK_BOT_TOKEN": "xoxb-1", "EVIDENT_SLACK_TRANSPORT": "http"},
     "SLACK_SIGNING_SECRET missing: needed for the HTTP transport"),
    ({"SLACK_BOT_TOKEN": "xoxb-1", "EVIDENT_SLACK_TRANSPORT": "carrier-pigeon"},
     "EVIDENT_SLACK_TRANSPORT='carrier-pigeon' is not one of: socket, http"),  # rejected at load now
])
def test_check_tokens_fails_fast_with_clear_message(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_tokens(Settings.load(env=env).slack)


def test_check_tokens_accepts_complete_configs() -> None:
    check_tokens(Settings.load(env={"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1"}).slack)
    check_tokens(Settings.load(env={"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s",
                                    "EVIDENT_SLACK_TRANSPORT": "http"}).slack)


def test_user_messages_are_short_and_specific() -> None:
    assert user_message(TransientError("x")) == "I couldn't reach the language model, please try again."
    assert "busy" in user_message(RateLimitedError("x", retry_after_s=3))
    assert "index" in user_message(EmbeddingError("x"))
    assert "went wrong" in user_message(ValueError("internal detail"))
    assert "internal detail" not in user_message(ValueError("internal detail"))


def test_manifest_declares_exactly_the_needed_scopes_events_and_command() -> None:
    yaml = pytest.importorskip("yaml")
    manifest = yaml.safe_load(
        (Path(__file__).parent.parent / "deploy" / "slack-app-manifest.yaml").read_text()
    )
    assert set(manifest["oauth_config"]["scopes"]["bot"]) == {
        "app_mentions:read",
        "chat:write",
        "im:history",
        "channels:history",
        "groups:history",
        "reactions:read",
        "commands",
        "assistant:write",
        "users:read",  # per-user access: who asks, guests told apart
        "users:read.email",  # ... and mapped to Confluence by e-mail
        "channels:read",  # who reads a channel: conversations.info and .members
        "groups:read",
        "mpim:read",
    }  # nothing evident never calls (im:read, reactions:write are gone)
    assert set(manifest["settings"]["event_subscriptions"]["bot_events"]) == {
        "app_mention",
        "message.im",
        "message.channels",
        "message.groups",
        "reaction_added",
        "reaction_removed",
        "assistant_thread_started",
        "assistant_thread_context_changed",
        "app_home_opened",
        "member_joined_channel",
        "member_left_channel",
    }
    assert manifest["features"]["app_home"]["home_tab_enabled"] is True
    assert "assistant_description" in manifest["features"]["assistant_view"]
    assert [c["command"] for c in manifest["features"]["slash_commands"]] == ["/ask"]
    assert manifest["settings"]["socket_mode_enabled"] is True
    assert manifest["settings"]["interactivity"]["is_enabled"] is True  # the answer's buttons


def test_a_low_confidence_answer_carries_the_certainty_note_on_every_surface() -> None:
    from bot.core.messages import CERTAINTY_NOTE
    from bot.teams.render import answer_activity

    low = _turn("Maybe X [1].")
    low.answer.confidence = "low"
    assert f":warning: {CERTAINTY_NOTE}" in _all_text(render_answer(low).blocks)
    assert CERTAINTY_NOTE in answer_activity(low)["text"]
    sure = _turn("Surely X [1].")
    sure.answer.confidence = "high"
    assert CERTAINTY_NOTE not in _all_text(render_answer(sure).blocks)
    refused = TurnResult(4, Answer(text="cannot be found", out_of_scope=True, confidence="low"), "", False)
    assert CERTAINTY_NOTE not in answer_activity(refused)["text"]
