"""`evident eval answers`: end-to-end answer quality over whole ConfQuestions conversations.

Conversations run turn by turn through the real ``Engine``; each turn sees only the system's own
earlier questions and answers (the engine's store), never gold, so follow-ups are as hard as in
deployment. Scores per turn: SQuAD-style token F1 and gold containment against the gold answer ``a``,
out-of-scope, P@10 of the evidence actually shown to the generator, and an optional LLM judge.
"""

from __future__ import annotations

import asyncio
import json
import re
import string
import tempfile
import time
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.access.scope import EVERYTHING
from pipeline.answer.citations import WORD_JOINER
from pipeline.answer.prompts import PromptLibrary
from pipeline.errors import RemoteError
from pipeline.evaluation.data import QATurn
from pipeline.evaluation.metrics import first_hit_rank, percentile
from pipeline.evaluation.ragas import METRICS, RagasJudge, RagasScores
from pipeline.protocols import LLM, Embedder, Index, SparseEncoder
from pipeline.settings import PipelineSettings

if TYPE_CHECKING:
    from pipeline.answer.engine import Engine

# SQuAD drops English articles; German articles are dropped too so both languages are scored alike.
_ARTICLES = {
    "en": {"a", "an", "the"},
    "de": {"der", "die", "das", "den", "dem", "des", "ein", "eine", "einen", "einem", "einer", "eines"},
}
_MARKERS = re.compile(r"\[\s*(?:sources?\s*)?\d+(?:\s*[,;]\s*(?:sources?\s*)?\d+)*\s*\]", re.IGNORECASE)
_PUNCT = set(string.punctuation) | {"“", "”", "„", "‘", "’", "«", "»", "–", "—", "…"}


# ---------------------------------------------------------------- text metrics


def normalize_answer(text: str, lang: str = "en") -> str:
    """SQuAD normalisation: lower case, no citation markers, punctuation or articles, single spaces."""
    text = unicodedata.normalize("NFKC", _MARKERS.sub(" ", text.replace(WORD_JOINER, ""))).lower()
    text = "".join(" " if ch in _PUNCT else ch for ch in text)
    articles = _ARTICLES.get(lang, _ARTICLES["en"])
    return " ".join(w for w in text.split() if w not in articles)


def token_f1(prediction: str, gold: str, lang: str = "en") -> float:
    """Bag-of-tokens F1 after normalisation (1.0 when both are empty)."""
    pred = normalize_answer(prediction, lang).split()
    ref = normalize_answer(gold, lang).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str, lang: str = "en") -> float:
    """SQuAD exact match: 1.0 when the normalised prediction equals the normalised gold answer."""
    return float(normalize_answer(prediction, lang) == normalize_answer(gold, lang))


def contains_gold(prediction: str, gold: str, lang: str = "en") -> float:
    """1.0 when the normalised gold answer occurs, on token boundaries, in the normalised prediction."""
    ref = normalize_answer(gold, lang)
    if not ref:
        return 0.0
    return float(f" {ref} " in f" {normalize_answer(prediction, lang)} ")


_SCORE = re.compile(r'"score"\s*:\s*"?(0(?:\.5)?|1(?:\.0)?|0\.0)"?')


def parse_judge_score(text: str) -> float | None:
    """The judge's {"score": 0|0.5|1}; None when the reply holds no valid score."""
    match = re.search(r"\{.*\}", text, re.DOTALL)
    if match:
        try:
            value = json.loads(match.group(0)).get("score")
            if isinstance(value, int | float | str) and float(value) in (0.0, 0.5, 1.0):
                return float(value)
        except (ValueError, AttributeError):
            pass
    found = _SCORE.search(text)
    return float(found.group(1)) if found else None


class LLMJudge:
    """Answer relevance graded by an LLM with ``prompts/judge.j2`` (paper's Fig. 8 idea)."""

    def __init__(self, llm: LLM, prompts: PromptLibrary) -> None:
        self.llm = llm
        self.prompts = prompts

    async def score(self, question: str, gold: str, answer: str) -> float | None:
        """0, 0.5 or 1; None when the endpoint fails or replies with no score (counted as missing)."""
        messages = self.prompts.render("judge", question=question, gold=gold, answer=answer)
        try:
            out = await self.llm.complete(messages, role="judge", max_tokens=80, temperature=0.0)
        except RemoteError:
            return None
        return parse_judge_score(out[0] if out else "")


# ---------------------------------------------------------------- engine for evals


async def eval_engine(settings: PipelineSettings, *, index: Index, embedder: Embedder, sparse: SparseEncoder,
                      store_path: Path, llm: LLM | None = None, documents_key: str | None = None) -> Engine:
    """The production composition over the eval index, with a throwaway store so evals never mix
    their turns into the bot's history (``documents_key``: the eval index's, for its keyword expander)."""
    from pipeline.answer.engine import Engine
    from pipeline.evaluation.index_cache import eval_expander
    from pipeline.factory import engine_options, make_llm_from, make_reranker_from
    from pipeline.store import Store

    return Engine(
        index=index,
        embedder=embedder,
        sparse=sparse,
        store=await Store.open(store_path),
        prompts=PromptLibrary(settings.answer.resolved_prompts_dir),
        retrieval=settings.retrieval,
        llm=llm if llm is not None else make_llm_from(settings),
        reranker=make_reranker_from(settings, embedder),
        options=engine_options(settings),
        expander=eval_expander(settings, documents_key, embedder, sparse) if documents_key else None,
    )


def temp_store_path() -> Path:
    """A fresh SQLite path for one eval run (the directory is left to the OS temp cleaner)."""
    return Path(tempfile.mkdtemp(prefix="evident-eval-")) / "eval.db"


# ---------------------------------------------------------------- the run


@dataclass
class AnswerResult:
    lang: str
    conv_id: str
    turn: int
    source: str
    q_type: str
    question: str
    completed_question: str
    answer: str
    gold: str
    f1: float
    containment: float
    exact: float
    out_of_scope: bool  # the engine answered "cannot be found" (failed turns count in ``error`` instead)
    p_at_10: float  # a gold URL is among the evidence shown to the generator
    judge: float | None
    latency_ms: float
    error: str | None = None
    # faithfulness, answer relevancy, context precision / recall (``--ragas``)
    ragas: RagasScores | None = None
    # where the shown answer is not the model's (the draft guard, quotes beneath): its own reply and scores
    model_reply: str | None = None
    model_f1: float | None = None
    model_containment: float | None = None
    draft: str | None = None  # ``draft`` style: the quote the model was given (``AnswerTrace.draft``)
    quoted_beneath: int = 0  # the draft's units quoted beneath the model's answer (``AnswerTrace``)


async def run_answer_eval(
    conversations: Sequence[Sequence[QATurn]],
    engine: Engine,
    *,
    langs: Sequence[str] = ("en", "de"),
    judge: LLMJudge | None = None,
    concurrency: int = 1,
    run_id: str = "eval",
    ragas: RagasJudge | None = None,
) -> list[AnswerResult]:
    """Ask every turn of every conversation in order; conversations run ``concurrency`` at a time. ``ragas``
    scores each answer against the evidence shown to the generator and the gold answer."""
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(lang: str, conv: Sequence[QATurn]) -> list[AnswerResult]:
        async with gate:
            key = f"{run_id}:{lang}:{conv[0].conv_id}"
            return [
                await _answer_turn(engine, key, turn, lang, judge, ragas) for turn in conv if lang in turn.q
            ]

    batches = await asyncio.gather(*(one(lang, conv) for lang in langs for conv in conversations))
    return [r for batch in batches for r in batch]


async def _answer_turn(engine: Engine, key: str, turn: QATurn, lang: str, judge: LLMJudge | None,
                       ragas: RagasJudge | None) -> AnswerResult:
    t = time.perf_counter()
    result = await engine.ask(key, turn.q[lang], scope=EVERYTHING)
    latency = (time.perf_counter() - t) * 1000
    text = "" if result.error else result.answer.text
    rank = first_hit_rank([h.evidence.url for h in result.answer.evidence][:10], turn.gold_urls)
    score = metrics = None
    if judge is not None and not result.error:
        score = await judge.score(turn.completed[lang], turn.answer, text)
    if ragas is not None and not result.error:
        shown = [h.evidence.text for h in result.answer.evidence]
        metrics = await ragas.score(turn.completed[lang], text, turn.answer, shown)
    return AnswerResult(
        lang=lang, conv_id=turn.conv_id, turn=turn.turn, source=turn.source, q_type=turn.q_type,
        question=turn.q[lang], completed_question=result.completed_question, answer=text, gold=turn.answer,
        f1=token_f1(text, turn.answer, lang), containment=contains_gold(text, turn.answer, lang),
        exact=exact_match(text, turn.answer, lang), out_of_scope=bool(result.answer.out_of_scope),
        p_at_10=1.0 if rank is not None else 0.0, judge=score, latency_ms=latency, error=result.error,
        ragas=metrics, **_model_reply(result.answer.trace.model_reply, turn.answer, lang),
        draft=result.answer.trace.draft, quoted_beneath=result.answer.trace.quoted_beneath,
    )


def _model_reply(reply: str | None, gold: str, lang: str) -> dict[str, Any]:
    """The model's own reply where the draft guard replaced it, scored like an answer."""
    if not reply:
        return {}
    return {"model_reply": reply, "model_f1": token_f1(reply, gold, lang),
            "model_containment": contains_gold(reply, gold, lang)}


def _mean(xs: Sequence[float]) -> float:
    return round(sum(xs) / len(xs), 4) if xs else 0.0


def _answer_row(results: Sequence[AnswerResult], **keys: object) -> dict[str, Any]:
    judged = [r.judge for r in results if r.judge is not None]
    lat = [r.latency_ms for r in results]
    return {
        **keys,
        "n": len(results),
        "f1": _mean([r.f1 for r in results]),
        "containment": _mean([r.containment for r in results]),
        "exact_match": _mean([r.exact for r in results]),
        "out_of_scope_rate": _mean([float(r.out_of_scope) for r in results]),
        "p_at_10": _mean([r.p_at_10 for r in results]),
        # the draft guard: turns where it showed the quote; turns with quotes beneath the model's answer; and
        # the same run scored with the model's own replies
        "draft_shown": sum(r.model_reply is not None and not r.quoted_beneath for r in results),
        "quoted_beneath": sum(r.quoted_beneath > 0 for r in results),
        "f1_without_guard": _mean([r.f1 if r.model_f1 is None else r.model_f1 for r in results]),
        "containment_without_guard": _mean(
            [r.containment if r.model_containment is None else r.model_containment for r in results]),
        "judge": _mean(judged) if judged else None,
        "latency_ms_p50": round(percentile(lat, 50), 2),
        "latency_ms_p95": round(percentile(lat, 95), 2),
        **_ragas_means(results),
    }


def _ragas_means(results: Sequence[AnswerResult]) -> dict[str, float | None]:
    """Mean of each RAGAS-style metric over the turns that have it (none: the run did not ask for them)."""
    scored = [r.ragas for r in results if r.ragas is not None]
    if not scored:
        return {}
    out: dict[str, float | None] = {}
    for metric in METRICS:
        values = [v for s in scored if (v := s.get(metric)) is not None]
        out[metric] = _mean(values) if values else None
    return out


def summarize_answers(results: Sequence[AnswerResult], *, config: dict[str, Any] | None = None,
                      by: Sequence[str] = ()) -> dict[str, Any]:
    """``{"config", "rows": [one per lang]}``, plus ``breakdowns`` by source/type when asked.

    A failed turn (LLM down) scores 0 everywhere and is counted in ``config["turn_errors"]``.
    """
    groups: dict[str, list[AnswerResult]] = defaultdict(list)
    for r in results:
        groups[r.lang].append(r)
    cfg = {**(config or {}), "turn_errors": sum(r.error is not None for r in results)}
    report: dict[str, Any] = {
        "config": cfg,
        "rows": [_answer_row(rs, lang=lang) for lang, rs in groups.items()],
    }
    breakdowns: dict[str, list[dict[str, Any]]] = {}
    for dim in by:
        sub: dict[tuple[str, str], list[AnswerResult]] = defaultdict(list)
        for r in results:
            sub[(r.lang, r.source if dim == "source" else r.q_type)].append(r)
        breakdowns[dim] = [_answer_row(rs, lang=lang, group=g) for (lang, g), rs in sorted(sub.items())]
    if breakdowns:
        report["breakdowns"] = breakdowns
    return report


def format_answer_table(report: dict[str, Any]) -> str:
    head = (f"{'lang':<6}{'n':>5}{'EM':>7}{'F1':>8}{'contain':>9}{'OOS':>7}{'P@10':>7}{'judge':>7}"
            f"{'p50 ms':>9}{'p95 ms':>9}")
    lines = [head]
    for r in report["rows"]:
        judge = "-" if r["judge"] is None else f"{r['judge']:.3f}"
        lines.append(
            f"{r['lang']:<6}{r['n']:>5}{r['exact_match']:>7.3f}{r['f1']:>8.3f}{r['containment']:>9.3f}"
            f"{r['out_of_scope_rate']:>7.3f}{r['p_at_10']:>7.3f}{judge:>7}"
            f"{r['latency_ms_p50']:>9.1f}{r['latency_ms_p95']:>9.1f}"
        )
    if any("faithfulness" in r for r in report["rows"]):
        lines.append(f"\n{'lang':<6}{'faithful':>10}{'relevancy':>11}{'ctx prec':>10}{'ctx rec':>9}")
        for r in report["rows"]:
            cells = [("-" if r[m] is None else f"{r[m]:.3f}") for m in METRICS]
            lines.append(f"{r['lang']:<6}{cells[0]:>10}{cells[1]:>11}{cells[2]:>10}{cells[3]:>9}")
    for dim, rows in (report.get("breakdowns") or {}).items():
        lines.append(f"\nby {dim}:")
        for r in rows:
            lines.append(
                f"  {r['lang']:<4}{r['group']!s:<10}{r['n']:>5}{r['f1']:>8.3f}{r['containment']:>9.3f}"
                f"{r['out_of_scope_rate']:>7.3f}{r['p_at_10']:>7.3f}"
            )
    return "\n".join(lines)
