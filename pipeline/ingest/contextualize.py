"""Evidence -> the text that is indexed (``contextualize``) and the text an LLM sees (``prompt_text``).

RAGonite's finding: a bare row or list item is hard to retrieve; prefixing the page title and heading
and adding the neighbouring text (``before``/``after``) lifts precision. Both functions use only
fields of the ``Evidence``, so the index can rebuild them without re-reading the page.

Layout, one item per line, in this fixed order whatever order ``items`` lists them in::

    breadcrumb      (ancestor titles joined " › ")
    title
    heading path    (joined " > ")
    before          (its END is kept: that is the text nearest the evidence)
    TEXT            (never cut here)
    after           (its START is kept)

Context items are squeezed onto one line and bounded to ``max_chars`` at a word boundary with "…";
empty items produce no line.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.errors import ConfigError
from pipeline.types import Evidence

CONTEXT_ITEMS: tuple[str, ...] = ("title", "heading", "before", "after", "breadcrumb")
DEFAULT_ITEMS: tuple[str, ...] = ("title", "heading", "before", "after")
ELLIPSIS = "…"


def validate_items(items: Sequence[str]) -> tuple[str, ...]:
    """Return ``items`` as a tuple; raise ``ConfigError`` naming the first unknown item."""
    if isinstance(items, str):  # a lone "title" would otherwise be read letter by letter
        items = (items,)
    for item in items:
        if item not in CONTEXT_ITEMS:
            raise ConfigError(
                f"unknown contextualization item {item!r}; expected one of {', '.join(CONTEXT_ITEMS)}"
            )
    return tuple(items)


def contextualize(ev: Evidence, items: Sequence[str] = DEFAULT_ITEMS, max_chars: int = 300) -> str:
    """The text embedded and lexically indexed for ``ev``: chosen context items around its raw text."""
    chosen = set(validate_items(items))
    _check_max(max_chars)
    lines: list[str] = []
    if "breadcrumb" in chosen:
        lines.append(clip(" › ".join(ev.breadcrumb), max_chars))
    if "title" in chosen:
        lines.append(clip(ev.title, max_chars))
    if "heading" in chosen:
        lines.append(clip(" > ".join(ev.headings), max_chars))
    if "before" in chosen:
        lines.append(clip_tail(ev.before, max_chars))
    lines.append(ev.text)
    if "after" in chosen:
        lines.append(clip(ev.after, max_chars))
    return "\n".join(line for line in lines if line)


def prompt_text(ev: Evidence, max_chars: int = 300) -> str:
    """What the generator sees for ``ev``: page title, section path and the raw text (no neighbours)."""
    _check_max(max_chars)
    lines = [f"Page: {clip(ev.title, max_chars)}"] if ev.title.strip() else []
    if ev.headings:
        lines.append(f"Section: {clip(' > '.join(ev.headings), max_chars)}")
    lines.append(ev.text)
    return "\n".join(lines)


def clip(text: str, max_chars: int) -> str:
    """One line of at most ``max_chars`` characters, cut at a word boundary, ending in "…" if cut."""
    line = " ".join(text.split())
    if len(line) <= max_chars:
        return line
    head = line[: max_chars - len(ELLIPSIS) + 1]
    cut = head.rfind(" ")
    head = head[:cut] if cut > 0 else head[: max_chars - len(ELLIPSIS)]
    return head.rstrip() + ELLIPSIS


def clip_tail(text: str, max_chars: int) -> str:
    """Like ``clip`` but keeps the end of the text, starting with "…" if cut."""
    line = " ".join(text.split())
    if len(line) <= max_chars:
        return line
    tail = line[len(line) - (max_chars - len(ELLIPSIS)) - 1 :]
    cut = tail.find(" ")
    tail = tail[cut + 1 :] if 0 <= cut < len(tail) - 1 else tail[-(max_chars - len(ELLIPSIS)) :]
    return ELLIPSIS + tail.lstrip()


def _check_max(max_chars: int) -> None:
    if max_chars < 2:
        raise ConfigError(f"context max_chars must be at least 2, got {max_chars}")
