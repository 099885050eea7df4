"""`evident eval retrieval|answers|attribution`: ConfQuestions-shaped benchmarks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from evident.common import cli_errors, load_settings
from evident.settings import Settings

T = TypeVar("T")

_questions = click.option("--questions", type=click.Path(path_type=Path, exists=True, dir_okay=False),
                          required=True, help="ConfQuestions-shaped JSON (e.g. qa-dev.json).")
_documents = click.option("--documents", type=click.Path(path_type=Path, exists=True, file_okay=False),
                          required=True, help="Folder of pages to index (cached per configuration).")
_lang = click.option("--lang", type=click.Choice(["en", "de", "both"]), default="both", show_default=True)
_output = click.option(
    "--output", type=click.Path(path_type=Path), default=None, help="Write the JSON report."
)


def page_source(documents: Path) -> Callable[[], Any]:
    """A fresh page iterator over an export folder, for each index the eval opens."""
    from connectors.local import LocalFolderConnector

    return lambda: LocalFolderConnector([Path(documents)]).iter_pages()


def _run_with_engine(settings: Settings, documents: Path, body: Callable[[Any], Awaitable[T]]) -> T:
    """Open the cached eval index, compose an engine over it, run ``body(engine)``, close everything."""
    from pipeline.evaluation.answers import eval_engine, temp_store_path
    from pipeline.evaluation.index_cache import open_eval_index

    documents_key, store_path = str(documents.resolve()), temp_store_path()

    async def run() -> T:
        index, embedder, sparse, _ = await open_eval_index(settings, documents_key, page_source(documents))
        try:
            engine = await eval_engine(settings, index=index, embedder=embedder, sparse=sparse,
                                       store_path=store_path, documents_key=documents_key)
        except BaseException:
            await index.close()
            raise
        async with engine:
            return await body(engine)

    return asyncio.run(run())


def _base_config(settings: Settings, questions: Path, documents: Path) -> dict[str, Any]:
    return {
        "questions_file": str(questions),
        "documents": str(documents),
        "embedder": settings.models.embedder,
        "retrieval_mode": settings.retrieval.mode,
        "final_k": settings.retrieval.final_k,
        "reranker": settings.models.reranker,
        "llm": settings.llm.model_for("answer") if settings.llm.base_url else "extractive (no LLM endpoint)",
        "attribution_params": settings.attribution.params(llm=bool(settings.llm.base_url)),
    }


def _write(report: dict[str, Any], output: Path | None) -> None:
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(report, indent=2, ensure_ascii=False), encoding="utf-8")
        click.echo(f"wrote {output}")


@click.group("eval")
def eval_group() -> None:
    """Benchmarks on ConfQuestions-shaped data."""


@eval_group.command("retrieval")
@click.option("--questions", type=click.Path(path_type=Path, exists=True), required=True)
@click.option("--documents", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True)
@click.option("--lang", type=click.Choice(["en", "de", "both"]), default="both", show_default=True)
@click.option("--query", "query_type", default="all", show_default=True,
              type=click.Choice(["completed", "conversational", "raw", "llm", "fused", "all", "followup"]),
              help="all: completed, conversational, raw; followup: conversational, llm, fused (the last "
                   "two need EVIDENT_LLM_BASE_URL).")
@click.option("--k", default=10, show_default=True)
@click.option("--by", "by", multiple=True, type=click.Choice(["source", "type", "turn"]))
@click.option("--strategy", default=None,
              help="Conversational query builder (default: EVIDENT_QUERY_STRATEGY).")
@click.option("--mode", type=click.Choice(["lexical", "dense", "hybrid"]), default=None)
@click.option("--output", type=click.Path(path_type=Path), default=None)
@click.option("--ablation", default=None,
              type=click.Choice(["context", "tables", "ranking", "linearization"]))
@click.option("--strict-urls", is_flag=True,
              help="Compare URLs literally (modulo +/%20/slashes) instead of by Confluence page id.")
@click.pass_context
@cli_errors
def eval_retrieval(ctx: click.Context, questions: Path, documents: Path, lang: str, query_type: str, k: int,
                   by: tuple[str, ...], strategy: str | None, mode: str | None, output: Path | None,
                   ablation: str | None, strict_urls: bool) -> None:
    """Precision@1 / hit@k / MRR on ConfQuestions (paper: P@1 0.528 completed by GPT-4o, 0.658 human)."""
    from pipeline.evaluation.ablation import run_ablation
    from pipeline.evaluation.data import load_conversations
    from pipeline.evaluation.retrieval import format_table, retrieval_report

    convs = load_conversations(questions)
    langs = ("en", "de") if lang == "both" else (lang,)
    qtypes = {"all": ("completed", "conversational", "raw"),
              "followup": ("conversational", "llm", "fused")}.get(query_type, (query_type,))
    settings = load_settings(ctx)
    strategy_name = strategy or settings.answer.query_strategy
    if mode:
        settings = settings.replace(retrieval_mode=mode)
    settings = settings.replace(final_k=k)
    if ablation:
        report = asyncio.run(run_ablation(ablation, settings, str(documents.resolve()),
                                          page_source(documents), convs, langs, qtypes, strategy_name))
        click.echo(report["table"])
    else:
        report = asyncio.run(retrieval_report(
            settings, convs, page_source(documents), documents_key=str(documents.resolve()),
            documents=str(documents), questions=str(questions), langs=langs, query_types=qtypes,
            strategy=strategy_name, strict_urls=strict_urls, by=by))
        click.echo(format_table(report))
    _write(report, output)


@eval_group.command("answers")
@_questions
@_documents
@_lang
@click.option("--limit-conversations", type=click.IntRange(min=1), default=None,
              help="Only the first N conversations.")
@click.option("--by", "by", multiple=True, type=click.Choice(["source", "type"]))
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True,
              help="Conversations run at once (turns within one always run in order).")
@click.option("--judge/--no-judge", default=True, show_default=True,
              help="LLM-judge relevance when an LLM endpoint is configured (EVIDENT_LLM_MODEL_JUDGE).")
@click.option("--ragas", is_flag=True,
              help="Also faithfulness, answer relevancy, context precision and recall from the judge model "
                   "(four more judge calls per turn).")
@_output
@click.pass_context
@cli_errors
def eval_answers(ctx: click.Context, questions: Path, documents: Path, lang: str,
                 limit_conversations: int | None, by: tuple[str, ...], concurrency: int, judge: bool,
                 ragas: bool, output: Path | None) -> None:
    """Token F1, gold containment, out-of-scope rate, P@10 and LLM-judge score of whole conversations
    answered turn by turn (history = the system's own answers, never gold)."""
    from pipeline.evaluation.answers import (
        LLMJudge,
        format_answer_table,
        run_answer_eval,
        summarize_answers,
    )
    from pipeline.evaluation.data import load_conversations
    from pipeline.evaluation.ragas import RagasJudge

    settings: Settings = ctx.obj["settings"]
    convs = load_conversations(questions)[:limit_conversations]
    langs = ("en", "de") if lang == "both" else (lang,)

    async def body(engine: Any) -> dict[str, Any]:
        llm = engine.llm
        grader = LLMJudge(llm, engine.prompts) if judge and llm is not None else None
        metrics = RagasJudge(llm, engine.prompts, engine.embedder) if ragas and llm is not None else None
        results = await run_answer_eval(convs, engine, langs=langs, judge=grader, concurrency=concurrency,
                                        ragas=metrics)
        config = {**_base_config(settings, questions, documents), "conversations": len(convs),
                  "history": "system answers", "ragas": metrics is not None,
                  "judge": settings.llm.model_for("judge") if grader or metrics else None}
        return {**summarize_answers(results, config=config, by=by), "turns": _turn_rows(results)}

    report = _run_with_engine(settings, documents, body)
    click.echo(format_answer_table(report))
    _write(report, output)


def _turn_rows(results: list[Any]) -> list[dict[str, Any]]:
    """Per turn, for paired comparisons between runs (``--output`` only; the table shows the summary)."""
    from pipeline.evaluation.ragas import METRICS

    return [{"lang": r.lang, "conv_id": r.conv_id, "turn": r.turn, "question": r.question,
             "completed_question": r.completed_question, "gold": r.gold, "f1": r.f1,
             "containment": r.containment, "exact": r.exact, "out_of_scope": r.out_of_scope, "judge": r.judge,
             "answer": r.answer,
             "model_reply": r.model_reply, "model_containment": r.model_containment, "model_f1": r.model_f1,
             "draft": r.draft, "quoted_beneath": r.quoted_beneath,
             **({m: r.ragas.get(m) for m in METRICS} if r.ragas else {})} for r in results]


@eval_group.command("judge")
@click.option("--sample", "sample_path", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              default=Path("tests/data/judge_sample.json"), show_default=True, help="Hand-labelled answers.")
@_output
@click.pass_context
@cli_errors
def eval_judge(ctx: click.Context, sample_path: Path, output: Path | None) -> None:
    """How far the judge model (EVIDENT_LLM_MODEL_JUDGE) agrees with people on faithfulness, answer relevancy,
    context precision and context recall, over a hand-labelled sample."""
    from pipeline.answer.prompts import PromptLibrary
    from pipeline.errors import ConfigError
    from pipeline.evaluation.judge_agreement import agreement, format_agreement, judge_sample, load_sample
    from pipeline.evaluation.ragas import RagasJudge
    from pipeline.factory import make_embedder_from, make_llm_from

    settings: Settings = ctx.obj["settings"]
    sample = load_sample(sample_path)
    llm = make_llm_from(settings)
    if llm is None:
        raise ConfigError(
            "eval judge needs a judge model: set EVIDENT_LLM_BASE_URL (and EVIDENT_LLM_MODEL_JUDGE)"
        )

    async def run() -> dict[str, Any]:
        embedder = await asyncio.to_thread(make_embedder_from, settings)
        try:
            scores = await judge_sample(
                sample, RagasJudge(llm, PromptLibrary(settings.answer.resolved_prompts_dir), embedder)
            )
        finally:
            await llm.close()
            await asyncio.to_thread(embedder.close)
        items = [{"id": i.id, "faithfulness": s.faithfulness, "answer_relevancy": s.answer_relevancy,
                  "context_precision": s.context_precision, "verdicts": list(s.verdicts),
                  "context_recall": s.context_recall} for i, s in zip(sample, scores, strict=True)]
        return {
            **agreement(sample, scores),
            "config": {
                "sample": str(sample_path),
                "judge": settings.llm.model_for("judge"),
                "embedder": settings.models.embedder,
            },
            "scores": items,
        }

    report = asyncio.run(run())
    click.echo(format_agreement(report))
    _write(report, output)


@eval_group.command("attribution")
@_questions
@_documents
@click.option("--methods", default="naive,cfa,cfa_clusters,page,cfa_citation_prior", show_default=True,
              help="Comma list of attribution methods.")
@_lang
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Only the first N questions per language.")
@click.option("--sample", type=click.IntRange(min=1), default=None,
              help="N questions per language spread evenly over the file (covers more topics than --limit).")
@click.option("--share-generations", is_flag=True,
              help="Reuse identical deterministic counterfactual answers across methods (for slow local "
                   "LLMs; makes later methods' calls and ratios look smaller).")
@click.option("--no-faithfulness", is_flag=True,
              help="Skip comprehensiveness, sufficiency and the deletion curve (they regenerate answers).")
@_output
@click.pass_context
@cli_errors
def eval_attribution(ctx: click.Context, questions: Path, documents: Path, methods: str, lang: str,
                     limit: int | None, sample: int | None, share_generations: bool, no_faithfulness: bool,
                     output: Path | None) -> None:
    """Top-1 accuracy and faithfulness (comprehensiveness, sufficiency, deletion AUC) of each attribution
    method and the first-source baseline on completed questions whose gold page was shown to the generator."""
    from pipeline.evaluation.attribution_eval import (
        check_methods,
        format_attribution_table,
        run_attribution_eval,
        summarize_attribution,
    )
    from pipeline.evaluation.data import load_conversations

    settings: Settings = ctx.obj["settings"]
    convs = load_conversations(questions)
    langs = ("en", "de") if lang == "both" else (lang,)
    names = tuple(m.strip() for m in methods.split(",") if m.strip())
    check_methods(names, prompt_logprobs=bool(settings.llm.base_url and settings.llm.prompt_logprobs))
    # ^ before the (slow) index build

    async def body(engine: Any) -> dict[str, Any]:
        run = await run_attribution_eval(convs, engine, methods=names, langs=langs, limit=limit,
                                         sample=sample, share_generations=share_generations,
                                         faithfulness=not no_faithfulness)
        config = {**_base_config(settings, questions, documents), "methods": list(names),
                  "limit_per_lang": limit, "sample_per_lang": sample,
                  "share_generations": share_generations, "faithfulness": not no_faithfulness}
        return summarize_attribution(run, config=config)

    report = _run_with_engine(settings, documents, body)
    click.echo(format_attribution_table(report))
    _write(report, output)
