"""The tree walker: an lxml tree of one page -> ``Heading | Paragraph | ListBlock | Table`` in order.

Block tags flush the running inline text as a paragraph, inline tags append to it, and Confluence
macros are reduced to the content a reader sees (bodies kept, parameters dropped). Bounded per page:
markup nested deeper than ``max_depth`` is kept as flat text, the walk checks a deadline every 1,024
elements (``ParseTimeoutError``), and tables spend from one ``TableBudget``
(``pipeline.ingest.storage.tables``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from lxml import etree

from pipeline.errors import ParseTimeoutError
from pipeline.ingest.storage.clock import now
from pipeline.ingest.storage.inline import (
    attr,
    clean_code,
    clean_inline,
    image_text,
    local_tag,
    one_line,
    render_text,
    resource_text,
    split_tag,
)
from pipeline.ingest.storage.tables import TableBudget, build_table
from pipeline.ingest.storage.tree import AC, HIDDEN_AC, HIDDEN_LOCAL, RI
from pipeline.types import Element, Heading, ListBlock, Paragraph, Table

_WS = re.compile(r"\s+")
_TICK_EVERY = 1024


@dataclass
class WalkContext:
    """Per-page state shared by a walker and its sub-walkers."""

    page_id: str = ""
    max_depth: int = 200
    deadline: float = float("inf")  # bound on ``now()``
    timeout_s: float = 0.0
    tables: TableBudget = field(default_factory=TableBudget)
    table_count: int = 0
    ticks: int = 0

    def tick(self) -> None:
        self.ticks += 1
        if self.ticks % _TICK_EVERY == 0 and now() > self.deadline:
            raise ParseTimeoutError(
                f"page {self.page_id or '?'} took longer than {self.timeout_s:g} s to parse "
                "(EVIDENT_PAGE_TIMEOUT_S)", page_id=self.page_id)


def walk_tree(root: etree._Element, ctx: WalkContext) -> list[Element]:
    walker = Walker(ctx)
    walker.walk_children(root, 0)
    walker.flush()
    return walker.out


def flat_text(el: etree._Element) -> str:
    """The text a reader sees under ``el``, hidden elements left out, without recursion."""
    parts: list[str] = []
    walker = etree.iterwalk(el, events=("start", "end"))
    for event, node in walker:
        if node is el:
            if event == "start" and node.text:
                parts.append(node.text)
            continue
        if event == "start":
            tag = node.tag if isinstance(node.tag, str) else ""
            if not tag or tag in _DROP:
                walker.skip_subtree()
                if node.tail:
                    parts.append(node.tail)
                continue
            if node.text:
                parts.append(node.text)
        elif node.tail:
            parts.append(node.tail)
    return " ".join(parts)


_HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}
# Containers whose children are walked in block context; they only separate paragraphs.
_BLOCK_CONTAINERS = {
    "div", "section", "article", "blockquote", "body", "main", "header", "footer", "aside", "nav", "figure",
    "center", "dl", "dd", "dt", "details", "summary", "form", "fieldset", "address",
    f"{{{AC}}}layout", f"{{{AC}}}layout-section", f"{{{AC}}}layout-cell", f"{{{AC}}}rich-text-body",
    f"{{{AC}}}adf-content",
}
# Paragraph-like tags; table/list parts only reach here when stray (recover mode): kept as blocks.
_BLOCK_TAGS = {"p", "hr", "li", "tr", "td", "th", "tbody", "thead", "tfoot", "caption"}
_DROP = set(HIDDEN_LOCAL) | {f"{{{AC}}}{name}" for name in HIDDEN_AC}
# Macros whose only visible content is a parameter (Confluence renders it as inline text).
_PARAM_MACROS = {"jira": "key", "status": "title"}


class Walker:
    """Depth-first walk that emits block elements and accumulates inline text between them."""

    def __init__(self, ctx: WalkContext, copies: set[int] | None = None) -> None:
        self.ctx = ctx
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
            text = clean_inline("".join(self._buf))
            self._buf = []
            if text:
                self.out.append(Paragraph(text))

    def text(self, raw: str | None) -> None:
        if raw:
            self._buf.append(_WS.sub(" ", raw))

    def _too_deep(self, depth: int) -> bool:
        return depth > self.ctx.max_depth

    def sub(
        self, el: etree._Element, depth: int, walk: Callable[[Walker], None] | None = None
    ) -> list[Element]:
        """Walk ``el``'s children into a fresh element list (for cells, items, headings)."""
        child = Walker(self.ctx, self.copies)
        if walk is None:
            child.walk_children(el, depth + 1)
        else:
            walk(child)
        child.flush()
        return child.out

    def walk_children(self, el: etree._Element, depth: int) -> None:
        if self._too_deep(depth):  # deeper than any real page: keep the text, drop the structure
            self.text(flat_text(el))
            return
        self.text(el.text)
        for child in el:
            self.walk(child, depth + 1)
            self.text(child.tail)

    # ------------------------------------------------------------ dispatch

    def walk(self, el: etree._Element, depth: int) -> None:
        self.ctx.tick()
        tag = local_tag(el)
        if not tag or tag in _DROP:  # comments, processing instructions, noise
            return
        if self._too_deep(depth):
            self.text(" " + flat_text(el) + " ")
            return
        ns, name = split_tag(tag)
        name = name if ns else name.lower()
        if ns == AC:
            self._walk_ac(el, name, depth)
        elif ns == RI:
            self.text(resource_text(el))
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
            code = clean_code("".join(el.itertext()))
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
            self.text(self._link_text(el, depth))
        elif name == "image":
            self.text(image_text(el))
        elif name == "task-list":
            items = self._task_items(el, depth)
            if items:
                self.emit(ListBlock(tuple(items)))
        elif name == "adf-extension":
            nodes = [c for c in el if local_tag(c) == f"{{{AC}}}adf-node"]
            for node in nodes or list(el):
                self.walk(node, depth + 1)
        elif name == "adf-node":
            self._adf_node(el, depth)
        elif name == "plain-text-body":
            code = clean_code(el.text or "")
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
        macro = attr(el, AC, "name").lower()
        if macro in _PARAM_MACROS:
            wanted = _PARAM_MACROS[macro]
            for param in el:
                if local_tag(param) == f"{{{AC}}}parameter" and attr(param, AC, "name") == wanted:
                    self.text(" " + "".join(param.itertext()).strip() + " ")
            return
        for child in el:
            tag = local_tag(child)
            if tag == f"{{{AC}}}rich-text-body":
                self.flush()
                self.walk_children(child, depth + 1)
                self.flush()
            elif tag == f"{{{AC}}}plain-text-body":
                code = clean_code(child.text or "")
                if code:
                    self.emit(Paragraph(code))
            # parameters and anything else: configuration noise, dropped

    def _adf_node(self, el: etree._Element, depth: int) -> None:
        """Atlassian document-format nodes (decisions, ...): ``*-list`` nodes become lists."""
        kind = el.get("type") or ""
        if kind.endswith("-list"):
            items = [self.render(self.sub(c, depth)) for c in el if local_tag(c) == f"{{{AC}}}adf-node"]
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
        if self._too_deep(depth):
            text = one_line(flat_text(el))
            return [("  " * level + text, [])] if text else []
        out: list[tuple[str, list[Table]]] = []
        indent = "  " * level
        for li in el:
            tag = local_tag(li).lower()
            if tag in ("ul", "ol"):  # sloppy nesting: a list directly inside a list
                out.extend(self._list_items(li, depth + 1, level + 1))
                continue
            if tag != "li":
                if tag and tag not in _DROP:
                    text = self.render(self.sub(li, depth))
                    if text:
                        out.append((indent + text, []))
                continue
            nested: list[etree._Element] = [c for c in li if local_tag(c).lower() in ("ul", "ol")]

            def walk_item(w: Walker, li: etree._Element = li, nested: list[etree._Element] = nested) -> None:
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
        skipped = {id(s) for s in skip}  # a set: an item with thousands of sub-lists stays linear
        self.text(el.text)
        for child in el:
            if id(child) not in skipped:
                self.walk(child, depth + 1)
            self.text(child.tail)

    def _task_items(self, el: etree._Element, depth: int) -> list[str]:
        items: list[str] = []
        for task in el:
            if local_tag(task) != f"{{{AC}}}task":
                continue
            status = ""
            body: etree._Element | None = None
            for part in task:
                tag = local_tag(part)
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
        stray: list[etree._Element] = []  # not a row: a damaged page's text the parser put in the table
        for child in el:
            tag = local_tag(child).lower()
            if tag == "tr":
                rows.append(child)
            elif tag in ("thead", "tbody", "tfoot"):
                rows.extend(r for r in child if local_tag(r).lower() == "tr")
            elif tag == "caption":
                caption = self.render(self.sub(child, depth))
            elif tag and tag not in ("colgroup", "col"):
                stray.append(child)
        if (el.text or "").strip() or stray:  # e.g. "<p>Oct<table> 30</p><p>…": the rest of the page
            self.text(" " + (el.text or "") + " ")
            for child in stray:
                self.walk(child, depth + 1)
                self.text(" " + (child.tail or "") + " ")
        self.ctx.table_count += 1
        table, nested = build_table(rows, caption, lambda cell: self.sub(cell, depth + 1), self.render,
                                    self.ctx.tables, self.ctx.table_count)
        if table is not None:
            self.emit(table)
        for inner in nested:
            self._copy(inner)

    def _copy(self, table: Table) -> None:
        self.copies.add(id(table))
        self.emit(table)

    def render(self, elements: Iterable[Element]) -> str:
        """Flatten elements to one line of text, skipping re-emitted nested tables."""
        return one_line(render_text(e for e in elements if id(e) not in self.copies))

    def _link_text(self, el: etree._Element, depth: int) -> str:
        """``ac:link``: the link body if it has text, else the target's readable name."""
        for child in el:
            tag = local_tag(child)
            if tag in (f"{{{AC}}}plain-text-link-body", f"{{{AC}}}link-body"):
                body = self.render(self.sub(child, depth))
                if body:
                    return body
        for child in el:
            if local_tag(child).startswith(f"{{{RI}}}"):
                text = resource_text(child)
                if text:
                    return text
        anchor = attr(el, AC, "anchor")
        return anchor
