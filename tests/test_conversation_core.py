"""The platform-neutral conversation core with a real store: what holds across restarts and scopes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fake_people import StaticPeople
from fake_slack import FakeEngine

from bot.core.access import AccessPolicy, Asker
from bot.core.conversations import Conversations, Question
from bot.core.scope import NOT_CONNECTED
from evident.settings import Settings
from pipeline.store import Store
from pipeline.turns import Turn

ASKER = Asker("U1", "C1", shared_in="C1")


def core_for(engine: FakeEngine, people: StaticPeople | None = None, **overrides: str) -> Conversations:
    """The core as production builds it, from settings (``overrides``: flat setting keys)."""
    settings = Settings.load(env={}, **overrides)
    policy = AccessPolicy.from_settings(settings.access, settings.chat, engine.store)
    return Conversations.from_settings(engine, settings.chat, policy, people or StaticPeople())


class RecordingSurface:
    """A Surface that keeps what evident would show (plain class, the protocol's methods)."""

    def __init__(self) -> None:
        self.shown: list[tuple[str, object]] = []

    async def progress(self) -> str | None:
        self.shown.append(("progress", None))
        return None

    def conversation_key(self, progress_id: str | None) -> str:
        return "test:conv"

    async def earlier_messages(self) -> list[tuple[str, str]] | None:
        return None

    def text_sink(self) -> None:
        return None

    def retrieval_sink(self) -> None:
        return None

    async def suggest(self, message_id: str, questions: list[str]) -> None:
        self.shown.append(("suggest", questions))

    async def answer(self, result: object) -> str | None:
        self.shown.append(("answer", result))
        return f"msg-{len(self.shown)}"

    async def say(self, text: str) -> None:
        self.shown.append(("say", text))

    async def rate_limited(self, retry_after_s: int) -> None:
        self.shown.append(("rate_limited", retry_after_s))

    async def explanation(self, result: object) -> None:
        self.shown.append(("explanation", result))


async def _answer(core: Conversations, store: Store, question: str) -> tuple[RecordingSurface, Turn | None]:
    """``question`` answered in test:conv; the surface it was answered on and its stored turn."""
    surface = RecordingSurface()
    await core.answer(Question("U1", question, "C1", "test:conv"), surface)
    return surface, await store.turn_by_message("test:conv", "msg-2")


async def test_an_answer_is_explained_once_even_across_a_restart(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "core.db")
    engine = FakeEngine(store)
    core = core_for(engine)
    surface, turn = await _answer(core, store, "How do I get VPN access?")
    assert turn is not None and turn.explained_at is None
    await core.explain(turn, surface, ASKER)
    restarted = core_for(FakeEngine(store))  # nothing in memory
    again = await store.get_turn(turn.id)
    assert again is not None and again.explained_at is not None
    await restarted.explain(again, surface, ASKER)
    assert [kind for kind, _ in surface.shown].count("explanation") == 1
    await store.close()


async def test_an_out_of_scope_answer_has_nothing_to_explain(tmp_path: Path) -> None:
    from bot.core.messages import NOTHING_TO_EXPLAIN
    from pipeline.answer.prompts import OUT_OF_SCOPE
    from pipeline.types import Answer

    store = await Store.open(tmp_path / "core.db")
    engine = FakeEngine(
        store, answer_for=lambda q: Answer(text=OUT_OF_SCOPE, out_of_scope=True, extractive=True)
    )
    core = core_for(engine)
    surface, turn = await _answer(core, store, "How do I bake bread?")
    assert turn is not None and turn.out_of_scope
    await core.explain(turn, surface, ASKER)
    await core.explain(turn, surface, ASKER)  # asked twice: told once
    assert [s for s in surface.shown if s[0] in ("explanation", "say")] == [("say", NOTHING_TO_EXPLAIN)]
    assert engine.explain_computations == []  # no counterfactual runs for it
    await store.close()


async def test_default_scope_none_tells_the_user_and_asks_nothing(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "core.db")
    engine = FakeEngine(store)
    core = core_for(engine, channel_spaces="C9=ENG", default_spaces="none")
    surface = RecordingSurface()
    await core.answer(Question("U1", "holidays?", "D1", "test:dm"), surface)
    await core.answer(Question("U1", "deploy?", "C9", "test:c9"), surface)
    assert surface.shown[0] == ("say", NOT_CONNECTED)
    assert [(a.question, a.spaces) for a in engine.asks] == [("deploy?", ("ENG",))]
    await store.close()


async def test_an_explanation_that_meets_a_known_failure_says_why_in_one_log_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The LLM down: the asker hears that (not a generic sorry), the log gets one warning, not a traceback
    at ERROR level (the soak's outage logged 8 of them), and a later request may try again."""
    from bot.core.messages import EXPLAIN_FAILED
    from pipeline.errors import UnreachableError
    from pipeline.runtime.user_messages import user_message

    store = await Store.open(tmp_path / "core.db")
    engine = FakeEngine(store)
    core = core_for(engine)
    surface, turn = await _answer(core, store, "How do I get VPN access?")
    assert turn is not None
    down = UnreachableError("cannot reach LLM endpoint http://llm/v1", service="llm")
    engine.explain_fails_with = down
    with caplog.at_level(logging.WARNING):
        await core.explain(turn, surface, ASKER)
    said = [text for kind, text in surface.shown if kind == "say"]
    assert said == [user_message(down)] and said != [EXPLAIN_FAILED]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    engine.explain_fails_with = None
    await core.explain(turn, surface, ASKER)  # up again: explained
    assert [kind for kind, _ in surface.shown].count("explanation") == 1
    await store.close()
