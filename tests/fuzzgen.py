"""Seeded hostile pages for the ingest fuzz suite (tests/test_fuzz_ingest.py, benchmarks/fuzz_ingest.py).

Every case is one file of an export folder. Visible text carries canary words (``zq`` + 8 letters);
after an ingest, ``check`` counts a *silent drop* for every canary of a page that is neither in the
index nor reported (failed / partial). Cases cover each trigger of the robustness issue: malformed
storage format, span abuse, deep nesting, huge and wide tables, quadratic lists, evidence floods,
wrong JSON types, JSON pathologies, bad encodings, lone surrogates, REST-shaped objects, symlinks.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers import ingest_options

from connectors.local import LocalFolderConnector
from pipeline.index.edge import EdgeIndex
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.report import IngestReport
from pipeline.ingest.run import ingest_pages
from pipeline.protocols import Embedder, SparseEncoder

Expect = str  # "index": canaries must be searchable unless reported partial; "report": must be reported


@dataclass
class Case:
    name: str
    data: bytes
    category: str
    canaries: list[str] = field(default_factory=list)
    expect: Expect = "index"
    page_id: str | None = None  # JSON pages: the id; HTML pages are matched by URL
    symlink_outside: bool = False


class _Gen:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.canaries: list[str] = []

    def canary(self) -> str:
        word = "zq" + "".join(self.rng.choice(string.ascii_lowercase) for _ in range(8))
        self.canaries.append(word)
        return word

    def words(self, n: int) -> str:
        return " ".join("".join(self.rng.choice("aeioulnrstdk") for _ in range(self.rng.randint(2, 9)))
                        for _ in range(n))

    # ------------------------------------------------------------ well-formed building blocks

    def block(self, rendered: bool = False) -> str:
        """One block of storage format; ``rendered``: plain HTML only, as an HTML export holds."""
        c = self.canary()
        choices = [
            lambda: f"<p>{self.words(12)} {c} {self.words(6)}.</p>",
            lambda: f"<h2>{c} {self.words(2)}</h2><p>{self.words(20)}</p>",
            lambda: (
                f"<ul><li>{self.words(4)}<ul><li>{c} "
                f"{self.words(3)}</li></ul></li><li>{self.words(5)}</li></ul>"
            ),
            lambda: (
                f'<table><tbody><tr><th>Name</th><th>Task</th></tr><tr><td rowspan="2">{self.words(1)}</td>'
                f"<td>{c}</td></tr><tr><td>{self.words(3)}</td></tr></tbody></table>"
            ),
            lambda: (
                f'<ac:structured-macro ac:name="info"><ac:parameter ac:name="title">{self.words(2)}'
                f"</ac:parameter><ac:rich-text-body><p>{c} {self.words(8)}</p></ac:rich-text-body>"
                "</ac:structured-macro>"
            ),
            lambda: (
                f'<ac:structured-macro ac:name="code"><ac:plain-text-body><![CDATA[if a < b && {c}:\n'
                f"    run()]]></ac:plain-text-body></ac:structured-macro>"
            ),
            lambda: (
                f"<ac:task-list><ac:task><ac:task-id>1</ac:task-id><ac:task-status>complete</ac:task-status>"
                f"<ac:task-body>{c} {self.words(3)}</ac:task-body></ac:task></ac:task-list>"
            ),
            lambda: (
                f'<p><ac:link><ri:page ri:content-title="{self.words(2)}"/><ac:plain-text-link-body>'
                f"<![CDATA[{c}]]></ac:plain-text-link-body></ac:link> {self.words(4)}</p>"
            ),
        ]
        return self.rng.choice(choices[:4] if rendered else choices)()

    def body(self, blocks: int = 6, rendered: bool = False) -> str:
        return "".join(self.block(rendered) for _ in range(blocks))

    # ------------------------------------------------------------ hostile storage format

    def malformed(self) -> str:
        c = self.canary()
        return self.rng.choice([
            f"<p data=x class=y>{c} unquoted</p>",
            f"<p>undefined &foo; &bar entity {c}</p>",
            f'<xyz:thing a="1">{c} unknown prefix</xyz:thing>',
            f"</div></span><p>{c} after stray end tags</p>",
            f"</body></html><p>{c} after a stray document end</p><body>",
            f"<p><b><i>{c} never closed",
            f"<p><b><i>{c} crossed</b></i></p>",
            f"<![CDATA[{c} bare cdata]]>",
            f"<p>\x01\x02control {c}\x0b\x0c</p>",
            f"<p>a < b & c > d {c}</p>",
            f"<p><!channel> <@U123> <!here> {c}</p>",
            f"<p>lone \ud800 surrogate {c}</p>",
            f"<p>invalid char refs &#0; &#xD800; &#99999999; {c}</p>",
        ])

    def deep(self) -> str:
        levels = self.rng.choice([250, 1500, 3000, 12000])
        tag = self.rng.choice(["div", "span", "blockquote"])
        return f"<{tag}>" * levels + f"<p>{self.canary()} deep</p>" + f"</{tag}>" * levels + self.block()

    def spans(self) -> str:
        rows = []
        for r in range(self.rng.randint(5, 60)):
            span = self.rng.choice(["1000", "99999", "-5", "abc", "0", "3", ""])
            text = self.words(self.rng.randint(5, 60))
            cell = (
                f'<td rowspan="{span}" colspan="{self.rng.choice(["1000", "70000", "2", "x"])}">{text}</td>'
            )
            rows.append(f"<tr>{cell}<td>{self.canary() if r % 7 == 0 else self.words(2)}</td></tr>")
        return "<table><tbody><tr><th>A</th><th>B</th></tr>" + "".join(rows) + "</tbody></table>"

    def huge_table(self) -> str:
        n = self.rng.choice([3000, 6000])
        marks = {0: self.canary(), n // 2: self.canary(), n - 1: self.canary()}
        rows = "".join(f"<tr><td>{i}</td><td>{marks.get(i, self.words(2))}</td><td>{self.words(3)}</td></tr>"
                       for i in range(n))
        return f"<table><tbody><tr><th>#</th><th>Key</th><th>Value</th></tr>{rows}</tbody></table>"

    def wide_table(self) -> str:
        cols = self.rng.choice([200, 400])
        head = "".join(f"<th>h{i}</th>" for i in range(cols))
        row = "".join(
            f"<td>{self.canary() if i in (0, cols - 1) else self.words(1)}</td>" for i in range(cols)
        )
        return f"<table><tbody><tr>{head}</tr><tr>{row}</tr></tbody></table>"

    def quadratic_list(self) -> str:
        n = self.rng.choice([5000, 20000])
        subs = "".join(f"<ul><li>{self.words(1)}</li></ul>" for _ in range(n))
        return f"<ul><li>{self.canary()} head{subs}<ul><li>{self.canary()}</li></ul></li></ul>"

    def flood(self) -> str:
        n = 3000
        return "".join(f"<ul><li>{self.canary() if i < 3 else self.words(2)}</li></ul>" for i in range(n))


def _page(page_id: str, title: str, body: str, **extra: Any) -> dict[str, Any]:
    return {"id": page_id, "title": title, "url": f"https://wiki.example/pages/{page_id}", "space": "FUZZ",
            "content": body, **extra}


def _json(obj: Any) -> bytes:
    return json.dumps(obj).encode("utf-8")  # ensure_ascii: lone surrogates become \\udXXX escapes


def generate(n: int, seed: int = 0) -> list[Case]:
    """``n`` cases, cycling through every category with seeded variation."""
    return list(iter_cases(n, seed))


def iter_cases(n: int, seed: int = 0) -> Iterator[Case]:
    makers: list[Callable[[_Gen, int], Case]] = [
        _valid, _malformed, _deep, _spans, _huge_table, _wide_table, _quadratic, _flood, _too_large,
        _wrong_types, _json_pathology, _rest_shapes, _surrogate_title, _list_file, _html_export, _symlink,
    ]
    for i in range(n):
        yield makers[i % len(makers)](_Gen(seed * 1_000_003 + i), i)


def _with(gen: _Gen, i: int, category: str, body: str, expect: Expect = "index") -> Case:
    pid = f"fz-{i}"
    return Case(f"{i:05d}-{category}.json", _json(_page(pid, f"Page {i} {category}", body)), category,
                list(gen.canaries), expect, pid)


def _valid(gen: _Gen, i: int) -> Case:
    return _with(gen, i, "valid", gen.body())


def _malformed(gen: _Gen, i: int) -> Case:
    parts = [gen.block()]
    for _ in range(gen.rng.randint(1, 4)):
        parts += [gen.malformed(), gen.block()]
    if gen.rng.random() < 0.3:  # an unterminated quote hides what follows (as in a browser): last on the page
        parts.append('<p title="unterminated>hidden words</p>')
    return _with(gen, i, "malformed", "".join(parts))


def _deep(gen: _Gen, i: int) -> Case:
    return _with(gen, i, "deep", gen.deep())


def _spans(gen: _Gen, i: int) -> Case:
    return _with(gen, i, "spans", gen.block() + gen.spans() + gen.block())


def _huge_table(gen: _Gen, i: int) -> Case:
    return _with(gen, i, "huge-table", gen.huge_table())


def _wide_table(gen: _Gen, i: int) -> Case:
    return _with(gen, i, "wide-table", gen.wide_table())


def _quadratic(gen: _Gen, i: int) -> Case:
    return _with(gen, i, "quadratic-list", gen.quadratic_list())


def _flood(gen: _Gen, i: int) -> Case:
    return _with(gen, i, "evidence-flood", gen.flood())


def _too_large(gen: _Gen, i: int) -> Case:
    body = (
        "<p>" + gen.words(10) + "</p>" + "<p>" + "x" * 100 + "</p>" * 1 + ("<p>" + "y" * 5000 + "</p>") * 900
    )
    gen.canaries.clear()
    return _with(gen, i, "too-large", body, expect="report")


def _wrong_types(gen: _Gen, i: int) -> Case:
    field_, value = gen.rng.choice(
        [
            ("ancestors", 7),
            ("labels", 3),
            ("id", [1, 2]),
            ("id", True),
            ("id", 1.5),
            ("title", 12),
            ("space", None),
            ("version", "abc"),
            ("version", -1),
            ("content", ["<p>x</p>"]),
            ("content", {"no": "storage"}),
            ("ancestors", [{"id": 1}]),
            ("date", 20240101),
        ]
    )
    record = _page(f"fz-{i}", f"Page {i}", gen.body(2))
    record[field_] = value
    gen.canaries.clear()
    return Case(f"{i:05d}-wrong-{field_}.json", _json(record), "wrong-types", [], "report", None)


def _json_pathology(gen: _Gen, i: int) -> Case:
    kind = gen.rng.choice(["deep", "bigint", "nan", "utf8", "truncated", "empty", "bom"])
    page = _page(f"fz-{i}", f"Page {i}", gen.body(2))
    if kind == "deep":
        data = b"[" * 100_000 + b"]" * 100_000
    elif kind == "bigint":
        data = _json(page)[:-1] + b', "n": ' + b"9" * 5000 + b"}"
    elif kind == "nan":
        data = _json(page)[:-1] + b', "version": NaN}'
    elif kind == "utf8":
        data = _json(page)[:-2] + b"\xff\xfe\"}"
    elif kind == "truncated":
        data = _json(page)[: len(_json(page)) // 2]
    elif kind == "empty":
        data = b""
    else:
        return Case(
            f"{i:05d}-json-bom.json",
            b"\xef\xbb\xbf" + _json(page),
            "json",
            list(gen.canaries),
            "index",
            f"fz-{i}",
        )
    gen.canaries.clear()
    return Case(f"{i:05d}-json-{kind}.json", data, "json", [], "report", None)


def _rest_shapes(gen: _Gen, i: int) -> Case:
    body = gen.body(3)
    if gen.rng.random() < 0.5:
        record: dict[str, Any] = {
            "id": 9_000_000 + i,
            "type": "page",
            "title": f"REST {i}",
            "space": {"key": "FUZZ"},
            "body": {"storage": {"value": body}},
            "version": {"number": 3, "when": "2025-01-02T03:04:05.000Z"},
            "_links": {"webui": f"/spaces/FUZZ/pages/{9_000_000 + i}", "base": "https://w.example/wiki"},
            "ancestors": [{"title": "Home"}],
            "metadata": {"labels": {"results": [{"name": "x"}]}},
        }
        pid = str(9_000_000 + i)
    else:
        record = _page(
            f"fz-{i}", f"REST content {i}", {"storage": {"value": body, "representation": "storage"}}
        )
        pid = f"fz-{i}"
    return Case(f"{i:05d}-rest.json", _json(record), "rest", list(gen.canaries), "index", pid)


def _surrogate_title(gen: _Gen, i: int) -> Case:
    return Case(f"{i:05d}-surrogate.json", _json(_page(f"fz-{i}", f"Title \ud83d half {i}", gen.body(2),
                                                       labels=["a\udfffb"])), "surrogate",
                list(gen.canaries), "index", f"fz-{i}")


def _list_file(gen: _Gen, i: int) -> Case:
    good = _page(f"fz-{i}-a", f"List {i} a", gen.body(2))
    kept = list(gen.canaries)
    bad = _page(f"fz-{i}-b", f"List {i} b", "<p>x</p>", ancestors=5)
    # one good page, one bad: the good one must be indexed, the bad one reported as file.json[1]
    return Case(f"{i:05d}-list.json", _json([good, bad]), "list-file", kept, "index", f"fz-{i}-a")


def _html_export(gen: _Gen, i: int) -> Case:
    body = gen.body(3, rendered=True)
    encoding = gen.rng.choice(["utf-8", "latin-1", "utf-16"])
    text = (f'<html><head><meta charset="{encoding}"><title>Export {i} : FUZZ</title></head><body>'
            f'<div id="main-content">{body}<p>Größe {gen.canary()}</p></div></body></html>')
    data = text.encode(encoding, "replace") if encoding != "utf-16" else text.encode("utf-16")
    return Case(f"{i:05d}-export.html", data, "html", list(gen.canaries), "index", None)


def _symlink(gen: _Gen, i: int) -> Case:
    gen.canaries.clear()
    return Case(f"{i:05d}-outside.html", b"<html><body><p>secret</p></body></html>", "symlink", [], "report",
                None, symlink_outside=True)


# ---------------------------------------------------------------- running and checking


@dataclass
class FuzzResult:
    cases: int = 0
    crashes: list[str] = field(default_factory=list)
    silent_drops: list[str] = field(default_factory=list)  # "case: canary"
    unreported: list[str] = field(default_factory=list)  # "report" cases neither failed nor warned
    coverage_reports: int = 0  # pages reported partial for low text coverage
    failed: int = 0
    partial: int = 0
    indexed_pages: int = 0
    inconsistent: list[str] = field(default_factory=list)
    slowest_page: tuple[str, float] = ("", 0.0)
    report: IngestReport | None = None


def write_cases(cases: Iterable[Case], folder: Path, outside: Path) -> list[Case]:
    """Write each case's file and drop its bytes (1,000 cases would otherwise hold ~300 MB)."""
    folder.mkdir(parents=True, exist_ok=True)
    outside.mkdir(parents=True, exist_ok=True)
    written = []
    for case in cases:
        if case.symlink_outside:
            target = outside / case.name
            target.write_bytes(case.data)
            (folder / case.name).symlink_to(target)
        else:
            (folder / case.name).write_bytes(case.data)
        case.data = b""
        written.append(case)
    return written


async def run_cases(cases: Iterable[Case], workdir: Path, *, embedder: Embedder, sparse: SparseEncoder,
                    options: IngestOptions | None = None) -> FuzzResult:
    """Write ``cases`` as an export folder, ingest it into a fresh index and check every expectation."""
    folder = workdir / "export"
    cases = write_cases(cases, folder, workdir / "outside")
    index = EdgeIndex(workdir / "index")
    await index.open(dense_dim=embedder.dim, embedder=embedder.name)
    result = FuzzResult(cases=len(cases))
    connector = LocalFolderConnector([folder])
    try:
        report = await ingest_pages(
            connector.iter_pages(),
            index=index,
            embedder=embedder,
            sparse=sparse,
            options=options or ingest_options(),
            vocabulary=workdir / "vocabulary.npz",
        )
    except Exception as exc:  # noqa: BLE001 - a crash is what the fuzz suite counts
        result.crashes.append(f"{type(exc).__name__}: {exc}")
        await index.close()
        return result
    try:
        texts: dict[str, list[str]] = {}
        urls: dict[str, str] = {}
        async for point in index.export_points():
            texts.setdefault(point.evidence.page_id, []).append(point.content)
            urls[point.evidence.url.rsplit("/", 1)[-1]] = point.evidence.page_id
        result.inconsistent = await _consistency(index)
    finally:
        await index.close()
    result.report = report
    result.failed = len(report.failed) + len(connector.failures)
    result.partial = len({pid for pid, _ in report.partial})
    result.coverage_reports = sum(1 for _, why in report.partial if "visible text" in why)
    result.indexed_pages = len(texts)
    result.slowest_page = report.slowest_page
    reported = {pid for pid, _ in (*report.failed, *report.partial)}
    reported_files = {Path(where.split("[")[0]).name for where, _ in connector.failures}
    for case in cases:
        pid = case.page_id or urls.get(case.name)
        if case.expect == "report":
            if case.name not in reported_files and (pid is None or pid not in reported):
                result.unreported.append(case.name)
            continue
        if pid in reported:
            continue
        indexed = "\n".join(texts.get(pid or "", []))
        result.silent_drops += [f"{case.name}: {c}" for c in case.canaries if c not in indexed]
    return result


async def _consistency(index: EdgeIndex) -> list[str]:
    """Every live page has one version and its evidence positions are unique; nothing is left staged."""
    problems = []
    stats = await index.stats()
    if stats.get("staged"):
        problems.append(f"{stats['staged']} staged points left")
    versions: dict[str, set[str]] = {}
    positions: dict[str, list[int]] = {}
    async for point in index.export_points():
        versions.setdefault(point.evidence.page_id, set()).add(point.page_hash)
        positions.setdefault(point.evidence.page_id, []).append(point.evidence.position)
    problems += [f"page {pid} has {len(v)} versions live" for pid, v in versions.items() if len(v) > 1]
    problems += [
        f"page {pid} repeats evidence positions" for pid, p in positions.items() if len(p) != len(set(p))
    ]
    return problems
