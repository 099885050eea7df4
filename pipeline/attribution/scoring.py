"""Shared arithmetic of attribution: texts to embed, similarities, softmax shares, result assembly."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from pipeline.attribution.types import AttributionResult, ClusterAttribution, EvidenceRef
from pipeline.errors import EmbeddingError
from pipeline.protocols import Embedder
from pipeline.types import Evidence, Hit


def evidence_text(hit: Hit) -> str:
    """The text the generator saw for this evidence (contextualised content when present)."""
    return hit.content or hit.evidence.text


def qa_text(question: str, answer: str) -> str:
    """Paper: the completed question is prepended to an answer before embedding it."""
    return f"{question}\n{answer}" if question else answer


def refs(hits: Sequence[Hit], rows: Sequence[int]) -> list[EvidenceRef]:
    """References to ``hits[rows]``; rank is the 1-based position the generator saw."""
    return [
        EvidenceRef(
            evidence_id=hits[i].evidence.id,
            title=hits[i].evidence.title,
            url=hits[i].evidence.url,
            kind=hits[i].evidence.kind,
            rank=i + 1,
            label=evidence_label(hits[i].evidence),
            quote=evidence_quote(hits[i].evidence),
        )
        for i in rows
    ]


QUOTE_CHARS = 90
_ROW_PREFIX = re.compile(r"^Row \d+ in Table \d+:\s*")


def evidence_label(ev: Evidence) -> str:
    """Where the evidence is: page title, its nearest heading, and the row or table for table evidence."""
    parts = [ev.title or "untitled"]
    if ev.headings:
        parts.append(ev.headings[-1])
    if ev.kind == "row" and ev.row_index is not None:
        parts.append(f"row {ev.row_index}" + (f" of table {ev.table_index}" if ev.table_index else ""))
    elif ev.kind == "table" and ev.table_index is not None:
        parts.append(f"table {ev.table_index}")
    return " › ".join(p for p in parts if p)


def evidence_quote(ev: Evidence, limit: int = QUOTE_CHARS) -> str:
    """The evidence's first words (a row without its "Row n in Table m:" prefix), cut at a word boundary."""
    text = " ".join(_ROW_PREFIX.sub("", ev.text).split())
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0] or text[:limit]
    return cut.rstrip(",;:") + "…"


def without(hits: Sequence[Hit], rows: Sequence[int]) -> list[Hit]:
    """``hits`` minus ``rows``, original order kept; a removed table row is also cut out of its whole table's
    evidence when that is shown too (a verbalized row repeats a line of its table: removing only the row would
    leave its content in the prompt, and the counterfactual would not see it gone)."""
    drop = set(rows)
    cut = [hits[i].evidence for i in sorted(drop) if 0 <= i < len(hits) and hits[i].evidence.kind == "row"]
    return [_without_rows(h, cut) for i, h in enumerate(hits) if i not in drop]


def _without_rows(hit: Hit, rows: Sequence[Evidence]) -> Hit:
    """``hit`` without the lines of ``rows`` when it is their table (same page and table number). A table's
    text is its rows, one line each; a row's own line is the last line of its text (markdown rows carry the
    header first). Whole lines are compared, so a short row ("Yes", plain linearization) never cuts into other
    rows."""
    ev = hit.evidence
    if ev.kind != "table":
        return hit
    gone = {row.text.splitlines()[-1] for row in rows
            if row.page_id == ev.page_id and row.table_index == ev.table_index and row.text.strip()}
    if not gone:
        return hit
    lines = ev.text.splitlines()
    kept = [line for line in lines if line not in gone]
    if len(kept) == len(lines):
        return hit
    return replace(hit, evidence=replace(ev, text="\n".join(kept)), content="")


def only(hits: Sequence[Hit], rows: Sequence[int]) -> list[Hit]:
    """Only ``rows`` of ``hits``, original order kept."""
    keep = set(rows)
    return [h for i, h in enumerate(hits) if i in keep]


async def answer_likeness(embedder: Embedder, answer: str, hits: Sequence[Hit]) -> list[float]:
    """Cosine of each evidence's text to the answer (the naive method's score)."""
    if not hits:
        return []
    vectors = await embed(embedder, [answer, *(evidence_text(h) for h in hits)])
    return [float(v @ vectors[0]) for v in vectors[1:]]


async def embed(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """Embed in a worker thread (CPU-bound) and check the shape; rows are re-normalised."""
    if not texts:
        return np.zeros((0, 0), dtype=np.float64)
    vectors = await asyncio.to_thread(embedder.embed_documents, list(texts))
    matrix = np.asarray(vectors, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != len(texts):
        raise EmbeddingError(f"embedder {getattr(embedder, 'name', '?')} returned shape {matrix.shape} "
                             f"for {len(texts)} texts")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0.0, 1.0, norms)


def softmax(values: Sequence[float], temperature: float) -> list[float]:
    """softmax(values / t), numerically stable."""
    if not values:
        return []
    x = np.asarray(values, dtype=np.float64) / temperature
    x = np.exp(x - x.max())
    return (x / x.sum()).tolist()


def assemble(
    *,
    method: str,
    question: str,
    answer: str,
    hits: Sequence[Hit],
    groups: Sequence[Sequence[int]],
    contributions: Sequence[float | None],
    temperature: float,
    answers: Sequence[Sequence[str]] | None = None,
    similarities: Sequence[Sequence[float]] | None = None,
    calls: int = 0,
    failed_calls: int = 0,
    params: Mapping[str, Any] | None = None,
    seconds: float = 0.0,
    details: Mapping[str, Any] | None = None,
    likeness: Sequence[float] | None = None,
) -> AttributionResult:
    """Turn per-group contributions (None = unknown) into a sorted result with softmax percentages;
    ``likeness`` (per shown evidence, its cosine to the answer) orders groups with equal shares."""
    known = {i: float(c) for i, c in enumerate(contributions) if c is not None}
    shares = softmax(list(known.values()), temperature)
    percent = {i: 100.0 * s for i, s in zip(known, shares, strict=True)}
    clusters = [
        ClusterAttribution(
            cluster_id=g + 1,
            members=refs(hits, rows),
            contribution=known.get(g, math.nan),
            percent=percent.get(g, 0.0),
            counterfactual_answers=list(answers[g]) if answers else [],
            similarities=[float(s) for s in similarities[g]] if similarities else [],
            unknown=contributions[g] is None,
            likeness=max((likeness[r] for r in rows), default=math.nan) if likeness else math.nan,
        )
        for g, rows in enumerate(groups)
    ]
    return AttributionResult(
        method=method,
        question=question,
        answer=answer,
        clusters=sort_clusters(clusters),
        partial=failed_calls > 0,
        calls=calls,
        params=dict(params or {}),
        seconds=seconds,
        failed_calls=failed_calls,
        details=dict(details or {}),
    )


def sort_clusters(clusters: list[ClusterAttribution]) -> list[ClusterAttribution]:
    """Known clusters by percent (desc), unknown ones last. Equal shares (removing either changed the
    answer as much, often not at all: a near-copy or unused evidence) are ordered by likeness to the
    answer, then by id: the counterfactual cannot tell them apart, their words can."""
    def key(c: ClusterAttribution) -> tuple[bool, float, float, int]:
        like = c.likeness if math.isfinite(c.likeness) else -math.inf
        return c.unknown, -round(c.percent, 6), -like, c.cluster_id

    return sorted(clusters, key=key)


def reweight(result: AttributionResult, weights: Mapping[int, float]) -> None:
    """Multiply known clusters' shares by ``weights[cluster_id]`` (default 1), renormalise, re-sort."""
    known = [c for c in result.clusters if not c.unknown]
    raw = {c.cluster_id: c.percent * weights.get(c.cluster_id, 1.0) for c in known}
    total = sum(raw.values())
    if total <= 0:
        return
    for c in known:
        c.percent = 100.0 * raw[c.cluster_id] / total
    result.clusters = sort_clusters(result.clusters)
