"""`evident ask`, `evident chat`, `evident explain` and `evident demo`: the engine from a terminal."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import click

from bot.core.messages import certainty_note
from evident.access_cli import as_option, scope_for
from evident.common import cli_errors, echo_error, index_dir_option, load_settings, run
from evident.settings import Settings
from pipeline.access.scope import EVERYTHING

DEMO_QUESTION = "What is Alice's todo from the RAG meeting in October?"


def _print_turn(result: Any, trace: bool, *, interactive: bool = False) -> None:
    """Print a turn; a failed one is an error line and exit 1 (``interactive``: a warning, go on)."""
    ans = result.answer
    if result.error:
        if interactive:
            click.echo(f"⚠ {result.error}")
            return
        echo_error(f"error: {result.error}")
        sys.exit(1)
    if result.is_followup and result.completed_question:
        click.echo(click.style(f"(answering: {result.completed_question})", dim=True))
    click.echo(ans.text)
    note = certainty_note(ans)
    if note:
        click.echo(click.style(f"⚠ {note}", fg="yellow"))
    if ans.extractive:
        click.echo(click.style("(extractive answer: no LLM endpoint configured)", dim=True))
    for c in ans.citations:
        click.echo(f"  [{c.number}] {c.title} · {c.space} <{c.url}>")
    if result.notice:
        click.echo(click.style(result.notice, dim=True))
    if trace:
        _print_trace(result)
    click.echo(click.style(f"(turn {result.turn_id})", dim=True))


def _print_trace(result: Any) -> None:
    r = result.retrieval
    click.echo("--- trace")
    click.echo(f"completed question: {result.completed_question}")
    if r is not None:
        click.echo(f"retrieval query:    {r.query}")
        click.echo(f"confidence:         {r.confidence or 'n/a'} (how many rankers' first evidence is on the "
                   "fused first page: high 2, medium 1, low 0)")
        if r.expansions:
            click.echo(
                "keyword expansion:  " + ", ".join(f"{w} -> {t} ({sim:.2f})" for w, t, sim in r.expansions)
            )
        for name, hits in (("lexical", r.lexical), ("dense", r.dense), ("fused", r.hits)):
            click.echo(f"{name}:")
            for h in hits:
                click.echo(f"  {h.rank:>2}. {h.score:.4f} {h.evidence.kind:<7} {h.evidence.title}: "
                           f"{h.evidence.text[:90]!r}")
    prompt = result.answer.trace.prompt
    if prompt:
        click.echo("prompt:")
        for m in prompt:
            click.echo(f"  [{m.role}] " + m.content.replace("\n", "\n    "))
    click.echo(
        "timings (ms): " + ", ".join(f"{k}={v:.1f}" for k, v in result.answer.trace.timings_ms.items())
    )


@click.command()
@click.argument("question")
@click.option("--trace", is_flag=True, help="Show completion, lexical/dense/fused lists, prompt, timings.")
@click.option("--session", default=None, help="Continue a named conversation.")
@as_option
@index_dir_option
@click.pass_context
@cli_errors
def ask(ctx: click.Context, question: str, trace: bool, session: str | None, as_email: str | None,
        index_dir: Path | None) -> None:
    """Answer one QUESTION with citations."""
    from pipeline.factory import build_engine

    settings = load_settings(ctx, index_dir=index_dir)
    key = f"cli:{session}" if session else f"cli:ask:{time.time_ns()}"

    async def go() -> Any:
        async with await build_engine(settings, trace=trace, require_index=True) as engine:
            return await engine.ask(
                key, question, scope=await scope_for(settings, engine.store, as_email), trace=trace
            )

    _print_turn(run(go()), trace)


@click.command()
@click.option("--session", default="default", show_default=True, help="Conversation name (persisted).")
@click.option("--trace", is_flag=True)
@as_option
@index_dir_option
@click.pass_context
@cli_errors
def chat(ctx: click.Context, session: str, trace: bool, as_email: str | None, index_dir: Path | None) -> None:
    """Multi-turn chat. /new starts a new thread, /explain explains the last answer, /quit exits."""
    from pipeline.factory import build_engine

    settings = load_settings(ctx, index_dir=index_dir)

    async def go() -> None:
        engine = await build_engine(settings, trace=trace, require_index=True)
        key = f"cli:{session}:{time.time_ns()}"
        last_turn: int | None = None
        scope = await scope_for(settings, engine.store, as_email)
        try:
            while True:
                try:
                    line = await asyncio.to_thread(input, "you> ")
                except EOFError:
                    break
                line = line.strip()
                if line in ("/quit", "/exit"):
                    break
                if line == "/new":
                    key = f"cli:{session}:{time.time_ns()}"
                    click.echo("(new thread)")
                    continue
                if line.startswith("/explain"):
                    if last_turn is None:
                        click.echo("nothing to explain yet")
                        continue
                    ex = await engine.explain(last_turn, scope=scope)
                    click.echo(ex.text)
                    continue
                if not line:
                    continue
                result = await engine.ask(key, line, scope=scope, trace=trace)
                last_turn = result.turn_id
                _print_turn(result, trace, interactive=True)
        finally:
            await engine.aclose()

    run(go())


@click.command()
@click.option("--turn", "turn_id", type=int, default=None, help="Turn id (default: the latest turn).")
@click.option("--method", default=None, help="naive | cfa | cfa_clusters | page | ...")
@click.option("--trace", is_flag=True, help="Show each counterfactual answer and its similarity.")
@as_option
@index_dir_option
@click.pass_context
@cli_errors
def explain(ctx: click.Context, turn_id: int | None, method: str | None, trace: bool, as_email: str | None,
            index_dir: Path | None) -> None:
    """Counterfactual attribution: which evidence caused an answer."""
    from pipeline.errors import InputError
    from pipeline.factory import build_engine

    settings = load_settings(ctx, index_dir=index_dir)

    async def go() -> Any:
        async with await build_engine(settings, require_index=True) as engine:
            tid = turn_id
            if tid is None:
                tid = await engine.store.latest_turn_id()
                if tid is None:
                    raise InputError("no turns yet: ask something first")
            return await engine.explain(
                tid, scope=await scope_for(settings, engine.store, as_email), method=method
            )

    ex = run(go())
    if ex.error:
        echo_error(f"error: {ex.error}")
        sys.exit(1)
    click.echo(ex.text)
    if trace and ex.result is not None:
        click.echo("--- counterfactuals")
        for c in ex.result.clusters:
            for ans, sim in zip(c.counterfactual_answers, c.similarities, strict=False):
                click.echo(f"cluster {c.cluster_id} sim={sim:.3f}: {ans!r}")


@click.command()
@click.option("--question", default=DEMO_QUESTION, show_default=True)
@click.pass_context
@cli_errors
def demo(ctx: click.Context, question: str) -> None:
    """Ingest the bundled sample space into the embedded index and answer a question."""
    from connectors.local import sample_space_dir
    from connectors.local_ingest import ingest_folders
    from pipeline.factory import build_engine

    settings: Settings = ctx.obj["settings"]
    report = run(ingest_folders(settings, (sample_space_dir(),))).ingest
    click.echo(f"ingested sample space: {report.pages_seen} pages, {report.evidence} new evidence, "
               f"{report.unchanged} unchanged, {report.seconds:.1f} s")
    click.echo(f"\nQ: {question}")

    async def go() -> Any:
        async with await build_engine(settings) as engine:
            return await engine.ask(f"cli:demo:{time.time_ns()}", question, scope=EVERYTHING)

    _print_turn(run(go()), trace=False)
