"""Inline pieces of storage format as text: tag and attribute helpers, Confluence resources, images, and
page elements flattened to one string (cells, items, headings)."""

from __future__ import annotations

from collections.abc import Iterable

from lxml import etree

from pipeline.ingest.storage.tables import cell_label
from pipeline.ingest.storage.tree import AC, RI
from pipeline.types import Element, Heading, ListBlock, Paragraph, Table


def local_tag(el: etree._Element) -> str:
    """The lxml tag (``{ns}name`` for ac:/ri: tags), or "" for comments and processing instructions."""
    tag = el.tag
    return tag if isinstance(tag, str) else ""


def split_tag(tag: str) -> tuple[str | None, str]:
    """(namespace, local name) of an lxml tag, without ``etree.QName`` (which refuses the odd names an HTML
    parse of a damaged page can hold)."""
    if tag.startswith("{") and "}" in tag:
        ns, _, local = tag[1:].partition("}")
        return ns, local
    return None, tag


def attr(el: etree._Element, ns: str, name: str) -> str:
    return (el.get(f"{{{ns}}}{name}") or el.get(name) or "").strip()


def clean_inline(raw: str) -> str:
    """Collapse whitespace inside lines; ``\\n`` marks hard breaks (``br``)."""
    lines = (" ".join(line.split()) for line in raw.split("\n"))
    return "\n".join(line for line in lines if line)


def clean_code(raw: str) -> str:
    lines = [line.rstrip() for line in raw.replace("\r\n", "\n").replace("\xa0", " ").split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def one_line(text: str) -> str:
    return " ".join(text.split())


def resource_text(el: etree._Element) -> str:
    """Readable text for a bare ``ri:`` resource (page, user, attachment, space, url)."""
    name = split_tag(local_tag(el))[1]
    if name == "page" or name == "blog-post":
        return attr(el, RI, "content-title")
    if name == "user":
        username = attr(el, RI, "username")
        if username:
            return f"@{username}"
        ident = attr(el, RI, "userkey") or attr(el, RI, "account-id")
        return f"@user:{ident}" if ident else ""
    if name == "attachment":
        return attr(el, RI, "filename")
    if name == "space":
        return attr(el, RI, "space-key")
    if name == "url":
        return attr(el, RI, "value")
    return ""


def image_text(el: etree._Element) -> str:
    for child in el:
        tag = local_tag(child)
        if tag == f"{{{RI}}}attachment":
            name = attr(child, RI, "filename")
            if name:
                return f"[image: {name}]"
        elif tag == f"{{{RI}}}url":
            value = attr(child, RI, "value")
            if value:
                return f"[image: {value.rsplit('/', 1)[-1] or value}]"
    alt = attr(el, AC, "alt") or attr(el, AC, "title")
    return f"[image: {alt}]" if alt else ""


# ---------------------------------------------------------------- element -> flat text


def render_text(elements: Iterable[Element]) -> str:
    """Flatten elements to text (cells, items, headings); tables become ``H: v, H: v; ...``."""
    parts: list[str] = []
    for e in elements:
        if isinstance(e, Heading | Paragraph):
            parts.append(e.text)
        elif isinstance(e, ListBlock):
            parts.append("; ".join(i.strip() for i in e.items))
        elif isinstance(e, Table):
            rows = [
                ", ".join(cell_label(h, v) for h, v in zip(e.headers, row, strict=True) if v)
                for row in e.rows
            ]
            parts.append("; ".join(r for r in rows if r))
    return " ".join(p for p in parts if p)
