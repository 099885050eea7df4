"""Plain documents next to Confluence exports: Markdown, plain text, PDF and Word, as a title and an HTML
body.

The body is ordinary HTML that the storage-format parser reads like a page (headings, paragraphs, lists,
tables), so these files get the same evidence, context and bounds as wiki pages. Markdown is rendered by
``markdown-it-py`` (CommonMark plus tables) with raw HTML in the source escaped; text is split into paragraphs
at blank lines; a PDF's text layer is read by ``pypdf`` page by page, at most ``MAX_PDF_PAGES`` pages, each
PDF page a section headed "Page n". A PDF without a text layer (a scan) is an error that says so. A Word
document (``.docx``) is read by ``python-docx`` in document order: headings (and the Title) as headings, list
paragraphs as lists, tables as tables (the first row as header), other paragraphs as paragraphs; one that
would unpack to more than ``MAX_DOCX_UNPACKED`` bytes is refused before it is parsed.
"""

from __future__ import annotations

import html
import io
import logging
import re
from typing import Any

from pipeline.errors import InputError

MARKDOWN_SUFFIXES = (".md", ".markdown")
TEXT_SUFFIXES = (".txt",)
PDF_SUFFIXES = (".pdf",)
DOCX_SUFFIXES = (".docx",)
DOCUMENT_SUFFIXES = MARKDOWN_SUFFIXES + TEXT_SUFFIXES + PDF_SUFFIXES + DOCX_SUFFIXES
MAX_DOCX_UNPACKED = 64 * 2**20
MAX_PDF_PAGES = 500
PDF_PARAGRAPH_CHARS = 600

_ATX_TITLE = re.compile(r"^\s{0,3}#\s+(.+?)\s*#*\s*$", re.MULTILINE)


def document_body(suffix: str, data: bytes, fallback_title: str) -> tuple[str, str]:
    """(title, HTML body) of a Markdown, text, PDF or Word file; ``InputError`` with the reason when
    unreadable."""
    if suffix in PDF_SUFFIXES:
        return _pdf(data, fallback_title)
    if suffix in DOCX_SUFFIXES:
        return _docx(data, fallback_title)
    text = _decode(data)
    if not text.strip():
        raise InputError("empty file")
    if suffix in MARKDOWN_SUFFIXES:
        return _markdown(text, fallback_title)
    return fallback_title, _paragraphs(text)


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from exc


def _markdown(text: str, fallback_title: str) -> tuple[str, str]:
    from markdown_it import MarkdownIt

    found = _ATX_TITLE.search(text)
    title = found.group(1).strip() if found else fallback_title
    renderer = MarkdownIt("commonmark", {"html": False}).enable("table")  # raw HTML is shown, never parsed
    return title, renderer.render(text)


def _paragraphs(text: str) -> str:
    blocks = [b.strip() for b in re.split(r"\n\s*\n", text.replace("\r\n", "\n")) if b.strip()]
    return "".join(f"<p>{html.escape(' '.join(b.split()))}</p>" for b in blocks)


def _pdf_paragraphs(text: str, target: int = PDF_PARAGRAPH_CHARS) -> str:
    """A PDF's text layer has line breaks, rarely blank lines: lines are joined into paragraphs of about
    ``target`` characters, ended at a sentence end (or at twice the size), so each is one focused evidence."""
    out: list[str] = []
    current: list[str] = []
    size = 0
    for raw in text.replace("\r\n", "\n").split("\n"):
        line = " ".join(raw.split())
        if line:
            current.append(line)
            size += len(line) + 1
        if current and (
            not line or size >= 2 * target or (size >= target and line.endswith((".", "!", "?", ":")))
        ):
            out.append(" ".join(current))
            current, size = [], 0
    if current:
        out.append(" ".join(current))
    return "".join(f"<p>{html.escape(p)}</p>" for p in out)


def _pdf(data: bytes, fallback_title: str) -> tuple[str, str]:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # malformed-but-readable files warn per object
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise InputError("the PDF is encrypted")
        meta_title = str(reader.metadata.get("/Title") or "").strip() if reader.metadata is not None else ""
        sections: list[str] = []
        for n, page in enumerate(reader.pages, start=1):
            if n > MAX_PDF_PAGES:
                break
            text = page.extract_text() or ""
            if text.strip():
                sections.append(f"<h2>Page {n}</h2>{_pdf_paragraphs(text)}")
    except InputError:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, IndexError, OSError,
            RecursionError, ZeroDivisionError) as exc:  # what malformed PDFs raise inside pypdf
        raise InputError(f"cannot read the PDF ({type(exc).__name__})") from exc
    if not sections:
        raise InputError("the PDF has no text layer (a scan?); nothing to index")
    return meta_title or fallback_title, "".join(sections)


def _docx(data: bytes, fallback_title: str) -> tuple[str, str]:
    import zipfile

    from docx import Document
    from docx.opc.exceptions import PackageNotFoundError
    from lxml.etree import LxmlError

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise InputError("not a Word document (not a zip archive)") from exc
    if unpacked > MAX_DOCX_UNPACKED:
        raise InputError(f"the Word document unpacks to {unpacked} bytes (limit {MAX_DOCX_UNPACKED})")
    try:
        doc = Document(io.BytesIO(data))
        title, parts = _docx_blocks(doc)
        title = (doc.core_properties.title or "").strip() or title
    except (PackageNotFoundError, KeyError, ValueError, LxmlError, zipfile.BadZipFile) as exc:
        raise InputError(f"cannot read the Word document ({type(exc).__name__})") from exc
    if not parts:
        raise InputError("the Word document has no text")
    return title or fallback_title, "".join(parts)


def _docx_blocks(doc: Any) -> tuple[str, list[str]]:
    """(the Title paragraph's text, HTML blocks) of a python-docx ``Document``, in document order."""
    from docx.table import Table

    title, parts, items = "", [], []
    for block in doc.iter_inner_content():
        if isinstance(block, Table):
            rows = [[html.escape(" ".join(c.text.split())) for c in row.cells] for row in block.rows]
            cells = (("th" if n == 0 else "td", row) for n, row in enumerate(rows))
            block_html = "".join(f"<tr>{''.join(f'<{c}>{v}</{c}>' for v in row)}</tr>" for c, row in cells)
            parts.append(f"<table>{block_html}</table>")
            continue
        text = " ".join(block.text.split())
        style = (block.style.name if block.style is not None else "") or ""
        numbered = block._p.pPr is not None and block._p.pPr.numPr is not None
        if text and ("List" in style or numbered):
            items.append(f"<li>{html.escape(text)}</li>")
            continue
        if items:
            parts.append(f"<ul>{''.join(items)}</ul>")
            items = []
        level = (
            1
            if style == "Title"
            else int(style[8:])
            if style.startswith("Heading ") and style[8:].isdigit()
            else 0
        )
        if style == "Title" and not title:
            title = text
        if text:
            tag = f"h{min(level, 6)}" if level else "p"
            parts.append(f"<{tag}>{html.escape(text)}</{tag}>")
    if items:
        parts.append(f"<ul>{''.join(items)}</ul>")
    return title, parts
