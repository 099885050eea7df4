"""Counterfactual attribution with a scripted deterministic generator and a hashed bag-of-words embedder."""

from __future__ import annotations

import asyncio
import gc
import json
import math
import re
import zlib
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from evident.settings import Settings
from pipeline.attribution import (
    METHODS,
    AttributionResult,
    ClusterAttribution,
    attribute,
    cited_positions,
    is_flat,
)
from pipeline.attribution.cluster import cluster_embeddings
from pipeline.attribution.render import reason
from pipeline.errors import ConfigError, EmbeddingError, InputError, TransientError
from pipeline.types import Evidence, Hit

QUESTION = "How often does the VPN password rotate?"
ANSWER = "The VPN password rotates every 90 days."
NO_ANSWER = "Sorry, nothing about that was found."
VPN = "VPN passwords rotate every 90 days; you get a reminder email."


class HashEmbedder:
    """Bag of words hashed into 64 dims, L2-normalised: deterministic, model-free."""

    name = "hash64"
    dim = 64

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim))
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[row, zlib.crc32(word.encode()) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1.0, norms)

    def close(self) -> None:
        pass

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_documents(texts)


class ScriptedGenerator:
    """Answers from the ids in the subset; records calls and the peak number of concurrent calls."""

    def __init__(
        self,
        answer: Callable[[frozenset[str]], str],
        *,
        delay: float = 0.0,
        fail: Callable[[frozenset[str]], bool] | None = None,
    ) -> None:
        self.answer = answer
        self.delay = delay
        self.fail = fail
        self.calls: list[tuple[frozenset[str], int]] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def __call__(self, subset: Sequence[Hit], m: int) -> list[str]:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            ids = frozenset(h.evidence.id for h in subset)
            self.calls.append((ids, m))
            if self.fail is not None and self.fail(ids):
                raise TransientError("LLM endpoint returned 503")
            return [self.answer(ids)] * m
        finally:
            self.in_flight -= 1


def make_hits(*specs: tuple[str, str, str]) -> list[Hit]:
    """(id, text, page) triples → hits in that order."""
    return [
        Hit(
            evidence=Evidence(id=eid, page_id=page, title=f"Page {page}", url=f"https://wiki.example/{page}",
                              space="ENG", kind="passage", position=i, text=text),
            score=1.0 / (i + 1),
            rank=i + 1,
        )
        for i, (eid, text, page) in enumerate(specs)
    ]


LUNCH = ("lunch", "Lunch is served in the canteen at noon.", "food")
PARKING = ("parking", "Visitor parking is in building B, level two.", "site")


def needs(*ids: str) -> Callable[[frozenset[str]], str]:
    """The answer survives while any of ``ids`` is present."""
    return lambda present: ANSWER if present & set(ids) else NO_ANSWER


async def run(method: str, hits: list[Hit], gen: ScriptedGenerator | None, answer: str = ANSWER,
              **params: object) -> AttributionResult:
    return await attribute(method, question=QUESTION, answer=answer, hits=hits, generate=gen,
                           embedder=HashEmbedder(), params=params)


def ids_of(result: AttributionResult, k: int) -> set[str]:
    return {m.evidence_id for m in result.clusters[k].members}


async def test_causal_evidence_comes_first() -> None:
    hits = make_hits(LUNCH, ("vpn", VPN, "it"), PARKING)
    gen = ScriptedGenerator(needs("vpn"))
    result = await run("cfa_clusters", hits, gen)
    assert ids_of(result, 0) == {"vpn"}
    assert result.clusters[0].percent > 90
    assert result.clusters[0].members[0].rank == 2
    assert result.clusters[0].counterfactual_answers == [NO_ANSWER]
    assert math.isclose(sum(c.percent for c in result.clusters), 100.0)
    assert all(math.isclose(c.contribution, 0.0, abs_tol=1e-9) for c in result.clusters[1:])
    assert result.calls == len(gen.calls) == 3
    assert not result.partial
    # each counterfactual removed exactly one evidence and kept the rest in order
    assert sorted(len(ids) for ids, _ in gen.calls) == [2, 2, 2]
    assert result.top_urls()[0] == "https://wiki.example/it"


async def test_evidence_whose_removal_changed_nothing_is_ordered_by_its_likeness_to_the_answer() -> None:
    """Removing any one of two near-copies changes nothing (each covers for the other), as removing unused
    evidence does: their equal shares are ordered by how much the evidence reads like the answer, not by
    where it was shown (the evidence deletion curve: retrieval rank is less faithful than similarity)."""
    hits = make_hits(LUNCH, PARKING, ("vpn-a", VPN, "it"), ("vpn-b", "VPN: every 90 days.", "sec"))
    for method in ("cfa", "cfa_clusters"):
        result = await run(method, hits, ScriptedGenerator(needs("vpn-a", "vpn-b")))
        assert all(math.isclose(c.contribution, 0.0, abs_tol=1e-9) for c in result.clusters)
        order = [m.evidence_id for c in result.clusters for m in c.members]
        assert set(order[:2]) == {"vpn-a", "vpn-b"}, (method, order)
        assert result.clusters[0].likeness > result.clusters[-1].likeness

    async def score(subset: Sequence[Hit], answer: str) -> float:  # teacher-forced: needs either copy
        return -0.1 if {h.evidence.id for h in subset} & {"vpn-a", "vpn-b"} else -3.0

    forced = await run("logprob", hits, None, score=score)
    assert {m.evidence_id for c in forced.clusters[:2] for m in c.members} == {"vpn-a", "vpn-b"}
    # a share still decides before likeness: the evidence the answer needed comes first
    needed = await run("cfa", hits, ScriptedGenerator(needs("lunch")))
    assert ids_of(needed, 0) == {"lunch"} and needed.clusters[0].likeness < needed.clusters[1].likeness


REWORDED = "VPN password rotates every 90 days."  # the answer less one word: similarity 0.983


async def test_a_reworded_answer_counts_as_unchanged() -> None:
    """A small model rewords its answer a little whenever the prompt changes. Removing unused evidence
    (lunch) must not earn it a share above other unused evidence (parking) for that: both left the answer
    the same, so both contribute 0, their shares are equal and likeness orders them; and the words say so."""
    hits = make_hits(LUNCH, PARKING, ("vpn", VPN, "it"))

    def answer(present: frozenset[str]) -> str:
        return NO_ANSWER if "vpn" not in present else ANSWER if "lunch" in present else REWORDED

    for method in ("cfa", "cfa_clusters"):
        result = await run(method, hits, ScriptedGenerator(answer))
        assert ids_of(result, 0) == {"vpn"}, method
        lunch, parking = (next(c for c in result.clusters if ids_of_cluster(c) == {k}) for k in
                          ("lunch", "parking"))
        assert lunch.mean_similarity is not None and 0.98 <= lunch.mean_similarity < 1.0
        assert lunch.contribution == 0.0 and lunch.percent == parking.percent, method
        assert "essentially unchanged" in reason(result, lunch, top=False)
        # counted as a change when only identical answers are the same (extractive answers: no rewording),
        # and still worded as "essentially unchanged" from 0.98 up
        exact = await run(method, hits, ScriptedGenerator(answer), unchanged=1.0)
        lunch = next(c for c in exact.clusters if ids_of_cluster(c) == {"lunch"})
        assert lunch.contribution > 0.01 and exact.params["unchanged"] == 1.0
        assert "essentially unchanged" in reason(exact, lunch, top=False)


def test_identical_answers_are_the_same_answer_whatever_the_float_rounding() -> None:
    """The cosine of an answer's unit vector with itself can come out one ulp below 1."""
    from pipeline.attribution.counterfactual import _Group

    assert _Group(rows=[0], similarities=[1.0 - 2e-16]).contribution(1.0) == 0.0
    assert _Group(rows=[0], similarities=[0.999]).contribution(1.0) == pytest.approx(0.001)


def ids_of_cluster(cluster: ClusterAttribution) -> set[str]:
    return {m.evidence_id for m in cluster.members}


class LikenessDown(HashEmbedder):
    """Refuses the batch of the answer with the shown evidence (the likeness), embeds everything else."""

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if len(texts) > 1 and texts[0] == ANSWER:
            raise EmbeddingError("embeddings endpoint returned 429")
        return super().embed_documents(texts)


async def test_a_failed_likeness_costs_only_the_order_of_equal_shares() -> None:
    hits = make_hits(LUNCH, PARKING, ("vpn-a", VPN, "it"), ("vpn-b", "VPN: every 90 days.", "sec"))
    result = await attribute("cfa", question=QUESTION, answer=ANSWER, hits=hits,
                             generate=ScriptedGenerator(needs("vpn-a", "vpn-b")), embedder=LikenessDown())
    order = [m.evidence_id for c in result.clusters for m in c.members]
    assert order == ["lunch", "parking", "vpn-a", "vpn-b"]  # by rank, as before likeness
    assert all(math.isnan(c.likeness) for c in result.clusters) and not result.partial


class EmbeddingsDown(HashEmbedder):
    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        raise EmbeddingError("embeddings endpoint returned 503")


async def test_a_failed_explanation_leaves_no_failed_task_unread() -> None:
    lost: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: lost.append(context))
    hits = make_hits(LUNCH, ("vpn", VPN, "it"))
    with pytest.raises(EmbeddingError):
        await attribute("cfa", question=QUESTION, answer=ANSWER, hits=hits,
                        generate=ScriptedGenerator(needs("vpn")), embedder=EmbeddingsDown())
    await asyncio.sleep(0.05)
    gc.collect()
    assert lost == []


async def test_duplicate_is_clustered_and_keeps_the_credit() -> None:
    hits = make_hits(("vpn", VPN, "it"), LUNCH, ("vpn-copy", VPN, "onboarding"), PARKING)
    clustered = await run("cfa_clusters", hits, ScriptedGenerator(needs("vpn", "vpn-copy")))
    assert ids_of(clustered, 0) == {"vpn", "vpn-copy"}
    assert clustered.clusters[0].percent > 90
    assert clustered.calls == 3  # 4 evidence, 3 clusters
    assert set(clustered.top_urls()[:2]) == {"https://wiki.example/it", "https://wiki.example/onboarding"}

    per_evidence = await run("cfa", hits, ScriptedGenerator(needs("vpn", "vpn-copy")))
    assert per_evidence.calls == 4
    # removing either copy alone changes nothing: the credit is lost and the distribution is uniform
    assert all(math.isclose(c.percent, 25.0) for c in per_evidence.clusters)
    assert is_flat(per_evidence) and not is_flat(clustered)


async def test_lower_temperature_sharpens() -> None:
    hits = make_hits(LUNCH, ("vpn", VPN, "it"), PARKING)
    sharp = await run("cfa_clusters", hits, ScriptedGenerator(needs("vpn")), temperature=0.05)
    soft = await run("cfa_clusters", hits, ScriptedGenerator(needs("vpn")), temperature=0.5)
    assert ids_of(sharp, 0) == ids_of(soft, 0) == {"vpn"}
    assert sharp.clusters[0].percent > soft.clusters[0].percent
    assert soft.clusters[0].percent < 90
    assert sharp.params["temperature"] == 0.05


async def test_partial_failure_is_reported_and_total_failure_raises() -> None:
    hits = make_hits(LUNCH, ("vpn", VPN, "it"), PARKING)
    gen = ScriptedGenerator(needs("vpn"), fail=lambda ids: "lunch" not in ids)
    result = await run("cfa_clusters", hits, gen)
    assert result.partial and result.failed_calls == 1 and result.calls == 3
    assert ids_of(result, 0) == {"vpn"}
    lunch = result.clusters[-1]
    assert lunch.unknown and lunch.percent == 0.0 and math.isnan(lunch.contribution)
    assert math.isclose(sum(c.percent for c in result.clusters), 100.0)
    json.dumps(result.to_dict())  # NaN must not leak into JSON

    with pytest.raises(TransientError):
        await run("cfa_clusters", hits, ScriptedGenerator(needs("vpn"), fail=lambda ids: True))


async def test_partial_samples_still_count() -> None:
    """With m samples from several rounds, a failed round keeps the samples that succeeded."""
    hits = make_hits(LUNCH, ("vpn", VPN, "it"))
    attempts: dict[frozenset[str], int] = {}

    def flaky(ids: frozenset[str]) -> bool:
        attempts[ids] = attempts.get(ids, 0) + 1
        return attempts[ids] == 2  # the second round fails for every cluster

    gen = ScriptedGenerator(needs("vpn"), fail=flaky)
    result = await run("early_stop", hits, gen, samples=3, round_size=1, delta=1.0)
    assert result.partial and result.failed_calls == 2 and result.calls == 6
    assert all(len(c.similarities) == 2 and not c.unknown for c in result.clusters)


async def test_generations_run_concurrently_and_respect_a_cap() -> None:
    hits = make_hits(*[(f"e{i}", f"fact number {i} about topic {i}", f"p{i}") for i in range(5)])
    free = ScriptedGenerator(needs("e0"), delay=0.05)
    await run("cfa", hits, free)
    assert free.max_in_flight == 5

    capped = ScriptedGenerator(needs("e0"), delay=0.02)
    result = await run("cfa", hits, capped, concurrency=2)
    assert capped.max_in_flight == 2 and result.calls == 5

    shared = ScriptedGenerator(needs("e0"), delay=0.01)
    await run("cfa", hits, shared, semaphore=asyncio.Semaphore(1))
    assert shared.max_in_flight == 1


async def test_samples_are_requested_in_one_call() -> None:
    hits = make_hits(LUNCH, ("vpn", VPN, "it"))
    gen = ScriptedGenerator(needs("vpn"))
    result = await run("cfa_clusters", hits, gen, samples=3)
    assert result.calls == 2 and {m for _, m in gen.calls} == {3}
    assert all(len(c.similarities) == 3 for c in result.clusters)


async def test_naive_uses_no_generation() -> None:
    hits = make_hits(LUNCH, ("vpn", VPN, "it"), PARKING)
    result = await run("naive", hits, None)
    assert result.calls == 0 and result.method == "naive"
    assert ids_of(result, 0) == {"vpn"}
    assert math.isclose(sum(c.percent for c in result.clusters), 100.0)
    assert len(result.clusters) == 3 and all(len(c.similarities) == 1 for c in result.clusters)


async def test_page_groups_by_url() -> None:
    hits = make_hits(
        ("vpn-a", VPN, "it"), LUNCH, ("vpn-b", "Reminder emails come 7 days before expiry.", "it")
    )
    gen = ScriptedGenerator(lambda ids: ANSWER if {"vpn-a", "vpn-b"} & ids else NO_ANSWER)
    result = await run("page", hits, gen)
    assert result.calls == 2
    assert ids_of(result, 0) == {"vpn-a", "vpn-b"}
    assert result.top_urls() == ["https://wiki.example/it", "https://wiki.example/food"]


async def test_citation_prior_breaks_ties_towards_cited_evidence() -> None:
    hits = make_hits(
        ("vpn-a", VPN, "it"), ("vpn-b", "Every 90 days the VPN credentials expire.", "sec"), LUNCH
    )

    def gen() -> ScriptedGenerator:
        return ScriptedGenerator(needs("vpn-a", "vpn-b"))

    cited = ANSWER + " [Source 2]"
    flat = await run("cfa_clusters", hits, gen(), answer=cited)
    assert all(math.isclose(c.percent, 100 / 3) for c in flat.clusters)
    prior = await run("cfa_citation_prior", hits, gen(), answer=cited, citation_lambda=1.0)
    assert ids_of(prior, 0) == {"vpn-b"} and math.isclose(prior.clusters[0].percent, 50.0)
    assert prior.details["cited"] == [2]
    unchanged = await run("cfa_citation_prior", hits, gen(), answer=cited, citation_lambda=0.0)
    assert all(math.isclose(c.percent, 100 / 3) for c in unchanged.clusters)


def test_cited_positions() -> None:
    text = "A [1]. B [Source 3]. C [2, 4]. D [Sources 5 and 6]. E [9]. F [Evidence 7]. G [x]."
    assert cited_positions(text, 7) == {1, 2, 3, 4, 5, 6, 7}
    assert cited_positions("no markers", 3) == set()


async def test_sufficiency_boosts_clusters_that_reproduce_the_answer_alone() -> None:
    hits = make_hits(
        ("vpn-a", VPN, "it"), ("vpn-b", "Every 90 days the VPN credentials expire.", "sec"), LUNCH
    )
    gen = ScriptedGenerator(needs("vpn-a", "vpn-b"))
    result = await run("sufficiency", hits, gen, tau=0.9, boost=1.0)
    assert result.calls == 5 == len(gen.calls)  # 3 counterfactuals + 2 sufficiency checks
    assert {ids for ids, _ in gen.calls[-2:]} == {frozenset({"vpn-a"}), frozenset({"vpn-b"})}
    checks = result.details["sufficiency"]
    assert [c["sufficient"] for c in checks] == [True, True]
    assert ids_of(result, 2) == {"lunch"} and math.isclose(result.clusters[2].percent, 20.0)
    assert math.isclose(result.clusters[0].percent, 40.0)


async def test_early_stop_saves_calls_when_decisive() -> None:
    hits = make_hits(LUNCH, ("vpn", VPN, "it"), PARKING)
    decisive = await run("early_stop", hits, ScriptedGenerator(needs("vpn")), samples=4, delta=0.3)
    assert decisive.calls == 3 and decisive.details["rounds"] == 1
    assert ids_of(decisive, 0) == {"vpn"}
    full = await run("early_stop", hits, ScriptedGenerator(needs("vpn")), samples=4, delta=1.0)
    assert full.calls == 12 and full.details["rounds"] == 4
    assert all(len(c.similarities) == 4 for c in full.clusters)


async def test_logprob_needs_a_scorer_and_reads_the_drop() -> None:
    hits = make_hits(LUNCH, ("vpn", VPN, "it"), PARKING)
    with pytest.raises(ConfigError, match="prompt log-probs"):
        await run("logprob", hits, None)

    async def score(subset: Sequence[Hit], answer: str) -> float:
        return -0.1 if any(h.evidence.id == "vpn" for h in subset) else -3.0

    result = await run("logprob", hits, None, score=score)
    assert ids_of(result, 0) == {"vpn"} and result.calls == 4
    assert math.isclose(result.clusters[0].similarities[0], math.exp(-2.9))

    def sync_score(subset: Sequence[Hit], answer: str) -> float:
        return -0.1 if any(h.evidence.id == "lunch" for h in subset) else -1.0

    result = await run("logprob", hits, None, score=sync_score)
    assert ids_of(result, 0) == {"lunch"}


async def test_bad_method_and_params_are_config_errors() -> None:
    hits = make_hits(LUNCH)
    with pytest.raises(ConfigError, match="unknown attribution method"):
        await run("magic", hits, None)
    with pytest.raises(ConfigError, match="unknown attribution parameter"):
        await run("naive", hits, None, temprature=0.1)
    with pytest.raises(ConfigError, match="temperature"):
        await run("naive", hits, None, temperature=0)
    with pytest.raises(ConfigError, match="generate callback"):
        await run("cfa", hits, None)


async def test_no_evidence_gives_an_empty_result() -> None:
    result = await run("cfa_clusters", [], ScriptedGenerator(needs()))
    assert result.clusters == [] and result.calls == 0 and result.top_urls() == []


async def test_round_trip_through_json() -> None:
    hits = make_hits(("vpn", VPN, "it"), LUNCH, ("vpn-copy", VPN, "onboarding"))
    gen = ScriptedGenerator(needs("vpn", "vpn-copy"), fail=lambda ids: ids == {"vpn", "vpn-copy"})
    result = await run("sufficiency", hits, gen, semaphore=asyncio.Semaphore(4))
    data = json.loads(json.dumps(result.to_dict()))
    again = AttributionResult.from_dict(data)
    assert again.to_dict() == data
    assert again.top_urls() == result.top_urls()
    assert [c.members for c in again.clusters] == [c.members for c in result.clusters]
    assert [c.likeness for c in again.clusters] == [c.likeness for c in result.clusters]
    del data["clusters"][0]["likeness"]  # cached before likeness was kept
    assert math.isnan(AttributionResult.from_dict(data).clusters[0].likeness)
    assert "semaphore" not in data["params"]
    with pytest.raises(InputError):
        AttributionResult.from_dict({"method": "x"})


def test_cluster_embeddings() -> None:
    a, b, c = np.eye(3)
    near_a = a + np.array([0.0, 0.0005, 0.0])
    groups = cluster_embeddings(np.stack([b, a, c, near_a, a]), eps=0.005, min_samples=2)
    assert groups == [[0], [1, 3, 4], [2]]
    assert cluster_embeddings(np.zeros((0, 3))) == []
    assert cluster_embeddings(np.stack([a])) == [[0]]


def test_registry_and_settings() -> None:
    assert {"naive", "cfa", "cfa_clusters", "page", "cfa_citation_prior", "sufficiency", "early_stop",
            "logprob"} <= set(METHODS)
    params = Settings.load(env={}).attribution.params(llm=False)
    assert params == {"samples": 1, "temperature": 0.05, "eps": 0.005, "min_samples": 2, "unchanged": 1.0}
    # a model rewords its answers a little: counted as the same answer up to 0.98; a setting overrides both
    assert Settings.load(env={}).attribution.params(llm=True)["unchanged"] == 0.98
    configured = Settings.load(env={"EVIDENT_ATTRIBUTION_UNCHANGED": "0.95"}).attribution
    assert configured.params(llm=False)["unchanged"] == configured.params(llm=True)["unchanged"] == 0.95


# ---------------------------------------------------------------- a table row and its whole table

ROW1 = "Row 1 in Table 1: Member is Alice, and Task is Prepare the evaluation list"
ROW2 = "Row 2 in Table 1: Member is Bruno, and Task is Collect questions"


def table_hits() -> list[Hit]:
    """Row 1, the whole table (both rows), an unrelated passage: the row's text is shown twice."""
    def ev(eid: str, kind: str, text: str, position: int, row: int | None = None) -> Evidence:
        return Evidence(id=eid, page_id="meeting", title="RAG meeting", url="https://wiki.example/meeting",
                        space="ENG", kind=kind, position=position, text=text,  # type: ignore[arg-type]
                        table_index=1, row_index=row)

    evidence = [
        ev("row1", "row", ROW1, 2, 1),
        ev("table1", "table", f"{ROW1}\n{ROW2}", 1),
        Evidence(
            id="lunch",
            page_id="food",
            title="Food",
            url="https://wiki.example/food",
            space="ENG",
            kind="passage",
            position=0,
            text=LUNCH[1],
        ),
    ]
    return [Hit(evidence=e, score=1.0, rank=i + 1) for i, e in enumerate(evidence)]


def test_removing_a_row_cuts_it_out_of_its_table_too() -> None:
    from pipeline.attribution.scoring import without

    hits = table_hits()
    rest = without(hits, [0])
    assert [h.evidence.id for h in rest] == ["table1", "lunch"]
    # a copy; the hit is unchanged
    assert rest[0].evidence.text == ROW2 and hits[1].evidence.text == f"{ROW1}\n{ROW2}"
    assert without(hits, [2])[1] is hits[1]  # removing something else leaves the table whole
    other = Hit(
        evidence=Evidence(**{**hits[1].evidence.__dict__, "id": "t2", "table_index": 2}), score=1.0, rank=4
    )
    assert without([*hits, other], [0])[-1] is other  # another table of the page keeps its lines


async def test_the_quoted_row_gets_the_credit_although_its_table_repeats_it() -> None:
    """An answer quoting row 1: removing the row (and so its line in the table) changes it, nothing else
    does."""
    calls: list[list[str]] = []

    async def quote(subset: Sequence[Hit], m: int) -> list[str]:
        calls.append([h.evidence.text for h in subset])
        return [ANSWER if any("Alice" in h.evidence.text for h in subset) else NO_ANSWER] * m

    result = await attribute("cfa", question=QUESTION, answer=ANSWER, hits=table_hits(), generate=quote,
                             embedder=HashEmbedder(), params={})
    assert ids_of(result, 0) == {"row1"} and result.clusters[0].percent > 90
    assert not is_flat(result)


def test_flat_only_when_no_removal_changed_the_answer() -> None:
    from pipeline.attribution.types import ClusterAttribution, EvidenceRef

    def clusters(*pairs: tuple[float, float]) -> list[ClusterAttribution]:
        return [
            ClusterAttribution(
                cluster_id=i,
                members=[EvidenceRef(f"e{i}", "T", "https://w.example", "passage", i + 1)],
                contribution=1 - sim,
                percent=pct,
                counterfactual_answers=["a"],
                similarities=[sim],
            )
            for i, (pct, sim) in enumerate(pairs)
        ]

    two_quoted = clusters((17.0, 0.97), (15.2, 0.97), *[(8.475, 1.0)] * 8)  # the demo question's shape
    assert not is_flat(
        AttributionResult(method="cfa_clusters", question="q", answer="a", clusters=two_quoted)
    )
    # by entropy
    assert is_flat(AttributionResult(method="naive", question="q", answer="a", clusters=two_quoted))
    unchanged = clusters((17.0, 0.99), (15.2, 0.99), *[(8.475, 1.0)] * 8)
    assert is_flat(AttributionResult(method="cfa_clusters", question="q", answer="a", clusters=unchanged))


def test_a_short_row_is_cut_as_a_whole_line_never_inside_other_rows() -> None:
    """Plain linearization: a row's text can be one word that other rows contain too."""
    from pipeline.attribution.scoring import without

    def ev(eid: str, kind: str, text: str, row: int | None = None) -> Evidence:
        return Evidence(
            id=eid,
            page_id="p",
            title="T",
            url="https://wiki.example/p",
            space="ENG",
            kind=kind,
            position=0,
            text=text,
            table_index=1,
            row_index=row,
        )  # type: ignore[arg-type]

    hits = [Hit(evidence=ev("r2", "row", "Yes", 2), score=1.0, rank=1),
            Hit(evidence=ev("t", "table", "Yes sir\nYes\nNo"), score=1.0, rank=2)]
    assert without(hits, [0])[0].evidence.text == "Yes sir\nNo"
