"""The time zone a Confluence site reads CQL dates in, measured with one of its own pages.

CQL's ``lastmodified >= "yyyy-MM-dd HH:mm"`` is read in the calling account's (Cloud) or server's (Data
Center) zone, which the REST API does not report. Without it the incremental bound needs an overlap as wide
as the most western zone (13 h), and every cycle re-fetches every page edited in the last 13 hours with
its body. With it the overlap only has to cover the search index's lag, a few minutes.

The measurement: take the space's newest page, whose ``version.when`` gives its exact UTC time ``T`` (an
ISO stamp with offset). Ask whether ``id = P and lastmodified >= W`` matches for ``W = floor_minute(T + o)``
written as wall time. The server reads ``W`` as UTC ``W - z`` for its zone ``z``, so the page matches
exactly when ``o <= z`` (``floor_minute(T + z) - z <= T`` and one step more is past ``T``): a monotone
predicate, bisected over -15 h … +15 h in 15-minute steps (every zone in use is a multiple of 15 min). That is
2 + 7 tiny requests (no bodies, ``limit=1``) plus one for the newest page, and the result is kept for
``ZONE_TTL_S`` in the checkpoint store so most cycles make none. Which clock stamped the pages does not
matter: both ``T`` and the comparison are the server's own.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from connectors.confluence.client import ConfluenceClient
from connectors.confluence.cql import parse_utc
from pipeline.errors import InputError
from pipeline.protocols import CheckpointStore

log = logging.getLogger(__name__)

STEP_MIN = 15
LIMIT_STEPS = 15 * 60 // STEP_MIN  # ±15 h: every zone in use (UTC-12 … UTC+14) lies inside
# the checkpoint store row (per site) holding "<minutes east>@<measured at, UTC ISO>"
ZONE_KEY = "__cql_zone__"
ZONE_TTL_S = 6 * 3600  # measured again after this long (daylight saving moves a zone twice a year)


async def measure_zone(client: ConfluenceClient, space_cql: str) -> int | None:
    """Minutes east of UTC in which the site reads CQL dates; None when the space has no dated page or the
    answers are not consistent with any zone (then the caller keeps the wide overlap)."""
    newest = None
    async for row in client.search(f"{space_cql} order by lastmodified desc", expand="version", limit=1):
        newest = row
        break
    when = ((newest or {}).get("version") or {}).get("when")
    if not newest or not when or not str(newest.get("id", "")).isdigit():
        return None
    page_id, t = str(newest["id"]), parse_utc(str(when))

    async def matches(steps: int) -> bool:
        wall = (t + timedelta(minutes=steps * STEP_MIN)).strftime("%Y-%m-%d %H:%M")
        data = await client.get("rest/api/content/search",
                                {"cql": f'id = {page_id} and lastmodified >= "{wall}"', "limit": 1})
        return bool(data.get("results"))

    lo, hi = -LIMIT_STEPS, LIMIT_STEPS
    if not await matches(lo) or await matches(hi):
        log.warning("cannot tell the zone Confluence reads CQL dates in; keeping the wide sync overlap")
        return None
    while hi - lo > 1:  # invariant: matches(lo), not matches(hi)
        mid = (lo + hi) // 2
        if await matches(mid):
            lo = mid
        else:
            hi = mid
    return lo * STEP_MIN


async def site_zone(client: ConfluenceClient, store: CheckpointStore, source_key: str, space_cql: str, *,
                    now: datetime | None = None) -> int | None:
    """The site's CQL zone (minutes east of UTC) from the store when measured recently, else measured now."""
    now = now or datetime.now(UTC)
    kept = await store.get_checkpoint(source_key, ZONE_KEY)
    if kept and "@" in kept:
        minutes, _, stamp = kept.partition("@")
        try:
            if (now - parse_utc(stamp)).total_seconds() < ZONE_TTL_S:
                return int(minutes)
        except (ValueError, InputError):  # a damaged row is measured again
            pass
    zone = await measure_zone(client, space_cql)
    if zone is not None:
        await store.set_checkpoint(source_key, ZONE_KEY, f"{zone}@{now.isoformat()}")
        log.info("Confluence reads CQL dates at UTC%+.2g h", zone / 60)
    return zone
