"""One real ask + explain against a real local OpenAI-compatible server (e.g. llama.cpp with SmolLM2).

Skipped unless ``EVIDENT_TEST_LLM_URL`` is set, e.g.::

    EVIDENT_TEST_LLM_URL=http://127.0.0.1:8765/v1 EVIDENT_TEST_LLM_MODEL=smollm2 pytest -m llm

Small models answer poorly, so this checks the plumbing (wire format, prompt size, n>1 or its
fallback, timeouts), not answer quality.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.access.scope import EVERYTHING
from tests.test_eval_attribution import close_world, open_world

pytestmark = [
    pytest.mark.llm,
    pytest.mark.skipif(not os.environ.get("EVIDENT_TEST_LLM_URL"), reason="EVIDENT_TEST_LLM_URL not set"),
]


async def test_real_llm_ask_and_explain(tmp_path: Path) -> None:
    engine = await open_world(tmp_path, os.environ["EVIDENT_TEST_LLM_URL"],
                              model=os.environ.get("EVIDENT_TEST_LLM_MODEL", "local"),
                              llm_timeout_s=120.0, llm_context_tokens=2048)
    try:
        turn = await engine.ask("real-llm", "Where are visitor badges handed out?", scope=EVERYTHING)
        assert turn.error is None, turn.error
        assert turn.answer.text.strip()
        assert turn.answer.evidence, "the generator saw no evidence"
        explained = await engine.explain(turn.turn_id, method="cfa_clusters", scope=EVERYTHING)
        assert explained.error is None and explained.result is not None
        assert explained.result.calls >= 1
        assert explained.clusters and abs(sum(c.percent for c in explained.clusters) - 100.0) < 1e-6
    finally:
        await close_world(engine)


async def test_real_llm_logprob_explain(tmp_path: Path) -> None:
    """The logprob method end to end against a server with prompt log-probs (llama.cpp's or vLLM)."""
    engine = await open_world(tmp_path, os.environ["EVIDENT_TEST_LLM_URL"],
                              model=os.environ.get("EVIDENT_TEST_LLM_MODEL", "local"),
                              llm_timeout_s=300.0, llm_context_tokens=2048, llm_prompt_logprobs=True)
    try:
        turn = await engine.ask("real-llm-lp", "Where are visitor badges handed out?", scope=EVERYTHING)
        assert turn.error is None, turn.error
        explained = await engine.explain(turn.turn_id, method="logprob", scope=EVERYTHING)
        assert explained.error is None and explained.result is not None
        assert explained.result.details["base_logprob"] < 0.0
        assert explained.clusters and abs(sum(c.percent for c in explained.clusters) - 100.0) < 1e-6
    finally:
        await close_world(engine)
