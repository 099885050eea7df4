"""Taking turns at one model: a long call in length-sorted chunks, short calls between them."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np

from pipeline.models.turns import CHUNK_TOKENS, Turns, chunks


def _vectors(texts: Sequence[str]) -> np.ndarray:
    return np.array([[len(t), t.count("b")] for t in texts], dtype=np.float32)


def test_chunks_cover_every_text_once_length_sorted_within_the_budget() -> None:
    texts = [("a" * (i * 37 % 700)) + "b" * (i % 3) for i in range(300)]
    runs = chunks(texts, max_tokens=128)
    assert sorted(i for run in runs for i in run) == list(range(300)) and len(runs) > 1
    flat = [i for run in runs for i in run]
    assert [len(texts[i]) for i in flat] == sorted(len(t) for t in texts)
    for run in runs:
        longest = max(min(128, len(texts[i]) // 3 + 2) for i in run)
        assert len(run) == 1 or len(run) * longest <= CHUNK_TOKENS
    assert chunks(["short question"], max_tokens=128) == [[0]]
    assert chunks(texts, max_tokens=128, chunk_tokens=10**9) == [flat]  # a GPU's chunks hold whole calls


def test_a_long_call_gives_the_callers_order() -> None:
    texts = [("a" * (i * 53 % 900)) + "b" * (i % 5) for i in range(200)]
    out = Turns(dim=2, max_tokens=128).run(_vectors, texts)
    assert np.array_equal(out, _vectors(texts))


def test_a_short_call_goes_before_the_long_calls_next_chunk() -> None:
    served: list[int] = []
    model = threading.Lock()  # the worker serves one request at a time
    first_running, release = threading.Event(), threading.Event()

    def embed(texts: Sequence[str]) -> np.ndarray:
        with model:
            served.append(len(texts))
            if len(served) == 1:
                first_running.set()
                release.wait(10)
            return _vectors(texts)

    turns = Turns(dim=2, max_tokens=128)
    long_texts = ["a" * 400] * 64  # 64 texts of 128 tokens: four chunks of 16
    results: list[np.ndarray] = []
    sync = threading.Thread(target=lambda: results.append(turns.run(embed, long_texts)))
    sync.start()
    assert first_running.wait(10)
    question = threading.Thread(target=lambda: results.append(turns.run(embed, ["who?"])))
    question.start()
    deadline = time.monotonic() + 10
    while turns.short_waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    sync.join(10)
    question.join(10)
    assert served == [16, 1, 16, 16, 16]
    assert turns.short_waiting == 0 and len(results) == 2
