"""Which pages show which others through include / excerpt-include macros, kept between syncs.

An included page's edit changes what its includers show, but not their own version or ``lastmodified``, so
an incremental sync would never fetch them. The map (includer id -> {included id: version time shown}, per
space) is kept in the checkpoint store row ``__includes__:<space>`` as JSON; each sync re-fetches the
includers showing an older version of a page it fetched (``sync._includers``) and records what every page
it resolved includes now (``stale_includers``). An included page of another synced space counts by the version
that space indexed lately (its known versions, ``connectors.confluence.state``).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from connectors.confluence.state import load_row, save_row
from pipeline.protocols import CheckpointStore

if TYPE_CHECKING:
    from connectors.confluence.macros import MacroResolver


async def load_includes(store: CheckpointStore, source_key: str, space: str) -> dict[str, dict[str, str]]:
    """The space's includer -> {included: version time} map (empty when none was kept or it is unreadable)."""
    data = await load_row(store, source_key, "includes", space)
    return {k: {str(i): str(t) for i, t in v.items()} for k, v in data.items() if isinstance(v, dict)}


async def save_includes(store: CheckpointStore, source_key: str, space: str, kept: dict[str, dict[str, str]],
                        macros: MacroResolver | None, *, unsettled: Collection[str] = ()) -> None:
    """``kept`` updated with what this run's resolved pages include now (``macros.includes``; a page that
    includes nothing leaves), except the pages to be read again (``unsettled``: their entries stay as they
    were, so they show as stale includers until a read of them succeeds)."""
    if macros is None:
        return
    merged = dict(kept)
    for page_id, shown in macros.includes.items():
        if page_id in unsettled:
            continue
        if shown:
            merged[page_id] = dict(shown)
        else:
            merged.pop(page_id, None)
    await save_row(store, source_key, "includes", space, merged, before=kept)


def known_elsewhere(known: Mapping[str, dict[str, str]], key: str) -> ChainMap[str, str]:
    """The known versions of the synced spaces' pages but ``key``'s (includes across spaces count by them): a
    view over the spaces' maps, not a copy (looked up only for included pages; copying every page of every
    space for each space made a cycle's work grow with the wiki times its spaces)."""
    return ChainMap(*(versions for other, versions in known.items() if other != key))


def stale_includers(seen: dict[str, str], includes: dict[str, dict[str, str]],
                    elsewhere: Mapping[str, str]) -> list[str]:
    """The includers (not read again already: ``seen``, id -> version time) that show an older version of a
    page read now (``seen``) or of another synced space's page (``elsewhere``)."""
    def changed(inc: str, when: str) -> bool:
        if inc in seen:
            return not when or seen[inc] != when
        return bool(when) and inc in elsewhere and elsewhere[inc] != when

    return sorted(pid for pid, shown in includes.items() if pid not in seen
                  and any(changed(inc, when) for inc, when in shown.items()))
