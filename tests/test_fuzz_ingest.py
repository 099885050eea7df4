"""Seeded fuzz of the whole ingest path: no crash, every page indexed or reported, no silent text loss."""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzzgen import generate, run_cases
from helpers import HashEmbedder, ingest_options

from pipeline.models.sparse import Bm25Encoder

pytestmark = pytest.mark.slow

CATEGORIES = 16
# A lower evidence cap than the default keeps the suite fast and still exercises the bound.
OPTIONS = ingest_options(max_evidence_per_page=200)


@pytest.mark.parametrize("seed", [1, 2])
async def test_fuzzed_export_folder(tmp_path: Path, seed: int) -> None:
    cases = generate(CATEGORIES * 8, seed=seed)
    result = await run_cases(cases, tmp_path, embedder=HashEmbedder(), sparse=Bm25Encoder(), options=OPTIONS)
    assert result.crashes == []
    assert result.silent_drops == []
    assert result.unreported == []
    assert result.inconsistent == []
    assert result.report is not None
    assert result.indexed_pages > len(cases) // 2  # most cases are indexable, and were indexed
    assert {c.category for c in cases} >= {"malformed", "deep", "spans", "huge-table", "json", "symlink"}


async def test_bounds_are_reported_not_silent(tmp_path: Path) -> None:
    cases = [
        c for c in generate(CATEGORIES * 2) if c.category in ("evidence-flood", "huge-table", "too-large")
    ]
    result = await run_cases(cases, tmp_path, embedder=HashEmbedder(), sparse=Bm25Encoder(), options=OPTIONS)
    assert result.report is not None
    reasons = [why for _, why in (*result.report.failed, *result.report.partial, *result.report.warnings)]
    assert any("too large" in r for r in reasons)
    assert any("EVIDENT_MAX_EVIDENCE_PER_PAGE" in r for r in reasons)
    assert result.silent_drops == [] and result.crashes == []
