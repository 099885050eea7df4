"""The conversation engine: the one place where the small stages are composed into a turn.

ask:     history -> question completion -> retrieval -> context budget -> answer -> citations -> store
explain: stored turn -> the same evidence -> counterfactual attribution -> cache in the store

Shared by the CLI and the Slack bot. Every failure becomes a stored turn with a short user-facing
``error``, never an exception the caller has to translate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from pipeline.access.scope import AccessScope
from pipeline.answer.completion import complete_question
from pipeline.answer.confidence import adaptive_hits
from pipeline.answer.explainer import Explainer
from pipeline.answer.followups import suggest_followups
from pipeline.answer.generator import Generator, RetrievedSink, TextSink
from pipeline.answer.options import EngineOptions
from pipeline.answer.prompts import PromptLibrary
from pipeline.answer.query_builder import PriorTurn, QueryPlan, backfilled_turns, clean_question, plan_query
from pipeline.answer.results import ExplainResult, TurnResult
from pipeline.answer.retrieve import Retrieval, retrieve_fused
from pipeline.answer.settings import RetrievalSettings
from pipeline.errors import EvidentError, InputError
from pipeline.models.vocabulary import KeywordExpander
from pipeline.protocols import LLM, Embedder, Index, Reranker, SparseEncoder
from pipeline.runtime.foreground import Foreground
from pipeline.runtime.logcontext import new_turn_ref
from pipeline.runtime.metrics import Metrics
from pipeline.runtime.user_messages import user_message
from pipeline.store import Store
from pipeline.turns import RetrievedRef, TurnRecord
from pipeline.types import Answer

log = logging.getLogger("evident.engine")
T = TypeVar("T")



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
        self.foreground = Foreground()  # a sync beside the engine steps aside while questions are retrieved
        self.options = options
        self.metrics = metrics or Metrics()  # `evident serve` passes the one it exports on /metrics
        self.generator = Generator(llm=llm, prompts=prompts, embedder=embedder, options=options,
                                   metrics=self.metrics)
        self.explainer = Explainer(store=store, index=index, embedder=embedder, generator=self.generator,
                                   options=options)

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

    async def visible(self, evidence_ids: Sequence[str], scope: AccessScope) -> set[str]:
        """Those of ``evidence_ids`` that ``scope`` may see (e.g. the pages behind suggested prompts)."""
        return {ev.id for ev in await self.index.get(list(evidence_ids), scope)}

    async def evidence_count(self) -> int:
        """Evidence in the index (cheap: no page listing), for status views."""
        return await self.index.count()

    # ------------------------------------------------------------------ ask

    async def ask(
        self,
        conversation_key: str,
        question: str,
        *,
        scope: AccessScope,
        user_id: str | None = None,
        history: Sequence[tuple[str, str]] | None = None,
        trace: bool | None = None,
        on_text: TextSink | None = None,
        on_retrieved: RetrievedSink | None = None,
    ) -> TurnResult:
        """Answer ``question`` in ``conversation_key`` from what ``scope`` may see; with ``on_text``, the
        answer's text is handed over piece by piece as it is generated (the returned ``TurnResult`` has the
        final, cited answer); ``on_retrieved`` is handed the evidence the answer will be written from, before
        it is (a platform shows what was read). Earlier turns of the conversation count as memory only where
        ``scope`` may see all the evidence they showed."""
        trace = self.options.trace if trace is None else trace
        new_turn_ref()
        t_start = time.perf_counter()
        self.metrics.questions.inc()
        question, notice = clean_question(question)
        prior = await self._prior_turns(conversation_key, history, scope)
        plan = (plan_query(question, prior, strategy=self.options.query_strategy) if question
                else QueryPlan(question, question, question, followup=False))
        turn = _Turn(plan)
        try:
            if not question:
                raise InputError("Please ask a question, for example: “Who is on call this week?”")
            await self._answer_turn(
                turn, prior, scope, trace=trace, on_text=on_text, on_retrieved=on_retrieved
            )
        except EvidentError as exc:
            log.warning("turn failed: %s: %s", type(exc).__name__, exc)
            turn.error = user_message(exc)
        except Exception:
            log.exception("turn failed unexpectedly")
            turn.error = user_message(RuntimeError())
        turn.timings["total_ms"] = (time.perf_counter() - t_start) * 1000
        self.metrics.answer_seconds.observe(turn.timings["total_ms"] / 1000)
        turn_id = await self._record(conversation_key, user_id, question, notice, turn)
        return TurnResult(
            turn_id=turn_id,
            answer=turn.answer,
            completed_question=turn.plan.completed,
            is_followup=turn.plan.followup,
            error=turn.error,
            retrieval=turn.retrieved,
            notice=notice,
        )

    async def _answer_turn(self, turn: _Turn, prior: list[PriorTurn], scope: AccessScope, *,
                           trace: bool, on_text: TextSink | None, on_retrieved: RetrievedSink | None) -> None:
        """Complete the question, retrieve, answer: into ``turn`` (which keeps what was done when one
        fails)."""
        turn.plan = await self._timed(turn.timings, "complete_ms", self._complete(turn.plan, prior))
        queries = turn.plan.retrieval_queries(self.options.followup_retrieval)
        turn.plan = replace(turn.plan, retrieval_query=" | ".join(dict.fromkeys(queries)))  # as recorded
        async with self.foreground.answering():
            turn.retrieved = await retrieve_fused(
                queries, index=self.index,
                embedder=self.embedder, sparse=self.sparse, config=self.retrieval, reranker=self.reranker,
                scope=scope, trace=trace, context_pages=turn.plan.context_pages, expander=self.expander,
            )
        turn.timings.update({f"{k}_ms": v for k, v in turn.retrieved.timings_ms.items()})
        hits = adaptive_hits(turn.retrieved.hits, turn.retrieved.confidence, self.options.confident_k)
        if on_retrieved is not None and hits:
            try:
                await on_retrieved(hits)
            except Exception:
                log.warning("showing the retrieved evidence failed", exc_info=True)
        # an extractive answer is CPU work here too; a model's is the model server's
        async with self.foreground.answering() if self.llm is None else contextlib.nullcontext():
            turn.answer, turn.template = await self._timed(
                turn.timings,
                "answer_ms",
                self.generator.answer(turn.plan.completed, hits, trace=trace, on_text=on_text),
            )
        turn.answer.confidence = turn.retrieved.confidence

    async def _record(self, conversation_key: str, user_id: str | None, question: str, notice: str | None,
                      turn: _Turn) -> int:
        answer = turn.answer
        answer.trace.notice = notice
        answer.trace.timings_ms = turn.timings
        shown = answer.evidence or (turn.retrieved.hits if turn.retrieved else [])
        return await self.store.add_turn(
            TurnRecord(
                conversation_key=conversation_key,
                user_id=user_id,
                question=question,
                completed_question=turn.plan.completed,
                retrieval_query=turn.plan.retrieval_query,
                retrieved=tuple(RetrievedRef.of(h) for h in shown),
                answer=answer.text,
                citations=tuple(answer.citations),
                out_of_scope=answer.out_of_scope,
                extractive=answer.extractive,
                model=answer.model,
                prompt_template=turn.template,
                prompt_version=self.prompts.version(turn.template) if turn.template else None,
                timings=turn.timings,
                error=turn.error,
                raw_answer=answer.trace.raw_answer if answer.trace.raw_answer is not None else answer.text,
                explained_answer=answer.trace.explained or "",
                notice=notice,
            )
        )

    @staticmethod
    async def _timed(timings: dict[str, float], name: str, work: Awaitable[T]) -> T:
        t = time.perf_counter()
        try:
            return await work
        finally:
            timings[name] = (time.perf_counter() - t) * 1000

    async def _prior_turns(
        self, conversation_key: str, history: Sequence[tuple[str, str]] | None, scope: AccessScope
    ) -> list[PriorTurn]:
        turns = await self.store.history(conversation_key, limit=self.options.history_turns)
        if scope.per_user:  # memory never carries evidence to readers who may not see it
            visible = await self.visible([r.evidence_id for t in turns for r in t.retrieved], scope)
            turns = [t for t in turns if all(r.evidence_id in visible for r in t.retrieved)]
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
        """With an LLM, a follow-up is rewritten into a self-contained question, the one answered (what it
        is retrieved with is ``EVIDENT_FOLLOWUP_RETRIEVAL``: by default the no-LLM query); without one (or
        when it fails) the no-LLM plan stands. Turn 1 is kept as asked."""
        if not prior or self.llm is None:
            return plan
        completed = await complete_question(self.generator, self.prompts, plan.question, prior)
        return replace(plan, completed=completed, retrieval_query=completed) if completed else plan

    # ------------------------------------------------------------------ explain

    async def explain(self, turn_id: int, *, scope: AccessScope, method: str | None = None) -> ExplainResult:
        """Explain a stored turn to ``scope``: only where it may see every evidence the answer was built
        from (the explanation regenerates from them and quotes them)."""
        with self.metrics.explain_seconds.time():
            return await self.explainer.explain(turn_id, scope=scope, method=method)


@dataclass
class _Turn:
    """One turn as it is answered: what is known so far when a stage fails."""

    plan: QueryPlan
    answer: Answer = field(default_factory=lambda: Answer(text=""))
    retrieved: Retrieval | None = None
    template: str = ""
    error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
