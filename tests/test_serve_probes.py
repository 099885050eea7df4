"""`evident serve` checks each remote credential once before serving (LLM, Confluence)."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
from stub_llm import StubLLMServer

from connectors.local import sample_space_dir
from evident.serve import probe_credentials
from evident.settings import Settings
from pipeline.errors import AuthError
from pipeline.models.llm import OpenAILLM
from tests.fake_confluence import FakeConfluence, synthetic_pages


def _llm(url: str, key: str) -> OpenAILLM:
    return OpenAILLM(base_url=url, api_key=key, models={"answer": "stub-model"}, max_retries=0)


async def test_a_rejected_llm_key_stops_start_up_naming_the_settings() -> None:
    async with StubLLMServer(require_key="right-key") as stub:
        llm = _llm(stub.base_url, "wrong-key")
        with pytest.raises(AuthError, match="check EVIDENT_LLM_BASE_URL / EVIDENT_LLM_API_KEY") as err:
            await probe_credentials(Settings.load(env={}), SimpleNamespace(llm=llm))
        assert "wrong-key" not in str(err.value)
        await probe_credentials(Settings.load(env={}), SimpleNamespace(llm=_llm(stub.base_url, "right-key")))
        await llm.close()


async def test_an_unreachable_llm_only_warns(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    llm = _llm(f"http://127.0.0.1:{port}/v1", "k")
    await probe_credentials(Settings.load(env={}), SimpleNamespace(llm=llm))
    assert "cannot check EVIDENT_LLM_BASE_URL" in caplog.text
    await llm.close()


async def test_a_rejected_confluence_token_stops_start_up() -> None:
    async with FakeConfluence(synthetic_pages(1, folder=sample_space_dir()), mode="dc") as fc:
        env = {"CONFLUENCE_URL": fc.url, "CONFLUENCE_TOKEN": "nope", "CONFLUENCE_SPACES": "ENG"}
        with pytest.raises(AuthError, match="check CONFLUENCE_URL / CONFLUENCE_TOKEN"):
            await probe_credentials(Settings.load(env=env), SimpleNamespace(llm=None))
        good = {**env, "CONFLUENCE_TOKEN": "s3cret-token"}
        await probe_credentials(Settings.load(env=good), SimpleNamespace(llm=None))
