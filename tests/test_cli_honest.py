"""The CLI tells scripts what happened (exit codes, named index problems) and never prints a secret."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from click.testing import Result
from helpers import CliData, cli_data_fixture, invoke_cli  # noqa: F401
from stub_llm import StubLLMServer
from thread_server import ThreadedServer

pytestmark = pytest.mark.slow

SECRETS = {
    "EVIDENT_LLM_API_KEY": "llmkey-Zq81x9Rk3",
    "QDRANT_API_KEY": "qdrantkey-Ww4u2Tt7",
    "CONFLUENCE_TOKEN": "conftoken-Pp3e6Yy0",
    "SLACK_BOT_TOKEN": "xoxb-9911-slackbot-Ab12Cd",
    "SLACK_APP_TOKEN": "xapp-1-A77-slackapp-Ef34",
    "SLACK_SIGNING_SECRET": "signsecret-Gh56Ij78",
}
URL_PASSWORD = "urlpass-Kk9Lm2Nn"


class EchoServer(ThreadedServer):
    """Answers every request with an error whose body quotes the request's headers and URL."""

    def __init__(self, status: int) -> None:
        self.status = status

        async def echo(request: web.Request) -> web.Response:
            body = {"error": {"message": f"denied {request.url} headers={dict(request.headers)}",
                              "type": "invalid_request_error"}, "ok": False, "error_code": "invalid_auth"}
            return web.json_response(body, status=self.status)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", echo)
        super().__init__(app)


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    with EchoServer(401) as server:
        yield server


def secret_env(echo: EchoServer) -> dict[str, str]:
    return {
        **SECRETS,
        "EVIDENT_LLM_BASE_URL": f"http://llmuser:{URL_PASSWORD}@{echo.url}/v1",
        "CONFLUENCE_URL": f"http://{echo.url}/wiki",
        "CONFLUENCE_USER": "bot@example.com",
        "CONFLUENCE_SPACES": "ENG",
        "EVIDENT_SLACK_API_URL": f"http://{echo.url}/api/",
        "EVIDENT_SLACK_TRANSPORT": "socket",
    }


def leaked(result: Result) -> list[str]:
    out = result.output + (result.stderr if result.stderr_bytes is not None else "")
    basic = base64.b64encode(f"bot@example.com:{SECRETS['CONFLUENCE_TOKEN']}".encode()).decode()
    values = [*SECRETS.values(), URL_PASSWORD, basic]
    return [v for v in values if v in out]


def test_failing_commands_print_no_secret(cli_data: CliData, echo: EchoServer, tmp_path: Path) -> None:
    env = secret_env(echo)
    runs = {
        "ask": invoke_cli(cli_data.path, "ask", "Who is on call?", env=env),
        "sync": invoke_cli(tmp_path, "sync", env=env),
        "serve": invoke_cli(tmp_path, "serve", env=env),
        "search (qdrant)": invoke_cli(tmp_path, "search", "x", env={
            **env, "QDRANT_URL": f"http://qdrantuser:{URL_PASSWORD}@{echo.url}"}),
        "config show": invoke_cli(tmp_path, "config", "show", env=env),
        "ask -v": invoke_cli(cli_data.path, "-v", "ask", "Who is on call?", env=env),
    }
    for name, result in runs.items():
        assert leaked(result) == [], (name, result.output)
        if name != "config show":
            assert result.exit_code != 0, (name, result.output)
            assert "Traceback" not in result.output, name
    assert "[redacted]" in runs["ask"].stderr or "***" in runs["ask"].stderr or "401" in runs["ask"].stderr


def test_failed_turns_exit_non_zero(cli_data: CliData) -> None:
    empty = invoke_cli(cli_data.path, "ask", "   ")
    assert empty.exit_code == 1 and empty.stderr.splitlines()[-1].startswith("error: Please ask a question")
    unreachable = invoke_cli(
        cli_data.path,
        "ask",
        "Who is on call?",
        env={"EVIDENT_LLM_BASE_URL": "http://127.0.0.1:9/v1", "EVIDENT_LLM_MAX_RETRIES": "0"},
    )
    assert unreachable.exit_code == 1 and unreachable.stderr.splitlines()[-1].startswith("error: ")


async def test_rejected_llm_key_exits_non_zero(cli_data: CliData) -> None:
    async with StubLLMServer(require_key="right-key") as stub:
        result = await asyncio.to_thread(
            invoke_cli,
            cli_data.path,
            "ask",
            "Who is on call?",
            env={"EVIDENT_LLM_BASE_URL": stub.base_url, "EVIDENT_LLM_API_KEY": "wrong-key"},
        )
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[-1].startswith("error: ") and "wrong-key" not in result.output


def test_missing_and_empty_index_are_named(tmp_path: Path) -> None:
    missing = invoke_cli(tmp_path / "nothing-here", "search", "on call")
    assert missing.exit_code == 2 and "no index at" in missing.stderr and "ingest" in missing.stderr
    assert not (tmp_path / "nothing-here" / "index").exists()  # a read never creates an index
    ask = invoke_cli(tmp_path / "nothing-here", "ask", "on call")
    assert ask.exit_code == 2 and "no index at" in ask.stderr


def test_empty_index_is_named(tmp_path: Path) -> None:
    from pipeline.index.edge import EdgeIndex

    async def make_empty() -> None:
        from evident.settings import Settings
        from pipeline.factory import make_embedder_from

        embedder = make_embedder_from(Settings.load(env={}, data_dir=tmp_path))
        index = EdgeIndex(tmp_path / "index")
        await index.open(dense_dim=embedder.dim, embedder=embedder.name)
        await index.close()

    asyncio.run(make_empty())
    result = invoke_cli(tmp_path, "search", "on call")
    assert result.exit_code == 2 and "is empty" in result.stderr, result.output


def test_index_of_another_embedder_is_named(tmp_path: Path) -> None:
    (tmp_path / "index").mkdir(parents=True)
    (tmp_path / "index" / "manifest.json").write_text(json.dumps(
        {"format": "evident-index", "version": 1, "embedder": "st:other-model", "dim": 768}))
    result = invoke_cli(tmp_path, "search", "on call")
    assert result.exit_code == 2
    assert "built with embedder 'st:other-model'" in result.stderr and "--rebuild" in result.stderr


def test_another_recipe_is_refused_and_rebuild_re_embeds(tmp_path: Path) -> None:
    first = invoke_cli(tmp_path, "ingest", "--sample", "--no-progress")
    assert first.exit_code == 0, first.output
    other = {"EVIDENT_EMBED_MAX_TOKENS": "64"}
    refused = invoke_cli(tmp_path, "search", "on call", env=other)
    assert refused.exit_code == 2 and "made with max_tokens 128" in refused.stderr
    assert "evident ingest --rebuild" in refused.stderr
    rebuilt = invoke_cli(tmp_path, "ingest", "--sample", "--no-progress", "--rebuild", env=other)
    assert rebuilt.exit_code == 0 and "added 10" in rebuilt.stdout, rebuilt.output
    assert invoke_cli(tmp_path, "search", "on call", env=other).exit_code == 0
    manifest = json.loads((tmp_path / "index" / "manifest.json").read_text())
    assert manifest["recipe"] == {"max_tokens": 64, "sparse": "bm25(avg_len=88.0)", "sparse_idf": True}


def test_an_index_encoded_before_bm25_lengths_were_recorded_is_refused_or_opened_as_it_was(
        tmp_path: Path) -> None:
    """An index encoded with the earlier length (40, recorded as plain ``bm25``) is refused, not mixed with
    vectors normalized by 88; with ``EVIDENT_BM25_AVG_LEN=40`` it opens as before."""
    first = invoke_cli(tmp_path, "ingest", "--sample", "--no-progress")
    assert first.exit_code == 0, first.output
    manifest_path = tmp_path / "index" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["recipe"]["sparse"] = "bm25"  # what the earlier release wrote
    manifest_path.write_text(json.dumps(manifest))
    refused = invoke_cli(tmp_path, "search", "on call")
    assert refused.exit_code == 2
    assert "sparse bm25," in refused.stderr and "sparse bm25(avg_len=88.0)" in refused.stderr
    assert "--rebuild" in refused.stderr and "EVIDENT_BM25_AVG_LEN=40" in refused.stderr
    old = {"EVIDENT_BM25_AVG_LEN": "40"}
    assert invoke_cli(tmp_path, "search", "on call", env=old).exit_code == 0
