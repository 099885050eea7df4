"""What a re-index costs in memory: rewrite a share of an existing embedded index's pages in place (new page
hashes, as a change of the evidence recipe does), sampling this process's anonymous and file-backed RSS.

    python benchmarks/reindex_memory.py COPY_OF_AN_INDEX_DIR [--share 0.25]

Writes go through ``EdgeIndex.replace_page`` (segments are built every ``optimize_every_points`` as in a
sync), then one ``optimize``. Run it on a copy: the pages' hashes change, so a later sync re-indexes them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import threading
import time
from pathlib import Path

from pipeline.index.edge import EdgeIndex


def memory_mib() -> dict[str, int]:
    out: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) // 1024
    return out


class Peaks:
    def __init__(self) -> None:
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            for key, mib in memory_mib().items():
                self.peak[key] = max(mib, self.peak.get(key, 0))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


async def run(path: Path, share: float) -> None:
    peaks = Peaks()
    index = EdgeIndex(path)
    manifest = json.loads((path / "manifest.json").read_text())
    await index.open(dense_dim=manifest["dim"], embedder=manifest["embedder"], recipe=manifest.get("recipe"))
    every = sorted(await index.page_hashes())
    pages = every[: int(len(every) * share)]
    print(f"opened: {len(every)} pages; {memory_mib()} MiB", flush=True)
    start, points = time.monotonic(), 0
    for i, page in enumerate(pages):
        new_hash = f"reindexed-{i}"
        batch = [dataclasses.replace(p, page_hash=new_hash)
                 async for p in index.export_points(page_ids=[page])]
        await index.replace_page(page, new_hash, batch)
        points += len(batch)
        if i % 2000 == 0:
            print(f"{i} pages, {points} points, {time.monotonic() - start:.0f} s: {memory_mib()} MiB; "
                  f"peaks {peaks.peak}", flush=True)
    await index.optimize()
    print(f"{len(pages)} pages, {points} points re-indexed and built in {time.monotonic() - start:.0f} s: "
          f"now {memory_mib()} MiB; peaks {peaks.peak}", flush=True)
    await index.close()
    peaks.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("index", type=Path)
    ap.add_argument("--share", type=float, default=0.25, help="share of the pages re-indexed")
    args = ap.parse_args()
    asyncio.run(run(args.index, args.share))


if __name__ == "__main__":
    main()
