"""The seams of evident. Every backend implements one of these; stages depend only on them.

CPU-bound model calls (``Embedder``, ``SparseEncoder``, ``Reranker``) are synchronous: the async
callers run them in a worker thread so the event loop never blocks. Network-bound ones are async.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from pipeline.types import ChatMessage, Evidence, Hit, IndexPoint, Page, SearchRequest, SparseVector


@runtime_checkable
class Embedder(Protocol):
    """Dense text embeddings; rows are L2-normalised so dot product = cosine."""

    name: str
    dim: int

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray: ...

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray: ...


@runtime_checkable
class SparseEncoder(Protocol):
    """Lexical sparse vectors. ``idf``: the index applies IDF on top (BM25 term frequencies), or not
    (learned weights such as bge-m3's already encode term importance)."""

    name: str
    idf: bool

    def encode_documents(self, texts: Sequence[str]) -> list[SparseVector]: ...

    def encode_query(self, text: str) -> SparseVector: ...


@runtime_checkable
class Index(Protocol):
    """A hybrid (dense + sparse) evidence index. One collection per index."""

    async def open(self, *, dense_dim: int, embedder: str, recipe: Mapping[str, Any] | None = None) -> None:
        """Create the collection if needed; raise ``IndexMismatchError`` on another model, dimension or
        recipe (how texts become vectors, e.g. ``{"max_tokens": 128}``), which is stored with the index."""

    async def page_hashes(self) -> dict[str, str]:
        """page id -> content hash of the version currently live in the index."""

    async def replace_page(self, page_id: str, page_hash: str, points: Sequence[IndexPoint]) -> None:
        """Atomically swap a page's evidence: queries see the old or the new version, never a mix."""

    async def delete_pages(self, page_ids: Sequence[str]) -> None: ...

    async def search(self, request: SearchRequest) -> list[Hit]: ...

    async def get(self, evidence_ids: Sequence[str]) -> list[Evidence]: ...

    async def count(self) -> int: ...

    async def stats(self) -> dict[str, object]: ...

    async def close(self) -> None: ...

    async def drop(self) -> None:
        """Delete the index's data (``--rebuild``), opened or not; ``open`` creates it again."""


@runtime_checkable
class Reranker(Protocol):
    name: str

    def rerank(self, query: str, hits: Sequence[Hit]) -> list[Hit]:
        """Return ``hits`` reordered (scores replaced, ranks renumbered from 1)."""


@runtime_checkable
class LLM(Protocol):
    """A chat-completions endpoint. ``role`` picks the configured model (answer, completion, ...)."""

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        role: str = "answer",
        max_tokens: int | None = None,
        temperature: float = 0.0,
        n: int = 1,
    ) -> list[str]:
        """Return ``n`` completions' texts."""

    def model_for(self, role: str) -> str: ...


@runtime_checkable
class PromptScorer(Protocol):
    """An endpoint that can teacher-force text and report its log-probs (vLLM, llama.cpp servers)."""

    async def score_continuation(self, prompt: str, continuation: str, *, role: str = "counterfactual") -> float:
        """Mean per-token log-prob of ``continuation`` right after the raw ``prompt``."""


@runtime_checkable
class SourceConnector(Protocol):
    """Somewhere pages come from: a local export folder, Confluence Cloud/Data Center, ..."""

    name: str

    def iter_pages(self) -> AsyncIterator[Page]: ...

    async def list_page_ids(self) -> set[str]:
        """Ids of every page currently in scope, used to remove deleted pages from the index."""
