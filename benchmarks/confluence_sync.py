"""Confluence sync throughput against the local fake Confluence server.

Measures (1) a full sync of every document (215 with ConfQuestions present) and (2) a no-change
incremental sync, with the real index (Qdrant Edge), store (SQLite), BM25 encoder and ingest, but the
hash-based *test* embedder: the numbers show connector + ingest + index overhead, not model speed.

    python -m benchmarks.confluence_sync [--mode dc|cloud] [--page-limit 50] [--limit N] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from connectors.confluence import ConfluenceClient, ConfluenceSource, sync_confluence
from pipeline.index.edge import EdgeIndex
from pipeline.ingest.run import IngestOptions
from pipeline.models.sparse import Bm25Encoder
from pipeline.store import Store
from tests.fake_confluence import FakeConfluence, HashEmbedder, documents_dir, load_pages


async def run(mode: str, page_limit: int, limit: int | None) -> dict[str, object]:
    pages = load_pages(limit=limit)
    embedder, sparse, options = HashEmbedder(), Bm25Encoder(), IngestOptions()
    async with FakeConfluence(pages, mode="cloud" if mode == "cloud" else "dc") as fc:
        spaces = sorted({p.space for p in pages})
        client = ConfluenceClient(fc.url, token=fc.token, user=fc.user if mode == "cloud" else None)
        source = ConfluenceSource(client, spaces=spaces, page_limit=page_limit)
        with tempfile.TemporaryDirectory() as tmp:
            index = EdgeIndex(Path(tmp) / "index")
            await index.open(dense_dim=embedder.dim, embedder=embedder.name)
            store = Store(Path(tmp) / "evident.db")
            try:
                kw = {"source": source, "index": index, "embedder": embedder, "sparse": sparse, "store": store,
                      "options": options}
                t0 = time.perf_counter()
                full = await sync_confluence(**kw)  # type: ignore[arg-type]
                full_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                incr = await sync_confluence(**kw)  # type: ignore[arg-type]
                incr_s = time.perf_counter() - t0
                points = await index.count()
            finally:
                await index.close()
                await store.close()
    return {
        "documents": str(documents_dir()),
        "embedder": f"{embedder.name} (hash-based TEST embedder, not a model)",
        "mode": mode,
        "spaces": len(spaces),
        "pages": len(pages),
        "points": points,
        "full_sync": {"seconds": round(full_s, 3), "pages_per_s": round(full.added / full_s, 1),
                      "added": full.added, "failed": len(full.failed), "api_calls": full.api_calls},
        "no_change_sync": {"seconds": round(incr_s, 3), "api_calls": incr.api_calls,
                           "pages_reread": incr.pages_seen, "updated": incr.updated + incr.added},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--mode", choices=["dc", "cloud"], default="dc")
    ap.add_argument("--page-limit", type=int, default=50, help="results per CQL page with bodies")
    ap.add_argument("--limit", type=int, default=None, help="serve only the first N documents")
    ap.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = ap.parse_args()
    result = asyncio.run(run(args.mode, args.page_limit, args.limit))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
