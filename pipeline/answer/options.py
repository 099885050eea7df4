"""What the engine does (``EngineOptions``), built from the settings areas by the factory."""

from __future__ import annotations

from dataclasses import dataclass


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
    answer_style: str  # the answer prompt: plain | persona | cot | draft (``pipeline.answer.prompts``)
    answer_quotes: bool  # draft style: the units a rewrite leaves out quoted beneath it (``draft_quotes``)
    followup_retrieval: str  # with an LLM: fused | completed | builder (``QueryPlan.retrieval_queries``)
