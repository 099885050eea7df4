"""The answer areas: how evidence is retrieved (``RetrievalSettings``, what ``retrieve`` takes) and how a turn
is answered (``AnswerSettings``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pipeline.runtime.config import Area, Lower, OptionalPath, setting


class RetrievalSettings(Area):
    title = "Retrieval"

    mode: Annotated[Literal["lexical", "dense", "hybrid"], Lower] = setting(
        "hybrid", "EVIDENT_RETRIEVAL_MODE", "lexical | dense | hybrid.")
    lexical_k: int = setting(30, "EVIDENT_LEXICAL_K", "Lexical candidates before fusion (paper: 10).", ge=1)
    dense_k: int = setting(30, "EVIDENT_DENSE_K", "Dense candidates before fusion (paper: 10).", ge=1)
    final_k: int = setting(10, "EVIDENT_FINAL_K", "Evidence after fusion/reranking.", ge=1)
    rrf_k: int = setting(60, "EVIDENT_RRF_K", "RRF constant.", ge=1)
    fusion: Annotated[Literal["rrf", "dbsf"], Lower] = setting(
        "dbsf",
        "EVIDENT_FUSION",
        "Hybrid fusion: dbsf (score pooling: each leg's scores normalized to mean ± 3 sd, "
        "summed; dev P@1 +0.033, chosen on either half) | rrf (ranks).",
    )
    hub_weight: float = setting(
        0.0,
        "EVIDENT_HUB_WEIGHT",
        "Graph reranking: a hit gains this x its mean lexical "
        "similarity to the other retrieved evidence (0 = off).",
        ge=0,
    )
    adaptive_min_k: int = setting(
        0,
        "EVIDENT_ADAPTIVE_K",
        "Adaptive k: cut the evidence at the steepest drop of "
        "the score curve, keeping at least this many (0 = always EVIDENT_FINAL_K).",
        ge=0,
    )
    continuity_boost: float = setting(
        0.5,
        "EVIDENT_CONTINUITY_BOOST",
        "Follow-ups: boost evidence of the page the previous turn retrieved (0 = off).",
        ge=0,
    )
    rescore_pool: int = setting(
        30,
        "EVIDENT_RESCORE_POOL",
        "Fused candidates rescored by continuity and graph reranking before the final cut.",
        ge=1,
    )
    fused_query_weight: float = setting(
        1.0,
        "EVIDENT_FUSED_QUERY_WEIGHT",
        "Follow-ups with an LLM (EVIDENT_FOLLOWUP_RETRIEVAL=fused): how much the completed question's "
        "ranking counts against the no-LLM query's (1) when the two are fused (0: the no-LLM query decides).",
        ge=0,
    )
    rerank_pool: int = setting(20, "EVIDENT_RERANK_POOL", "Fused candidates handed to the reranker.", ge=1)
    confidence: bool = setting(
        True,
        "EVIDENT_CONFIDENCE",
        "Check whether the keyword and meaning searches agree "
        "on the top page (one extra top-1 search each; a note under unsure answers).",
    )
    keep_firsts: bool = setting(
        True,
        "EVIDENT_KEEP_FIRSTS",
        "Hybrid search without a reranker: each ranker's first evidence is among the evidence shown (it "
        "takes the last place when fusion ranked it lower: a sole keyword match scored as an average meaning "
        "match and was lost).",
    )
    keyword_weight: float = setting(
        0.5,
        "EVIDENT_KEYWORD_WEIGHT",
        "Keyword expansion: a query word the pages "
        "never use adds its nearest corpus word to the lexical query at this weight "
        "(0 = off).",
        ge=0,
    )
    keyword_min_similarity: float = setting(
        0.85,
        "EVIDENT_KEYWORD_MIN_SIMILARITY",
        "Keyword expansion: least cosine between a query word and the corpus word it adds.",
        ge=0,
        le=1,
    )


class AnswerSettings(Area):
    title = "Answers"

    query_strategy: Annotated[Literal["raw", "prev_questions", "topic"], Lower] = setting(
        "prev_questions",
        "EVIDENT_QUERY_STRATEGY",
        "No-LLM follow-up query builder: raw | prev_questions | topic.",
    )
    followup_retrieval: Annotated[Literal["builder", "fused", "completed"], Lower] = setting(
        "builder",
        "EVIDENT_FOLLOWUP_RETRIEVAL",
        "With an LLM, a follow-up is retrieved with: builder (the no-LLM query alone; best P@1 on either dev "
        "half with Qwen2.5-0.5B) | fused (the no-LLM query and the LLM-completed question, ranks fused; "
        "more gold pages in the top 10) | completed (the LLM's question alone); the completed question is "
        "what is answered either way.",
    )
    history_turns: int = setting(
        6, "EVIDENT_HISTORY_TURNS", "Earlier turns of a conversation used for follow-ups.", ge=0
    )
    confident_k: int = setting(
        0,
        "EVIDENT_CONFIDENT_K",
        "Evidence handed to the generator when both rankers agree on the top page (0: final_k).",
        ge=0,
    )
    answer_max_tokens: int = setting(200, "EVIDENT_ANSWER_MAX_TOKENS", "Answer length cap.", ge=1)
    answer_style: Annotated[Literal["plain", "persona", "cot", "draft"], Lower] = setting(
        "draft",
        "EVIDENT_ANSWER_STYLE",
        "Answer prompt: draft (the model rewrites the extractive answer's quote, which is shown where the "
        "rewrite drops it; with Qwen2.5-0.5B it contained the gold in more turns than cot, fewer than "
        "quoting) | plain | persona (a named assistant) | cot (reasons first; only its answer is shown and "
        "streamed).",
    )
    answer_quotes: bool = setting(
        True,
        "EVIDENT_ANSWER_QUOTES",
        "draft style: the quoted units a model's rewrite leaves out are shown beneath it, word for word, so "
        "an answer says at least what quoting says (with Qwen2.5-0.5B it contained the gold as often as "
        "quoting or more, where the rewrite alone did less often; pipeline/answer/draft_quotes.py).",
    )
    prompts_dir: OptionalPath = setting(None, "EVIDENT_PROMPTS_DIR", "Directory of Jinja2 prompt templates.")

    @property
    def resolved_prompts_dir(self) -> Path:
        from pipeline.answer.prompts import default_prompts_dir

        return Path(self.prompts_dir) if self.prompts_dir else default_prompts_dir()
