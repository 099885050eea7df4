"""CQL for syncing: one place that quotes values and formats the incremental-sync bound.

Why an overlap window (this text is the README's explanation)
-------------------------------------------------------------
Confluence evaluates ``lastmodified >= "yyyy-MM-dd HH:mm"`` in the *calling user's / site's* time
zone, at minute precision, against the server's own clock. We cannot reliably learn that time zone
through the REST API, so we keep the checkpoint in UTC (the newest ``lastmodified`` of a page we
actually ingested) and query with ``checkpoint - overlap`` written as UTC wall-clock time, floored to
the minute. The server then reads our bound shifted by its zone's offset and by any clock skew:

* zones east of UTC (UTC+10 reads "10:00" as 00:00 UTC) and flooring to the minute only move the bound
  *earlier*: we re-read more pages, never fewer;
* zones west of UTC (UTC-5 reads "10:00" as 15:00 UTC) and a server clock that runs behind ours move it
  *later*, by ``|offset| + skew``.

An edit is missed only if the effective bound lands after it, i.e. only if ``|west offset| + skew``
exceeds ``EVIDENT_SYNC_OVERLAP_S``; with a larger overlap a miss is impossible. Re-reading the
overlapped pages is harmless: ingest compares content hashes and skips unchanged pages without
parsing or embedding them. So set the overlap to at least your site's western UTC offset plus a few
minutes of skew (the 600 s default suits sites on UTC or east of it; use e.g. 19800 for UTC-5).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from pipeline.errors import InputError

EXPAND_PAGE = "body.storage,version,ancestors,space,metadata.labels"
EXPAND_RESTRICTIONS = "restrictions.read.restrictions.user,restrictions.read.restrictions.group"


def quote(value: str) -> str:
    """A CQL string literal; backslashes and double quotes are escaped so keys cannot inject CQL."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_utc(stamp: str) -> datetime:
    """Parse an ISO 8601 timestamp (any offset, ``Z`` allowed) into an aware UTC datetime."""
    try:
        dt = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InputError(f"not an ISO 8601 timestamp: {stamp!r}") from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC)


def to_utc_iso(stamp: str) -> str:
    """Normalise a Confluence ``version.when`` (server offset) to ISO UTC with a ``Z`` suffix."""
    return parse_utc(stamp).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def since_bound(checkpoint_utc: str, overlap_s: int) -> str:
    """The ``lastmodified`` bound for an incremental query: checkpoint minus overlap, floored to the minute."""
    dt = parse_utc(checkpoint_utc) - timedelta(seconds=max(0, overlap_s))
    return dt.strftime("%Y-%m-%d %H:%M")


def pages_cql(
    space: str,
    *,
    since: str | None = None,
    labels_include: Sequence[str] = (),
    labels_exclude: Sequence[str] = (),
    ancestor: str | None = None,
    ordered: bool = True,
) -> str:
    """CQL selecting the in-scope pages of one space, optionally modified since ``since`` (a bound)."""
    parts = [f"space = {quote(space)}", "type = page"]
    if ancestor:
        if not ancestor.isdigit():
            raise InputError(f"CONFLUENCE_ANCESTOR must be a numeric page id, got {ancestor!r}")
        parts.append(f"ancestor = {ancestor}")
    if labels_include:
        parts.append("label in (" + ", ".join(quote(v) for v in labels_include) + ")")
    if labels_exclude:
        parts.append("label not in (" + ", ".join(quote(v) for v in labels_exclude) + ")")
    if since:
        parts.append(f"lastmodified >= {quote(since)}")
    cql = " and ".join(parts)
    return cql + " order by lastmodified asc" if ordered else cql
