"""Answers from evidence: the prompt in its context budget, the LLM (or the extractive answerer offline), the
citations, and the same generation over a subset of the evidence for attribution's counterfactuals.

Every LLM call is counted in ``Metrics`` (calls by role, failures by kind).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from pipeline.answer.budget import fit_evidence
from pipeline.answer.citations import CitingStream, is_out_of_scope, parse_citations
from pipeline.answer.draft_guard import keeps_draft
from pipeline.answer.draft_quotes import left_out_units, with_quotes
from pipeline.answer.extractive import extractive_answer_dense
from pipeline.answer.prompts import ANSWER_TEMPLATES, OUT_OF_SCOPE, PromptLibrary, answer_stream, final_answer
from pipeline.attribution.counterfactual import NEEDS_PROMPT_LOGPROBS
from pipeline.errors import ConfigError
from pipeline.ingest.contextualize import prompt_text
from pipeline.protocols import LLM, Embedder, PromptScorer
from pipeline.runtime.metrics import Metrics, error_kind
from pipeline.types import Answer, ChatMessage, Hit

if TYPE_CHECKING:
    from pipeline.answer.options import EngineOptions

T = TypeVar("T")
_POSITION_MARK = re.compile(r"\[(\d+)\]")
TextSink = Callable[[str], Awaitable[None]]
RetrievedSink = Callable[[Sequence[Hit]], Awaitable[None]]  # the evidence an answer is written from


class Generator:
    def __init__(self, *, llm: LLM | None, prompts: PromptLibrary, embedder: Embedder, options: EngineOptions,
                 metrics: Metrics) -> None:
        self.llm = llm
        self.prompts = prompts
        self.embedder = embedder
        self.options = options
        self.metrics = metrics

    def messages(self, question: str, sources: Sequence[str], draft: str = "") -> list[ChatMessage]:
        """Instructions and question first, evidence last, so a server's prefix cache is reused."""
        return self.prompts.render(ANSWER_TEMPLATES[self.options.answer_style], question=question,
                                   sources=list(sources), draft=draft)

    async def draft(self, question: str, kept: Sequence[Hit]) -> str:
        """For the ``draft`` style: the extractive answer over the prompt's sources, cited ``[Source n]`` as
        the model is asked to cite ("" for the other styles, or when nothing matched)."""
        if self.options.answer_style != "draft" or not kept:
            return ""
        quoted = await extractive_answer_dense(question, kept, self.embedder)
        if quoted.out_of_scope or not quoted.trace.raw_answer:
            return ""
        return _POSITION_MARK.sub(r"[Source \1]", quoted.trace.raw_answer)

    def fit(self, question: str, hits: Sequence[Hit]) -> tuple[list[Hit], list[str], list[str]]:
        """Fit ranked evidence into the context window; returns (hits, their prompt texts, dropped ids)."""
        opts = self.options
        budget = max(256, opts.context_tokens - opts.answer_max_tokens - 600 - len(question) // 3)
        items = [(h.evidence.id, prompt_text(h.evidence)) for h in hits]
        result = fit_evidence(items, budget_tokens=budget)
        by_id = {h.evidence.id: h for h in hits}
        return [by_id[i] for i, _ in result.kept], [t for _, t in result.kept], list(result.dropped)

    async def answer(self, question: str, hits: Sequence[Hit], *, trace: bool = False,
                     on_text: TextSink | None = None) -> tuple[Answer, str]:
        """The cited answer from ``hits`` and the template it used ("" when none); with ``on_text`` the answer
        streams as it is generated, with the markers the final answer shows (a ``cot`` reasoning is held
        back)."""
        if not hits:
            return Answer(text=OUT_OF_SCOPE, out_of_scope=True, model="none"), ""
        if self.llm is None:
            ans = await extractive_answer_dense(question, hits, self.embedder)
            ans.evidence = list(hits)
            return ans, ""
        kept, texts, dropped = self.fit(question, hits)
        draft = await self.draft(question, kept)
        messages = self.messages(question, texts, draft)
        reply = final_answer(await self._generate(messages, kept, on_text), self.options.answer_style)
        model = self.llm.model_for("answer")
        quoted = keeps_draft(reply, question, draft, texts)  # the model dropped the quote: shown instead
        raw, beneath = (draft, 0) if quoted else self.with_quotes(reply, question, draft, texts)
        if not raw:
            ans = Answer(text=OUT_OF_SCOPE, out_of_scope=True, model=model)
            ans.trace.warning = "the language model returned an empty answer"
        else:
            text, citations = parse_citations(raw, kept)
            ans = Answer(text=text, citations=citations, out_of_scope=is_out_of_scope(raw), model=model)
        ans.evidence = kept
        ans.trace.raw_answer = raw
        ans.trace.dropped_for_budget = dropped
        ans.trace.draft = draft or None
        ans.trace.quoted_beneath = beneath
        if beneath:
            ans.trace.model_reply = ans.trace.explained = reply
        if quoted:  # replacing what was streamed
            said = "the model's answer said less than the quoted draft" if reply else (
                "the language model returned an empty answer")
            ans.trace.warning = f"{said}; the quoted draft is shown"
            ans.trace.model_reply = reply
        if trace:
            ans.trace.prompt = list(messages)
        return ans, "answer"

    async def _generate(
        self, messages: list[ChatMessage], kept: Sequence[Hit], on_text: TextSink | None
    ) -> str:
        assert self.llm is not None
        if on_text is None:
            out = await self.complete(messages, role="answer", max_tokens=self.options.answer_max_tokens,
                                      temperature=0.0)
            return (out[0] if out else "").strip()
        citing = CitingStream(kept, on_text)
        sink = answer_stream(citing.add) if self.options.answer_style == "cot" else citing.add
        raw = await self._counted(
            "answer",
            self.llm.stream(
                messages,
                on_text=sink,
                role="answer",
                max_tokens=self.options.answer_max_tokens,
                temperature=0.0,
            ),
        )
        await citing.flush()
        return raw.strip()

    async def generate_from(self, question: str, hits: Sequence[Hit], m: int, max_tokens: int) -> list[str]:
        """Counterfactual generator for attribution: the answer's prompt and guard, a subset of evidence."""
        if self.llm is None:
            return [(await extractive_answer_dense(question, hits, self.embedder)).text] * m
        if not hits:
            return [OUT_OF_SCOPE] * m
        kept, texts, _ = self.fit(question, hits)
        draft = await self.draft(question, kept)
        messages = self.messages(question, texts, draft)
        temperature = 0.0 if m == 1 else 0.7
        if self.options.answer_style == "cot":  # the reasoning comes first: room for it, then the answer
            max_tokens += self.options.answer_max_tokens
        out = await self.complete(messages, role="counterfactual", max_tokens=max_tokens,
                                  temperature=temperature, n=m)
        answers = [final_answer(text, self.options.answer_style) for text in out]
        # the answer's own procedure: where the model dropped this subset's quote, the quote (units quoted
        # beneath a rewrite are not regenerated: explanations are of the model's words, ``trace.explained``)
        return [draft if keeps_draft(a, question, draft, texts) else a for a in answers]

    def with_quotes(self, reply: str, question: str, draft: str, sources: Sequence[str]) -> tuple[str, int]:
        """``reply`` (written from ``sources``) with the units of ``draft`` it leaves out quoted beneath it
        (``answer_quotes``), and how many; ``(reply, 0)`` without a draft or with the quotes off."""
        if not (draft and self.options.answer_quotes) or is_out_of_scope(reply):
            return reply, 0
        units = left_out_units(reply, question, draft, sources)
        return with_quotes(reply, units), len(units)

    async def score_from(self, question: str, hits: Sequence[Hit], answer: str) -> float:
        """Teacher-forced mean log-prob of ``answer`` given only ``hits``, in the answer prompt's shape."""
        if not self.options.prompt_logprobs or not isinstance(self.llm, PromptScorer):
            raise ConfigError(NEEDS_PROMPT_LOGPROBS)
        kept, texts, _ = self.fit(question, hits) if hits else ([], [], [])
        messages = self.messages(question, texts, await self.draft(question, kept))
        prompt = self.prompts.render_raw(self.options.raw_template, messages)
        self.metrics.llm_calls.inc(role="score")
        return await self.llm.score_continuation(prompt, answer, role="counterfactual")

    async def complete(self, messages: Sequence[ChatMessage], *, role: str, **kwargs: Any) -> list[str]:
        """``llm.complete``, counted."""
        assert self.llm is not None
        return await self._counted(role, self.llm.complete(messages, role=role, **kwargs))

    async def _counted(self, role: str, call: Awaitable[T]) -> T:
        self.metrics.llm_calls.inc(role=role)
        try:
            return await call
        except Exception as exc:
            self.metrics.llm_errors.inc(kind=error_kind(exc))
            raise
