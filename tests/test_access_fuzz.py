"""The permission fuzz (``benchmarks/access_fuzz.py``) in small: per-user access leaks nothing, and the fuzz
does find the leaks of space-only scopes (so a zero means something)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks.access_fuzz import Fuzz

pytestmark = pytest.mark.slow


def _args(access: str, mode: str) -> argparse.Namespace:
    return argparse.Namespace(turns=120, people=50, groups=10, spaces=20, seed=11, mode=mode, access=access)


@pytest.mark.parametrize("mode", ["cloud", "dc"])
async def test_per_user_access_leaks_nothing(tmp_path: Path, mode: str) -> None:
    fuzz = Fuzz(_args("per-user", mode), tmp_path)
    assert await fuzz.run() == 0
    assert fuzz.turns == 120 and fuzz.leaks == 0, fuzz.leaked
    assert fuzz.shown["cited answers"] > 60 and fuzz.shown["explanations"] > 0  # it did answer and explain


async def test_the_fuzz_finds_space_only_leaks(tmp_path: Path) -> None:
    fuzz = Fuzz(_args("space", "cloud"), tmp_path)
    assert await fuzz.run() == 1 and fuzz.leaks > 10
