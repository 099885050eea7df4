"""Per-space sync state kept between syncs as JSON rows of the checkpoint store (``__<name>__:<space>``).

Two maps live there: which pages show which others through include macros (``connectors.confluence.includes``)
and the version time of each page a sync indexed lately (``known_versions``: an incremental query's re-reads
of those need no body, which on Cloud is a REST v2 request per results page).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from connectors.confluence.cql import parse_utc
from pipeline.errors import InputError
from pipeline.protocols import CheckpointStore

KNOWN_HORIZON = timedelta(days=1, hours=13)  # no incremental query reaches further behind its checkpoint


async def load_checkpoint(store: CheckpointStore, source_key: str, space: str,
                          warnings: list[tuple[str, str]]) -> str | None:
    """The space's checkpoint (UTC ISO), or None: never kept, or damaged (not a time: reported in
    ``warnings``, and the space is read as if never synced, which writes a sound one)."""
    raw = await store.get_checkpoint(source_key, space)
    if not raw:
        return None
    try:
        parse_utc(raw)
    except InputError:
        warnings.append((f"space:{space}", f"checkpoint {raw[:40]!r} is not a time: read in full"))
        return None
    return raw


def _row(name: str, space: str) -> str:
    return f"__{name}__:{space}"


async def load_row(store: CheckpointStore, source_key: str, name: str, space: str) -> dict[str, Any]:
    """The space's ``name`` map (empty when none was kept or it is unreadable)."""
    raw = await store.get_checkpoint(source_key, _row(name, space))
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return {str(k): v for k, v in data.items()} if isinstance(data, dict) else {}


async def save_row(store: CheckpointStore, source_key: str, name: str, space: str, data: dict[str, Any],
                   *, before: dict[str, Any] | None = None) -> None:
    """Keep ``data`` as the space's ``name`` map (nothing is written when it equals ``before``)."""
    if data != before:
        await store.set_checkpoint(source_key, _row(name, space), json.dumps(data, sort_keys=True))


async def load_known(store: CheckpointStore, source_key: str, space: str) -> dict[str, str]:
    """page id -> the version time (UTC ISO) it was last indexed at, for the space's recently indexed
    pages."""
    return {
        k: str(v)
        for k, v in (await load_row(store, source_key, "known", space)).items()
        if isinstance(v, str)
    }


async def save_known(store: CheckpointStore, source_key: str, space: str, kept: dict[str, str],
                     indexed: Iterable[tuple[str, str | None]], checkpoint: str | None, *,
                     drop: Iterable[str] = ()) -> None:
    """``kept`` less ``drop``, with the pages ``indexed`` now (id, version time), less what lies beyond
    ``KNOWN_HORIZON`` behind ``checkpoint`` (an incremental query never returns those again)."""
    gone = set(drop)
    merged = {pid: when for pid, when in kept.items() if pid not in gone}
    merged.update({pid: when for pid, when in indexed if when})
    if checkpoint:
        oldest = parse_utc(checkpoint) - KNOWN_HORIZON
        merged = {pid: when for pid, when in merged.items() if _after(when, oldest)}
    await save_row(store, source_key, "known", space, merged, before=kept)


def _after(when: str, oldest: Any) -> bool:
    try:
        return bool(parse_utc(when) >= oldest)
    except InputError:  # a damaged value: not kept
        return False
