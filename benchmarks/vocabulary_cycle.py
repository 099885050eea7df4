"""What the keyword vocabulary costs a sync cycle, on a real wiki's counts (``wiki_scale.py`` leaves 50,000
pages' worth in ``<work>/data/vocabulary``).

Copies the vocabulary, its counts and per-page rows to a temporary folder, then runs sync cycles the way
``evident serve`` does: a cycle that changes nothing, and cycles that rewrite ``--edits`` pages (each keeps
its words but one, and gains a new one). Each is timed in CPU seconds (``time.process_time``, what competes
with answers for the two cores) and wall seconds, split into the run's start (the lock and the counts),
counting, and its finish (the vocabulary and the counts written), with and without the counts kept between
cycles (``KeptCounts``; a release without it runs the first only). Also: reading the vocabulary file, which
``KeywordExpander`` does after every cycle that changed it.

    python benchmarks/vocabulary_cycle.py --vocabulary /tmp/ws50e/data/vocabulary/edge-….npz
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sqlite3
import string
import sys
import tempfile
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.ingest import vocabulary_run
from pipeline.ingest.vocabulary_run import VocabularyRun
from pipeline.models.sparse import Bm25Encoder
from pipeline.models.term_counts import Contribution, _decode
from pipeline.models.vocabulary import Vocabulary


class HashEmbedder:
    """Stands in for the embedder that made the vocabulary (its name and size), so known words keep their
    vectors as they do in production; new words get hashed vectors."""

    def __init__(self, name: str, dim: int) -> None:
        self.name, self.dim = name, dim

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i, zlib.crc32(t.encode()) % self.dim] = 1.0
        return out

    embed_documents = embed_queries

    def close(self) -> None:
        pass


def _edits(pages: Path, n: int, rng: random.Random, cycle: int) -> list[tuple[str, Contribution, int]]:
    db = sqlite3.connect(pages)
    ids = [r[0] for r in db.execute("SELECT id FROM pages")]
    out = []
    for pid in rng.sample(ids, min(n, len(ids))):
        words, stems = _decode(db.execute("SELECT terms FROM pages WHERE id = ?", (pid,)).fetchone()[0])
        if words:
            del words[rng.choice(list(words))]
        new = "zq" + "".join(rng.choice(string.ascii_lowercase) for _ in range(8)) + "x" * (cycle % 3)
        words[new] += 2
        stems[new] += 2
        out.append((pid, (words, stems), 4))
    db.close()
    return out


async def _cycle(path: Path, sparse: Bm25Encoder, embedder: HashEmbedder, kept: object,
                 edits: list[tuple[str, Contribution, int]]) -> dict[str, float]:
    times: dict[str, float] = {}
    c, w = time.process_time(), time.perf_counter()
    run = await (VocabularyRun.start(path, sparse, None, kept) if kept is not None  # type: ignore[call-arg]
                 else VocabularyRun.start(path, sparse, None))
    assert run is not None
    times["start_cpu"], times["start_s"] = time.process_time() - c, time.perf_counter() - w
    c, w = time.process_time(), time.perf_counter()
    if edits:
        await run.counted(edits)
    times["count_cpu"], times["count_s"] = time.process_time() - c, time.perf_counter() - w
    c, w = time.process_time(), time.perf_counter()
    warnings: list[tuple[str, str]] = []
    await (run.finish(embedder, warnings, kept) if kept is not None  # type: ignore[call-arg]
           else run.finish(embedder, warnings))
    assert not warnings, warnings
    times["finish_cpu"], times["finish_s"] = time.process_time() - c, time.perf_counter() - w
    return times


def _read_cpu(path: Path) -> float:
    c = time.process_time()
    Vocabulary.load(path)
    return time.process_time() - c


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocabulary", type=Path, required=True)
    ap.add_argument("--edits", type=int, default=500, help="pages rewritten per edit cycle (1 %% of 50,000)")
    ap.add_argument("--cycles", type=int, default=3)
    args = ap.parse_args()
    src: Path = args.vocabulary
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("files", "kept"):
            kept_type = getattr(vocabulary_run, "KeptCounts", None)
            if mode == "kept" and kept_type is None:
                print("kept: this release keeps no counts between cycles")
                continue
            path = Path(tmp) / mode / src.name
            path.parent.mkdir()
            for file in src.parent.glob(src.stem + ".*"):
                if not file.name.endswith(".lock"):
                    shutil.copy(file, path.parent / file.name)
            vocab = Vocabulary.load(path)
            print(f"{mode}: {len(vocab.terms):,} words; reading the file as copied: "
                  f"{_read_cpu(path):.3f} s CPU")
            embedder, sparse = HashEmbedder(vocab.embedder, vocab.vectors.shape[1]), Bm25Encoder()
            kept = kept_type() if mode == "kept" else None
            rng = random.Random(7)
            await _cycle(path, sparse, embedder, kept, [])  # the first cycle of a loop reads the files
            for i in range(args.cycles):
                for label, edits in (("no change", []), (f"{args.edits} edits", _edits(
                        path.with_name(path.stem + ".pages.sqlite"), args.edits, rng, i))):
                    t = await _cycle(path, sparse, embedder, kept, edits)
                    steps = ("start", "count", "finish")
                    print(f"{mode} cycle {i + 1} {label:>10}: " + "  ".join(
                        f"{k} {t[k + '_cpu']:.3f} CPU / {t[k + '_s']:.3f} s" for k in steps))
            print(f"{mode}: reading the vocabulary file after the cycles: {_read_cpu(path):.3f} s CPU, "
                  f"{path.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    asyncio.run(main())
