"""CQL for syncing: one place that quotes values and formats the incremental-sync bound.

Why an overlap window (this text is the README's explanation)
-------------------------------------------------------------
Confluence evaluates ``lastmodified >= "yyyy-MM-dd HH:mm"`` in the *calling user's / site's* time
zone, at minute precision, against the server's own clock. We keep the checkpoint in UTC (the newest
``lastmodified`` of a page we actually ingested, as the server stamped it) and write the bound as wall-clock
time in the zone the site reads it in, measured once every few hours with one of the site's own pages
(``connectors.confluence.clock``), minus ``EVIDENT_SYNC_OVERLAP_S`` (default 600 s) for the search index's
lag behind edits. Both the checkpoint and the comparison use the server's clock, so clock skew between us and
the server does not matter.

When the zone cannot be measured (an empty space, a server that answers inconsistently, or
``EVIDENT_SYNC_ZONE_PROBE=false``) the bound is written as UTC wall time and 13 hours more overlap are added:
a zone west of UTC reads our bound *later* by its offset (at most 12 h), so the extra 13 h make a miss
impossible in every zone; east of UTC it only reads earlier. Re-reading overlapped pages is harmless either
way: ingest compares content hashes and skips unchanged pages without parsing or embedding them; it costs
the requests and bodies, which is what the measurement saves.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pipeline.errors import InputError

# what REST v2 lists cannot give (ancestor titles, labels)
EXPAND_META = "version,ancestors,space,metadata.labels"
EXPAND_PAGE = f"body.storage,{EXPAND_META}"
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


# added when the site's zone is unknown: the most western zone (UTC-12) and an hour
WIDE_OVERLAP_S = 13 * 3600


# added to a measured zone: daylight saving may have moved the site's zone back by an hour since it was
# measured (``clock.ZONE_TTL_S``), and a bound read an hour late would miss that hour's edits for good
ZONE_SHIFT_S = 3600


def since_bound(checkpoint_utc: str, overlap_s: int, zone_min: int | None = None) -> str:
    """The ``lastmodified`` bound for an incremental query: checkpoint minus overlap as wall time in the
    site's CQL zone (``zone_min`` east of UTC) less ``ZONE_SHIFT_S``, floored to the minute; an unknown zone
    widens the overlap by 13 h."""
    dt = parse_utc(checkpoint_utc) - timedelta(seconds=max(0, overlap_s))
    dt += timedelta(seconds=-WIDE_OVERLAP_S) if zone_min is None else timedelta(
        minutes=zone_min, seconds=-ZONE_SHIFT_S)
    return dt.strftime("%Y-%m-%d %H:%M")


def pages_cql(
    space: str,
    *,
    since: str | None = None,
    labels_include: Sequence[str] = (),
    labels_exclude: Sequence[str] = (),
    ancestor: str | None = None,
    ordered: bool = True,
    blog_posts: bool = False,
) -> str:
    """CQL selecting the in-scope pages (and ``blog_posts``) of one space, optionally modified since
    ``since``."""
    parts = [f"space = {quote(space)}", "type in (page, blogpost)" if blog_posts else "type = page"]
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


def version_time(r: dict[str, Any]) -> str | None:
    """A search result's version time as ``Page.updated`` carries it (UTC ISO), or None."""
    when = (r.get("version") or {}).get("when") if isinstance(r.get("version"), dict) else None
    try:
        return to_utc_iso(str(when)) if when else None
    except InputError:
        return None
