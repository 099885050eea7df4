"""The conversation engine: the one place where the small stages are composed into a turn.

ask:     history -> question completion -> retrieval -> context budget -> answer -> citations -> store
explain: stored turn -> the same evidence -> counterfactual attribution -> cache in the store

Shared by the CLI and the Slack bot. Every failure becomes a stored turn with a short user-facing
``error``, never an exception the caller has to translate.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from pipeline.answer.budget import fit_evidence
from pipeline.answer.citations import CitingStream, is_out_of_scope, parse_citations
from pipeline.answer.confidence import adaptive_hits
from pipeline.answer.extractive import extractive_answer_dense
from pipeline.answer.followups import suggest_followups
from pipeline.answer.prompts import ANSWER_TEMPLATES, OUT_OF_SCOPE, PromptLibrary, answer_stream, final_answer
from pipeline.answer.query_builder import (
    PriorTurn,
    QueryPlan,
    backfilled_turns,
    clean_question,
    plan_query,
)
from pipeline.answer.results import NOTHING_TO_EXPLAIN, ClusterShare, ExplainResult, TurnResult
from pipeline.answer.retrieve import retrieve
from pipeline.answer.settings import RetrievalSettings
from pipeline.attribution import AttributionResult, attribute
from pipeline.attribution.counterfactual import NEEDS_PROMPT_LOGPROBS
from pipeline.attribution.render import render_text
from pipeline.errors import (
    ConfigError,
    EvidentError,
    InputError,
    RemoteError,
)
from pipeline.ingest.contextualize import contextualize, prompt_text
from pipeline.models.vocabulary import KeywordExpander
from pipeline.protocols import LLM, Embedder, Index, PromptScorer, Reranker, SparseEncoder
from pipeline.runtime.logcontext import new_turn_ref
from pipeline.runtime.metrics import Metrics, error_kind
from pipeline.runtime.user_messages import user_message
from pipeline.store import Store
from pipeline.turns import RetrievedRef, TurnRecord
from pipeline.types import Answer, ChatMessage, Evidence, Hit

log = logging.getLogger("evident.engine")
T = TypeVar("T")
TextSink = Callable[[str], Awaitable[None]]



@dataclass(frozen=True)
class EngineOptions:
    """What the engine does, built from the settings areas by ``pipeline.factory.engine_options`` (no defaults
    here: every default is declared once, in its settings area)."""

    query_strategy: str
    history_turns: int
    context_tokens: int
    answer_max_tokens: int
    attribution_method: str
    attribution_params: dict[str, float | int]
    trace: bool
    # The text each evidence's dense vector was built from at ingest. Attribution clusters on the same
    # text, so the embedding cache returns the indexed vectors instead of re-embedding at explain time.
    dense_context_items: tuple[str, ...] | None
    context_item_max_chars: int
    # The LLM endpoint can teacher-force (prompt log-probs); the logprob attribution method needs it.
    prompt_logprobs: bool
    raw_template: str
    confident_k: int  # evidence for the generator when retrieval is sure (0: all); pipeline.answer.confidence
    answer_style: str  # the answer prompt: plain | persona | cot (``pipeline.answer.prompts``)


class Engine:
    def __init__(
        self,
        *,
        index: Index,
        embedder: Embedder,
        sparse: SparseEncoder,
        store: Store,
        prompts: PromptLibrary,
        retrieval: RetrievalSettings,
        options: EngineOptions,
        llm: LLM | None = None,
        reranker: Reranker | None = None,
        metrics: Metrics | None = None,
        expander: KeywordExpander | None = None,
    ) -> None:
        self.index = index
        self.embedder = embedder
        self.sparse = sparse
        self.store = store
        self.prompts = prompts
        self.retrieval = retrieval
        self.llm = llm
        self.reranker = reranker
        self.expander = expander
        self.options = options
        self.metrics = metrics or Metrics()  # `evident serve` passes the one it exports on /metrics

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close what the engine owns: LLM client, store, index, embedder. Safe to call twice."""
        try:
            if self.llm is not None:
                await self.llm.close()
            await self.store.close()
        finally:
            try:
                await self.index.close()
            finally:
                await asyncio.to_thread(self.embedder.close)

    async def followups(self, result: TurnResult) -> list[str]:
        """Up to three questions a user might ask next (none for a failed or out-of-scope turn)."""
        a = result.answer
        done = not result.error and not a.out_of_scope and a.text.strip()
        return (
            await suggest_followups(self.llm, self.prompts, result.completed_question, a.text, a.citations)
            if done
            else []
        )

    async def evidence_count(self) -> int:
        """Evidence in the index (cheap: no page listing), for status views."""
        return await self.index.count()

    # ------------------------------------------------------------------ ask

    async def ask(
        self,
        conversation_key: str,
        question: str,
        *,
        user_id: str | None = None,
        spaces: tuple[str, ...] | None = None,
        history: Sequence[tuple[str, str]] | None = None,
        trace: bool | None = None,
        on_text: TextSink | None = None,
    ) -> TurnResult:
        """Answer ``question`` in ``conversation_key``; with ``on_text``, an LLM answer's raw text is handed
        over piece by piece as it is generated (the returned ``TurnResult`` has the final, cited answer)."""
        trace = self.options.trace if trace is None else trace
        new_turn_ref()
        t_start = time.perf_counter()
        self.metrics.questions.inc()
        question, notice = clean_question(question)
        prior = await self._prior_turns(conversation_key, history)
        plan = (plan_query(question, prior, strategy=self.options.query_strategy) if question
                else QueryPlan(question, question, question, followup=False))
        answer, retrieved, template, error = Answer(text=""), None, "", None
        timings: dict[str, float] = {}
        try:
            if not question:
                raise InputError("Please ask a question, for example: “Who is on call this week?”")
            plan = await self._timed(timings, "complete_ms", self._complete(plan, prior))
            retrieved = await retrieve(
                plan.retrieval_query, index=self.index, embedder=self.embedder, sparse=self.sparse,
                config=self.retrieval, reranker=self.reranker, spaces=spaces, trace=trace,
                context_pages=plan.context_pages, expander=self.expander,
            )
            timings.update({f"{k}_ms": v for k, v in retrieved.timings_ms.items()})
            hits = adaptive_hits(retrieved.hits, retrieved.confidence, self.options.confident_k)
            answer, template = await self._timed(
                timings, "answer_ms", self._answer(plan.completed, hits, trace=trace, on_text=on_text)
            )
            answer.confidence = retrieved.confidence
        except EvidentError as exc:
            log.warning("turn failed: %s: %s", type(exc).__name__, exc)
            error = user_message(exc)
        except Exception:
            log.exception("turn failed unexpectedly")
            error = user_message(RuntimeError())
        timings["total_ms"] = (time.perf_counter() - t_start) * 1000
        self.metrics.answer_seconds.observe(timings["total_ms"] / 1000)
        answer.trace.notice = notice
        answer.trace.timings_ms = timings
        shown = answer.evidence or (retrieved.hits if retrieved else [])
        turn_id = await self.store.add_turn(TurnRecord(
            conversation_key=conversation_key, user_id=user_id, question=question,
            completed_question=plan.completed, retrieval_query=plan.retrieval_query,
            retrieved=tuple(RetrievedRef.of(h) for h in shown), answer=answer.text,
            citations=tuple(answer.citations), out_of_scope=answer.out_of_scope, extractive=answer.extractive,
            model=answer.model, prompt_template=template,
            prompt_version=self.prompts.version(template) if template else None, timings=timings, error=error,
            raw_answer=answer.trace.raw_answer if answer.trace.raw_answer is not None else answer.text,
            notice=notice,
        ))
        return TurnResult(turn_id=turn_id, answer=answer, completed_question=plan.completed,
                          is_followup=plan.followup, error=error, retrieval=retrieved, notice=notice)

    @staticmethod
    async def _timed(timings: dict[str, float], name: str, work: Awaitable[T]) -> T:
        t = time.perf_counter()
        try:
            return await work
        finally:
            timings[name] = (time.perf_counter() - t) * 1000

    async def _prior_turns(
        self, conversation_key: str, history: Sequence[tuple[str, str]] | None
    ) -> list[PriorTurn]:
        turns = await self.store.history(conversation_key, limit=self.options.history_turns)
        prior = [
            PriorTurn(
                question=t.asked,
                retrieved_titles=tuple(r.title for r in t.retrieved[:3]),
                retrieved_pages=tuple(r.page_id for r in t.retrieved[:3]),
                answer=t.answer,
            )
            for t in turns
            if not t.error
        ]
        if not prior and history:
            prior = backfilled_turns(history)  # e.g. Slack messages from before evident was mentioned
        return prior[-self.options.history_turns :]

    async def _complete(self, plan: QueryPlan, prior: list[PriorTurn]) -> QueryPlan:
        """With an LLM, a follow-up is rewritten into a self-contained question used for both retrieval and
        the answer; without one (or when it fails) the no-LLM plan stands. Turn 1 is kept as asked."""
        if not prior or self.llm is None:
            return plan
        messages = self.prompts.render(
            "rephrase",
            history=[{"question": p.question, "answer": p.answer} for p in prior],
            question=plan.question,
        )
        try:
            out = await self._complete_llm(messages, role="completion", max_tokens=120, temperature=0.0)
        except RemoteError as exc:
            log.warning("question completion failed, using the no-LLM query builder: %s", exc)
            return plan
        completed = (out[0] if out else "").strip().strip('"').strip()
        return replace(plan, completed=completed, retrieval_query=completed) if completed else plan

    # ------------------------------------------------------------------ answer generation

    def _answer_messages(self, question: str, sources: Sequence[str]) -> list[ChatMessage]:
        """Instructions and question first, evidence last, so a server's prefix cache is reused."""
        return self.prompts.render(ANSWER_TEMPLATES[self.options.answer_style], question=question,
                                   sources=list(sources))

    def _fit(self, question: str, hits: Sequence[Hit]) -> tuple[list[Hit], list[str], list[str]]:
        """Fit ranked evidence into the context window; returns (hits, their prompt texts, dropped ids)."""
        budget = max(
            256, self.options.context_tokens - self.options.answer_max_tokens - 600 - len(question) // 3
        )
        items = [(h.evidence.id, prompt_text(h.evidence)) for h in hits]
        result = fit_evidence(items, budget_tokens=budget)
        by_id = {h.evidence.id: h for h in hits}
        return [by_id[i] for i, _ in result.kept], [t for _, t in result.kept], list(result.dropped)

    async def _answer(self, question: str, hits: Sequence[Hit], *, trace: bool = False,
                      on_text: TextSink | None = None) -> tuple[Answer, str]:
        if not hits:
            return Answer(text=OUT_OF_SCOPE, out_of_scope=True, model="none"), ""
        if self.llm is None:
            ans = await extractive_answer_dense(question, hits, self.embedder)
            ans.evidence = list(hits)
            return ans, ""
        kept, texts, dropped = self._fit(question, hits)
        messages = self._answer_messages(question, texts)
        # cot: only the answer after the reasoning is streamed; markers as shown at the end
        if on_text is not None:
            citing = CitingStream(kept, on_text)
            sink = answer_stream(citing.add) if self.options.answer_style == "cot" else citing.add
            raw = (await self._stream_llm(messages, sink)).strip()
            await citing.flush()
        else:
            out = await self._complete_llm(
                messages, role="answer", max_tokens=self.options.answer_max_tokens, temperature=0.0
            )
            raw = (out[0] if out else "").strip()
        raw = final_answer(raw, self.options.answer_style)
        if not raw:
            ans = Answer(text=OUT_OF_SCOPE, out_of_scope=True, model=self.llm.model_for("answer"))
            ans.trace.warning = "the language model returned an empty answer"
        else:
            text, citations = parse_citations(raw, kept)
            ans = Answer(
                text=text,
                citations=citations,
                out_of_scope=is_out_of_scope(raw),
                model=self.llm.model_for("answer"),
            )
        ans.evidence = kept
        ans.trace.raw_answer = raw
        ans.trace.dropped_for_budget = dropped
        if trace:
            ans.trace.prompt = list(messages)
        return ans, "answer"

    async def generate_from(self, question: str, hits: Sequence[Hit], m: int, max_tokens: int) -> list[str]:
        """Counterfactual generator for attribution: same prompt shape, a subset of the evidence."""
        if self.llm is None:
            return [(await extractive_answer_dense(question, hits, self.embedder)).text] * m
        if not hits:
            return [OUT_OF_SCOPE] * m
        _, texts, _ = self._fit(question, hits)
        messages = self._answer_messages(question, texts)
        temperature = 0.0 if m == 1 else 0.7
        if self.options.answer_style == "cot":  # the reasoning comes first: room for it, then the answer
            max_tokens += self.options.answer_max_tokens
        out = await self._complete_llm(messages, role="counterfactual", max_tokens=max_tokens,
                                       temperature=temperature, n=m)
        return [final_answer(text, self.options.answer_style) for text in out]

    async def score_from(self, question: str, hits: Sequence[Hit], answer: str) -> float:
        """Teacher-forced mean log-prob of ``answer`` given only ``hits``, in the answer prompt's shape."""
        if not self.options.prompt_logprobs or not isinstance(self.llm, PromptScorer):
            raise ConfigError(NEEDS_PROMPT_LOGPROBS)
        texts = self._fit(question, hits)[1] if hits else []
        prompt = self.prompts.render_raw(self.options.raw_template, self._answer_messages(question, texts))
        self.metrics.llm_calls.inc(role="score")
        return await self.llm.score_continuation(prompt, answer, role="counterfactual")

    async def _complete_llm(self, messages: Sequence[ChatMessage], *, role: str, **kwargs: Any) -> list[str]:
        """``llm.complete`` counted in ``metrics`` (calls by role, failures by kind)."""
        assert self.llm is not None
        return await self._counted(role, self.llm.complete(messages, role=role, **kwargs))

    async def _stream_llm(self, messages: Sequence[ChatMessage], on_text: TextSink) -> str:
        assert self.llm is not None
        return await self._counted(
            "answer",
            self.llm.stream(
                messages,
                on_text=on_text,
                role="answer",
                max_tokens=self.options.answer_max_tokens,
                temperature=0.0,
            ),
        )

    async def _counted(self, role: str, call: Awaitable[T]) -> T:
        """An LLM call counted in ``metrics`` (calls by role, failures by kind)."""
        self.metrics.llm_calls.inc(role=role)
        try:
            return await call
        except Exception as exc:
            self.metrics.llm_errors.inc(kind=error_kind(exc))
            raise

    # ------------------------------------------------------------------ explain

    async def explain(self, turn_id: int, *, method: str | None = None) -> ExplainResult:
        with self.metrics.explain_seconds.time():
            return await self._explain(turn_id, method=method)

    async def _explain(self, turn_id: int, *, method: str | None) -> ExplainResult:
        method = method or self.options.attribution_method
        params: dict[str, Any] = dict(self.options.attribution_params)
        params_hash = hashlib.sha1(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:12]
        turn = await self.store.get_turn(turn_id)
        if turn is None:
            raise InputError(f"no turn with id {turn_id}")
        cached = await self.store.get_attribution(turn_id, method, params_hash)
        if cached is not None:
            result = AttributionResult.from_dict(cached)
            return self._explain_result(turn_id, result, cached=True)
        if not turn.answered:
            return ExplainResult(turn_id, "There is no answer to explain for this turn.", [], False, False,
                                 error="no answer")
        if turn.out_of_scope:  # nothing in the wiki produced it: shares over the evidence would mean nothing
            return ExplainResult(turn_id, NOTHING_TO_EXPLAIN, [])
        ids = [r.evidence_id for r in turn.retrieved]
        evidence = await self.index.get(ids)
        if len(evidence) < len(ids):
            log.info("turn %s: %d of its evidence are no longer indexed", turn_id, len(ids) - len(evidence))
        # Same order as the generator saw, so [n] markers line up with the prompt (prompts are rebuilt from
        # the evidence). ``content`` is the text embedded at ingest, so clustering reuses the cached vectors.
        hits = [
            Hit(evidence=ev, score=0.0, rank=i + 1, content=self._cluster_text(ev))
            for i, ev in enumerate(evidence)
        ]
        question = turn.asked
        answer = turn.raw_answer or turn.answer
        max_tokens = max(32, int(len(answer) / 3.0) + 16)

        async def generate(subset: Sequence[Hit], m: int) -> list[str]:
            return await self.generate_from(question, subset, m, max_tokens)

        result = await attribute(
            method,
            question=question,
            answer=answer,
            hits=hits,
            generate=generate,
            embedder=self.embedder,
            params=self.attribution_params_for(question, params),
        )
        await self.store.put_attribution(turn_id, method, params_hash, result.to_dict())
        return self._explain_result(turn_id, result, cached=False)

    def attribution_params_for(self, question: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """The attribution params plus, where the endpoint can teacher-force, the logprob scorer.

        Added after the params hash is taken: a callable has no stable hash.
        """
        out = dict(self.options.attribution_params if params is None else params)
        if self.options.prompt_logprobs and self.llm is not None:

            async def score(subset: Sequence[Hit], text: str) -> float:
                return await self.score_from(question, subset, text)

            out["score"] = score
        return out

    def _cluster_text(self, ev: Evidence) -> str:
        items = self.options.dense_context_items
        if items is None:
            return prompt_text(ev)
        return contextualize(ev, items, self.options.context_item_max_chars)

    @staticmethod
    def _explain_result(turn_id: int, result: AttributionResult, *, cached: bool) -> ExplainResult:
        shares = [
            ClusterShare(
                percent=c.percent,
                evidence_titles=[m.title for m in c.members],
                urls=list(dict.fromkeys(m.url for m in c.members)),
                size=len(c.members),
            )
            for c in result.clusters
        ]
        return ExplainResult(turn_id, render_text(result), shares, cached, result.partial, result)
