"""What a cycle's listings say about the index: pages gone or moved between synced spaces; and which errors
are the site's refusal of the credentials rather than of one item."""

from __future__ import annotations

from pipeline.errors import AuthError, RemoteError


def is_attachment(pid: str) -> bool:
    return pid.startswith("att") and pid[3:].isdigit()


def rejected_credentials(exc: RemoteError) -> bool:
    """The site rejected the token itself (HTTP 401), as opposed to one space or page being refused (403)."""
    return isinstance(exc, AuthError) and exc.status == 401


def gone_and_moved(
    indexed: dict[str, str], listings: dict[str, set[str]]
) -> tuple[list[str], dict[str, list[str]]]:
    """From where each page is indexed (page id -> space) and this run's listings (space -> in-scope ids):

    - gone: pages indexed under a space listed in this run that no listing holds any more: deleted, archived,
      restricted, out of scope, or moved into a space that is not synced (or that the account cannot read);
    - moved: space -> pages it lists that are indexed under another space (moved between synced spaces).

    Pages indexed under a space not listed in this run (another ``--spaces`` selection, a listing that
    failed) are left alone, and so are non-numeric ids (other sources, e.g. a local export).
    """
    where = {pid: space for space, ids in listings.items() for pid in ids}
    gone = sorted(pid for pid, space in indexed.items()
                  if (pid.isdigit() or is_attachment(pid)) and space in listings and pid not in where)
    moved: dict[str, list[str]] = {}
    for pid, space in where.items():
        if pid in indexed and indexed[pid] != space:
            moved.setdefault(space, []).append(pid)
    return gone, {space: sorted(ids) for space, ids in moved.items()}
