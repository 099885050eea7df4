"""`evident eval attribution`: is the top-attributed evidence from a gold page? (RAGonite Sec. 4.3)

Protocol, as in the paper: every question is asked as a *completed* question in a fresh conversation
(so all methods explain the same answer to a self-contained question), and only questions whose gold
page is among the evidence shown to the generator are kept (paper: 364 of 600) — otherwise no method
could be right. Each method then explains the same stored turn.

Accuracy: the top-attributed cluster's highest-ranked member (the evidence the generator saw first
within the winning cluster) has a gold URL. Choosing one member, not "any member", keeps a large
cluster from scoring just by being large, and equals the paper's rule for singleton clusters.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.access.scope import EVERYTHING
from pipeline.attribution import METHODS, AttributionResult, attribute
from pipeline.errors import ConfigError, EvidentError
from pipeline.evaluation.data import QATurn
from pipeline.evaluation.faithfulness import (
    METRICS,
    Faithfulness,
    Regenerations,
    credit_order,
    first_source_order,
    paired,
    summary,
)
from pipeline.evaluation.metrics import first_hit_rank, normalize_url
from pipeline.ingest.contextualize import prompt_text
from pipeline.types import Hit

if TYPE_CHECKING:
    from pipeline.answer.engine import Engine

DEFAULT_METHODS = ("naive", "cfa", "cfa_clusters", "page", "cfa_citation_prior")


@dataclass
class AnsweredQuestion:
    """One completed question answered by the engine, with what the explainers need."""

    lang: str
    conv_id: str
    turn: int
    source: str
    q_type: str
    question: str
    gold_urls: tuple[str, ...]
    turn_id: int
    answer_ms: float
    eligible: bool  # a gold URL is among the evidence shown to the generator
    out_of_scope: bool
    error: str | None = None
    raw_answer: str = ""
    hits: list[Hit] = field(default_factory=list)


@dataclass
class AttributionOutcome:
    method: str
    lang: str
    conv_id: str
    turn: int
    source: str
    q_type: str
    correct: float
    top_url: str | None
    calls: int
    explain_ms: float
    answer_ms: float
    partial: bool = False
    error: str | None = None
    faithfulness: Faithfulness | None = None


def check_methods(methods: Sequence[str], *, prompt_logprobs: bool = True) -> None:
    """Fail before any work when a method name is unknown, none is given, or ``logprob`` is asked for
    without an endpoint that can teacher-force (answering every question first would waste the run)."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise ConfigError(f"unknown attribution method(s) {', '.join(unknown) or '(none given)'}; "
                          f"choose from {', '.join(METHODS)}")
    if "logprob" in methods and not prompt_logprobs:
        raise ConfigError("the logprob method needs an LLM endpoint with prompt log-probs: set "
                          "EVIDENT_LLM_BASE_URL and EVIDENT_LLM_PROMPT_LOGPROBS=true")


def top_evidence_url(result: AttributionResult) -> str | None:
    """URL of the top known cluster's highest-ranked member (clusters are sorted by share)."""
    for cluster in result.clusters:
        if cluster.unknown or not cluster.members:
            continue
        return min(cluster.members, key=lambda m: m.rank).url
    return None


def is_correct(result: AttributionResult, gold_urls: Sequence[str]) -> bool:
    url = top_evidence_url(result)
    return url is not None and normalize_url(url) in {normalize_url(g) for g in gold_urls}


def select_questions(conversations: Sequence[Sequence[QATurn]], langs: Sequence[str],
                     limit: int | None, sample: int | None = None) -> list[tuple[str, QATurn]]:
    """(lang, turn) pairs in file order.

    ``limit`` keeps the first N questions per language (cheap smoke runs, but they all come from the first
    few conversations); ``sample`` keeps N spread evenly over the whole file, so a small run with a slow LLM
    still covers many pages and topics. Both are deterministic.
    """
    out: list[tuple[str, QATurn]] = []
    for lang in langs:
        turns = [t for conv in conversations for t in conv if lang in t.completed]
        if sample is not None and sample < len(turns):
            turns = [turns[(i * len(turns)) // sample] for i in range(sample)]
        out.extend((lang, t) for t in (turns if limit is None else turns[:limit]))
    return out


async def answer_questions(engine: Engine, questions: Sequence[tuple[str, QATurn]], *,
                           run_id: str = "attr") -> list[AnsweredQuestion]:
    """Ask each completed question in its own conversation (no history), sequentially so the answer
    wall-clock is not inflated by competing requests."""
    out: list[AnsweredQuestion] = []
    for lang, turn in questions:
        question = turn.completed[lang]
        t = time.perf_counter()
        result = await engine.ask(f"{run_id}:{lang}:{turn.conv_id}:{turn.turn}", question, scope=EVERYTHING)
        answer_ms = (time.perf_counter() - t) * 1000
        shown = result.answer.evidence
        rank = first_hit_rank([h.evidence.url for h in shown], turn.gold_urls)
        out.append(AnsweredQuestion(
            lang=lang, conv_id=turn.conv_id, turn=turn.turn, source=turn.source, q_type=turn.q_type,
            question=result.completed_question, gold_urls=turn.gold_urls, turn_id=result.turn_id,
            answer_ms=answer_ms, eligible=rank is not None and not result.error,
            out_of_scope=result.answer.out_of_scope, error=result.error,
            raw_answer=result.answer.trace.explained or result.answer.trace.raw_answer or result.answer.text,
            hits=[Hit(evidence=h.evidence, score=0.0, rank=i + 1, content=prompt_text(h.evidence))
                  for i, h in enumerate(shown)],
        ))
    return out


class SharedGenerations:
    """Memoises deterministic (m == 1) counterfactual generations across methods for one question.

    cfa, page, cfa_clusters and cfa_citation_prior often remove the very same evidence subsets; with
    temperature 0 the regenerated answer is the same, so a slow local LLM need not produce it twice.
    Off by default: it makes later methods look cheaper than they are.
    """

    def __init__(self, engine: Engine, question: str, max_tokens: int) -> None:
        self.engine = engine
        self.question = question
        self.max_tokens = max_tokens
        self.cache: dict[tuple[tuple[str, ...], int], list[str]] = {}
        self.llm_calls = 0

    async def __call__(self, subset: Sequence[Hit], m: int) -> list[str]:
        key = (tuple(h.evidence.id for h in subset), m)
        if m == 1 and key in self.cache:
            return self.cache[key]
        self.llm_calls += 1
        texts = await self.engine.generator.generate_from(self.question, subset, m, self.max_tokens)
        if m == 1:
            self.cache[key] = texts
        return texts


async def explain_one(engine: Engine, q: AnsweredQuestion, method: str,
                      shared: SharedGenerations | None = None,
                      regen: Regenerations | None = None) -> AttributionOutcome:
    """Run one method on one answered question and score it (with ``regen``: its faithfulness too)."""
    t = time.perf_counter()
    result: AttributionResult | None = None
    error: str | None = None
    try:
        if shared is None:
            explained = await engine.explain(q.turn_id, scope=EVERYTHING, method=method)
            result, error = explained.result, explained.error
        else:
            result = await attribute(method, question=q.question, answer=q.raw_answer, hits=q.hits,
                                     generate=shared, embedder=engine.embedder,
                                     params=engine.explainer.params_for(q.question))
    except ConfigError:
        raise
    except EvidentError as exc:
        error = f"{type(exc).__name__}: {exc}"
    explain_ms = (time.perf_counter() - t) * 1000
    measured = await regen.measure(credit_order(result, q.hits)) if regen and result is not None else None
    return AttributionOutcome(
        method=method, lang=q.lang, conv_id=q.conv_id, turn=q.turn, source=q.source, q_type=q.q_type,
        correct=float(result is not None and is_correct(result, q.gold_urls)),
        top_url=top_evidence_url(result) if result is not None else None,
        calls=result.calls if result is not None else 0, explain_ms=explain_ms, answer_ms=q.answer_ms,
        partial=bool(result is not None and result.partial), error=error, faithfulness=measured,
    )


async def first_source(q: AnsweredQuestion, regen: Regenerations | None) -> AttributionOutcome:
    """The baseline that credits the first evidence shown (retrieval rank alone)."""
    first = q.hits[0].evidence.url if q.hits else None
    gold = {normalize_url(g) for g in q.gold_urls}
    return AttributionOutcome(
        method="first_source", lang=q.lang, conv_id=q.conv_id, turn=q.turn, source=q.source, q_type=q.q_type,
        correct=float(first is not None and normalize_url(first) in gold), top_url=first, calls=0,
        explain_ms=0.0, answer_ms=q.answer_ms,
        faithfulness=await regen.measure(first_source_order(q.hits)) if regen else None,
    )


def regenerations(engine: Engine, q: AnsweredQuestion) -> Regenerations:
    """The question's regenerations for the faithfulness metrics (greedy, the answer's length budget)."""
    max_tokens = max(32, int(len(q.raw_answer) / 3.0) + 16)

    async def generate(subset: Sequence[Hit]) -> str:
        texts = await engine.generator.generate_from(q.question, subset, 1, max_tokens)
        return texts[0] if texts else ""

    return Regenerations(q.question, q.raw_answer, q.hits, generate, engine.embedder)


@dataclass
class AttributionEval:
    answered: list[AnsweredQuestion]
    outcomes: list[AttributionOutcome]


async def run_attribution_eval(
    conversations: Sequence[Sequence[QATurn]],
    engine: Engine,
    *,
    methods: Sequence[str] = DEFAULT_METHODS,
    langs: Sequence[str] = ("en", "de"),
    limit: int | None = None,
    sample: int | None = None,
    share_generations: bool = False,
    faithfulness: bool = True,
    run_id: str = "attr",
) -> AttributionEval:
    """Answer, keep questions with a gold page in the shown evidence, explain each with every method and the
    ``first_source`` baseline; with ``faithfulness``, measure each explanation by regenerating without and
    with only what it credits (``pipeline.evaluation.faithfulness``)."""
    check_methods(methods, prompt_logprobs=engine.options.prompt_logprobs and engine.llm is not None)
    questions = select_questions(conversations, langs, limit, sample)
    answered = await answer_questions(engine, questions, run_id=run_id)
    outcomes: list[AttributionOutcome] = []
    for q in answered:
        if not q.eligible:
            continue
        shared = None
        if share_generations:
            shared = SharedGenerations(engine, q.question, max(32, int(len(q.raw_answer) / 3.0) + 16))
        regen = regenerations(engine, q) if faithfulness else None
        for method in methods:
            outcomes.append(await explain_one(engine, q, method, shared, regen))
        outcomes.append(await first_source(q, regen))
    return AttributionEval(answered, outcomes)


# ---------------------------------------------------------------- report


def _row(outcomes: Sequence[AttributionOutcome], **keys: object) -> dict[str, Any]:
    n = len(outcomes)
    answer_ms = sum(o.answer_ms for o in outcomes)
    explain_ms = sum(o.explain_ms for o in outcomes)
    ratios = sorted(o.explain_ms / o.answer_ms for o in outcomes if o.answer_ms > 0)
    return {
        **keys,
        "n": n,
        "accuracy": round(sum(o.correct for o in outcomes) / n, 4) if n else 0.0,
        "llm_calls_mean": round(sum(o.calls for o in outcomes) / n, 2) if n else 0.0,
        "explain_answer_ratio": round(explain_ms / answer_ms, 3) if answer_ms > 0 else None,
        "explain_answer_ratio_p50": round(ratios[len(ratios) // 2], 3) if ratios else None,
        "explain_ms_mean": round(explain_ms / n, 1) if n else 0.0,
        "answer_ms_mean": round(answer_ms / n, 1) if n else 0.0,
        "partial": sum(o.partial for o in outcomes),
        "errors": sum(o.error is not None for o in outcomes),
        **summary([o.faithfulness for o in outcomes if o.faithfulness is not None]),
    }


BREAKDOWNS = {
    "lang": lambda o: o.lang,
    "source": lambda o: o.source,
    "q_type": lambda o: o.q_type,
}


def summarize_attribution(run: AttributionEval, *, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"config", "rows": [one per method], "breakdowns": {lang|source|q_type: [...]}}``."""
    eligible = [q for q in run.answered if q.eligible]
    cfg = {
        **(config or {}),
        "questions": "completed",
        "asked": len(run.answered),
        "eligible": len(eligible),
        "eligible_out_of_scope": sum(q.out_of_scope for q in eligible),
        "answer_errors": sum(q.error is not None for q in run.answered),
        "accuracy_rule": "top cluster's highest-ranked member URL is a gold URL",
    }
    by_method: dict[str, list[AttributionOutcome]] = defaultdict(list)
    for o in run.outcomes:
        by_method[o.method].append(o)
    report: dict[str, Any] = {"config": cfg, "rows": [_row(os_, method=m) for m, os_ in by_method.items()]}
    breakdowns: dict[str, list[dict[str, Any]]] = {}
    for dim, key_of in BREAKDOWNS.items():
        sub: dict[tuple[str, str], list[AttributionOutcome]] = defaultdict(list)
        for o in run.outcomes:
            sub[(o.method, key_of(o))].append(o)
        breakdowns[dim] = [_row(os_, method=m, group=g) for (m, g), os_ in sub.items()]
    report["breakdowns"] = breakdowns
    report["paired"] = paired_counts(run.outcomes)
    per_question: dict[str, dict[Any, Faithfulness]] = defaultdict(dict)
    for o in run.outcomes:
        if o.faithfulness is not None:
            per_question[o.method][(o.lang, o.conv_id, o.turn)] = o.faithfulness
    report["faithfulness_paired"] = paired(per_question)
    report["questions"] = [
        {"method": o.method, "lang": o.lang, "conv_id": o.conv_id, "turn": o.turn, "source": o.source,
         "correct": bool(o.correct), "top_url": o.top_url, "calls": o.calls,
         "explain_ms": round(o.explain_ms, 1), "answer_ms": round(o.answer_ms, 1), "partial": o.partial,
         "error": o.error, **(o.faithfulness.as_dict() if o.faithfulness else {})}
        for o in run.outcomes
    ]
    return report


def paired_counts(outcomes: Sequence[AttributionOutcome]) -> list[dict[str, Any]]:
    """Each method against the first one on the same questions: how many it alone gets right / wrong.

    With a few dozen questions an accuracy gap of one or two points is noise; the discordant pairs are
    what a sign test would look at, so the report keeps them.
    """
    by_method: dict[str, dict[tuple[str, str, int], float]] = defaultdict(dict)
    for o in outcomes:
        by_method[o.method][(o.lang, o.conv_id, o.turn)] = o.correct
    if not by_method:
        return []
    reference, *others = list(by_method)
    ref = by_method[reference]
    rows = []
    for method in others:
        common = [k for k in by_method[method] if k in ref]
        rows.append({
            "method": method, "reference": reference, "n": len(common),
            "only_method_right": sum(1 for k in common if by_method[method][k] > ref[k]),
            "only_reference_right": sum(1 for k in common if by_method[method][k] < ref[k]),
        })
    return rows


def format_attribution_table(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = [f"eligible questions (gold page among shown evidence): {cfg['eligible']} of {cfg['asked']}",
             f"{'method':<20}{'n':>5}{'acc':>8}{'comp':>7}{'suff':>7}{'del':>7}{'del1':>7}{'calls':>7}{'ratio':>7}"
             f"{'p50':>7}{'errors':>7}"]
    for r in report["rows"]:
        ratio = "-" if r["explain_answer_ratio"] is None else f"{r['explain_answer_ratio']:.2f}"
        p50 = "-" if r["explain_answer_ratio_p50"] is None else f"{r['explain_answer_ratio_p50']:.2f}"
        faith = "".join("      -" if r.get(m) is None else f"{r[m]:>7.3f}" for m in METRICS)
        lines.append(f"{r['method']:<20}{r['n']:>5}{r['accuracy']:>8.3f}{faith}{r['llm_calls_mean']:>7.1f}"
                     f"{ratio:>7}{p50:>7}{r['errors']:>7}")
    for p in report.get("faithfulness_paired") or []:
        lines.append(
            f"{p['method']} − {p['reference']} (n {p['n']}): "
            + ", ".join(
                f"{m} {p[f'{m}_diff']:+.3f} (p {p[f'{m}_p']:.3f})"
                for m in METRICS
                if p[f"{m}_diff"] is not None
            )
        )
    for p in report.get("paired") or []:
        lines.append(
            f"{p['method']} vs {p['reference']}: {p['only_method_right']} questions only "
            f"{p['method']} got right, {p['only_reference_right']} only {p['reference']} (of {p['n']})"
        )
    for dim, rows in (report.get("breakdowns") or {}).items():
        lines.append(f"\nby {dim}:")
        for r in rows:
            lines.append(f"  {r['method']:<20}{r['group']!s:<10}{r['n']:>5}{r['accuracy']:>8.3f}")
    return "\n".join(lines)
