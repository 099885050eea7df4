"""Credentials never reach a log line, an error line or a quoted response body.

``Redactor`` removes, from any text:

- token shapes (Slack ``xox?-``/``xapp-``, OpenAI ``sk-``, ``Bearer``/``Basic`` credentials);
- credentials written into URLs (``https://user:pass@host`` -> ``https://***@host``);
- values of credential-named fields however they are quoted (``api-key: x``, ``"api_key": "x"``,
  ``authorization=x``, ``?token=x``, ``password``, ``secret``);
- the literal values of the configured secrets (``Redactor.from_settings``): whatever shape a token
  has, a server that echoes it back in an error body cannot get it printed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Protocol
from urllib.parse import unquote

MASK = "[redacted]"
_SHAPES = re.compile(
    r"(xox[abprs]-[A-Za-z0-9-]{6,}|xapp-[A-Za-z0-9-]{6,}|sk-[A-Za-z0-9_-]{12,}|"
    r"(?i:bearer)\s+[A-Za-z0-9._~+/=-]{8,}|(?i:basic)\s+[A-Za-z0-9+/=]{8,})"
)
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@:'\"]*(?::[^/\s@'\"]*)?@")
_CREDENTIAL_FIELD = re.compile(
    r"(?i)([\"']?\b(?:x-)?(?:api[-_]?key|authorization|access[-_]?token|token|password|passwd|secret|"
    r"client[-_]?secret)[\"']?\s*[:=]\s*)(?!\[redacted\])(\"[^\"]*\"|'[^']*'|(?:(?i:bearer|basic|token)\s+)?[^\s,;&'\"}\]]+)"
)
_MIN_SECRET = 4  # shorter values would mask ordinary words


def mask_url_credentials(text: str) -> str:
    """``https://user:pass@host`` -> ``https://***@host`` (anywhere in ``text``)."""
    return _URL_USERINFO.sub(lambda m: m.group(1) + "***@", text)


def redact(text: str) -> str:
    """Shape-based redaction alone (no configured values)."""
    return Redactor()(text)


class HasSecrets(Protocol):
    def secret_values(self) -> list[str]: ...


class Redactor:
    """Callable: ``redactor(text)`` -> the text with every credential masked."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = {s for s in secrets if s and len(s) >= _MIN_SECRET}
        self._values = sorted(values, key=len, reverse=True)  # longest first: no partial leftovers

    @classmethod
    def from_settings(cls, settings: HasSecrets) -> Redactor:
        """Every secret setting's value, and credentials inside every URL-valued setting."""
        return cls([unquote(v) for v in settings.secret_values()] + list(settings.secret_values()))

    def __call__(self, text: str) -> str:
        for value in self._values:
            if value in text:
                text = text.replace(value, MASK)
        text = _SHAPES.sub(MASK, mask_url_credentials(text))
        return _CREDENTIAL_FIELD.sub(lambda m: m.group(1) + MASK, text)
