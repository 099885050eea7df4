"""One exception root for evident, so callers can catch by meaning instead of by library.

Tree::

    EvidentError
    ├── ConfigError                 missing/invalid settings (unknown embedder, missing token, ...)
    ├── InputError                  bad user input (empty path, non-JSON file, empty question, ...)
    │   └── ParseError              a page whose storage format cannot be parsed (carries page_id)
    │       └── ParseTimeoutError   a page that took longer than EVIDENT_PAGE_TIMEOUT_S to parse
    ├── IndexError_                 the vector index failed
    │   ├── IndexMismatchError      index built with another embedding model/dimension
    │   └── IndexBusyError          the embedded index stayed in use by another process too long
    ├── EmbeddingError              the embedding model failed or is unavailable
    ├── RemoteError                 a remote service failed (base for LLM / Confluence / Slack)
    │   ├── RateLimitedError        429 / throttled; carries ``retry_after_s``
    │   ├── TransientError          5xx, timeout, connection reset: safe to retry (``retry_after_s`` too)
    │   ├── AuthError               wrong key / token / credentials
    │   ├── NotFoundError           unknown model, space, page
    │   └── UnreachableError        DNS / connection refused / wrong base URL
    └── StoreError                  the SQLite conversation store failed

Retry data (``retry_after_s``) lives on the exception, not in log strings.
"""

from __future__ import annotations


class EvidentError(Exception):
    """Root of every error evident raises on purpose."""


class ConfigError(EvidentError):
    """Settings are missing or invalid; the message names the setting."""


class InputError(EvidentError):
    """User input cannot be processed; the message says what to change."""


class ParseError(InputError):
    """A page's storage-format XHTML could not be parsed even in recover mode."""

    def __init__(self, message: str, *, page_id: str | None = None) -> None:
        super().__init__(message)
        self.page_id = page_id


class ParseTimeoutError(ParseError):
    """Parsing one page took longer than its time bound."""


class IndexError_(EvidentError):
    """The vector index failed."""


class IndexMismatchError(IndexError_):
    """The index on disk was built with another embedding model or dimension."""


class IndexBusyError(IndexError_):
    """Another process held the embedded index for longer than ``EVIDENT_INDEX_WAIT_S``."""


class EmbeddingError(EvidentError):
    """The embedding model failed or cannot be loaded."""


class StoreError(EvidentError):
    """The SQLite conversation store failed."""


class RemoteError(EvidentError):
    """A remote service (LLM endpoint, Confluence, Slack) failed. ``retry_after_s``: the wait the server asked
    for (``Retry-After`` on a 429 or a 5xx), None when it named none."""

    def __init__(self, message: str, *, service: str = "", status: int | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.service = service
        self.status = status
        self.retry_after_s = retry_after_s


class RateLimitedError(RemoteError):
    """The remote asked us to slow down (HTTP 429, or Data Center's throttling 403)."""

    def __init__(
        self, message: str, *, service: str = "", status: int | None = 429, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message, service=service, status=status, retry_after_s=retry_after_s)


class TransientError(RemoteError):
    """5xx, timeouts, resets: the same call may succeed later."""


class AuthError(RemoteError):
    """Credentials were rejected."""


class NotFoundError(RemoteError):
    """The named model, space or page does not exist or is not visible."""


class UnreachableError(RemoteError):
    """The host cannot be reached (DNS, refused connection, wrong base URL)."""
