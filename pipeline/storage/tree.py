"""Repaired storage format -> an lxml tree: strict XML when the page is well-formed, else recovering HTML.

Storage format is XHTML with undeclared ``ac:``/``ri:`` namespaces. A well-formed page (all 225 pages
of ConfQuestions and the sample space) is parsed as XML inside a root that declares them. A page
that is not well-formed is *not* parsed with libxml2's XML recover mode, which silently drops the rest
of a page after errors such as an unquoted attribute; it goes through libxml2's HTML parser, which
recovers locally (unquoted attributes, stray or missing end tags, unknown prefixes), and its
``ac:``/``ri:`` tag and attribute names are then mapped back to the namespaces the walker expects.

``visible_words`` counts the words a reader would see, on an independent HTML parse of the same body,
so the caller can tell how much text a parse kept (``ParseResult.coverage``).
"""

from __future__ import annotations

import re
from collections import Counter

from lxml import etree

from pipeline.storage.repair import for_html

AC = "http://atlassian.com/content"
RI = "http://atlassian.com/resource/identifier"
NAMESPACES = {"ac": AC, "ri": RI}
_ROOT_OPEN = f'<evident-root xmlns:ac="{AC}" xmlns:ri="{RI}">'
_ROOT_CLOSE = "</evident-root>"
_WORD = re.compile(r"\w+", re.UNICODE)

# Elements whose text a reader never sees (configuration, scripts, ids): left out by the walker and
# by the coverage reference alike.
HIDDEN_LOCAL = frozenset({"script", "style", "colgroup", "col", "head", "title"})
HIDDEN_AC = frozenset({"parameter", "emoticon", "hipchat-emoticon", "placeholder", "adf-attribute",
                       "adf-fallback", "task-id", "task-status"})


def strict_tree(text: str) -> etree._Element | None:
    """The page as XML, or None when it is not well-formed."""
    parser = etree.XMLParser(recover=False, resolve_entities=False, no_network=True, huge_tree=True)
    try:
        return etree.fromstring((_ROOT_OPEN + text + _ROOT_CLOSE).encode("utf-8"), parser)
    except (etree.XMLSyntaxError, ValueError):
        return None


def html_tree(text: str) -> etree._Element:
    """The page through the recovering HTML parser, with ``ac:``/``ri:`` names as namespaced names."""
    root = _html_parse(text)
    for el in root.iter():
        tag = el.tag
        if not isinstance(tag, str):
            continue
        prefix, sep, local = tag.partition(":")
        if sep and prefix in NAMESPACES and local:
            el.tag = f"{{{NAMESPACES[prefix]}}}{local}"
        for name in [a for a in el.attrib if ":" in a and a.split(":", 1)[0] in NAMESPACES]:
            prefix, _, local = name.partition(":")
            value = el.attrib.pop(name)
            if local:
                el.set(f"{{{NAMESPACES[prefix]}}}{local}", value)
    return root


def visible_words(text: str) -> Counter[str]:
    """The words a reader sees in ``text`` (hidden elements and comments left out), with counts."""
    root = _html_parse(text)
    for el in [el for el in root.iter() if isinstance(el.tag, str) and _hidden_html(el.tag)]:
        el.clear(keep_tail=True)  # its text goes, the text after it stays
    return word_counts(" ".join(root.itertext()))


def word_counts(text: str) -> Counter[str]:
    return Counter(_WORD.findall(text))


def _hidden_html(tag: str) -> bool:
    prefix, sep, local = tag.partition(":")
    return (sep and prefix == "ac" and local in HIDDEN_AC) or (not sep and tag in HIDDEN_LOCAL)


def _html_parse(text: str) -> etree._Element:
    parser = etree.HTMLParser(recover=True, huge_tree=True, no_network=True, remove_comments=True,
                              remove_pis=True)
    doc = etree.fromstring(f"<html><body><div>{for_html(text)}</div></body></html>", parser)
    body = doc.find("body") if doc is not None else None
    if body is None or not len(body):
        return etree.Element("evident-root")
    root = body[0]
    root.tag = "evident-root"
    return root
