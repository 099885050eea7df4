"""RAGAS-style metrics with a judge model, and the judge's agreement with the hand-labelled sample in
tests/data."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pipeline.answer.prompts import OUT_OF_SCOPE, PromptLibrary
from pipeline.errors import InputError
from pipeline.evaluation.judge_agreement import LabelledAnswer, agreement, auc, kappa, load_sample
from pipeline.evaluation.ragas import RagasJudge, RagasScores, average_precision, parse_json_object, share
from pipeline.models.llm import OpenAILLM
from tests.stub_llm import StubLLMServer
from tests.test_keyword_expansion import TrigramEmbedder

SAMPLE = Path(__file__).parent / "data" / "judge_sample.json"


def test_json_objects_are_found_in_prose_and_fences() -> None:
    assert parse_json_object('Sure!\n```json\n{"verdicts": [1, 0]}\n```') == {"verdicts": [1, 0]}
    assert parse_json_object('{"a": {"b": 1}} and a stray } brace') == {"a": {"b": 1}}
    assert parse_json_object("no json here") is None
    assert parse_json_object('{"unclosed": ') is None


def test_average_precision_and_shares() -> None:
    assert average_precision([1, 0, 1]) == pytest.approx((1 / 1 + 2 / 3) / 2)
    assert average_precision([0, 1]) == 0.5 and average_precision([0, 0]) == 0.0
    assert share([{"ok": True}, {"ok": False}, {"ok": True}], "ok") == pytest.approx(2 / 3)
    assert share([{"ok": "yes"}], "ok") is None and share([], "ok") is None and share("x", "ok") is None


def _judge_reply(body: dict[str, Any]) -> str:
    """A judge that follows each prompt's JSON contract (what a capable model answers)."""
    system = body["messages"][0]["content"]
    user = body["messages"][-1]["content"]
    if "whether an answer is supported" in system:
        supported = "Paris" in user.split("Answer:")[1].split("Source 1:")[0]
        return json.dumps(
            {"claims": [{"claim": "x", "supported": supported}, {"claim": "y", "supported": True}]}
        )
    if "write the questions it answers" in system:
        evasive = "no idea" in user
        return json.dumps({"questions": ["What is the capital of France?", "Which city is France's capital?"],
                           "noncommittal": evasive})
    if "which sources help" in system:
        return '{"verdicts": [0, 1]}' if user.count("Source ") == 2 else '{"verdicts": [1]}'
    if "how much of a reference answer" in system:
        return '{"statements": [{"statement": "Paris is the capital", "attributed": true}]}'
    return "?"


async def _judge(stub: StubLLMServer) -> tuple[RagasJudge, OpenAILLM]:
    llm = OpenAILLM(base_url=stub.base_url, api_key="k", model_for=lambda role: "stub-model", max_retries=0)
    return RagasJudge(llm, PromptLibrary(), TrigramEmbedder()), llm


async def test_the_four_metrics_follow_the_judges_json() -> None:
    async with StubLLMServer(responder=_judge_reply) as stub:
        judge, llm = await _judge(stub)
        sources = ["Lyon is a city.", "Paris is the capital of France."]
        good = await judge.score("What is the capital of France?", "Paris [Source 2].", "Paris", sources)
        assert good.faithfulness == 1.0 and good.context_recall == 1.0
        assert good.verdicts == (0, 1) and good.context_precision == 0.5
        assert good.answer_relevancy is not None and good.answer_relevancy > 0.5
        wrong = await judge.score("What is the capital of France?", "Lyon [Source 1].", "Paris", sources)
        assert wrong.faithfulness == 0.5  # one of its two claims unsupported
        evasive = await judge.answer_relevancy("What is the capital of France?", "I have no idea.")
        assert evasive == 0.0
        oos = await judge.score("What is the capital of France?", OUT_OF_SCOPE, "Paris", sources)
        # no claims; a refusal answers nothing
        assert oos.faithfulness is None and oos.answer_relevancy == 0.0
        # 1 verdict for 3 sources
        assert await judge.context_verdicts("q", "g", ["only", "two", "three"]) is None
        await llm.close()


async def test_a_failing_judge_gives_missing_scores_not_zeros() -> None:
    async with StubLLMServer(responder=lambda body: "not json at all") as stub:
        judge, llm = await _judge(stub)
        scores = await judge.score("q?", "an answer", "gold", ["a source"])
        assert scores == RagasScores(faithfulness=None, answer_relevancy=None, context_precision=None,
                                     context_recall=None)
        stub.fail_next("400", 5)
        assert await judge.faithfulness("q?", "an answer", ["a source"]) is None
        await llm.close()


def test_kappa_and_auc() -> None:
    assert kappa([1, 0, 1, 0], [1, 0, 1, 0]) == 1.0
    assert kappa([1, 0, 1, 0], [0, 1, 0, 1]) == -1.0
    assert kappa([1, 1], [1, 1]) is None  # chance agreement is 1: undefined
    assert auc([0.9, 0.8, 0.3], [1, 1, 0]) == 1.0 and auc([0.5, 0.5], [1, 0]) == 0.5
    assert auc([0.1], [1]) is None


def test_agreement_compares_the_judge_with_the_labels() -> None:
    sample = [LabelledAnswer("a", "en", "q", ("s1", "s2"), "ans", "g", 1.0, 1, (1, 0), 1.0),
              LabelledAnswer("b", "en", "q", ("s1", "s2"), "ans", "g", 0.0, 0, (0, 1), 0.0),
              LabelledAnswer("c", "de", "q", ("s1",), "ans", "g", None, 0, (1,), 1.0)]
    scores = [RagasScores(1.0, 0.9, 1.0, 1.0, (1, 0)), RagasScores(1.0, 0.2, 0.5, 0.0, (0, 1)),
              RagasScores(None, 0.0, None, None, ())]
    report = agreement(sample, scores)
    assert report["faithfulness"] == {
        "n": 2,
        "missing": 0,
        "accuracy": 0.5,
        "kappa": 0.0,
        "mean_abs_diff": 0.5,
    }
    assert report["context_recall"]["accuracy"] == 1.0 and report["context_recall"]["missing"] == 1
    assert report["answer_relevancy"]["auc"] == 1.0 and report["answer_relevancy"]["mean_relevant"] == 0.9
    assert report["context_precision"] == {"sources": 4, "missing_items": 1, "accuracy": 1.0, "kappa": 1.0}


def test_the_hand_labelled_sample_is_complete_and_varied() -> None:
    sample = load_sample(SAMPLE)
    assert len(sample) == 30 and len({i.id for i in sample}) == 30
    assert {i.lang for i in sample} == {"en", "de"}
    assert {i.relevant for i in sample} == {0, 1}
    faith = [i.faithfulness for i in sample]
    assert None in faith and 0.0 in faith and 0.5 in faith and 1.0 in faith
    assert all(i.answer == OUT_OF_SCOPE for i in sample if i.faithfulness is None)
    assert {v for i in sample for v in i.useful} == {0, 1} and {i.recall for i in sample} == {0.0, 1.0}


def test_a_malformed_sample_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(
        '{"items": [{"id": "x", "lang": "en", "question": "q", "sources": ["a"], "answer": "b", '
        '"gold": "c", "labels": {"faithfulness": 1, "relevant": 1, "useful": [1, 0], "recall": 1}}]}'
    )
    with pytest.raises(InputError, match=r"bad.json: not a judge sample .*2 'useful' labels for 1 sources"):
        load_sample(bad)


def test_eval_judge_runs_the_sample_through_the_judge(tmp_path: Path) -> None:
    from evident.cli import main

    env = {"EVIDENT_DATA_DIR": str(tmp_path), "EVIDENT_EMBED_PROCESS": "no"}
    runner = CliRunner()
    missing = runner.invoke(main, ["eval", "judge", "--sample", str(SAMPLE)], env=env)
    assert missing.exit_code == 2 and "needs a judge model" in missing.output
    with _serving(_judge_reply) as url:
        out = tmp_path / "judge.json"
        result = runner.invoke(main, ["eval", "judge", "--sample", str(SAMPLE), "--output", str(out)],
                               env={**env, "EVIDENT_LLM_BASE_URL": url})
    assert result.exit_code == 0, result.output
    assert "judge agreement on 30 hand-labelled answers" in result.output
    report = json.loads(out.read_text())
    assert report["items"] == 30 and len(report["scores"]) == 30
    assert report["context_precision"]["sources"] > 0


class _serving:
    """The stub judge on a thread of its own with its own event loop, for a CLI that runs its own loop."""

    def __init__(self, responder: Any) -> None:
        self._stub = StubLLMServer(responder=responder)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._stub.start(), self._loop).result(10)
        return self._stub.base_url

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stub.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
