"""The seams of evident. Every backend implements one of these; stages depend only on them.

CPU-bound model calls (``Embedder``, ``SparseEncoder``, ``Reranker``) are synchronous: the async
callers run them in a worker thread so the event loop never blocks. Network-bound ones are async.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from pipeline.access.people import Account, Directory
from pipeline.access.scope import AccessScope, PageAccess
from pipeline.store.reports import FeedbackSummary, SpaceSync, SyncRun
from pipeline.turns import Turn
from pipeline.types import ChatMessage, Evidence, Hit, IndexPoint, Page, SearchRequest, SparseVector


@runtime_checkable
class Embedder(Protocol):
    """Dense text embeddings; rows are L2-normalised so dot product = cosine."""

    name: str
    dim: int

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray: ...

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray: ...

    def close(self) -> None:
        """Release the model (a worker process, a thread pool); a no-op where there is nothing to free."""


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

    async def recipe(self) -> dict[str, Any] | None:
        """The recipe the open index records (``open`` stores the first one given to an index without
        one); None where none was ever given. ``evident index migrate`` copies it with the vectors."""

    async def page_hashes(self) -> dict[str, str]:
        """page id -> content hash of the version currently live in the index."""

    async def page_spaces(self) -> dict[str, str]:
        """page id -> the space key its live version was indexed under ("" when it has none)."""

    async def replace_page(self, page_id: str, page_hash: str, points: Sequence[IndexPoint]) -> None:
        """Atomically swap a page's evidence: queries see the old or the new version, never a mix."""

    async def delete_pages(self, page_ids: Sequence[str]) -> None: ...

    async def set_access(self, pages: Mapping[str, PageAccess | None]) -> None:
        """Write who may read each page (``pipeline.access.scope``) onto its evidence, live and staged: a
        payload write, nothing re-embedded. ``None`` removes the permissions (unknown)."""

    async def optimize(self) -> bool:
        """Build what bulk writes left unindexed (HNSW, quantization, vacuum); ``True`` if anything changed.

        Called after each ingest or sync that wrote pages. A server optimizes in the background: no-op
        there."""

    async def search(self, request: SearchRequest) -> list[Hit]: ...

    async def search_many(self, requests: Sequence[SearchRequest]) -> list[list[Hit]]:
        """Each request's hits, in order, as one operation where the backend allows: the embedded index's
        worker answers a question's searches in one round trip instead of queueing each behind a sync's
        writes."""

    async def get(self, evidence_ids: Sequence[str], scope: AccessScope) -> list[Evidence]:
        """Live evidence by id that ``scope`` may see, in the given order (unknown or hidden ids left out)."""

    async def count(self) -> int: ...

    async def missing_access(self) -> int:
        """Live evidence that carries no permissions (indexed before permissions were synced)."""

    async def stats(self) -> dict[str, object]: ...

    async def snapshot(self, dest: Path) -> dict[str, object]:
        """This index's part of a backup: the embedded index copies its files into ``dest`` (consistent: the
        lease held); a server snapshots server-side and says where. What was done, for the manifest."""

    async def restore(self, src: Path, *, force: bool = False) -> None:
        """Bring a backup's index part (``src``) back; ``InputError`` over an existing index unless ``force``,
        or where the backend restores elsewhere (a server's snapshot recovery)."""

    async def ready(self) -> None:
        """A readiness check: returns when searches can be answered now (a busy embedded worker building
        segments counts, for a while), raises ``IndexError_`` when they cannot."""

    def export_points(
        self, batch: int = 256, *, page_ids: Sequence[str] | None = None
    ) -> AsyncIterator[IndexPoint]:
        """Every live point (of ``page_ids``, default all) with its vectors, a page's points consecutive: what
        another index's ``replace_page`` takes (``evident index migrate``)."""

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

    async def stream(self, messages: Sequence[ChatMessage], *, on_text: Callable[[str], Awaitable[None]],
                     role: str = "answer", max_tokens: int | None = None, temperature: float = 0.0) -> str:
        """One completion, each piece of text handed to ``on_text`` as it arrives; the whole text."""

    def model_for(self, role: str) -> str: ...

    async def ping(self) -> None:
        """A readiness check: the endpoint answers and accepts the key (raises the matching
        ``RemoteError``)."""

    async def close(self) -> None:
        """Close the HTTP client."""


@runtime_checkable
class PromptScorer(Protocol):
    """An endpoint that can teacher-force text and report its log-probs (vLLM, llama.cpp servers)."""

    async def score_continuation(
        self, prompt: str, continuation: str, *, role: str = "counterfactual"
    ) -> float:
        """Mean per-token log-prob of ``continuation`` right after the raw ``prompt``."""


@runtime_checkable
class SourceConnector(Protocol):
    """Somewhere pages come from: a local export folder, Confluence Cloud/Data Center. Files or records
    that cannot be read are skipped and listed in ``failures`` (where, why) after an ``iter_pages`` run."""

    name: str

    @property
    def failures(self) -> list[tuple[str, str]]: ...

    def iter_pages(self) -> AsyncIterator[Page]: ...

    async def list_page_ids(self) -> set[str]:
        """Ids of every page currently in scope, used to remove deleted pages from the index."""


class CheckpointStore(Protocol):
    """Where a connector keeps how far each space has been synced (``pipeline.store.Store``)."""

    async def get_checkpoint(self, source: str, space: str) -> str | None: ...

    async def set_checkpoint(self, source: str, space: str, checkpoint_utc: str) -> None: ...


class PermissionStore(Protocol):
    """Where a connector keeps the people directory and the permissions it wrote
    (``pipeline.store.directory``)."""

    async def replace_directory(self, source: str, accounts: Sequence[Account]) -> None: ...

    async def page_access_fingerprints(self, source: str) -> dict[str, str]: ...

    async def set_page_access_fingerprints(self, source: str, prints: Mapping[str, str | None]) -> None: ...


class SyncStore(CheckpointStore, PermissionStore, Protocol):
    """What a sync needs of the store."""


class TurnStore(Protocol):
    """Turns and the platform messages that show them (``pipeline.store.turns``)."""

    async def set_message_ref(self, turn_id: int, message_ref: str) -> None: ...

    async def turn_by_message(self, key_or_channel: str, message_ref: str) -> Turn | None: ...

    async def get_turn(self, turn_id: int) -> Turn | None: ...

    async def mark_explained(self, turn_id: int) -> None: ...

    async def conversation_exists(self, key: str) -> bool: ...


class ConversationMetaStore(Protocol):
    """What a platform keeps about a conversation (``pipeline.store.conversations``)."""

    async def conversation_meta(self, key: str) -> dict[str, Any]: ...

    async def set_conversation_meta(self, key: str, meta: Mapping[str, Any]) -> None: ...


class FeedbackStore(Protocol):
    """One rating per user and turn, named with the platform it came from (``pipeline.store.feedback``)."""

    async def set_feedback(self, turn_id: int, user_id: str, value: int, *, platform: str,
                           comment: str | None = None) -> None: ...

    async def remove_feedback(self, turn_id: int, user_id: str) -> None: ...


class EventLog(Protocol):
    """Platform events already handled (``pipeline.store.events``)."""

    async def mark_event_seen(self, event_id: str) -> bool: ...


class StatusReports(Protocol):
    """What status views read (``pipeline.store.reports``)."""

    async def popular_pages(self, limit: int = 20) -> list[tuple[str, str, int, str]]: ...

    async def recent_questions(self, user_id: str, limit: int = 5) -> list[tuple[int, str, str]]: ...

    async def feedback_summary(self, worst: int = 5) -> FeedbackSummary: ...

    async def sync_status(self) -> list[SpaceSync]: ...

    async def last_sync(self) -> SyncRun | None: ...


class ConversationStore(TurnStore, ConversationMetaStore, FeedbackStore, EventLog, StatusReports, Directory,
                        Protocol):
    """What a chat adapter's conversation core needs of the store: the protocols above together, and the
    people directory the access policy reads (``pipeline.access.people.Directory``)."""
