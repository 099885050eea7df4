"""Named attribution methods and the one entry point, ``attribute``.

Every method takes the same inputs (question, answer, the hits shown to the generator, a ``generate``
callback, an embedder, a params dict) and returns an ``AttributionResult``, so the engine, the CLI and
the evaluation grid can switch methods by name.

Methods:
  naive               softmax over cosine(answer, evidence); 0 generation calls (paper's baseline).
  cfa                 counterfactual per evidence, no clustering.
  cfa_clusters        the paper's Algorithm 1: DBSCAN-cluster redundant evidence, then counterfactuals.
  page                counterfactual per page (all evidence of one URL removed together; fewer calls).
  cfa_citation_prior  cfa_clusters shares × (1 + λ·cited) renormalised, where "cited" means the
                      original answer carries a [n] / [Source n] marker for one of the cluster's members.
  sufficiency         cfa_clusters, then for each of the top-2 clusters regenerate from ONLY that
                      cluster's evidence; if the mean similarity (question + answer embeddings) to the
                      original answer is ≥ τ, the cluster alone suffices and its share is multiplied by
                      (1 + boost), then renormalised. Costs up to 2 extra calls; diagnostics in
                      ``details["sufficiency"]``.
  early_stop          cfa_clusters drawing samples round_size at a time; stops once the top share leads
                      the second by more than δ (saves calls when m > 1).
  logprob             teacher-forces the original answer per ablation via params["score"] (prompt
                      log-probs); c_i = 1 − exp(min(0, lp_i − lp_all)).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from pipeline.attribution.cluster import cluster_embeddings
from pipeline.attribution.counterfactual import (
    NEEDS_PROMPT_LOGPROBS,
    counterfactual_attribution,
    likeness_or_none,
    logprob_attribution,
    regenerate,
)
from pipeline.attribution.naive import naive_attribution
from pipeline.attribution.params import AttributionParams, Generate, parse_params
from pipeline.attribution.scoring import embed, evidence_text, only, qa_text, reweight
from pipeline.attribution.types import AttributionResult
from pipeline.errors import ConfigError
from pipeline.protocols import Embedder
from pipeline.types import Hit

Runner = Callable[..., Awaitable[AttributionResult]]


@dataclass(frozen=True)
class Method:
    name: str
    summary: str
    run: Runner
    generates: bool = True  # needs the ``generate`` callback


# ---------------------------------------------------------------- grouping


def singleton_groups(hits: Sequence[Hit]) -> list[list[int]]:
    return [[i] for i in range(len(hits))]


def page_groups(hits: Sequence[Hit]) -> list[list[int]]:
    """Group hits by page URL (page id when the URL is empty), ordered by first appearance."""
    groups: dict[str, list[int]] = {}
    for i, hit in enumerate(hits):
        groups.setdefault(hit.evidence.url or hit.evidence.page_id, []).append(i)
    return list(groups.values())


async def evidence_clusters(
    hits: Sequence[Hit], embedder: Embedder, params: AttributionParams
) -> list[list[int]]:
    """DBSCAN clusters of the evidence texts the generator saw."""
    if len(hits) < 2:
        return singleton_groups(hits)
    vectors = await embed(embedder, [evidence_text(h) for h in hits])
    return cluster_embeddings(vectors, eps=params.eps, min_samples=params.min_samples)


_CITATION = re.compile(
    r"\[\s*(?:(?:sources?|evidence)\s*)?(\d+(?:\s*(?:,|;|and)\s*(?:(?:sources?|evidence)\s*)?\d+)*)\s*\]",
    re.IGNORECASE,
)


def cited_positions(answer: str, n_hits: int) -> set[int]:
    """1-based hit positions cited as [n], [1, 2], [Source n] or [Evidence n] in ``answer``."""
    cited: set[int] = set()
    for match in _CITATION.finditer(answer):
        cited.update(int(d) for d in re.findall(r"\d+", match.group(1)) if 1 <= int(d) <= n_hits)
    return cited


# ---------------------------------------------------------------- methods


def _need(generate: Generate | None, method: str) -> Generate:
    if generate is None:
        raise ConfigError(f"attribution method {method!r} needs a generate callback")
    return generate


async def _naive(*, question: str, answer: str, hits: Sequence[Hit], generate: Generate | None,
                 embedder: Embedder, params: AttributionParams) -> AttributionResult:
    return await naive_attribution(
        question=question, answer=answer, hits=hits, embedder=embedder, params=params
    )


async def _cfa(*, question: str, answer: str, hits: Sequence[Hit], generate: Generate | None,
               embedder: Embedder, params: AttributionParams) -> AttributionResult:
    return await counterfactual_attribution(
        method="cfa", question=question, answer=answer, hits=hits, groups=singleton_groups(hits),
        generate=_need(generate, "cfa"), embedder=embedder, params=params)


async def _clusters(*, question: str, answer: str, hits: Sequence[Hit], generate: Generate | None,
                    embedder: Embedder, params: AttributionParams, method: str = "cfa_clusters",
                    early_stop: bool = False) -> AttributionResult:
    started = time.perf_counter()
    groups = await evidence_clusters(hits, embedder, params)
    result = await counterfactual_attribution(
        method=method, question=question, answer=answer, hits=hits, groups=groups,
        generate=_need(generate, method), embedder=embedder, params=params, early_stop=early_stop)
    result.seconds = time.perf_counter() - started
    return result


async def _page(*, question: str, answer: str, hits: Sequence[Hit], generate: Generate | None,
                embedder: Embedder, params: AttributionParams) -> AttributionResult:
    return await counterfactual_attribution(
        method="page", question=question, answer=answer, hits=hits, groups=page_groups(hits),
        generate=_need(generate, "page"), embedder=embedder, params=params)


async def _citation_prior(*, question: str, answer: str, hits: Sequence[Hit], generate: Generate | None,
                          embedder: Embedder, params: AttributionParams) -> AttributionResult:
    result = await _clusters(question=question, answer=answer, hits=hits, generate=generate,
                             embedder=embedder, params=params, method="cfa_citation_prior")
    cited = cited_positions(answer, len(hits))
    weights = {
        c.cluster_id: 1.0 + params.citation_lambda
        for c in result.clusters
        if any(m.rank in cited for m in c.members)
    }
    reweight(result, weights)
    result.details["cited"] = sorted(cited)
    return result


async def _sufficiency(*, question: str, answer: str, hits: Sequence[Hit], generate: Generate | None,
                       embedder: Embedder, params: AttributionParams) -> AttributionResult:
    started = time.perf_counter()
    gen = _need(generate, "sufficiency")
    result = await _clusters(question=question, answer=answer, hits=hits, generate=gen,
                             embedder=embedder, params=params, method="sufficiency")
    top = [c for c in result.clusters if not c.unknown][:2]
    limiter = params.limiter()
    outcomes = await asyncio.gather(
        *(regenerate(gen, only(hits, [m.rank - 1 for m in c.members]), params.samples, limiter) for c in top)
    )
    result.calls += len(top)
    texts = [qa_text(question, answer)]
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            result.failed_calls += 1
            result.partial = True
        else:
            texts.extend(qa_text(question, a) for a in outcome)
    vectors = await embed(embedder, texts) if len(texts) > 1 else np.zeros((1, 1))
    row = 1
    weights: dict[int, float] = {}
    report: list[dict[str, Any]] = []
    for cluster, outcome in zip(top, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            report.append({"cluster_id": cluster.cluster_id, "similarity": None, "sufficient": None,
                           "answers": [], "error": str(outcome) or type(outcome).__name__})
            continue
        sims = [float(vectors[row + j] @ vectors[0]) for j in range(len(outcome))]
        row += len(outcome)
        similarity = float(np.mean(sims))
        sufficient = similarity >= params.tau
        if sufficient:
            weights[cluster.cluster_id] = 1.0 + params.boost
        report.append({"cluster_id": cluster.cluster_id, "similarity": similarity, "sufficient": sufficient,
                       "answers": list(outcome)})
    reweight(result, weights)
    result.details["sufficiency"] = report
    result.seconds = time.perf_counter() - started
    return result


async def _early_stop(*, question: str, answer: str, hits: Sequence[Hit], generate: Generate | None,
                      embedder: Embedder, params: AttributionParams) -> AttributionResult:
    return await _clusters(question=question, answer=answer, hits=hits, generate=generate, embedder=embedder,
                           params=params, method="early_stop", early_stop=True)


async def _logprob(*, question: str, answer: str, hits: Sequence[Hit], generate: Generate | None,
                   embedder: Embedder, params: AttributionParams) -> AttributionResult:
    if params.score is None:
        raise ConfigError(NEEDS_PROMPT_LOGPROBS)
    started = time.perf_counter()
    groups = await evidence_clusters(hits, embedder, params)
    result = await logprob_attribution(method="logprob", question=question, answer=answer, hits=hits,
                                       groups=groups, params=params,
                                       likeness=await likeness_or_none(embedder, answer, hits))
    result.seconds = time.perf_counter() - started
    return result


METHODS: Mapping[str, Method] = MappingProxyType({
    m.name: m
    for m in (
        Method("naive", "softmax over cosine(answer, evidence); no generation (paper's baseline)", _naive,
               generates=False),
        Method("cfa", "counterfactual per evidence, no clustering", _cfa),
        Method("cfa_clusters", "paper's Algorithm 1: cluster redundant evidence, then counterfactuals",
               _clusters),
        Method("page", "counterfactual per page (URL)", _page),
        Method("cfa_citation_prior", "cfa_clusters combined with the answer's own [n] citations",
               _citation_prior),
        Method("sufficiency", "cfa_clusters plus a sufficiency check of the top-2 clusters", _sufficiency),
        Method("early_stop", "cfa_clusters with sampling rounds that stop once the winner is clear",
               _early_stop),
        Method("logprob", "teacher-forced log-prob drop per cluster (needs prompt log-probs)", _logprob,
               generates=False),
    )
})


async def attribute(
    method: str,
    *,
    question: str,
    answer: str,
    hits: Sequence[Hit],
    generate: Generate | None,
    embedder: Embedder,
    params: Mapping[str, Any] | None = None,
) -> AttributionResult:
    """Explain which of ``hits`` produced ``answer`` to ``question`` (the completed question).

    ``generate(subset, m)`` must return m answers from only ``subset``; recoverable failures
    (``EvidentError``, ``TimeoutError``) degrade the result to ``partial``; unknown method/params raise
    ``ConfigError``.
    """
    entry = METHODS.get(method)
    if entry is None:
        raise ConfigError(f"unknown attribution method {method!r}; choose one of {', '.join(METHODS)}")
    parsed = parse_params(params)
    return await entry.run(question=question, answer=answer, hits=list(hits), generate=generate,
                           embedder=embedder, params=parsed)
