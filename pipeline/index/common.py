"""What both ``Index`` backends share: payload layout, point ids, the manifest check and RRF.

Keeping this in one place guarantees that an index written by Qdrant Edge and one written through
qdrant-client store the same payload, use the same ids and fuse with the same formula.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, cast

from pipeline.access.scope import ACL_FIELDS, PageAccess, access_from_payload, acl_payload
from pipeline.errors import IndexError_, IndexMismatchError, InputError
from pipeline.types import Evidence, EvidenceKind, Hit, IndexPoint, SearchRequest, SparseVector

DENSE = "dense"
SPARSE = "sparse"

# Visibility of a point. New page versions are written ``staged`` (invisible to every read) and
# flipped to ``live`` in the swap; a crash leaves only ``staged`` leftovers, which are removed later.
STATE = "state"
LIVE = "live"
STAGED = "staged"

# Keyword payload indexes: filters on these run on every query / swap / get.
KEYWORD_FIELDS: tuple[str, ...] = ("space", "page_id", "kind", STATE, "evidence_id", *ACL_FIELDS)

MANIFEST_FORMAT = "evident-index"
MANIFEST_VERSION = 1

# Points per write call: bounds how long one write holds the index (Edge holds the GIL while it works).
WRITE_BATCH = 256

_POINT_NS = uuid.uuid5(uuid.NAMESPACE_URL, "https://evident.invalid/index-point")


def point_id(evidence_id: str, page_hash: str) -> str:
    """Deterministic point id for one evidence *of one page version*.

    Including the page hash lets a new version be written next to the live one (and swapped in)
    instead of overwriting it in place, while re-ingesting the same version stays idempotent.
    """
    return str(uuid.uuid5(_POINT_NS, f"{evidence_id}\x1f{page_hash}"))


def to_payload(point: IndexPoint, state: str) -> dict[str, Any]:
    """The stored payload of one point (plain JSON types only)."""
    ev = point.evidence
    return {
        "evidence_id": ev.id,
        "page_id": ev.page_id,
        "space": ev.space,
        "kind": ev.kind,
        "url": ev.url,
        "title": ev.title,
        "text": ev.text,
        "content": point.content,
        "headings": list(ev.headings),
        "before": ev.before,
        "after": ev.after,
        "breadcrumb": list(ev.breadcrumb),
        "position": ev.position,
        "table_index": ev.table_index,
        "row_index": ev.row_index,
        "page_hash": point.page_hash,
        STATE: state,
        **acl_payload(ev.access),
    }


def group_by_access(pages: Mapping[str, PageAccess | None],
                    chunk: int = 1000) -> list[tuple[PageAccess | None, list[str]]]:
    """Pages that get the same access, together (one payload write each), at most ``chunk`` ids a write."""
    groups: dict[PageAccess | None, list[str]] = {}
    for page_id, access in pages.items():
        groups.setdefault(access, []).append(page_id)
    return [(access, ids[n:n + chunk]) for access, ids in groups.items() for n in range(0, len(ids), chunk)]


def evidence_from_payload(payload: Mapping[str, Any]) -> Evidence:
    """Rebuild the ``Evidence`` a payload was written from."""
    try:
        return Evidence(
            id=str(payload["evidence_id"]),
            page_id=str(payload["page_id"]),
            title=str(payload.get("title", "")),
            url=str(payload.get("url", "")),
            space=str(payload.get("space", "")),
            kind=cast(EvidenceKind, payload["kind"]),
            position=int(payload.get("position", 0)),
            text=str(payload.get("text", "")),
            headings=tuple(payload.get("headings") or ()),
            before=str(payload.get("before") or ""),
            after=str(payload.get("after") or ""),
            breadcrumb=tuple(payload.get("breadcrumb") or ()),
            table_index=payload.get("table_index"),
            row_index=payload.get("row_index"),
            access=access_from_payload(payload),
        )
    except KeyError as exc:
        raise IndexError_(
            f"index point payload lacks field {exc.args[0]!r}; re-ingest with --rebuild"
        ) from exc


def check_point(page_id: str, page_hash: str, point: IndexPoint, dim: int) -> None:
    """Reject a point that does not belong to the page version being written, before it is stored."""
    if point.evidence.page_id != page_id:
        raise IndexError_(
            f"evidence {point.evidence.id} belongs to page {point.evidence.page_id}, not {page_id}"
        )
    if point.page_hash != page_hash:
        raise IndexError_(
            f"evidence {point.evidence.id} has page hash {point.page_hash}, expected {page_hash}"
        )
    if len(point.dense) != dim:
        raise IndexError_(
            f"evidence {point.evidence.id} has a {len(point.dense)}-dim vector; index expects {dim}"
        )


REEMBED = ("re-embed with `evident ingest --rebuild PATH` or `evident sync --rebuild`, "
           "or use another --index-dir / EVIDENT_COLLECTION")


def manifest(embedder: str, dense_dim: int, recipe: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What an index records about how its vectors were made: model, dimension and text recipe."""
    out: dict[str, Any] = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "embedder": embedder,
                           "dim": dense_dim}
    if recipe:
        out["recipe"] = dict(recipe)
    return out


def check_manifest(stored: Mapping[str, Any], *, embedder: str, dense_dim: int, where: str,
                   recipe: Mapping[str, Any] | None = None) -> None:
    """Raise ``IndexMismatchError`` when an existing index was built with another model, dimension or recipe
    (e.g. another ``EVIDENT_EMBED_MAX_TOKENS``): vectors made differently must never be mixed.

    An index without a recorded recipe (built before recipes were recorded) is accepted.
    """
    old_embedder = str(stored.get("embedder", "?"))
    old_dim = stored.get("dim")
    if old_embedder != embedder or old_dim != dense_dim:
        raise IndexMismatchError(
            f"index at {where} was built with embedder '{old_embedder}' (dim {old_dim}); "
            f"this run uses '{embedder}' (dim {dense_dim}): {REEMBED}"
        )
    old_recipe = stored.get("recipe")
    if recipe and isinstance(old_recipe, Mapping) and dict(old_recipe) != dict(recipe):
        def fmt(r: Mapping[str, Any]) -> str:
            return ", ".join(f"{k} {v}" for k, v in sorted(r.items()))
        # encoded before BM25's length was recorded (``pipeline.models.sparse.LEGACY_AVG_LEN``)
        legacy = (old_recipe.get("sparse") == "bm25" and str(recipe.get("sparse", "")).startswith("bm25(")
                  and {**old_recipe, "sparse": None} == {**recipe, "sparse": None})
        raise IndexMismatchError(
            f"index at {where} holds '{embedder}' vectors made with {fmt(old_recipe)}; this run makes them "
            "with "
            f"{fmt(recipe)}: {REEMBED}"
            + (" (until then EVIDENT_BM25_AVG_LEN=40 opens it as it was encoded)" if legacy else "")
        )


def engine_rrf_k(rrf_k: int) -> int:
    """Qdrant scores rank r (1-based) as 1/(r/w + k - 1); passing k+1 gives the textbook 1/(k + r)."""
    return rrf_k + 1


def rrf_fuse(
    rankings: Sequence[Sequence[str]], *, k: int = 60, weights: Sequence[float] | None = None
) -> list[tuple[str, float]]:
    """Client-side (weighted) RRF with exactly the engine's formula: score = Σ 1 / (rank/w + k).

    For w = 1 this is the textbook 1/(k + rank), rank 1-based. Used as the fallback when a Qdrant
    server cannot fuse with weights, and by tests to predict the engine's order.
    """
    if weights is not None and len(weights) != len(rankings):
        raise IndexError_(f"RRF got {len(weights)} weights for {len(rankings)} rankings")
    scores: dict[str, float] = {}
    for i, ranking in enumerate(rankings):
        w = 1.0 if weights is None else float(weights[i])
        for pos, key in enumerate(ranking):
            s = 0.0 if w <= 0 else 1.0 / ((pos + 1) / w + k)
            scores[key] = scores.get(key, 0.0) + s
    return sorted(scores.items(), key=lambda kv: kv[1], reverse=True)


def dbsf_fuse(scored: Sequence[Sequence[tuple[str, float]]]) -> list[tuple[str, float]]:
    """Client-side distribution-based score fusion, the engine's formula: each leg's scores are mapped from
    its mean ± 3 sample standard deviations to [0, 1] (not clipped: an outlier scores above 1), a leg of one
    point scores 0.5, and a point's normalized scores are summed (Qdrant's ``distr_norm``; a leg ordered
    smallest first is flipped, as there)."""
    scores: dict[str, float] = {}
    for leg in scored:
        if not leg:
            continue
        values = [s for _, s in leg]
        mean = sum(values) / len(values)
        # sample sd, as the engine
        std = (sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1)) ** 0.5
        low, high = mean - 3 * std, mean + 3 * std
        flip = values[0] < values[-1]
        for key, s in leg:
            norm = 0.5 if high == low else (s - low) / (high - low)
            scores[key] = scores.get(key, 0.0) + (1.0 - norm if flip else norm)
    return sorted(scores.items(), key=lambda kv: kv[1], reverse=True)


def fuse_hits(lists: Sequence[Sequence[Hit]], request: SearchRequest,
              weights: Sequence[float] | None) -> list[Hit]:
    """The rankers' hit lists fused client-side as the engine fuses them (``request.fusion``: ``dbsf_fuse``,
    or ``rrf_fuse`` with ``weights``), equal scores by evidence id (as ``stable_order``) before the cut to
    ``request.limit`` (the engine cuts first, so its last hit may be the other of a tie)."""
    by_id = {h.evidence.id: h for hits in lists for h in hits}
    fused = (
        dbsf_fuse([[(h.evidence.id, h.score) for h in hits] for hits in lists])
        if request.fusion == "dbsf"
        else rrf_fuse([[h.evidence.id for h in hits] for hits in lists], k=request.rrf_k, weights=weights)
    )
    fused.sort(key=lambda kv: (-kv[1], kv[0]))
    return [Hit(by_id[eid].evidence, score, rank, by_id[eid].content)
            for rank, (eid, score) in enumerate(fused[: request.limit], start=1)]


def query_legs(request: SearchRequest) -> tuple[bool, bool]:
    """Which retrievers a request runs: (sparse, dense). An empty sparse query simply has no lexical leg."""
    has_sparse = request.sparse is not None and len(request.sparse.indices) > 0
    if request.mode == "lexical":
        if request.sparse is None:
            raise InputError("lexical search needs a sparse query vector")
        return has_sparse, False
    if request.dense is None:
        raise InputError(f"{request.mode} search needs a dense query vector")
    if request.mode == "dense":
        return False, True
    if request.mode != "hybrid":
        raise InputError(f"unknown retrieval mode {request.mode!r}; use lexical, dense or hybrid")
    return has_sparse, True


def leg_weights(request: SearchRequest, sparse: bool, dense: bool) -> list[float] | None:
    """RRF weights for the legs that actually run (None = equal weights)."""
    if request.weights is None:
        return None
    lexical_w, dense_w = request.weights
    return [w for w, used in ((lexical_w, sparse), (dense_w, dense)) if used]


def stable_order(points: list[Any]) -> list[Any]:
    """Order scored points by score, ties broken by evidence id, so results are reproducible.

    Qdrant leaves the order of equal scores unspecified (it differs after a reopen and between
    backends), and RRF ranks, answers and benchmarks would inherit that noise.
    """
    return sorted(points, key=lambda p: (-float(p.score), str((p.payload or {}).get("evidence_id", ""))))


def point_from_record(record: Any) -> IndexPoint:
    """A scrolled record (payload and vectors) as the ``IndexPoint`` it was written from."""
    payload = record.payload or {}
    vectors: Any = record.vector or {}
    sparse = vectors.get(SPARSE)
    return IndexPoint(
        evidence=evidence_from_payload(payload),
        content=str(payload.get("content", "")),
        dense=tuple(float(x) for x in vectors.get(DENSE) or ()),
        sparse=SparseVector(tuple(int(i) for i in sparse.indices), tuple(float(v) for v in sparse.values))
        if sparse is not None else SparseVector((), ()),
        page_hash=str(payload.get("page_hash", "")),
    )
