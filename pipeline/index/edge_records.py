"""Edge filters, and the scan that fills the page table from the shard's records."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import qdrant_edge as qe

Scroll = Callable[[qe.ScrollRequest], tuple[list[Any], Any]]


def match(key: str, value: str) -> qe.FieldCondition:
    return qe.FieldCondition(key=key, match=qe.MatchValue(value))


def match_any(key: str, values: Sequence[str]) -> qe.FieldCondition:
    return qe.FieldCondition(key=key, match=qe.MatchAny(list(values)))


def scan_pages(scroll: Scroll, live: qe.Filter) -> list[tuple[str, str, str]]:
    """``(page_id, hash, space)`` of every live page, from one scroll of the payload (5,000 points a call)."""
    out: dict[str, tuple[str, str, str]] = {}
    offset: Any = None
    selector = qe.PayloadSelector.Include(["page_id", "page_hash", "space"])
    while True:
        records, offset = scroll(
            qe.ScrollRequest(offset=offset, limit=5000, filter=live, with_payload=selector)
        )
        for r in records:
            if r.payload:
                page = str(r.payload["page_id"])
                out[page] = (page, str(r.payload.get("page_hash") or ""), str(r.payload.get("space") or ""))
        if offset is None:
            return list(out.values())
