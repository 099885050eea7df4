"""`evident sync` end to end through the CLI, against the fake Confluence REST server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

from connectors.local import sample_space_dir
from evident.cli import main
from pipeline.store import Store
from tests.fake_confluence import FakeConfluence, synthetic_pages

pytestmark = pytest.mark.slow


def _env(data: Path, url: str = "", token: str = "s3cret-token") -> dict[str, str]:
    return {
        "EVIDENT_DATA_DIR": str(data),
        "EVIDENT_INDEX_DIR": "",
        "EVIDENT_STORE_PATH": "",
        "QDRANT_URL": "",
        "EVIDENT_CONFIG": "",
        "CONFLUENCE_URL": url,
        "CONFLUENCE_TOKEN": token,
        "CONFLUENCE_USER": "",
        "CONFLUENCE_SPACES": "ENG,OPS",
    }


async def test_sync_cli_full_then_no_change(tmp_path: Path) -> None:
    pages = synthetic_pages(2, folder=sample_space_dir())
    runner = CliRunner()
    async with FakeConfluence(pages, mode="dc") as fc:
        env = _env(tmp_path, fc.url)
        # The CLI runs its own event loop; the fake server needs ours, so the CLI goes to a thread.
        first = await asyncio.to_thread(runner.invoke, main, ["sync"], env=env)
        assert first.exit_code == 0, first.output
        assert f"added {len(pages)}, updated 0, deleted 0" in first.output
        second = await asyncio.to_thread(runner.invoke, main, ["sync"], env=env)
        assert second.exit_code == 0, second.output
        assert f"added 0, updated 0, deleted 0, unchanged {len(pages)}" in second.output
        wrong = await asyncio.to_thread(
            runner.invoke, main, ["sync"], env=_env(tmp_path / "b", fc.url, "nope")
        )
        assert wrong.exit_code == 2
        assert "error: Confluence rejected the credentials (HTTP 401)" in wrong.output
        assert "Traceback" not in wrong.output
        assert "s3cret-token" not in first.output + second.output + wrong.output
    store = Store(tmp_path / "evident.db")  # each run is recorded for the operator (Slack's App Home)
    last = await store.last_sync()
    await store.close()
    assert last is not None and last.summary.startswith(
        f"added 0, updated 0, deleted 0, unchanged {len(pages)}"
    )
    assert last.failed == 0 and last.errors == ()


def test_sync_cli_without_confluence_url_is_one_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["sync"], env=_env(tmp_path, url=""))
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == ["error: CONFLUENCE_URL missing: set it (Cloud: "
                                                  "https://<site>.atlassian.net/wiki)"]


async def test_a_rejected_token_exits_2_whatever_the_space_check_cache(tmp_path: Path) -> None:
    """Found outside: within 6 h of a passed space check, a wrong token gave per-space `failed: … 401` lines
    and exit 1; on a fresh data dir one error line and exit 2."""
    pages = synthetic_pages(2, folder=sample_space_dir())
    runner = CliRunner()
    async with FakeConfluence(pages, mode="dc") as fc:
        first = await asyncio.to_thread(runner.invoke, main, ["sync"], env=_env(tmp_path, fc.url))
        assert first.exit_code == 0, first.output
        wrong = await asyncio.to_thread(runner.invoke, main, ["sync"], env=_env(tmp_path, fc.url, "nope"))
        assert wrong.exit_code == 2, wrong.output
        assert "error: Confluence rejected the credentials (HTTP 401)" in wrong.output
        assert "failed:" not in wrong.output


async def test_a_warning_during_the_progress_bar_gets_its_own_line(tmp_path: Path) -> None:
    """Found outside: the v1-fallback warning printed onto the progress bar's line."""
    pages = synthetic_pages(3, folder=sample_space_dir())
    async with FakeConfluence(pages, mode="cloud") as fc:
        fc.v2_pages = False  # REST v2 bodies answer 404: evident warns and reads them through v1
        env = {**_env(tmp_path, fc.url), "CONFLUENCE_USER": fc.user}
        result = await asyncio.to_thread(CliRunner().invoke, main, ["sync"], env=env)
    assert result.exit_code == 0, result.output
    [line] = [ln for ln in result.output.split("\n") if "no REST v2" in ln]
    shown = line.split("\r")[-1]  # what a terminal shows of that line
    assert shown.split(" ", 2)[2].startswith("WARNING") and "embedding" not in shown, repr(line)
