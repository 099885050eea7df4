"""Ingest through an OpenAI-compatible embeddings endpoint: does the pipeline keep a slow server busy?

    python benchmarks/remote_embed.py [--latency-ms 50] [--concurrency 1,4,8] [--documents DIR]

A local fake (``tests/fake_embeddings.py``, the OpenAI wire format) answers every request after
``--latency-ms``; the 215 ConfQuestions pages are ingested cold (no embedding cache) into a fresh
Qdrant Edge index with ``EVIDENT_EMBEDDER=openai:fake-embed`` at each concurrency. Prints evidence/s,
requests, the most requests the server saw in flight, and the wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fake_embeddings import FakeEmbeddingsServer

from connectors.local import LocalFolderConnector
from evident.settings import Settings
from pipeline.factory import ingest_options
from pipeline.index.edge import EdgeIndex
from pipeline.ingest.run import ingest_pages
from pipeline.models.embedders import make_embedder
from pipeline.models.openai_embedder import RemoteEmbedding
from pipeline.models.sparse import Bm25Encoder

CONFQ = Path(__file__).resolve().parent.parent.parent / "shared" / "confquestions"


async def one(
    server: FakeEmbeddingsServer, documents: Path, concurrency: int, work: Path
) -> dict[str, float]:
    settings = Settings.load(env={}, data_dir=work)
    emb = make_embedder("openai:fake-embed", batch_size=settings.models.embed_batch_size,
                        max_tokens=settings.models.embed_max_tokens,
                        remote=RemoteEmbedding(base_url=server.base_url, concurrency=concurrency))
    index = EdgeIndex(work / "index")
    await index.open(dense_dim=emb.dim, embedder=emb.name)
    server.max_in_flight = 0
    before = len(server.requests)
    start = time.perf_counter()
    report = await ingest_pages(LocalFolderConnector([documents]).iter_pages(), index=index, embedder=emb,
                                sparse=Bm25Encoder(), options=ingest_options(settings))
    wall = time.perf_counter() - start
    await index.close()
    emb.close()  # type: ignore[attr-defined]
    return {"concurrency": concurrency, "evidence": report.evidence, "wall_s": round(wall, 2),
            "evidence_per_s": round(report.evidence / wall, 1), "requests": len(server.requests) - before,
            "max_in_flight": server.max_in_flight, "failed": len(report.failed)}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency-ms", type=float, default=50)
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--documents", type=Path, default=CONFQ / "documents")
    args = ap.parse_args()
    with FakeEmbeddingsServer(dim=384, latency_s=args.latency_ms / 1000) as server:
        print(f"fake /v1/embeddings, {args.latency_ms:g} ms per request, dim 384, batches of 32 inputs")
        print("| concurrency | evidence | wall s | evidence/s | requests | max in flight | failed |")
        print("|---|---|---|---|---|---|---|")
        for c in (int(x) for x in args.concurrency.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                r = await one(server, args.documents, c, Path(tmp))
            print(f"| {r['concurrency']} | {r['evidence']} | {r['wall_s']} | {r['evidence_per_s']} | "
                  f"{r['requests']} | {r['max_in_flight']} | {r['failed']} |")


if __name__ == "__main__":
    asyncio.run(main())
