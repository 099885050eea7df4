"""Per-user access at the end of a sync cycle: the permissions that changed are written onto the indexed
evidence (a payload write: nothing re-parsed or re-embedded), and the people directory of the groups they name
is replaced. Fingerprints in the store say what the index holds, so an unchanged page costs nothing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from connectors.confluence.source import ConfluenceSource
from pipeline.access.scope import PageAccess, fingerprint
from pipeline.errors import RemoteError
from pipeline.protocols import Index, SyncStore


async def settle_access(
    source: ConfluenceSource,
    index: Index,
    store: SyncStore,
    listings: dict[str, set[str]],
    gone: Sequence[str],
    warnings: list[tuple[str, str]],
    *,
    unlisted: Iterable[str] = (),
) -> int:
    """How many pages' permissions were written (0 in space mode); problems are added to ``warnings``.
    ``unlisted``: items kept indexed though their listing failed; their permissions cannot be checked, so
    they are shown to nobody until it answers again."""
    sweep = source.permissions
    if sweep is None:
        return 0
    known = await store.page_access_fingerprints(source.source_key)
    listed = {pid for ids in listings.values() for pid in ids}
    current: dict[str, PageAccess | None] = {pid: source.access.get(pid) for pid in listed}
    current |= dict.fromkeys(set(unlisted) - listed)
    changed = {pid: a for pid, a in current.items() if fingerprint(a) != known.get(pid)}
    await index.set_access(changed)
    prints: dict[str, str | None] = {pid: fingerprint(a) for pid, a in changed.items()}
    await store.set_page_access_fingerprints(source.source_key, prints | dict.fromkeys(gone))
    if sweep.hidden_ancestors:
        warnings.append(("permissions", f"{sweep.hidden_ancestors} ancestor page(s) the sync account cannot "
                                        "see: their descendants are shown to nobody"))
    try:
        await store.replace_directory(source.source_key, await sweep.directory())
    except RemoteError as exc:
        warnings.append(("permissions", f"group members not read, the last directory is kept: {exc}"))
    return len(changed)
