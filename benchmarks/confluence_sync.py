"""Confluence sync throughput and the cost of incremental cycles, against the local fake Confluence server.

Measures (1) a full sync of every document (215 with ConfQuestions present), (2) a no-change incremental
sync and (3) a sync after one edit, with the real index (Qdrant Edge), store (SQLite), BM25 encoder and
ingest, but the hash-based *test* embedder: the numbers show connector + ingest + index overhead, not model
speed. The pages' edit times are spread over the last ``--spread-hours`` (a busy site), and the cycles run
once with the site's CQL zone measured (the default) and once without (the 13 h overlap that was the default
before), in a site zone of ``--tz-min`` minutes east of UTC. ``--listing-interval`` is
``EVIDENT_SYNC_LISTING_INTERVAL_S`` (default: the setting's; 0 lists every space every cycle).

    python -m benchmarks.confluence_sync [--mode dc|cloud] [--page-limit 50] [--limit N] [--spread-hours 48]
                                         [--tz-min -300] [--listing-interval S] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from helpers import ingest_options

from connectors.confluence import ConfluenceClient, ConfluenceSource, sync_confluence
from connectors.confluence.settings import ConfluenceSettings
from pipeline.index.edge import EdgeIndex
from pipeline.models.sparse import Bm25Encoder
from pipeline.store import Store
from tests.fake_confluence import FakeConfluence, HashEmbedder, documents_dir, load_pages


async def cycles(mode: str, page_limit: int, limit: int | None, spread_h: float, tz_min: int,
                 zone_probe: bool, listing_s: float) -> dict[str, Any]:
    pages = load_pages(limit=limit)
    now = datetime.now(UTC)
    for n, page in enumerate(pages):  # oldest first, the newest a minute ago
        page.when = (
            now
            - timedelta(minutes=1)
            - timedelta(hours=spread_h) * (len(pages) - 1 - n) / max(1, len(pages) - 1)
        )
    embedder, sparse, options = HashEmbedder(), Bm25Encoder(), ingest_options()
    async with FakeConfluence(pages, mode="cloud" if mode == "cloud" else "dc", tz_offset_min=tz_min) as fc:
        spaces = sorted({p.space for p in pages})
        client = ConfluenceClient(fc.url, token=fc.token, user=fc.user if mode == "cloud" else None)
        source = ConfluenceSource(
            client, spaces=spaces, page_limit=page_limit, overlap_s=600, zone_probe=zone_probe,
            listing_interval_s=listing_s,
        )
        with tempfile.TemporaryDirectory() as tmp:
            index = EdgeIndex(Path(tmp) / "index")
            await index.open(dense_dim=embedder.dim, embedder=embedder.name)
            store = Store(Path(tmp) / "evident.db")
            try:
                kw = {
                    "source": source,
                    "index": index,
                    "embedder": embedder,
                    "sparse": sparse,
                    "store": store,
                    "options": options,
                }
                out: dict[str, Any] = {"spaces": len(spaces), "pages": len(pages)}
                for label in ("full_sync", "no_change_sync", "one_edit_sync"):
                    if label == "one_edit_sync":
                        fc.edit(
                            pages[len(pages) // 2].id, body=pages[len(pages) // 2].body + "<p>An edit.</p>"
                        )
                    t0 = time.perf_counter()
                    report = await sync_confluence(**kw)  # type: ignore[arg-type]
                    seconds = time.perf_counter() - t0
                    out[label] = {
                        "seconds": round(seconds, 3),
                        "api_calls": report.api_calls,
                        "bodies_fetched": report.pages_seen,
                        "written": report.added + report.updated,
                        "failed": len(report.failed),
                        "cql_zone_min": report.cql_zone_min,
                    }
                out["points"] = await index.count()
            finally:
                await index.close()
                await store.close()
    return out


async def run(
    mode: str, page_limit: int, limit: int | None, spread_h: float, tz_min: int, listing_s: float
) -> dict[str, object]:
    return {
        "documents": str(documents_dir()),
        "embedder": "hash-based TEST embedder, not a model",
        "mode": mode,
        "site_zone_min": tz_min,
        "edits_spread_over_hours": spread_h,
        "listing_interval_s": listing_s,
        "zone_measured": await cycles(mode, page_limit, limit, spread_h, tz_min, True, listing_s),
        "zone_unknown_13h_overlap": await cycles(mode, page_limit, limit, spread_h, tz_min, False, listing_s),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--mode", choices=["dc", "cloud"], default="dc")
    ap.add_argument("--page-limit", type=int, default=50, help="results per CQL page with bodies")
    ap.add_argument("--limit", type=int, default=None, help="serve only the first N documents")
    ap.add_argument("--spread-hours", type=float, default=48.0, help="edit times spread over this many hours")
    ap.add_argument("--tz-min", type=int, default=-300, help="the site's CQL zone, minutes east of UTC")
    ap.add_argument("--listing-interval", type=float, default=ConfluenceSettings().sync_listing_interval_s,
                    help="EVIDENT_SYNC_LISTING_INTERVAL_S (0: every cycle lists every space)")
    ap.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = ap.parse_args()
    result = asyncio.run(run(args.mode, args.page_limit, args.limit, args.spread_hours, args.tz_min,
                             args.listing_interval))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
