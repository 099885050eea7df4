"""Small helpers every embedder shares: optional imports, row normalisation, batching."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from pipeline.errors import ConfigError


def normalise_rows(matrix: np.ndarray) -> np.ndarray:
    """L2-normalise rows (zero rows stay zero) so dot product equals cosine."""
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return (matrix / np.clip(norms, 1e-12, None)).astype(np.float32)


def batches(items: Sequence[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def require_extra(module: str, extra: str | None, what: str) -> Any:
    """Import an optional dependency or explain which extra (or, for core ones, package) installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if extra is None:
            raise ConfigError(f"{what} needs the '{module}' package: pip install {module}") from exc
        raise ConfigError(f"{what} needs the '{extra}' extra: pip install 'evident-bot[{extra}]'") from exc


def available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
