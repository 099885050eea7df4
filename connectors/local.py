"""Pages from local files: ConfQuestions-shaped JSON, Confluence HTML exports, Markdown, text, PDF and Word
(.docx).

This is the offline way into evident (the bundled sample space, benchmark documents, a space
exported from Confluence). Bad files are skipped and listed in ``failures`` instead of aborting the
whole ingest, because one broken export file should not block a space of hundreds. In a JSON file
holding a list of pages, each page stands alone: ``file.json[3]`` names the one that failed.

Pages made from a file (HTML, Markdown, text, PDF, Word) are identified by their path relative to the folder
read, and cite ``base_url`` + that path when a base URL is given (where the files are published), else the
``file://`` URL. ``origins`` maps each page read to its file and ``read_files`` lists the files read in full,
so the caller can tell which indexed pages of the folder are gone (``connectors.local_ingest``).

Bounded: files over ``max_file_bytes`` are not read; JSON must be strict (no NaN/Infinity, integers
within Python's 4,300-digit limit, nesting within the interpreter's recursion limit); symbolic links
that lead out of the folder being read are reported, not followed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import lxml.etree
import lxml.html

from connectors.local_formats import DOCUMENT_SUFFIXES, document_body
from pipeline.errors import InputError
from pipeline.ingest.pages import clean_line, page_from_record
from pipeline.types import Page

PAGE_SUFFIXES = (".json", ".html", ".htm", *DOCUMENT_SUFFIXES)
MAX_FILE_BYTES = 64 * 2**20


def sample_space_dir() -> Path:
    """The bundled ACME sample space (package data next to this module)."""
    return Path(__file__).resolve().parent / "sample_space"


class LocalFolderConnector:
    """A ``SourceConnector`` over files and folders (recursively).

    ``space`` overrides every page's space key. A folder carries no permissions: its pages may be read by
    anyone (``EVIDENT_ACCESS=per-user`` included), so put only what everyone may read there. After each
    ``iter_pages`` run, ``failures`` holds
    ``(path, reason)`` for every file that was skipped, ``origins`` page id -> file for every page yielded
    and ``read_files`` the files whose every page was read.
    """

    name = "local"

    def __init__(self, paths: Sequence[Path], space: str | None = None, *,
                 max_file_bytes: int = MAX_FILE_BYTES, base_url: str | None = None) -> None:
        self.paths = [Path(p).expanduser() for p in paths]
        self.space = space
        self.max_file_bytes = max_file_bytes
        self.base_url = base_url.rstrip("/") + "/" if base_url else None
        self.failures: list[tuple[str, str]] = []
        self.origins: dict[str, str] = {}
        self.read_files: set[str] = set()

    async def iter_pages(self) -> AsyncIterator[Page]:
        self.failures, self.origins, self.read_files = [], {}, set()
        files = await asyncio.to_thread(self._discover)
        seen: dict[str, str] = {}
        for root, path in files:
            try:
                loaded = await asyncio.to_thread(self._load_file, root, path)
            except InputError as exc:
                self.failures.append((str(path), str(exc)))
                continue
            except (RecursionError, MemoryError, ValueError, OSError) as exc:  # never abort the run
                self.failures.append((str(path), f"cannot be read ({type(exc).__name__})"))
                continue
            whole = True
            for where, page in loaded:
                if isinstance(page, InputError):
                    self.failures.append((where, str(page)))
                    whole = False
                    continue
                if page.id in seen:
                    self.failures.append((where, f"duplicate page id {page.id} (also in {seen[page.id]})"))
                    continue
                seen[page.id] = where
                self.origins[page.id] = str(path)
                yield replace(page, access=())  # a local folder holds what anyone may read
            if whole:
                self.read_files.add(str(path))
        if not seen:
            where = ", ".join(str(p) for p in self.paths) or "(no paths)"
            detail = f" ({len(self.failures)} files failed)" if self.failures else ""
            raise InputError(f"no pages found in {where}{detail}")

    async def list_page_ids(self) -> set[str]:
        return {page.id async for page in self.iter_pages()}

    # ------------------------------------------------------------------ files

    def _discover(self) -> list[tuple[Path, Path]]:
        """(root, file) pairs in a stable order; ``root`` anchors ids of HTML pages.

        Walks without following directory links; a file link that leads out of its root is a failure.
        """
        found: list[tuple[Path, Path]] = []
        for root in self.paths:
            if root.is_file():
                found.append((root.parent, root))
            elif root.is_dir():
                real_root = root.resolve()
                for folder, dirs, names in os.walk(root):
                    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                    for name in sorted(names):
                        path = Path(folder) / name
                        if name.startswith(".") or path.suffix.lower() not in PAGE_SUFFIXES:
                            continue
                        if path.is_symlink() and not path.resolve().is_relative_to(real_root):
                            self.failures.append(
                                (
                                    str(path),
                                    f"symbolic link to {path.resolve()} leads out of {root}; not followed",
                                )
                            )
                            continue
                        if path.is_file():
                            found.append((root, path))
        if not found:
            where = ", ".join(str(p) for p in self.paths) or "(no paths)"
            raise InputError(f"no pages found in {where}")
        return found

    def _load_file(self, root: Path, path: Path) -> list[tuple[str, Page | InputError]]:
        try:
            size = path.stat().st_size
            if size > self.max_file_bytes:
                raise InputError(
                    f"file is too large ({size / 2**20:.1f} MiB > {self.max_file_bytes / 2**20:.0f} MiB)"
                )
            data = path.read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read file: {exc.strerror or exc}") from exc
        suffix = path.suffix.lower()
        if suffix == ".json":
            return self._json_pages(path, data)
        if suffix in DOCUMENT_SUFFIXES:
            title, body = document_body(suffix, data, path.stem)
            return [(str(path), self._file_page("doc", root, path, title=title, body=body))]
        return [(str(path), self._html_page(root, path, data))]

    def _file_page(
        self,
        kind: str,
        root: Path,
        path: Path,
        *,
        title: str,
        body: str,
        space: str | None = None,
        ancestors: tuple[str, ...] = (),
    ) -> Page:
        """A page made from one file: its id and (with ``base_url``) its URL from the path inside ``root``."""
        try:
            rel = path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:  # a link inside the folder to elsewhere in it: the link's own path
            rel = Path(os.path.relpath(path, root)).as_posix()
        url = self.base_url + urllib.parse.quote(rel) if self.base_url else path.resolve().as_uri()
        return Page(
            id=f"{kind}-" + hashlib.sha1(rel.encode("utf-8", "surrogatepass")).hexdigest()[:16],
            title=clean_line(title) or path.stem,
            url=url,
            space=space or self.space or path.parent.name or "LOCAL",
            body=body,
            ancestors=ancestors,
        )

    def _json_pages(self, path: Path, data: bytes) -> list[tuple[str, Page | InputError]]:
        doc = parse_json(data)
        items = doc if isinstance(doc, list) else [doc]
        out: list[tuple[str, Page | InputError]] = []
        for i, item in enumerate(items):
            where = f"{path}[{i}]" if isinstance(doc, list) else str(path)
            try:
                out.append((where, page_from_record(item, space=self.space)))
            except InputError as exc:
                out.append((where, exc))
        return out

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
        return self._file_page("html", root, path, title=title, body=body, space=space,
                               ancestors=tuple(c for c in crumbs[1:] if c))


def parse_json(data: bytes) -> Any:
    """Strict JSON from UTF-8 bytes, every failure an ``InputError`` with a one-line reason."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"not valid JSON: not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from exc
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError as exc:
        raise InputError("not valid JSON: nested too deeply") from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc}") from exc
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits, NaN/Infinity
        raise InputError(f"not valid JSON: {str(exc).split(';')[0]}") from exc


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


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
