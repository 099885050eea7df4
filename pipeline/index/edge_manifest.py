"""The embedded index's ``manifest.json``: which embedder (name, dimension, recipe) built it.

Written atomically before the shard of a new index exists, so a crash never leaves a shard without one;
checked on every open, so an index is never searched with vectors of another model.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.errors import IndexError_, InputError
from pipeline.index import common as ic

__all__ = ["MANIFEST_FILE", "SHARD_DIR", "prepare_manifest", "read_manifest", "read_recipe",
           "write_json_atomic"]

MANIFEST_FILE = "manifest.json"
SHARD_DIR = "shard"


def read_manifest(index_dir: Path) -> tuple[str, int]:
    """(embedder, dimension) an embedded index was built with, read without opening it (no model load)."""
    data, path = _load(index_dir)
    try:
        return str(data["embedder"]), int(data["dim"])
    except (KeyError, TypeError, ValueError) as exc:
        raise IndexError_(f"cannot read {path}: {exc}") from exc


def read_recipe(index_dir: Path) -> dict[str, Any] | None:
    """The text recipe an embedded index records (``pipeline.index.common.manifest``); None before recipes."""
    recipe = _load(index_dir)[0].get("recipe")
    return dict(recipe) if isinstance(recipe, dict) else None


def _load(index_dir: Path) -> tuple[dict[str, Any], Path]:
    path = Path(index_dir) / MANIFEST_FILE
    if not path.is_file():
        raise InputError(f"no embedded index at {index_dir} (no {MANIFEST_FILE})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise IndexError_(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise IndexError_(f"cannot read {path}: not a JSON object")
    return data, path


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """temp file + fsync + rename, so a crash never leaves a half-written manifest."""
    fd, tmp = tempfile.mkstemp(prefix=".manifest-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def prepare_manifest(index_dir: Path, shard_path: Path, *, embedder: str, dense_dim: int,
                     recipe: Mapping[str, Any] | None) -> bool:
    """Check the manifest against what opens the index (``IndexMismatchError`` on a mismatch), adopt an old
    manifest without a recipe, write one for a new index; returns whether a manifest exists now."""
    manifest_path = index_dir / MANIFEST_FILE
    shard_path = index_dir / SHARD_DIR
    has_manifest = manifest_path.exists()
    if has_manifest:
        try:
            stored = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise IndexError_(f"cannot read {manifest_path}: {exc}") from exc
        ic.check_manifest(stored, embedder=embedder, dense_dim=dense_dim, where=str(index_dir), recipe=recipe)
        if recipe and not isinstance(stored.get("recipe"), Mapping):  # from before recipes: adopt this one
            write_json_atomic(manifest_path, ic.manifest(embedder, dense_dim, recipe))
    exists = shard_path.is_dir() and any(shard_path.iterdir())
    if not exists and not has_manifest:  # a new index: the manifest first, so a crash never leaves
        write_json_atomic(manifest_path, ic.manifest(embedder, dense_dim, recipe))  # a shard without one
        has_manifest = True
    return has_manifest
