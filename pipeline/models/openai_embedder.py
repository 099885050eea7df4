"""Embeddings from any OpenAI-compatible ``/v1/embeddings`` endpoint (OpenAI, Azure OpenAI, Hugging Face TEI,
vLLM, Ollama, infinity): ``EVIDENT_EMBEDDER=openai:<model>`` with ``EVIDENT_EMBED_BASE_URL`` and
``EVIDENT_EMBED_API_KEY``.

- **Batching within the server's limits**: a request carries at most ``batch_size`` inputs and about
  ``max_request_tokens`` tokens (estimated at 3 characters a token, so it errs low); each input is cut
  to ``max_tokens`` the same way. A server that still answers 413 (or a 400 about batch size) gets the
  batch halved, down to single inputs.
- **Bounded concurrency**: ``concurrency`` requests in flight (a thread pool; the ``Embedder`` protocol is
  synchronous and its callers already run it off the event loop).
- **Retries** (tenacity): 429 honouring ``Retry-After``, 5xx, timeouts and dropped connections, with
  exponential backoff, ``max_retries`` times; the wait is read from the exception's ``retry_after_s``.
- **Start-up probe**: one request discovers the dimension, and a wrong key (``AuthError``), an unknown model
  (``NotFoundError``) or a wrong base URL (``UnreachableError``) fails at once, naming the setting. Every
  later response is checked against that dimension.
- **Prefixes**: ``query_prefix`` / ``document_prefix`` (e5: ``query: `` / ``passage: ``; bge: its
  instruction).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.errors import (
    EmbeddingError,
    NotFoundError,
    RateLimitedError,
    RemoteError,
    TransientError,
    UnreachableError,
)
from pipeline.runtime.remote import CallOptions, RetryPolicy, call_with_retries_sync, status_error

log = logging.getLogger(__name__)
CHARS_PER_TOKEN = 3  # estimate that errs towards fewer tokens per request than the server counts


@dataclass(frozen=True)
class RemoteEmbedding:
    """Where and how to reach an embeddings endpoint (``EVIDENT_EMBED_*`` settings)."""

    base_url: str = ""
    api_key: str = ""
    concurrency: int = 8
    max_request_tokens: int = 8192
    timeout_s: float = 30.0
    max_retries: int = 4
    dimensions: int | None = None
    query_prefix: str = ""
    document_prefix: str = ""
    api_version: str | None = None

    def build(self, model: str, *, batch_size: int, max_tokens: int) -> OpenAIEmbedder:
        return OpenAIEmbedder(
            model,
            base_url=self.base_url,
            api_key=self.api_key,
            batch_size=batch_size,
            max_tokens=max_tokens,
            max_request_tokens=self.max_request_tokens,
            concurrency=self.concurrency,
            timeout_s=self.timeout_s,
            max_retries=self.max_retries,
            dimensions=self.dimensions,
            query_prefix=self.query_prefix,
            document_prefix=self.document_prefix,
            api_version=self.api_version,
        )


class OpenAIEmbedder:
    """``openai:<model>``; ``name`` carries the model, its requested dimension and the prefixes."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str,
        api_key: str = "",
        batch_size: int = 32,
        max_tokens: int = 128,
        max_request_tokens: int = 8192,
        concurrency: int = 8,
        timeout_s: float = 30.0,
        max_retries: int = 4,
        dimensions: int | None = None,
        query_prefix: str = "",
        document_prefix: str = "",
        api_version: str | None = None,
        backoff_max_s: float = 30.0,
    ) -> None:
        import httpx

        if not base_url:
            raise EmbeddingError("EVIDENT_EMBEDDER=openai:<model> needs EVIDENT_EMBED_BASE_URL")
        self.model = model
        self.max_tokens = max(1, max_tokens)
        self.batch_size = max(1, batch_size)
        self.max_request_tokens = max(1, max_request_tokens)
        self.query_prefix, self.document_prefix = query_prefix, document_prefix
        self.dimensions = dimensions
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        params = {}
        if api_version:  # Azure OpenAI: api-key header and an api-version query parameter
            headers = {"api-key": api_key} if api_key else {}
            params["api-version"] = api_version
        self._url = base_url.rstrip("/") + "/embeddings"
        self._http = httpx.Client(headers=headers, params=params, timeout=timeout_s,
                                  limits=httpx.Limits(max_connections=max(1, concurrency)))
        self._pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="embed-http")
        self._policy = RetryPolicy(max_retries=max(0, max_retries), max_s=backoff_max_s)
        self._lock = threading.Lock()
        self.requests = 0
        self.dim = self._probe()
        prefixes = (("q", query_prefix), ("d", document_prefix))
        recipe = [f"dim={self.dim}"] + [f"{k}={v!r}" for k, v in prefixes if v]
        self.name = f"openai:{model}[{','.join(recipe)}]"

    def _probe(self) -> int:
        """One request finds the model's dimension (and a wrong key or model, before any ingest)."""
        try:
            dim = int(self._post(["dimension probe"]).shape[1])
        except RemoteError:
            self.close()
            raise
        if self.dimensions is not None and dim != self.dimensions:
            self.close()
            raise EmbeddingError(f"embedding model {self.model!r} returned {dim}-dim vectors, "
                                 f"EVIDENT_EMBED_DIMENSIONS asks for {self.dimensions}")
        return dim

    # ------------------------------------------------------------------ Embedder

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, self.document_prefix)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, self.query_prefix)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._http.close()

    # ------------------------------------------------------------------ internals

    def _embed(self, texts: Sequence[str], prefix: str) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        inputs = [prefix + self._cut(t) for t in texts]
        batches = self._batches(inputs)
        for (start, end), vectors in zip(
            batches, self._pool.map(lambda b: self._post_split(inputs[b[0] : b[1]]), batches), strict=True
        ):
            out[start:end] = vectors
        return out

    def _cut(self, text: str) -> str:
        limit = self.max_tokens * CHARS_PER_TOKEN
        if len(text) <= limit:
            return text
        cut = text.rfind(" ", 0, limit)
        return text[: cut if cut > limit // 2 else limit]

    def _batches(self, inputs: list[str]) -> list[tuple[int, int]]:
        """[start, end) runs of at most ``batch_size`` inputs and ~``max_request_tokens`` tokens."""
        out: list[tuple[int, int]] = []
        start, tokens = 0, 0
        for i, text in enumerate(inputs):
            cost = len(text) // CHARS_PER_TOKEN + 1
            if i > start and (i - start >= self.batch_size or tokens + cost > self.max_request_tokens):
                out.append((start, i))
                start, tokens = i, 0
            tokens += cost
        out.append((start, len(inputs)))
        return out

    def _post_split(self, inputs: list[str]) -> np.ndarray:
        """``_post`` with retries; a batch the server finds too large is halved."""
        try:
            return call_with_retries_sync(lambda: self._post(inputs), self._policy,
                                          CallOptions(log, "embeddings request", retry=_retryable))
        except _TooLargeError:
            if len(inputs) == 1:
                raise EmbeddingError(
                    f"the embeddings endpoint rejects even a single input of {len(inputs[0])} "
                    "characters; lower EVIDENT_EMBED_MAX_TOKENS"
                ) from None
            half = len(inputs) // 2
            return np.vstack([self._post_split(inputs[:half]), self._post_split(inputs[half:])])

    def _post(self, inputs: list[str]) -> np.ndarray:
        import httpx

        body: dict[str, Any] = {"model": self.model, "input": inputs, "encoding_format": "float"}
        if self.dimensions is not None:
            body["dimensions"] = self.dimensions
        with self._lock:
            self.requests += 1
        try:
            response = self._http.post(self._url, json=body)
        except httpx.TimeoutException as exc:
            raise TransientError(
                f"embeddings endpoint timed out ({type(exc).__name__})", service="embeddings"
            ) from None
        except httpx.ConnectError as exc:
            raise UnreachableError(f"cannot reach the embeddings endpoint EVIDENT_EMBED_BASE_URL ({exc})",
                                   service="embeddings") from None
        except httpx.TransportError as exc:
            raise TransientError(
                f"embeddings request failed ({type(exc).__name__})", service="embeddings"
            ) from None
        if response.status_code != 200:
            raise _status_error(response, self.model)
        return self._vectors(response, len(inputs))

    def _vectors(self, response: Any, n: int) -> np.ndarray:
        try:
            data = sorted(response.json()["data"], key=lambda d: d.get("index", 0))
            matrix = np.asarray([d["embedding"] for d in data], dtype=np.float32)
        except (ValueError, KeyError, TypeError) as exc:
            raise EmbeddingError(
                f"the embeddings endpoint answered without a list of embeddings ({exc})"
            ) from None
        if matrix.ndim != 2 or matrix.shape[0] != n:
            raise EmbeddingError(f"the embeddings endpoint returned {matrix.shape[0] if matrix.ndim else 0} "
                                 f"vectors for {n} inputs")
        if getattr(self, "dim", None) and matrix.shape[1] != self.dim:
            raise EmbeddingError(
                f"the embeddings endpoint returned {matrix.shape[1]}-dim vectors; this index "
                f"uses {self.dim} (did the model behind {self.model!r} change?)"
            )
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        return (matrix / np.clip(norms, 1e-12, None)).astype(np.float32)


class _TooLargeError(RemoteError):
    """The server refused the batch's size (413, or a 400 about it): halve and retry."""


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, RateLimitedError | TransientError)


def _status_error(response: Any, model: str) -> RemoteError:
    status = int(response.status_code)
    try:
        detail = response.json().get("error")
        message = str(detail.get("message") if isinstance(detail, dict) else detail or "")[:200]
    except (ValueError, AttributeError):
        message = response.text[:200]
    lowered = message.lower()
    if status == 404 or ("model" in lowered and ("not found" in lowered or "does not exist" in lowered)):
        return NotFoundError(
            f"embedding model {model!r} is unknown at EVIDENT_EMBED_BASE_URL ({status}: {message})",
            service="embeddings",
            status=status,
        )
    if status == 413 or (
        status == 400 and ("batch" in lowered or "too large" in lowered or "too long" in lowered)
    ):
        return _TooLargeError(f"batch too large ({status})", service="embeddings", status=status)
    if status in (401, 403):
        what = "the embeddings endpoint rejected the API key"
    elif status == 429 or status >= 500 or status == 408:
        what = "the embeddings endpoint failed"
    else:
        what = f"the embeddings endpoint refused the request: {message}"
    return status_error(status, service="embeddings", what=what, headers=response.headers,
                        auth_hint="EVIDENT_EMBED_API_KEY")
