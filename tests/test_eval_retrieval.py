"""Retrieval metrics on hand-made fixtures with known answers, and `evident eval retrieval` end to end on
the bundled sample space with a tiny hand-written ConfQuestions-shaped question file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    DEPLOY_URL,
    HARDWARE_URL,
    RAG_MEETING_URL,
    CliData,
    cli_data_fixture,  # noqa: F401
    invoke_cli,
)
from stub_llm import StubLLMServer

from connectors.local import sample_space_dir
from pipeline.evaluation.copies import copy_groups, page_copies, shingles, with_copies
from pipeline.evaluation.metrics import (
    first_hit_rank,
    hit_at,
    ndcg_at,
    normalize_url,
    p_at_1,
    percentile,
    rr_at,
)
from pipeline.evaluation.retrieval import QuestionResult, summarize

pytestmark = pytest.mark.slow

ROW_KEYS = {
    "query",
    "lang",
    "n",
    "p_at_1",
    "hit_at_5",
    "hit_at_10",
    "mrr_at_10",
    "ndcg_at_10",
    "latency_ms_p50",
    "latency_ms_p95",
    "p_at_1_copies",
}

# ---------------------------------------------------------------- metrics


@pytest.mark.parametrize(("a", "b"), [
    ("https://w.example/pages/1/On+call+rotation", "https://w.example/pages/1/On%20call%20rotation"),
    ("https://w.example/pages/1/On+call+rotation/", "https://w.example/pages/1/On+call+rotation"),
    ("HTTPS://W.Example/pages/1/X", "https://w.example/pages/1/X"),
    ("  https://w.example/pages/1/X  ", "https://w.example/pages/1/X/"),
])
def test_normalize_url_equates_encodings_case_and_trailing_slash(a: str, b: str) -> None:
    assert normalize_url(a) == normalize_url(b)


def test_normalize_url_keeps_pages_and_paths_apart() -> None:
    assert normalize_url("https://w.example/pages/1/X") != normalize_url("https://w.example/pages/2/X")
    assert normalize_url("https://w.example/docs/x") != normalize_url("https://w.example/docs/X")  # path case
    assert normalize_url("https://a.example/pages/1/X") != normalize_url("https://b.example/pages/1/X")


def test_confluence_page_urls_compare_by_page_id() -> None:
    """The slug after /pages/<id>/ is cosmetic (renames, exports that keep punctuation)."""
    assert normalize_url("https://w.example/wiki/spaces/S/pages/42/Old+Title") == \
        normalize_url("https://W.example/wiki/spaces/S/pages/42/New%3A+Title,+(v2)")


def test_first_hit_rank() -> None:
    ranked = ["https://w/a", "https://w/b+c", "https://w/a", "https://w/d"]
    assert first_hit_rank(ranked, ["https://w/b%20c/"]) == 2
    assert first_hit_rank(ranked, ["https://w/zzz", "https://w/d"]) == 4
    assert first_hit_rank(ranked, ["https://w/a"]) == 1
    assert first_hit_rank(ranked, ["https://w/none"]) is None
    assert first_hit_rank([], ["https://w/a"]) is None


@pytest.mark.parametrize(("rank", "p1", "h5", "h10", "rr10"), [
    (1, 1.0, 1.0, 1.0, 1.0),
    (2, 0.0, 1.0, 1.0, 0.5),
    (5, 0.0, 1.0, 1.0, 0.2),
    (6, 0.0, 0.0, 1.0, 1 / 6),
    (10, 0.0, 0.0, 1.0, 0.1),
    (11, 0.0, 0.0, 0.0, 0.0),
    (None, 0.0, 0.0, 0.0, 0.0),
])
def test_rank_metrics(rank: int | None, p1: float, h5: float, h10: float, rr10: float) -> None:
    assert p_at_1(rank) == p1
    assert hit_at(rank, 5) == h5 and hit_at(rank, 10) == h10
    assert rr_at(rank, 10) == pytest.approx(rr10)


@pytest.mark.parametrize(("rank", "ndcg"),
                         [(1, 1.0), (2, 0.6309), (3, 0.5), (10, 0.2891), (11, 0.0), (None, 0.0)])
def test_ndcg_at_10_with_one_relevant_page(rank: int | None, ndcg: float) -> None:
    assert ndcg_at(rank, 10) == pytest.approx(ndcg, abs=1e-4)


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]  # 1..20
    assert (
        percentile(values, 50) == 10.0 and percentile(values, 95) == 19.0 and percentile(values, 100) == 20.0
    )
    assert percentile([7.0], 95) == 7.0 and percentile([], 50) == 0.0


def _result(
    rank: int | None,
    *,
    qt: str = "completed",
    lang: str = "en",
    turn: int = 1,
    source: str = "table",
    q_type: str = "simple",
    latency: float = 10.0,
) -> QuestionResult:
    return QuestionResult(qt, lang, "c1", turn, source, q_type, "q", rank, latency)


def test_summarize_on_known_ranks() -> None:
    results = [
        _result(1, latency=10),
        _result(2, latency=20, source="passage"),
        _result(None, latency=30, turn=2),
        _result(4, latency=40, turn=7, q_type="complex"),
    ]
    report = summarize(results, by=("source", "turn"), config={"k": 10})
    assert report["config"] == {"k": 10}
    (row,) = report["rows"]
    assert set(row) == ROW_KEYS
    assert row["query"] == "completed" and row["lang"] == "en" and row["n"] == 4
    assert row["p_at_1"] == 0.25 and row["hit_at_5"] == 0.75 and row["hit_at_10"] == 0.75
    assert row["mrr_at_10"] == pytest.approx((1 + 0.5 + 0 + 0.25) / 4, abs=1e-4)
    assert row["latency_ms_p50"] == 20.0 and row["latency_ms_p95"] == 40.0
    by_source = {r["group"]: r for r in report["breakdowns"]["source"]}
    assert by_source["table"]["n"] == 3 and by_source["passage"]["p_at_1"] == 0.0
    by_turn = {r["group"]: r["n"] for r in report["breakdowns"]["turn"]}
    assert by_turn == {"1": 2, "2": 1, "6-10": 1}


def test_summarize_keeps_query_types_and_languages_apart() -> None:
    results = [_result(1, qt="completed", lang="en"), _result(3, qt="completed", lang="de"),
               _result(None, qt="raw", lang="en")]
    rows = {(r["query"], r["lang"]): r for r in summarize(results)["rows"]}
    assert set(rows) == {("completed", "en"), ("completed", "de"), ("raw", "en")}
    assert rows[("completed", "de")]["mrr_at_10"] == pytest.approx(1 / 3, abs=1e-4)
    assert rows[("raw", "en")]["hit_at_10"] == 0.0


# ---------------------------------------------------------------- `evident eval retrieval` end to end

# normalises to the page
ONCALL_GOLD = "https://ACME.example/wiki/spaces/ACME/pages/100003/On%20call%20rotation/"


def _turn(turn_id: int, en: str, de: str, completed_en: str, completed_de: str, url: str, source: str,
          q_type: str, answer: str) -> dict[str, Any]:
    return {"turn_id": str(turn_id), "q_type": q_type, "q_en": en, "q_de": de, "completed_q_en": completed_en,
            "completed_q_de": completed_de, "a_url": [url], "a_source": source, "a": answer}


QUESTIONS: list[dict[str, Any]] = [
    {"conv_id": "1", "turns": [
        _turn(1, "What is Alice's todo from the RAG meeting in October?",
              "Was ist Alices Aufgabe aus dem RAG-Meeting im Oktober?",
              "What is Alice's todo from the RAG meeting in October?",
              "Was ist Alices Aufgabe aus dem RAG-Meeting im Oktober?",
              RAG_MEETING_URL, "table", "simple", "Prepare the evaluation todo list"),
        _turn(2, "And Bruno?", "Und Bruno?", "What is Bruno's todo from the RAG meeting in October?",
              "Was ist Brunos Aufgabe aus dem RAG-Meeting im Oktober?",
              RAG_MEETING_URL, "table", "simple", "Collect 50 real questions from the support team"),
    ]},
    {"conv_id": "2", "turns": [
        _turn(1, "Which host still uses TPM 1.2?", "Welcher Host nutzt noch TPM 1.2?",
              "Which host still uses TPM 1.2?", "Welcher Host nutzt noch TPM 1.2?",
              HARDWARE_URL, "passage", "simple", "fra-legacy-07"),
        _turn(2, "When will it be replaced?", "Wann wird er ersetzt?", "When will fra-legacy-07 be replaced?",
              "Wann wird fra-legacy-07 ersetzt?", HARDWARE_URL, "passage", "complex", "March 2025"),
    ]},
    {"conv_id": "3", "turns": [
        _turn(1, "How do I roll back a deployment?", "Wie rolle ich ein Deployment zurück?",
              "How do I roll back a deployment?", "Wie rolle ich ein Deployment zurück?",
              DEPLOY_URL, "passage", "simple", "kestrel rollback --service billing"),
        _turn(2, "How long does an on-call shift last?", "Wie lange dauert eine Rufbereitschaft?",
              "How long does an on-call shift last?", "Wie lange dauert eine Rufbereitschaft?",
              ONCALL_GOLD, "passage", "simple", "One week"),
    ]},
]


def test_eval_retrieval_cli_report(cli_data: CliData, tmp_path: Path) -> None:
    qa = tmp_path / "qa.json"
    qa.write_text(json.dumps(QUESTIONS), encoding="utf-8")
    out = tmp_path / "report.json"
    result = invoke_cli(cli_data.path, "eval", "retrieval", "--questions", str(qa), "--documents",
                        str(sample_space_dir()), "--output", str(out), "--by", "source", "--by", "type",
                        "--by", "turn")
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stdout and "P@1" in result.stdout
    report = json.loads(out.read_text(encoding="utf-8"))
    assert {"config", "rows", "breakdowns"} <= set(report)
    assert set(report) <= {"config", "rows", "breakdowns", "averages"}
    assert isinstance(report["config"], dict) and report["config"]
    rows = report["rows"]
    assert {(r["query"], r["lang"]) for r in rows} == {
        (q, lang) for q in ("completed", "conversational", "raw") for lang in ("en", "de")}
    for r in rows:
        assert set(r) == ROW_KEYS, r
        assert r["n"] == 6
        for metric in ("p_at_1", "hit_at_5", "hit_at_10", "mrr_at_10"):
            assert 0.0 <= r[metric] <= 1.0
        assert r["hit_at_5"] <= r["hit_at_10"] and r["p_at_1"] <= r["mrr_at_10"] <= r["hit_at_10"]
        assert 0 < r["latency_ms_p50"] <= r["latency_ms_p95"]
    completed_en = next(r for r in rows if r["query"] == "completed" and r["lang"] == "en")
    assert completed_en["hit_at_10"] == 1.0  # every page is among 68 evidence of 10 pages; all gold found
    assert completed_en["p_at_1"] >= 0.5
    breakdowns = report["breakdowns"]
    assert set(breakdowns) == {"source", "type", "turn"}
    assert {r["group"] for r in breakdowns["source"]} == {"table", "passage"}
    assert {r["group"] for r in breakdowns["type"]} == {"simple", "complex"}
    assert {r["group"] for r in breakdowns["turn"]} == {"1", "2"}
    for dim_rows in breakdowns.values():
        for r in dim_rows:
            assert set(r) == ROW_KEYS | {"group"}
        # each breakdown partitions every (query, lang) row
        assert sum(r["n"] for r in dim_rows) == sum(r["n"] for r in rows)


def test_eval_retrieval_single_language_and_query(cli_data: CliData, tmp_path: Path) -> None:
    qa = tmp_path / "qa.json"
    qa.write_text(json.dumps(QUESTIONS[:1]), encoding="utf-8")
    out = tmp_path / "r.json"
    result = invoke_cli(cli_data.path, "eval", "retrieval", "--questions", str(qa), "--documents",
                        str(sample_space_dir()), "--lang", "en", "--query", "completed", "--output", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text(encoding="utf-8"))
    assert [(r["query"], r["lang"], r["n"]) for r in report["rows"]] == [("completed", "en", 2)]
    assert report["rows"][0]["p_at_1"] == 1.0
    assert "breakdowns" not in report


async def test_eval_retrieval_followup_completes_each_turn_once_and_fuses(cli_data: CliData,
                                                                          tmp_path: Path) -> None:
    qa = tmp_path / "qa.json"
    qa.write_text(json.dumps(QUESTIONS[:1]), encoding="utf-8")
    out = tmp_path / "r.json"
    args = ("eval", "retrieval", "--questions", str(qa), "--documents", str(sample_space_dir()), "--lang",
            "en", "--query", "followup", "--output", str(out))
    async with StubLLMServer(default_reply="What is served in the cafeteria?") as stub:
        result = await asyncio.to_thread(invoke_cli, cli_data.path, *args,
                                         env={"EVIDENT_LLM_BASE_URL": stub.base_url})
        completions = len(stub.requests)
    assert result.exit_code == 0, result.output
    assert completions == 1  # the conversation's one follow-up, completed once for llm and fused
    rows = {r["query"]: r for r in json.loads(out.read_text(encoding="utf-8"))["rows"]}
    assert set(rows) == {"conversational", "llm", "fused"} and all(r["n"] == 2 for r in rows.values())
    # the first turn is never completed: a wrong completion can only cost the follow-up
    assert rows["llm"]["p_at_1"] <= rows["conversational"]["p_at_1"]
    without = await asyncio.to_thread(invoke_cli, cli_data.path, *args)
    assert without.exit_code == 2 and "need an LLM endpoint" in without.stderr, without.output
    assert "Traceback" not in without.output


def test_eval_retrieval_bad_questions_file(cli_data: CliData, tmp_path: Path) -> None:
    qa = tmp_path / "qa.json"
    qa.write_text("[{oops", encoding="utf-8")
    result = invoke_cli(cli_data.path, "eval", "retrieval", "--questions", str(qa), "--documents",
                        str(sample_space_dir()))
    assert result.exit_code != 0 and isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output and "is not JSON" in result.stderr


# ---------------------------------------------------------------- copies of the gold page


def test_copy_groups_join_near_copies_only() -> None:
    text = " ".join(f"word{i}" for i in range(200))
    edited = text.replace("word100", "changed")  # one word of 200 changed: 5 of 196 shingles differ
    other = " ".join(f"other{i}" for i in range(200))
    half = " ".join(f"word{i}" for i in range(100))  # the first half only: Jaccard ~0.5
    groups = copy_groups([("a", shingles(text)), ("b", shingles(f"<p>{edited}</p>")), ("c", shingles(other)),
                          ("d", shingles(half)), ("e", shingles(""))])
    assert groups == {"a": frozenset({"b"}), "b": frozenset({"a"})}


def test_with_copies_adds_the_copies_of_each_gold_url() -> None:
    copies = {normalize_url("https://w.example/pages/1/A"): frozenset({"w.example/pages/2"})}
    gold = with_copies(["https://w.example/pages/1/A%20title"], copies)
    assert first_hit_rank(["https://w.example/pages/2/A", "https://w.example/pages/1/A"], gold) == 1
    assert first_hit_rank(["https://w.example/pages/3/B"], gold) is None
    assert with_copies(["https://w.example/pages/9/C"], copies) == ["https://w.example/pages/9/C"]


async def test_page_copies_of_a_folder_with_a_copied_page(tmp_path: Path) -> None:
    from connectors.local import LocalFolderConnector

    docs = _with_copy(tmp_path)
    copies = await page_copies(LocalFolderConnector([docs]).iter_pages())
    assert copies == {normalize_url(RAG_MEETING_URL): frozenset({normalize_url(COPY_URL)}),
                      normalize_url(COPY_URL): frozenset({normalize_url(RAG_MEETING_URL)})}


COPY_URL = "https://acme.example/wiki/spaces/~alice/pages/200002/RAG+meeting+October"


def _with_copy(tmp_path: Path) -> Path:
    """The sample space plus a copy of its RAG meeting page in Alice's personal space (another page id)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for f in sample_space_dir().glob("*.json"):
        (docs / f.name).write_text(f.read_text(encoding="utf-8"), encoding="utf-8")
    page = json.loads((docs / "100002-rag-meeting-october.json").read_text(encoding="utf-8"))
    page.update(id="200002", url=COPY_URL, space="~alice")
    (docs / "200002-rag-meeting-october-copy.json").write_text(json.dumps(page), encoding="utf-8")
    return docs


def test_eval_retrieval_counts_a_copy_of_the_gold_page_in_the_copies_column(cli_data: CliData,
                                                                          tmp_path: Path) -> None:
    """Both copies rank together; the gold names one of them. The page-id P@1 scores whichever came first, the
    copy-aware one scores both."""
    docs = _with_copy(tmp_path)
    turns = [dict(t) for t in QUESTIONS[0]["turns"]]
    for t in turns:
        t["a_url"] = [COPY_URL]
    qa = tmp_path / "qa.json"
    qa.write_text(json.dumps([{"conv_id": "1", "turns": turns}]), encoding="utf-8")
    out = tmp_path / "r.json"
    result = invoke_cli(cli_data.path, "eval", "retrieval", "--questions", str(qa), "--documents", str(docs),
                        "--lang", "en", "--query", "completed", "--output", str(out))
    assert result.exit_code == 0, result.output
    (row,) = json.loads(out.read_text(encoding="utf-8"))["rows"]
    assert row["p_at_1_copies"] == 1.0
    assert row["p_at_1"] <= row["p_at_1_copies"]
    assert "P@1 copies" in result.stdout
