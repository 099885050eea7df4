"""Taking turns at one model: a question's embedding never waits behind a whole sync batch.

A model that serves one call at a time (``ProcessEmbedder``'s worker) would make a question asked during a
sync wait for the sync's current call: 256 and more evidence, seconds of CPU. ``Turns`` splits a long call
into chunks of about ``CHUNK_TOKENS`` padded tokens on a CPU (one or two batches of the torch runtime, which
says so as ``turn_tokens``: 32x that on CUDA; length-sorted, so padding stays as small as in one call) and
lets every short call (one chunk or less: a question, an answer's quote units) go before the long call's next
chunk. So a question waits for at most the chunk running when it arrives (~0.2 s on 2 cores) instead of the
whole call. The long call's vectors come back in the caller's order, as close to one call's as any two
batchings of the int8 model are (cosine > 0.999).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

CHUNK_TOKENS = 2048  # padded tokens a long call embeds between turns on a CPU (one or two torch batches)
CHARS_PER_TOKEN = 3  # a low estimate (e5's tokenizer makes ~4 of English), so chunks err on the small side
Embed = Callable[[Sequence[str]], np.ndarray]


def chunks(texts: Sequence[str], max_tokens: int, chunk_tokens: int = CHUNK_TOKENS) -> list[list[int]]:
    """Positions of ``texts``, length-sorted, in runs of at most ``chunk_tokens`` estimated padded tokens."""
    cap = max_tokens if max_tokens > 0 else 512
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    estimates = [min(cap, len(t) // CHARS_PER_TOKEN + 2) for t in texts]
    return padded_runs(order, estimates, chunk_tokens, max_texts=max(1, len(texts)))


def padded_runs(order: list[int], lengths: list[int], budget: int, max_texts: int) -> list[list[int]]:
    """Consecutive runs of the length-sorted ``order``, each at most ``budget`` padded tokens and
    ``max_texts`` texts (the torch runtime's batches, and ``chunks``)."""
    runs: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # sorted ascending, so the newest text is the longest: padded size = count × its length
        if current and ((len(current) + 1) * lengths[i] > budget or len(current) >= max_texts):
            runs.append(current)
            current = []
        current.append(i)
    if current:
        runs.append(current)
    return runs


class Turns:
    """Short calls first: a long call yields to waiting short ones between its chunks."""

    def __init__(self, dim: int, max_tokens: int, chunk_tokens: int = CHUNK_TOKENS) -> None:
        self.dim = dim
        self.max_tokens = max_tokens
        self.chunk_tokens = chunk_tokens
        self._cond = threading.Condition()
        self._short_waiting = 0

    @property
    def short_waiting(self) -> int:
        """Short calls waiting for or holding the model now."""
        with self._cond:
            return self._short_waiting

    def run(self, embed: Embed, texts: Sequence[str]) -> np.ndarray:
        """``embed(texts)`` (``embed`` serializes calls itself), a long call chunk by chunk."""
        runs = chunks(texts, self.max_tokens, self.chunk_tokens)
        if len(runs) <= 1:
            with self._cond:
                self._short_waiting += 1
            try:
                return embed(texts)
            finally:
                with self._cond:
                    self._short_waiting -= 1
                    self._cond.notify_all()
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for run in runs:
            with self._cond:
                self._cond.wait_for(lambda: self._short_waiting == 0)
            vectors = np.asarray(embed([texts[i] for i in run]), dtype=np.float32)
            out[run] = vectors.reshape(len(run), self.dim)
        return out
