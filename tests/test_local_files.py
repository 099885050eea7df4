"""Local folders beyond exports: Markdown, text, PDF and Word files, citable URLs, and deleted files leaving
the index."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import CLI_ISOLATE, ingest_options
from pdf_maker import minimal_pdf, word_document

from connectors.local import LocalFolderConnector
from connectors.local_ingest import ingest_folders
from evident.settings import Settings
from pipeline.factory import open_stack, vocabulary_path
from pipeline.ingest.run import page_to_evidence
from pipeline.models.term_counts import TermCounts

pytestmark = pytest.mark.slow

RUNBOOK_MD = """# Deploy runbook

Deploys go out on **Tuesdays**. <script>alert(1)</script> is shown as text.

| Service | Owner |
|---|---|
| billing | Alice |
| search | Bob |

- tag the release
- announce in #deploys
"""


async def _pages(folder: Path, **kw: object) -> tuple[LocalFolderConnector, dict[str, object]]:
    src = LocalFolderConnector([folder], **kw)  # type: ignore[arg-type]
    return src, {p.title: p async for p in src.iter_pages()}


async def test_markdown_text_and_pdf_become_pages_with_evidence(tmp_path: Path) -> None:
    docs = tmp_path / "OPS"
    docs.mkdir()
    (docs / "runbook.md").write_text(RUNBOOK_MD)
    (docs / "notes.txt").write_text("First paragraph\nstill first.\n\nSecond paragraph.\n")
    (docs / "vpn.pdf").write_bytes(
        minimal_pdf(["The VPN gateway is vpn2.example.com.", "Ask the platform team."], title="VPN guide")
    )
    src, pages = await _pages(docs)
    assert set(pages) == {"Deploy runbook", "notes", "VPN guide"} and src.failures == []
    md = pages["Deploy runbook"]
    assert md.space == "OPS" and md.id.startswith("doc-") and md.url.startswith("file://")
    evidence = page_to_evidence(md, ingest_options())  # type: ignore[arg-type]
    kinds = {e.kind for e in evidence}
    assert {"row", "list", "table", "passage"} <= kinds
    assert any("Owner is Alice" in e.text for e in evidence)
    # escaped, not markup
    assert any("<script>alert(1)</script> is shown as text" in e.text for e in evidence)
    txt = page_to_evidence(pages["notes"], ingest_options())  # type: ignore[arg-type]
    lines = [line for e in txt for line in e.text.split("\n")]
    assert lines == ["First paragraph still first.", "Second paragraph."]  # paragraphs at blank lines
    pdf = page_to_evidence(pages["VPN guide"], ingest_options())  # type: ignore[arg-type]
    assert any("vpn2.example.com" in e.text and e.headings == ("Page 1",) for e in pdf)


async def test_word_documents_become_pages_with_headings_lists_and_rows(tmp_path: Path) -> None:
    (tmp_path / "oncall.docx").write_bytes(word_document())
    src, pages = await _pages(tmp_path)
    assert list(pages) == ["On-call handbook"] and src.failures == []
    evidence = page_to_evidence(pages["On-call handbook"], ingest_options())  # type: ignore[arg-type]
    by_kind = {e.kind: e for e in evidence}
    assert {"passage", "list", "table", "row"} <= set(by_kind)
    assert by_kind["passage"].headings == ("Escalation",)
    assert "Page the <duty> manager after 30 minutes." in by_kind["passage"].text  # text, not markup
    assert "check the dashboard" in by_kind["list"].text and "open an incident" in by_kind["list"].text
    assert any("Owner is Alice" in e.text for e in evidence)


async def test_word_documents_that_are_broken_or_bombs_are_refused_by_name(tmp_path: Path) -> None:
    import zipfile

    (tmp_path / "broken.docx").write_bytes(b"PK\x03\x04 not a zip")
    with zipfile.ZipFile(tmp_path / "bomb.docx", "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("word/document.xml", b"<" + b"a" * (65 * 2**20))  # 65 MiB of text, a few KB packed
    with zipfile.ZipFile(tmp_path / "notword.docx", "w") as z:
        z.writestr("hello.txt", "a zip, but no Word document inside")
    (tmp_path / "ok.md").write_text("# Fine\n\ntext\n")
    src, pages = await _pages(tmp_path)
    assert list(pages) == ["Fine"]
    reasons = {Path(where).name: why for where, why in src.failures}
    assert reasons["broken.docx"] == "not a Word document (not a zip archive)"
    assert reasons["bomb.docx"].startswith("the Word document unpacks to")
    assert reasons["notword.docx"].startswith("cannot read the Word document")


async def test_unreadable_documents_are_reported_one_line_each(tmp_path: Path) -> None:
    (tmp_path / "ok.md").write_text("# Fine\n\ntext\n")
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4\nnot really a pdf")
    (tmp_path / "scan.pdf").write_bytes(minimal_pdf([]))
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "empty.md").write_text("  \n")
    src, pages = await _pages(tmp_path)
    assert list(pages) == ["Fine"]
    reasons = {Path(where).name: why for where, why in src.failures}
    assert reasons["broken.pdf"].startswith("cannot read the PDF")
    assert "no text layer" in reasons["scan.pdf"]
    assert "not UTF-8" in reasons["latin1.txt"] and reasons["empty.md"] == "empty file"


async def test_a_base_url_makes_file_pages_citable(tmp_path: Path) -> None:
    sub = tmp_path / "team docs"
    sub.mkdir()
    (sub / "on call.md").write_text("# On call\n\nThe rotation is weekly.\n")
    (sub / "export.html").write_text(
        "<html><head><title>Export</title></head><body><p>Hello.</p></body></html>"
    )
    (sub / "record.json").write_text(json.dumps({"id": "42", "title": "Record", "url": "https://wiki/x/42",
                                                  "space": "ENG", "content": "<p>r</p>"}))
    _, pages = await _pages(tmp_path, base_url="https://docs.example.com/runbooks")
    assert pages["On call"].url == "https://docs.example.com/runbooks/team%20docs/on%20call.md"
    assert pages["Export"].url == "https://docs.example.com/runbooks/team%20docs/export.html"
    assert pages["Record"].url == "https://wiki/x/42"  # type: ignore[attr-defined]  # its own URL is kept


async def test_deleted_files_and_pages_leave_the_index_and_failed_files_keep_theirs(tmp_path: Path) -> None:
    folder, data = tmp_path / "docs", tmp_path / "data"
    folder.mkdir()
    (folder / "a.md").write_text("# Alpha\n\nAlpha text about deploys.\n")
    (folder / "b.txt").write_text("Bravo text about rotations.\n")
    (folder / "c.json").write_text(json.dumps([
        {"id": "1", "title": "One", "url": "https://w/1", "space": "S", "content": "<p>one</p>"},
        {"id": "2", "title": "Two", "url": "https://w/2", "space": "S", "content": "<p>two</p>"}]))
    (folder / "d.json").write_text(
        json.dumps(
            {"id": "3", "title": "Three", "url": "https://w/3", "space": "S", "content": "<p>three</p>"}
        )
    )
    settings = Settings.load(env={**CLI_ISOLATE, "EVIDENT_DATA_DIR": str(data)})
    first = await ingest_folders(settings, [folder])
    assert first.ingest.added == 5 and first.deleted == []

    (folder / "a.md").unlink()  # deleted file
    (folder / "c.json").write_text(json.dumps([  # page 2 removed from a file read in full
        {"id": "1", "title": "One", "url": "https://w/1", "space": "S", "content": "<p>one</p>"}]))
    (folder / "d.json").write_text("{not json")  # unreadable this time: its page stays
    second = await ingest_folders(settings, [folder])
    assert sorted(second.deleted) == sorted(["2", first_id(first, "a.md")])
    assert [Path(w).name for w, _ in second.failures] == ["d.json"]
    vocabulary = vocabulary_path(settings)
    assert vocabulary is not None
    counts = TermCounts.load(vocabulary)  # the deleted pages' words left the keyword vocabulary's counts
    assert "alpha" not in counts.df and "deploys" not in counts.df and counts.df["bravo"] >= 1
    _embedder, _sparse, index = await open_stack(settings)
    try:
        assert set(await index.page_hashes()) == {"1", "3", first_id(first, "b.txt")}
    finally:
        await index.close()
        _embedder.close()


def first_id(_report: object, name: str) -> str:
    """The id of a page made from file ``name`` at the top of the folder (its path in the folder, hashed)."""
    import hashlib

    return "doc-" + hashlib.sha1(name.encode()).hexdigest()[:16]
