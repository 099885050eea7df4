"""`evident` command line. User errors print one line and exit non-zero; no tracebacks."""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from pipeline.errors import EvidentError
from pipeline.runtime.redact import Redactor
from pipeline.runtime.settings import Settings
from pipeline.types import Page

T = TypeVar("T")

DEMO_QUESTION = "What is Alice's todo from the RAG meeting in October?"


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def redactor() -> Redactor:
    """The redactor of the running command (built from its settings in ``main``)."""
    ctx = click.get_current_context(silent=True)
    found = ctx.find_object(dict) if ctx is not None else None
    return found.get("redactor") or Redactor() if found else Redactor()


MAX_ERROR_CHARS = 600


def echo_error(line: str) -> None:
    """One line on stderr, credentials masked (a quoted response body can span lines and pages)."""
    text = " ".join(redactor()(line).split())
    click.echo(text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…", err=True)


def cli_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn evident's errors into one clear line and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except EvidentError as exc:
            echo_error(f"error: {exc}")
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


def load_settings(ctx: click.Context, **overrides: Any) -> Settings:
    base: Settings = ctx.obj["settings"]
    clean = {k: v for k, v in overrides.items() if v is not None}
    return base.replace(**clean) if clean else base


@click.group()
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None,
              help="TOML settings file (else $EVIDENT_CONFIG).")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@click.pass_context
def main(ctx: click.Context, config_path: Path | None, verbose: bool) -> None:
    """evident: answers from your Confluence wiki, with sources and causal explanations."""
    try:
        settings = Settings.load(toml_path=config_path)
    except EvidentError as exc:
        click.echo(Redactor()(f"error: {exc}"), err=True)
        sys.exit(2)
    from evident.logging_setup import setup_logging

    secrets = Redactor.from_settings(settings)
    setup_logging(settings.log_level, json_lines=settings.log_format == "json", verbose=verbose, redactor=secrets)
    ctx.obj = {"settings": settings, "redactor": secrets}


index_dir_option = click.option(
    "--index-dir", type=click.Path(path_type=Path), default=None, help="Embedded index directory."
)


# ---------------------------------------------------------------- ingest / search / index


async def _ingest(settings: Settings, paths: tuple[Path, ...], space: str | None, progress: bool,  # type: ignore[no-untyped-def]
                  rebuild: bool = False):
    from connectors.local import LocalFolderConnector
    from pipeline.errors import InputError
    from pipeline.factory import drop_index, ingest_options, open_stack
    from pipeline.ingest.run import ingest_pages

    options = ingest_options(settings)
    connector = LocalFolderConnector([Path(p) for p in paths], space=space)

    def explained(exc: InputError) -> InputError:
        # "no pages found (3 files failed)" alone hides why: name the first failing file and its reason.
        if not connector.failures:
            return exc
        where, reason = connector.failures[0]
        return InputError(f"{exc}; {where}: {reason}")

    # Read the first page before loading the model, so bad input fails at once, not after seconds.
    pages = connector.iter_pages()
    try:
        first = await anext(pages)
    except InputError as exc:
        raise explained(exc) from exc

    async def all_pages() -> AsyncIterator[Page]:
        yield first
        async for page in pages:
            yield page

    if rebuild:
        await drop_index(settings)
    embedder, sparse, index = await open_stack(settings)
    try:
        report = await ingest_pages(
            all_pages(), index=index, embedder=embedder, sparse=sparse, options=options, progress=progress,
        )
    except InputError as exc:
        raise explained(exc) from exc
    finally:
        await index.close()
    return report, connector.failures


@main.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--space", default=None, help="Override the space key of every page.")
@index_dir_option
@click.option("--sample", is_flag=True, help="Ingest the bundled sample space.")
@click.option("--no-progress", is_flag=True, help="No progress bar (evidence embedded, rate, ETA).")
@click.option("--rebuild", is_flag=True,
              help="Delete the index first (another embedder or recipe); every page is embedded again.")
@click.pass_context
@cli_errors
def ingest(ctx: click.Context, paths: tuple[Path, ...], space: str | None, index_dir: Path | None,
           sample: bool, no_progress: bool, rebuild: bool) -> None:
    """Index Confluence pages from export folders (ConfQuestions-style JSON or HTML exports)."""
    from connectors.local import sample_space_dir
    from pipeline.errors import InputError

    settings = load_settings(ctx, index_dir=index_dir)
    if sample:
        paths = (*paths, sample_space_dir())
    if not paths:
        raise InputError("give at least one PATH to ingest (or --sample for the bundled sample space)")
    missing = [str(p) for p in paths if not Path(p).expanduser().exists()]
    if missing:
        raise InputError(f"path not found: {', '.join(missing)}")
    report, failures = run(_ingest(settings, paths, space, progress=not no_progress, rebuild=rebuild))
    kinds = ", ".join(f"{k} {v}" for k, v in report.evidence_by_kind.items()) or "none"
    partial = f", partial {len({pid for pid, _ in report.partial})}" if report.partial else ""
    click.echo(
        f"pages {report.pages_seen} (added {report.added}, updated {report.updated}, unchanged "
        f"{report.unchanged}, failed {len(report.failed) + len(failures)}{partial}) · evidence {report.evidence} "
        f"({kinds}) · {report.seconds:.1f} s · index {settings.resolved_index_dir}"
    )
    echo_page_problems([*failures, *report.failed], report.partial, report.warnings)
    if report.failed or failures or report.partial:
        sys.exit(1)


def echo_page_problems(failed: Sequence[tuple[str, str]], partial: Sequence[tuple[str, str]],
                       warnings: Sequence[tuple[str, str]]) -> None:
    """One stderr line per page problem: ``failed:`` (not indexed), ``partial:`` (text lost), ``warning:``."""
    for label, rows in (("failed", failed), ("partial", partial), ("warning", warnings)):
        for where, reason in rows:
            echo_error(f"{label}: {where}: {reason}")


async def _search(settings: Settings, query: str, k: int, mode: str | None, trace: bool):  # type: ignore[no-untyped-def]
    from pipeline.answer.retrieve import retrieve
    from pipeline.factory import make_reranker_from, open_stack, retrieval_config

    embedder, sparse, index = await open_stack(settings, require_index=True)
    try:
        cfg = retrieval_config(settings)
        from dataclasses import replace

        cfg = replace(cfg, final_k=k)
        if mode:
            cfg = replace(cfg, mode=mode)  # type: ignore[arg-type]  # click.Choice guarantees the literal
        return await retrieve(query, index=index, embedder=embedder, sparse=sparse, config=cfg,
                              reranker=make_reranker_from(settings), trace=trace)
    finally:
        await index.close()


@main.command()
@click.argument("query")
@click.option("-k", default=10, show_default=True)
@click.option("--mode", type=click.Choice(["lexical", "dense", "hybrid"]), default=None)
@click.option("--json", "as_json", is_flag=True)
@index_dir_option
@click.pass_context
@cli_errors
def search(ctx: click.Context, query: str, k: int, mode: str | None, as_json: bool, index_dir: Path | None) -> None:
    """Retrieve evidence for QUERY (no answer generation)."""
    from pipeline.errors import InputError

    if not query.strip():
        raise InputError("the query is empty")
    settings = load_settings(ctx, index_dir=index_dir)
    result = run(_search(settings, query, k, mode, trace=False))
    if as_json:
        click.echo(json.dumps({
            "query": query,
            "timings_ms": result.timings_ms,
            "hits": [{"rank": h.rank, "score": h.score, "kind": h.evidence.kind, "title": h.evidence.title,
                      "url": h.evidence.url, "evidence_id": h.evidence.id, "content": h.content}
                     for h in result.hits],
        }, ensure_ascii=False, indent=2))
        return
    for h in result.hits:
        click.echo(f"{h.rank:>2}. {h.score:.4f} {h.evidence.kind:<7} {h.evidence.title} <{h.evidence.url}>")
        click.echo("    " + (h.content or h.evidence.text).replace("\n", "\n    ")[:600])
    click.echo(f"({sum(result.timings_ms.values()):.1f} ms)")


@main.group()
def index() -> None:
    """Inspect or move the evidence index."""


def _index_identity(settings: Settings, index_dir: Path | None) -> tuple[int, str]:
    """(dimension, embedder name) to open an index with, for commands that never embed: the embedded
    index's manifest when there is one (no model load, and no mismatch for an index built with another
    embedder), else the configured embedder."""
    if not settings.qdrant_url:
        manifest = Path(index_dir or settings.resolved_index_dir) / "manifest.json"
        try:
            data = json.loads(manifest.read_text(encoding="utf-8"))
            return int(data["dim"]), str(data["embedder"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    from pipeline.factory import make_embedder_from

    embedder = make_embedder_from(settings, cache=False)
    return embedder.dim, embedder.name


@index.command("stats")
@index_dir_option
@click.pass_context
@cli_errors
def index_stats(ctx: click.Context, index_dir: Path | None) -> None:
    """Points, pages, evidence by kind, size on disk."""
    from pipeline.factory import make_index_from

    settings = load_settings(ctx, index_dir=index_dir)

    async def go() -> dict[str, object]:
        dim, name = _index_identity(settings, index_dir)
        idx = make_index_from(settings)
        await idx.open(dense_dim=dim, embedder=name)
        try:
            return await idx.stats()
        finally:
            await idx.close()

    click.echo(json.dumps(run(go()), indent=2, default=str))


# ---------------------------------------------------------------- ask / chat / explain


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
    click.echo("timings (ms): " + ", ".join(f"{k}={v:.1f}" for k, v in result.answer.trace.timings_ms.items()))


@main.command()
@click.argument("question")
@click.option("--trace", is_flag=True, help="Show completion, lexical/dense/fused lists, prompt, timings.")
@click.option("--session", default=None, help="Continue a named conversation.")
@index_dir_option
@click.pass_context
@cli_errors
def ask(ctx: click.Context, question: str, trace: bool, session: str | None, index_dir: Path | None) -> None:
    """Answer one QUESTION with citations."""
    from pipeline.factory import build_engine

    settings = load_settings(ctx, index_dir=index_dir)
    key = f"cli:{session}" if session else f"cli:ask:{time.time_ns()}"

    async def go() -> Any:
        async with await build_engine(settings, trace=trace, require_index=True) as engine:
            return await engine.ask(key, question, trace=trace)

    _print_turn(run(go()), trace)


@main.command()
@click.option("--session", default="default", show_default=True, help="Conversation name (persisted).")
@click.option("--trace", is_flag=True)
@index_dir_option
@click.pass_context
@cli_errors
def chat(ctx: click.Context, session: str, trace: bool, index_dir: Path | None) -> None:
    """Multi-turn chat. /new starts a new thread, /explain explains the last answer, /quit exits."""
    from pipeline.factory import build_engine

    settings = load_settings(ctx, index_dir=index_dir)

    async def go() -> None:
        engine = await build_engine(settings, trace=trace, require_index=True)
        key = f"cli:{session}:{time.time_ns()}"
        last_turn: int | None = None
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
                    ex = await engine.explain(last_turn)
                    click.echo(ex.text)
                    continue
                if not line:
                    continue
                result = await engine.ask(key, line, trace=trace)
                last_turn = result.turn_id
                _print_turn(result, trace, interactive=True)
        finally:
            await engine.aclose()

    run(go())


@main.command()
@click.option("--turn", "turn_id", type=int, default=None, help="Turn id (default: the latest turn).")
@click.option("--method", default=None, help="naive | cfa | cfa_clusters | page | ...")
@click.option("--trace", is_flag=True, help="Show each counterfactual answer and its similarity.")
@index_dir_option
@click.pass_context
@cli_errors
def explain(ctx: click.Context, turn_id: int | None, method: str | None, trace: bool, index_dir: Path | None) -> None:
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
            return await engine.explain(tid, method=method)

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


# ---------------------------------------------------------------- demo / config


@main.command()
@click.option("--question", default=DEMO_QUESTION, show_default=True)
@click.pass_context
@cli_errors
def demo(ctx: click.Context, question: str) -> None:
    """Ingest the bundled sample space into the embedded index and answer a question."""
    from connectors.local import sample_space_dir
    from pipeline.factory import build_engine

    settings: Settings = ctx.obj["settings"]
    report, _ = run(_ingest(settings, (sample_space_dir(),), None, progress=False))
    click.echo(f"ingested sample space: {report.pages_seen} pages, {report.evidence} new evidence, "
               f"{report.unchanged} unchanged, {report.seconds:.1f} s")
    click.echo(f"\nQ: {question}")

    async def go() -> Any:
        async with await build_engine(settings) as engine:
            return await engine.ask(f"cli:demo:{time.time_ns()}", question)

    _print_turn(run(go()), trace=False)


@main.group()
def config() -> None:
    """Show the effective configuration."""


@config.command("show")
@click.pass_context
def config_show(ctx: click.Context) -> None:
    """Print the effective configuration with secrets masked."""
    click.echo(json.dumps(ctx.obj["settings"].masked(), indent=2, default=str))


def _register_optional() -> None:
    """Commands that live in other modules (eval, sync, serve, backup)."""
    from evident import commands

    commands.register(main)


_register_optional()
