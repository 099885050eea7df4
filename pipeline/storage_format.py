"""Confluence storage-format XHTML -> an ordered stream of page elements.

Storage format is XHTML with undeclared ``ac:``/``ri:`` namespaces, HTML named entities and, in
practice, the odd stray ``&`` or ``<``. We repair those textually (outside CDATA), wrap the fragment in
a root that declares the namespaces and parse it with lxml in recover mode, so a sloppy page still
yields its text. One walker then turns the tree into ``Heading | Paragraph | ListBlock | Table``:
block tags flush the running inline text as a paragraph, inline tags append to it, and Confluence
macros are reduced to the content a reader sees (bodies kept, parameters dropped).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from html.entities import name2codepoint

from lxml import etree

from pipeline.errors import ParseError
from pipeline.types import Element, Heading, ListBlock, Paragraph, Table

AC = "http://atlassian.com/content"
RI = "http://atlassian.com/resource/identifier"
_ROOT_OPEN = f'<evident-root xmlns:ac="{AC}" xmlns:ri="{RI}">'
_ROOT_CLOSE = "</evident-root>"

MAX_DEPTH = 200  # deeper nesting than any real page; guards the recursive walker
_MAX_SPAN = 1000  # clamp absurd row/colspan values

_CDATA = re.compile(r"(<!\[CDATA\[.*?(?:\]\]>|$))", re.S)
_ENTITY = re.compile(r"&(#[0-9]+;|#[xX][0-9a-fA-F]+;|[A-Za-z][A-Za-z0-9]*;)?")
_STRAY_LT = re.compile(r"<(?![A-Za-z_/!?])")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")
_WS = re.compile(r"\s+")
_GENERIC_HEADER = re.compile(r"Column \d+")

_HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}
# Containers whose children are walked in block context; they only separate paragraphs.
_BLOCK_CONTAINERS = {
    "div",
    "section",
    "article",
    "blockquote",
    "body",
    "main",
    "header",
    "footer",
    "aside",
    "nav",
    "figure",
    "center",
    "dl",
    "dd",
    "dt",
    "details",
    "summary",
    "form",
    "fieldset",
    "address",
    f"{{{AC}}}layout",
    f"{{{AC}}}layout-section",
    f"{{{AC}}}layout-cell",
    f"{{{AC}}}rich-text-body",
    f"{{{AC}}}adf-content",
}
# Paragraph-like tags; table/list parts only reach here when stray (recover mode): kept as blocks.
_BLOCK_TAGS = {"p", "hr", "li", "tr", "td", "th", "tbody", "thead", "tfoot", "caption"}
_DROP = {
    "script",
    "style",
    "colgroup",
    "col",
    "head",
    "title",
    f"{{{AC}}}parameter",
    f"{{{AC}}}emoticon",
    f"{{{AC}}}hipchat-emoticon",
    f"{{{AC}}}placeholder",
    f"{{{AC}}}adf-attribute",
    f"{{{AC}}}adf-fallback",
    f"{{{AC}}}task-id",
    f"{{{AC}}}task-status",
}
# Macros whose only visible content is a parameter (Confluence renders it as inline text).
_PARAM_MACROS = {"jira": "key", "status": "title"}


def parse_storage(xhtml: str, *, page_id: str = "") -> list[Element]:
    """Parse one page's ``body.storage.value`` into document-ordered elements.

    Raises ``ParseError`` (carrying ``page_id``) when not even recover-mode parsing yields a tree.
    """
    if not xhtml or not xhtml.strip():
        return []
    root = _parse_tree(xhtml, page_id)
    walker = _Walker(page_id)
    try:
        walker.walk_children(root, 0)
    except RecursionError as exc:  # only reachable when called from an already deep stack
        raise ParseError(
            f"storage format of page {page_id or '?'} nests too deeply", page_id=page_id
        ) from exc
    walker.flush()
    return walker.out


def _parse_tree(xhtml: str, page_id: str) -> etree._Element:
    text = _CONTROL.sub("", _repair(xhtml))
    parser = etree.XMLParser(recover=True, resolve_entities=False, no_network=True, huge_tree=True)
    try:
        root = etree.fromstring((_ROOT_OPEN + text + _ROOT_CLOSE).encode("utf-8"), parser)
    except (etree.XMLSyntaxError, ValueError) as exc:
        raise ParseError(
            f"cannot parse storage format of page {page_id or '?'}: {exc}", page_id=page_id
        ) from exc
    if root is None:
        raise ParseError(f"cannot parse storage format of page {page_id or '?'}: no content", page_id=page_id)
    return root


def _repair(xhtml: str) -> str:
    """Make every entity a numeric character reference and escape stray ``&``/``<``, outside CDATA.

    Numeric references also for ``&amp;``/``&lt;``: after its first error, libxml2's recover mode
    silently drops predefined entity references but keeps numeric ones.
    """
    parts = _CDATA.split(xhtml)
    for i in range(0, len(parts), 2):  # odd indices are CDATA sections
        parts[i] = _STRAY_LT.sub("&#60;", _ENTITY.sub(_fix_entity, parts[i]))
    return "".join(parts)


def _fix_entity(match: re.Match[str]) -> str:
    ref = match.group(1)
    if ref is None:
        return "&#38;"
    if ref.startswith("#"):
        return match.group(0)
    code = name2codepoint.get(ref[:-1])
    if code is None and ref[:-1] == "apos":
        code = 39
    return f"&#{code};" if code is not None else "&#38;" + ref


def _local(el: etree._Element) -> str:
    """The lxml tag (``{ns}name`` for ac:/ri: tags), or "" for comments and processing instructions."""
    tag = el.tag
    return tag if isinstance(tag, str) else ""


def _attr(el: etree._Element, ns: str, name: str) -> str:
    return (el.get(f"{{{ns}}}{name}") or el.get(name) or "").strip()


def _span(value: str | None) -> int:
    try:
        n = int((value or "1").strip())
    except ValueError:
        return 1
    return max(1, min(n, _MAX_SPAN))


def _clean_inline(raw: str) -> str:
    """Collapse whitespace inside lines; ``\\n`` marks hard breaks (``br``)."""
    lines = (" ".join(line.split()) for line in raw.split("\n"))
    return "\n".join(line for line in lines if line)


def _clean_code(raw: str) -> str:
    lines = [line.rstrip() for line in raw.replace("\r\n", "\n").replace("\xa0", " ").split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def _one_line(text: str) -> str:
    return " ".join(text.split())


class _Walker:
    """Depth-first walk that emits block elements and accumulates inline text between them."""

    def __init__(self, page_id: str, copies: set[int] | None = None) -> None:
        self.page_id = page_id
        self.out: list[Element] = []
        self._buf: list[str] = []
        # ids of tables re-emitted after the table/list that contains them; already part of the
        # container's text, so flattening must not count them twice
        self.copies: set[int] = copies if copies is not None else set()

    # ------------------------------------------------------------ plumbing

    def emit(self, element: Element) -> None:
        self.flush()
        self.out.append(element)

    def flush(self) -> None:
        if self._buf:
            text = _clean_inline("".join(self._buf))
            self._buf = []
            if text:
                self.out.append(Paragraph(text))

    def text(self, raw: str | None) -> None:
        if raw:
            self._buf.append(_WS.sub(" ", raw))

    def _check_depth(self, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise ParseError(
                f"storage format of page {self.page_id or '?'} nests deeper than {MAX_DEPTH} levels",
                page_id=self.page_id,
            )

    def sub(
        self, el: etree._Element, depth: int, walk: Callable[[_Walker], None] | None = None
    ) -> list[Element]:
        """Walk ``el``'s children into a fresh element list (for cells, items, headings)."""
        child = _Walker(self.page_id, self.copies)
        if walk is None:
            child.walk_children(el, depth + 1)
        else:
            walk(child)
        child.flush()
        return child.out

    def walk_children(self, el: etree._Element, depth: int) -> None:
        self._check_depth(depth)
        self.text(el.text)
        for child in el:
            self.walk(child, depth + 1)
            self.text(child.tail)

    # ------------------------------------------------------------ dispatch

    def walk(self, el: etree._Element, depth: int) -> None:
        self._check_depth(depth)
        tag = _local(el)
        if not tag or tag in _DROP:  # comments, processing instructions, noise
            return
        name = etree.QName(tag).localname if tag.startswith("{") else tag.lower()
        ns = etree.QName(tag).namespace if tag.startswith("{") else None
        if ns == AC:
            self._walk_ac(el, name, depth)
        elif ns == RI:
            self.text(_resource_text(el))
        elif name in _HEADINGS:
            text = self.render(self.sub(el, depth))
            if text:
                self.emit(Heading(int(name[1]), text))
        elif name in _BLOCK_CONTAINERS or name in _BLOCK_TAGS:
            self.flush()
            self.walk_children(el, depth)
            self.flush()
        elif name in ("ul", "ol"):
            items = self._list_items(el, depth, 0)
            if items:
                self.emit(ListBlock(tuple(i for i, _ in items), ordered=name == "ol"))
            for table in (t for _, ts in items for t in ts):
                self._copy(table)
        elif name == "pre":
            code = _clean_code("".join(el.itertext()))
            if code:
                self.emit(Paragraph(code))
        elif name == "table":
            self._table(el, depth)
        elif name == "br":
            self._buf.append("\n")
        elif name == "img":
            label = el.get("alt") or (el.get("src") or "").rsplit("/", 1)[-1]
            if label:
                self.text(f"[image: {label}]")
        elif name == "time":
            self.text((el.text or "").strip() or el.get("datetime") or "")
        elif name == "a":
            before = len(self._buf)
            self.walk_children(el, depth)
            if not "".join(self._buf[before:]).strip():
                self.text(el.get("href") or "")
        else:  # inline markup (span, strong, code, ...) and unknown tags: keep their text
            self.walk_children(el, depth)

    def _walk_ac(self, el: etree._Element, name: str, depth: int) -> None:
        if name == "structured-macro" or name == "macro":
            self._macro(el, depth)
        elif name == "link":
            self.text(_link_text(el, self, depth))
        elif name == "image":
            self.text(_image_text(el))
        elif name == "task-list":
            items = self._task_items(el, depth)
            if items:
                self.emit(ListBlock(tuple(items)))
        elif name == "adf-extension":
            nodes = [c for c in el if _local(c) == f"{{{AC}}}adf-node"]
            for node in nodes or list(el):
                self.walk(node, depth + 1)
        elif name == "adf-node":
            self._adf_node(el, depth)
        elif name == "plain-text-body":
            code = _clean_code(el.text or "")
            if code:
                self.emit(Paragraph(code))
        elif name in ("plain-text-link-body", "link-body"):
            self.walk_children(el, depth)
        elif f"{{{AC}}}{name}" in _BLOCK_CONTAINERS:
            self.flush()
            self.walk_children(el, depth)
            self.flush()
        else:  # unknown ac: element: keep any text it wraps
            self.walk_children(el, depth)

    # ------------------------------------------------------------ macros

    def _macro(self, el: etree._Element, depth: int) -> None:
        macro = _attr(el, AC, "name").lower()
        if macro in _PARAM_MACROS:
            wanted = _PARAM_MACROS[macro]
            for param in el:
                if _local(param) == f"{{{AC}}}parameter" and _attr(param, AC, "name") == wanted:
                    self.text(" " + "".join(param.itertext()).strip() + " ")
            return
        for child in el:
            tag = _local(child)
            if tag == f"{{{AC}}}rich-text-body":
                self.flush()
                self.walk_children(child, depth + 1)
                self.flush()
            elif tag == f"{{{AC}}}plain-text-body":
                code = _clean_code(child.text or "")
                if code:
                    self.emit(Paragraph(code))
            # parameters and anything else: configuration noise, dropped

    def _adf_node(self, el: etree._Element, depth: int) -> None:
        """Atlassian document-format nodes (decisions, ...): ``*-list`` nodes become lists."""
        kind = el.get("type") or ""
        if kind.endswith("-list"):
            items = [self.render(self.sub(c, depth)) for c in el if _local(c) == f"{{{AC}}}adf-node"]
            items = [i for i in items if i]
            if items:
                self.emit(ListBlock(tuple(items)))
            return
        self.flush()
        self.walk_children(el, depth)
        self.flush()

    # ------------------------------------------------------------ lists

    def _list_items(self, el: etree._Element, depth: int, level: int) -> list[tuple[str, list[Table]]]:
        """Flatten a list: one (indented text, tables found inside) per item, nested lists indented."""
        self._check_depth(depth)
        out: list[tuple[str, list[Table]]] = []
        indent = "  " * level
        for li in el:
            tag = _local(li).lower()
            if tag in ("ul", "ol"):  # sloppy nesting: a list directly inside a list
                out.extend(self._list_items(li, depth + 1, level + 1))
                continue
            if tag != "li":
                if tag and tag not in _DROP:
                    text = self.render(self.sub(li, depth))
                    if text:
                        out.append((indent + text, []))
                continue
            nested: list[etree._Element] = [c for c in li if _local(c).lower() in ("ul", "ol")]

            def walk_item(w: _Walker, li: etree._Element = li, nested: list[etree._Element] = nested) -> None:
                w._walk_skipping(li, nested, depth + 1)

            elements = self.sub(li, depth, walk_item)
            tables = [e for e in elements if isinstance(e, Table)]
            text = self.render(elements)
            children: list[tuple[str, list[Table]]] = []
            for sub_list in nested:
                children.extend(self._list_items(sub_list, depth + 2, level + 1))
            if text:
                out.append((indent + text, tables))
            elif tables:
                out.append((indent + "(table)", tables))
            out.extend(children)
        return out

    def _walk_skipping(self, el: etree._Element, skip: list[etree._Element], depth: int) -> None:
        self.text(el.text)
        for child in el:
            if not any(child is s for s in skip):
                self.walk(child, depth + 1)
            self.text(child.tail)

    def _task_items(self, el: etree._Element, depth: int) -> list[str]:
        items: list[str] = []
        for task in el:
            if _local(task) != f"{{{AC}}}task":
                continue
            status = ""
            body: etree._Element | None = None
            for part in task:
                tag = _local(part)
                if tag == f"{{{AC}}}task-status":
                    status = (part.text or "").strip().lower()
                elif tag == f"{{{AC}}}task-body":
                    body = part
            text = self.render(self.sub(body, depth)) if body is not None else ""
            if text:
                items.append(("[x] " if status == "complete" else "[ ] ") + text)
        return items

    # ------------------------------------------------------------ tables

    def _table(self, el: etree._Element, depth: int) -> None:
        caption = ""
        rows: list[etree._Element] = []
        for child in el:
            tag = _local(child).lower()
            if tag == "tr":
                rows.append(child)
            elif tag in ("thead", "tbody", "tfoot"):
                rows.extend(r for r in child if _local(r).lower() == "tr")
            elif tag == "caption":
                caption = self.render(self.sub(child, depth))
        nested: list[Table] = []
        grid: dict[tuple[int, int], tuple[str, bool]] = {}
        n_rows = len(rows)
        width = 0
        for r, tr in enumerate(rows):
            c = 0
            for cell in tr:
                tag = _local(cell).lower()
                if tag not in ("td", "th"):
                    continue
                while (r, c) in grid:
                    c += 1
                elements = self.sub(cell, depth + 1)
                nested.extend(e for e in elements if isinstance(e, Table))
                value = self.render(elements)
                rowspan = cell.get("rowspan")
                rs = n_rows - r if (rowspan or "").strip() == "0" else min(_span(rowspan), n_rows - r)
                cs = _span(cell.get("colspan"))
                for dr in range(rs):
                    for dc in range(cs):
                        grid.setdefault((r + dr, c + dc), (value, tag == "th"))
                c += cs
                width = max(width, c)
        table = _make_table(grid, n_rows, width, caption)
        if table is not None:
            self.emit(table)
        for table in nested:
            self._copy(table)

    def _copy(self, table: Table) -> None:
        self.copies.add(id(table))
        self.emit(table)

    def render(self, elements: Iterable[Element]) -> str:
        """Flatten elements to one line of text, skipping re-emitted nested tables."""
        return _one_line(_render_text(e for e in elements if id(e) not in self.copies))


def _make_table(
    grid: dict[tuple[int, int], tuple[str, bool]], n_rows: int, width: int, caption: str
) -> Table | None:
    """Pick the header row(s), pad ragged rows, drop empty rows, make header names unique.

    The first row is the header. When it is all ``th``, following all-``th`` rows are header rows too
    (grouped headers such as "Legacy" spanning "Install | Upgrade" become "Legacy Install", ...).
    A table with a single row has no header: its row is data under "Column 1", "Column 2", ...
    """
    matrix = [[grid.get((r, c), ("", False)) for c in range(width)] for r in range(n_rows)]
    matrix = [row for row in matrix if any(v for v, _ in row)]
    if not matrix or width == 0:
        return None
    if len(matrix) == 1:
        headers = [""] * width
        body = matrix
    else:
        n_head = 1
        if all(th for _, th in matrix[0]):
            while n_head < len(matrix) - 1 and all(th for _, th in matrix[n_head]):
                n_head += 1
        headers = [_join_header([matrix[r][c][0] for r in range(n_head)]) for c in range(width)]
        body = matrix[n_head:]
    return Table(
        headers=_unique_headers(headers),
        rows=tuple(tuple(v for v, _ in row) for row in body),
        caption=caption,
    )


def _join_header(parts: list[str]) -> str:
    """Stack header cells of one column, skipping the repeats a rowspan produces."""
    out: list[str] = []
    for part in parts:
        if part and (not out or out[-1] != part):
            out.append(part)
    return " ".join(out)


def _unique_headers(headers: list[str]) -> tuple[str, ...]:
    seen: dict[str, int] = {}
    out: list[str] = []
    for i, raw in enumerate(headers, start=1):
        name = raw or f"Column {i}"
        base = name
        n = seen.get(base, 0) + 1
        seen[base] = n
        if n > 1:
            name = f"{base} ({n})"
            while name in seen:
                n += 1
                name = f"{base} ({n})"
            seen[base] = n
        seen.setdefault(name, 1)
        out.append(name)
    return tuple(out)


# ---------------------------------------------------------------- inline Confluence resources


def _resource_text(el: etree._Element) -> str:
    """Readable text for a bare ``ri:`` resource (page, user, attachment, space, url)."""
    name = etree.QName(el.tag).localname
    if name == "page" or name == "blog-post":
        return _attr(el, RI, "content-title")
    if name == "user":
        username = _attr(el, RI, "username")
        if username:
            return f"@{username}"
        ident = _attr(el, RI, "userkey") or _attr(el, RI, "account-id")
        return f"@user:{ident}" if ident else ""
    if name == "attachment":
        return _attr(el, RI, "filename")
    if name == "space":
        return _attr(el, RI, "space-key")
    if name == "url":
        return _attr(el, RI, "value")
    return ""


def _link_text(el: etree._Element, walker: _Walker, depth: int) -> str:
    """``ac:link``: the link body if it has text, else the target's readable name."""
    for child in el:
        tag = _local(child)
        if tag in (f"{{{AC}}}plain-text-link-body", f"{{{AC}}}link-body"):
            body = walker.render(walker.sub(child, depth))
            if body:
                return body
    for child in el:
        if _local(child).startswith(f"{{{RI}}}"):
            text = _resource_text(child)
            if text:
                return text
    anchor = _attr(el, AC, "anchor")
    return anchor


def _image_text(el: etree._Element) -> str:
    for child in el:
        tag = _local(child)
        if tag == f"{{{RI}}}attachment":
            name = _attr(child, RI, "filename")
            if name:
                return f"[image: {name}]"
        elif tag == f"{{{RI}}}url":
            value = _attr(child, RI, "value")
            if value:
                return f"[image: {value.rsplit('/', 1)[-1] or value}]"
    alt = _attr(el, AC, "alt") or _attr(el, AC, "title")
    return f"[image: {alt}]" if alt else ""


# ---------------------------------------------------------------- element -> flat text


def _render_text(elements: Iterable[Element]) -> str:
    """Flatten elements to text (cells, items, headings); tables become ``H: v, H: v; ...``."""
    parts: list[str] = []
    for e in elements:
        if isinstance(e, Heading | Paragraph):
            parts.append(e.text)
        elif isinstance(e, ListBlock):
            parts.append("; ".join(i.strip() for i in e.items))
        elif isinstance(e, Table):
            rows = [
                ", ".join(_cell_label(h, v) for h, v in zip(e.headers, row, strict=True) if v)
                for row in e.rows
            ]
            parts.append("; ".join(r for r in rows if r))
    return " ".join(p for p in parts if p)


def _cell_label(header: str, value: str) -> str:
    """``Header: value``; a generated "Column N" header adds nothing, so the value stands alone."""
    return value if _GENERIC_HEADER.fullmatch(header) else f"{header}: {value}"
