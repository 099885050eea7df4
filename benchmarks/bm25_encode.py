"""BM25 document encoding and keyword counting per text: what a sync spends most of its Python time on.

    python benchmarks/bm25_encode.py [--documents ../shared/confquestions/documents] [--rounds 3]

The texts are the contextualized evidence of every page in ``--documents`` (ConfQuestions by default), as
ingest encodes them. Each round starts from an encoder and word caches that are empty, so a round measures a
sync's first pass; the best round is printed, with a digest of the vectors, the keyword counts and 2,000
query vectors (compare it across commits: an optimization must leave it unchanged).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time
from pathlib import Path

from connectors.local import LocalFolderConnector
from evident.settings import Settings
from pipeline.factory import ingest_options
from pipeline.ingest.contextualize import contextualize
from pipeline.ingest.run import split_page
from pipeline.models import sparse as bm25
from pipeline.models.term_counts import TermCounts

REPO = Path(__file__).resolve().parent.parent


async def texts_of(documents: Path) -> list[str]:
    options = ingest_options(Settings.load())
    out: list[str] = []
    async for page in LocalFolderConnector([documents]).iter_pages():
        for ev in split_page(page, options).evidence:
            out.append(contextualize(ev, options.context_items, options.context_item_max_chars))
    return out


def one_round(texts: list[str]) -> tuple[dict[str, float], str]:
    for name in ("_COMPOUNDS", "_TERM_IDS"):  # a first pass: nothing remembered yet (none before 1a35d6e)
        getattr(bm25, name, {}).clear()
    enc = bm25.Bm25Encoder()
    t = time.perf_counter()
    vectors = enc.encode_documents(texts)
    encode = time.perf_counter() - t
    t = time.perf_counter()
    counts = [TermCounts.contribution([x], enc) for x in texts]
    count = time.perf_counter() - t
    queries = [enc.encode_query(x[:80]) for x in texts[:2000]]
    canonical = json.dumps(([(v.indices, v.values) for v in vectors],
                            [(sorted(w.items()), sorted(s.items())) for w, s in counts],
                            [(v.indices, v.values) for v in queries]))
    return {"encode": encode, "count": count}, hashlib.sha256(canonical.encode()).hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--documents", type=Path, default=REPO.parent / "shared" / "confquestions" / "documents")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    texts = asyncio.run(texts_of(args.documents))
    best: dict[str, float] = {}
    digest = ""
    for _ in range(args.rounds):
        took, digest = one_round(texts)
        best = {k: min(v, best.get(k, v)) for k, v in took.items()}
    per = {k: f"{v / len(texts) * 1e6:.1f} us/text" for k, v in best.items()}
    print(f"{len(texts)} texts, mean {sum(map(len, texts)) / len(texts):.0f} chars; best of {args.rounds}: "
          f"encode {per['encode']}, keyword counting {per['count']}; digest {digest}")


if __name__ == "__main__":
    main()
