"""Pages from local files: ConfQuestions-shaped JSON and Confluence HTML exports.

This is the offline way into evident (the bundled sample space, benchmark documents, a space
exported from Confluence). Bad files are skipped and listed in ``failures`` instead of aborting the
whole ingest, because one broken export file should not block a space of hundreds.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import lxml.etree
import lxml.html

from pipeline.errors import InputError
from pipeline.types import Page

REQUIRED_FIELDS = ("id", "title", "url", "space", "content")
PAGE_SUFFIXES = (".json", ".html", ".htm")


def sample_space_dir() -> Path:
    """The bundled ACME sample space (package data next to this module)."""
    return Path(__file__).resolve().parent / "sample_space"


class LocalFolderConnector:
    """A ``SourceConnector`` over files and folders (recursively).

    ``space`` overrides every page's space key. After each ``iter_pages`` run, ``failures`` holds
    ``(path, reason)`` for every file that was skipped.
    """

    name = "local"

    def __init__(self, paths: Sequence[Path], space: str | None = None) -> None:
        self.paths = [Path(p).expanduser() for p in paths]
        self.space = space
        self.failures: list[tuple[str, str]] = []

    async def iter_pages(self) -> AsyncIterator[Page]:
        self.failures = []
        files = await asyncio.to_thread(self._discover)
        seen: dict[str, str] = {}
        for root, path in files:
            try:
                pages = await asyncio.to_thread(self._load_file, root, path)
            except InputError as exc:
                self.failures.append((str(path), str(exc)))
                continue
            for page in pages:
                if page.id in seen:
                    self.failures.append((str(path), f"duplicate page id {page.id} (also in {seen[page.id]})"))
                    continue
                seen[page.id] = str(path)
                yield page
        if not seen:
            where = ", ".join(str(p) for p in self.paths) or "(no paths)"
            detail = f" ({len(self.failures)} files failed)" if self.failures else ""
            raise InputError(f"no pages found in {where}{detail}")

    async def list_page_ids(self) -> set[str]:
        return {page.id async for page in self.iter_pages()}

    # ------------------------------------------------------------------ files

    def _discover(self) -> list[tuple[Path, Path]]:
        """(root, file) pairs in a stable order; ``root`` anchors ids of HTML pages."""
        found: list[tuple[Path, Path]] = []
        for root in self.paths:
            if root.is_file():
                found.append((root.parent, root))
            elif root.is_dir():
                found.extend(
                    (root, p)
                    for p in sorted(root.rglob("*"))
                    if p.is_file() and p.suffix.lower() in PAGE_SUFFIXES and not p.name.startswith(".")
                )
        if not found:
            where = ", ".join(str(p) for p in self.paths) or "(no paths)"
            raise InputError(f"no pages found in {where}")
        return found

    def _load_file(self, root: Path, path: Path) -> list[Page]:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read file: {exc.strerror or exc}") from exc
        if path.suffix.lower() == ".json":
            return self._json_pages(data)
        return [self._html_page(root, path, data)]

    def _json_pages(self, data: bytes) -> list[Page]:
        try:
            doc = json.loads(data.decode("utf-8-sig"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"not valid JSON: {exc}") from exc
        items = doc if isinstance(doc, list) else [doc]
        return [self._json_page(item) for item in items]

    def _json_page(self, item: Any) -> Page:
        if not isinstance(item, dict):
            raise InputError("JSON page must be an object")
        missing = [f for f in REQUIRED_FIELDS if item.get(f) in (None, "")]
        if missing:
            raise InputError(f"JSON page lacks required fields: {', '.join(missing)}")
        ancestors = item.get("ancestors") or ()
        labels = item.get("labels") or ()
        version = item.get("version")
        return Page(
            id=str(item["id"]),
            title=str(item["title"]),
            url=str(item["url"]),
            space=self.space or str(item["space"]),
            body=str(item["content"]),
            version=int(version) if isinstance(version, int | str) and str(version).isdigit() else None,
            updated=str(item["date"]) if item.get("date") else None,
            ancestors=tuple(str(a.get("title", "")) if isinstance(a, dict) else str(a) for a in ancestors),
            labels=tuple(str(label) for label in labels),
        )

    def _html_page(self, root: Path, path: Path, data: bytes) -> Page:
        if not data.strip():
            raise InputError("empty HTML file")
        try:
            doc = lxml.html.document_fromstring(data)
        except (ValueError, lxml.etree.ParserError) as exc:
            raise InputError(f"cannot parse HTML: {exc}") from exc
        crumbs = [" ".join(li.text_content().split()) for li in doc.xpath('//*[@id="breadcrumbs"]//li')]
        space = self.space or path.parent.name or "LOCAL"
        title_el = doc.xpath('//*[@id="title-text"]')
        raw_title = title_el[0].text_content() if title_el else (doc.findtext(".//title") or "")
        title = _strip_space(" ".join(raw_title.split()), [space, *crumbs[:1]]) or path.stem
        main = doc.get_element_by_id("main-content", None)
        if main is None:
            main = doc.find("body")
        if main is None:
            raise InputError("HTML file has no body")
        body = (main.text or "") + "".join(
            lxml.html.tostring(child, encoding="unicode", with_tail=True) for child in main
        )
        rel = path.resolve().relative_to(root.resolve()).as_posix()
        return Page(
            id="html-" + hashlib.sha1(rel.encode("utf-8")).hexdigest()[:16],
            title=title,
            url=path.resolve().as_uri(),
            space=space,
            body=body,
            ancestors=tuple(c for c in crumbs[1:] if c),
        )


def _strip_space(title: str, spaces: Sequence[str]) -> str:
    """Drop the space name Confluence exports add to ``<title>`` ("Page : Space" or "Space : Page")."""
    for space in spaces:
        if not space:
            continue
        low, key = title.lower(), space.lower()
        if low.endswith(f" : {key}"):
            return title[: -len(space) - 3].strip()
        if low.startswith(f"{key} : "):
            return title[len(space) + 3 :].strip()
    return title
