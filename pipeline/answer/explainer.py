"""Why a stored turn's answer came out as it did: the same evidence, counterfactual attribution, cached.

The turn's evidence is read back from the index in the order the generator saw it (so ``[n]`` markers line up
with the rebuilt prompt), attributed by the configured method through the turn's own generator, and the result
is cached in the store per (turn, method, parameters).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pipeline.access.scope import AccessScope
from pipeline.answer.generator import Generator
from pipeline.answer.results import NOTHING_TO_EXPLAIN, ExplainResult
from pipeline.attribution import AttributionResult, attribute
from pipeline.attribution.render import render_text
from pipeline.errors import InputError
from pipeline.ingest.contextualize import contextualize, prompt_text
from pipeline.protocols import Embedder, Index
from pipeline.store import Store
from pipeline.types import Evidence, Hit

if TYPE_CHECKING:
    from pipeline.answer.options import EngineOptions

log = logging.getLogger("evident.engine")
NOT_VISIBLE_HERE = (
    "This answer drew on pages that not everyone here may read (or that are gone), so it is not "
    "explained here. The person who asked can ask for the explanation where they asked."
)


class Explainer:
    def __init__(self, *, store: Store, index: Index, embedder: Embedder, generator: Generator,
                 options: EngineOptions) -> None:
        self.store = store
        self.index = index
        self.embedder = embedder
        self.generator = generator
        self.options = options

    async def explain(self, turn_id: int, *, scope: AccessScope, method: str | None = None) -> ExplainResult:
        method = method or self.options.attribution_method
        params: dict[str, Any] = dict(self.options.attribution_params)
        params_hash = hashlib.sha1(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:12]
        turn = await self.store.get_turn(turn_id)
        if turn is None:
            raise InputError(f"no turn with id {turn_id}")
        hits = await self._hits([r.evidence_id for r in turn.retrieved], turn_id, scope)
        if hits is None:
            return ExplainResult(turn_id, NOT_VISIBLE_HERE, error="not visible")
        cached = await self.store.get_attribution(turn_id, method, params_hash)
        if cached is not None:
            return explain_result(turn_id, AttributionResult.from_dict(cached), cached=True)
        if not turn.answered:
            return ExplainResult(turn_id, "There is no answer to explain for this turn.", error="no answer")
        if turn.out_of_scope:  # nothing in the wiki produced it: shares over the evidence would mean nothing
            return ExplainResult(turn_id, NOTHING_TO_EXPLAIN)
        question, answer = turn.asked, turn.explained_answer or turn.raw_answer or turn.answer
        max_tokens = max(32, int(len(answer) / 3.0) + 16)

        async def generate(subset: Sequence[Hit], m: int) -> list[str]:
            return await self.generator.generate_from(question, subset, m, max_tokens)

        result = await attribute(method, question=question, answer=answer, hits=hits, generate=generate,
                                 embedder=self.embedder, params=self.params_for(question, params))
        await self.store.put_attribution(turn_id, method, params_hash, result.to_dict())
        return explain_result(turn_id, result, cached=False)

    async def _hits(self, ids: list[str], turn_id: int, scope: AccessScope) -> list[Hit] | None:
        """The turn's evidence in the order shown; ``content`` is the text embedded at ingest, so clustering
        reuses the cached vectors. None where ``scope`` may not see all of it (per-user access)."""
        evidence = await self.index.get(ids, scope)
        if scope.per_user and len(evidence) < len(ids):
            log.info("turn %s: %d of its evidence are not visible to %s", turn_id, len(ids) - len(evidence),
                     scope.audience or "this audience")
            return None
        if len(evidence) < len(ids):
            log.info("turn %s: %d of its evidence are no longer indexed", turn_id, len(ids) - len(evidence))
        return [Hit(evidence=ev, score=0.0, rank=i + 1, content=self._cluster_text(ev))
                for i, ev in enumerate(evidence)]

    def params_for(self, question: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """The attribution params plus, where the endpoint can teacher-force, the logprob scorer.

        Added after the params hash is taken: a callable has no stable hash.
        """
        out = dict(self.options.attribution_params if params is None else params)
        if self.options.prompt_logprobs and self.generator.llm is not None:

            async def score(subset: Sequence[Hit], text: str) -> float:
                return await self.generator.score_from(question, subset, text)

            out["score"] = score
        return out

    def _cluster_text(self, ev: Evidence) -> str:
        items = self.options.dense_context_items
        if items is None:
            return prompt_text(ev)
        return contextualize(ev, items, self.options.context_item_max_chars)


def explain_result(turn_id: int, result: AttributionResult, *, cached: bool) -> ExplainResult:
    return ExplainResult(turn_id, render_text(result), cached, result.partial, result)
