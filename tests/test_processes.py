"""Real `evident` processes on one data directory: they take turns on the embedded index, none fails."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import pytest
from fake_slack import FakeSlack

from connectors.local import sample_space_dir
from tests.fake_confluence import FakeConfluence, synthetic_pages

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent


def base_env(data: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("EVIDENT_", "CONFLUENCE_", "SLACK_", "QDRANT_"))
    }
    return {**env, "EVIDENT_DATA_DIR": str(data), "PYTHONPATH": str(REPO)}


async def evident(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "evident",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_serve_and_sync_and_search_share_the_embedded_index(tmp_path: Path) -> None:
    pages = synthetic_pages(3, folder=sample_space_dir())
    slack = await FakeSlack().start()
    port = free_port()
    try:
        async with FakeConfluence(pages, mode="dc") as fc:
            env = {
                **base_env(tmp_path),
                "CONFLUENCE_URL": fc.url,
                "CONFLUENCE_TOKEN": "s3cret-token",
                "CONFLUENCE_SPACES": "ENG,OPS",
                "SLACK_BOT_TOKEN": "xoxb-proc-test",
                "SLACK_SIGNING_SECRET": "sig",
                "EVIDENT_SLACK_TRANSPORT": "http",
                "EVIDENT_HTTP_PORT": str(port),
                "EVIDENT_SLACK_API_URL": slack.base_url,
                "EVIDENT_SYNC_INTERVAL_S": "3600",
            }
            serve = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "evident",
                "serve",
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                await wait_ready(port, serve)  # serve syncs once at start and keeps the index open
                code, out, err = await evident(env, "sync")
                assert code == 0, err
                assert "added 0, updated 0, deleted 0, unchanged " in out and "failed 0" in out
                code, out, err = await evident(env, "search", "on-call rotation", "--json")
                assert code == 0, err
                assert json.loads(out)["hits"]
                code, out, err = await evident(env, "index", "stats")
                assert code == 0, err
            finally:
                serve.send_signal(signal.SIGTERM)
                _, serve_err = await asyncio.wait_for(serve.communicate(), 60)
            assert serve.returncode == 0, serve_err.decode()[-2000:]
            assert "Can't init WAL" not in serve_err.decode()
            started = " objects left out of garbage collection; the GIL switches every 1 ms"
            assert started in serve_err.decode()
            assert "page worker started (pid " in serve_err.decode()  # serve's sync parsed in its worker
    finally:
        await slack.stop()


async def wait_ready(port: int, proc: asyncio.subprocess.Process) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(480):  # two minutes
            if proc.returncode is not None:
                raise AssertionError(f"serve exited with {proc.returncode}")
            try:
                async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.25)
    raise AssertionError("serve did not become ready")


async def test_search_during_a_long_ingest(tmp_path: Path) -> None:
    env = base_env(tmp_path)
    code, _, err = await evident(env, "ingest", "--sample", "--no-progress")
    assert code == 0, err
    many = tmp_path / "many"
    many.mkdir()
    for page in synthetic_pages(40, folder=sample_space_dir()):
        (many / f"{page.id}.json").write_text(json.dumps({
            "id": page.id, "title": page.title, "url": f"https://wiki.example/pages/{page.id}",
            "space": page.space, "content": page.body}))
    ingest = asyncio.create_task(evident(env, "ingest", str(many), "--no-progress"))
    await asyncio.sleep(4)  # well into the ingest, which writes page after page
    code, out, err = await evident(env, "search", "deployment runbook", "-k", "3")
    assert code == 0, err
    assert out.count("<https://") == 3
    code, out, err = await ingest
    assert code == 0, err
    assert "added 80" in out
