"""Edge filters, and records read back as evident's types: exported points, the scan that fills the page table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import qdrant_edge as qe

from pipeline.index import common as ic
from pipeline.types import IndexPoint, SparseVector

Scroll = Callable[[qe.ScrollRequest], tuple[list[Any], Any]]


def match(key: str, value: str) -> qe.FieldCondition:
    return qe.FieldCondition(key=key, match=qe.MatchValue(value))


def match_any(key: str, values: Sequence[str]) -> qe.FieldCondition:
    return qe.FieldCondition(key=key, match=qe.MatchAny(list(values)))


def point_from_record(record: Any) -> IndexPoint:
    """A scrolled record (payload and vectors) as the ``IndexPoint`` it was written from."""
    payload = record.payload or {}
    vectors: Any = record.vector or {}
    sparse = vectors.get(ic.SPARSE)
    return IndexPoint(
        evidence=ic.evidence_from_payload(payload),
        content=str(payload.get("content", "")),
        dense=tuple(float(x) for x in vectors.get(ic.DENSE) or ()),
        sparse=SparseVector(tuple(int(i) for i in sparse.indices), tuple(float(v) for v in sparse.values))
        if sparse is not None else SparseVector((), ()),
        page_hash=str(payload.get("page_hash", "")),
    )


def scan_pages(scroll: Scroll, live: qe.Filter) -> list[tuple[str, str, str]]:
    """``(page_id, hash, space)`` of every live page, from one scroll of the payload (5,000 points a call)."""
    out: dict[str, tuple[str, str, str]] = {}
    offset: Any = None
    selector = qe.PayloadSelector.Include(["page_id", "page_hash", "space"])
    while True:
        records, offset = scroll(qe.ScrollRequest(offset=offset, limit=5000, filter=live, with_payload=selector))
        for r in records:
            if r.payload:
                page = str(r.payload["page_id"])
                out[page] = (page, str(r.payload.get("page_hash") or ""), str(r.payload.get("space") or ""))
        if offset is None:
            return list(out.values())
