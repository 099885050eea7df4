"""Slack mrkdwn escaping and link building.

Everything that did not come from us (page titles, page text, LLM output, user questions) goes through
:func:`escape` *before* we add our own ``<url|label>`` links, so nothing can ping ``@channel``/``@here``
or forge ``<@U123>`` mentions: Slack only parses ``<...>`` control sequences, and after escaping there
are none left except ours.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pipeline.answer.citations import WORD_JOINER

_URL_UNSAFE = {"<": "%3C", ">": "%3E", "|": "%7C", " ": "%20", "\n": "", "\r": ""}


def escape(text: str) -> str:
    """Escape the three characters Slack treats as control characters (``&`` first)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_MARKDOWN_LINK = re.compile(r"([\\\[\]])")


def escape_markdown(text: str) -> str:
    """For Markdown fields (a stream's ``markdown_text``): :func:`escape`, and ``[``, ``]`` and ``\\``
    backslash-escaped, so text from pages or the model cannot form a ``[label](url)`` link or image. Safe on
    any piece of a stream (no look-ahead). Page text quoted as written loses its word joiner here: escaped
    brackets link nothing, and "regs[0]" copies as written."""
    return _MARKDOWN_LINK.sub(r"\\\1", escape(text)).replace(WORD_JOINER, "")


def safe_url(url: str) -> str | None:
    """A URL that can sit inside ``<url|label>``, or None when it is not http(s)."""
    url = url.strip()
    if urlsplit(url).scheme.lower() not in ("http", "https"):
        return None
    for ch, rep in _URL_UNSAFE.items():
        url = url.replace(ch, rep)
    return url.replace("&", "&amp;")


def link(url: str, label: str) -> str:
    """``<url|label>`` with ``label`` escaped; just the escaped label when the URL is unusable."""
    label = escape(label).replace("|", "¦") or "link"
    target = safe_url(url)
    return f"<{target}|{label}>" if target else label


def bar(percent: float, width: int = 8) -> str:
    """A text bar such as ``████░░░░`` for a share in percent (clamped to 0..100)."""
    p = max(0.0, min(100.0, percent))
    full = round(p / 100 * width)
    return "█" * full + "░" * (width - full)
