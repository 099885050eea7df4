"""Repaired storage format -> an lxml tree: strict XML when the page is well-formed, else recovering HTML.

Storage format is XHTML with undeclared ``ac:``/``ri:`` namespaces. A well-formed page (all 225 pages
of ConfQuestions and the sample space) is parsed as XML inside a root that declares them. A page
that is not well-formed is *not* parsed with libxml2's XML recover mode, which silently drops the rest
of a page after errors such as an unquoted attribute; it goes through libxml2's HTML parser, which
recovers locally (unquoted attributes, stray or missing end tags, unknown prefixes), and its
``ac:``/``ri:`` tag and attribute names are then mapped back to the namespaces the walker expects.

``visible_words`` counts the words a reader would see, with the standard library's tokenizer (not
libxml2), so the caller can tell how much text a parse kept (``ParseResult.coverage``).
"""

from __future__ import annotations

import contextlib
import html
import re
from collections import Counter

from lxml import etree

from pipeline.ingest.storage.repair import for_html

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
            with contextlib.suppress(ValueError):  # a name XML cannot hold: kept as is (its text counts)
                el.tag = f"{{{NAMESPACES[prefix]}}}{local}"
        for name in [a for a in el.attrib if ":" in a and a.split(":", 1)[0] in NAMESPACES]:
            prefix, _, local = name.partition(":")
            value = el.attrib.pop(name)
            if local:
                with contextlib.suppress(ValueError):
                    el.set(f"{{{NAMESPACES[prefix]}}}{local}", value)
    return root


def visible_words(text: str) -> Counter[str]:
    """The words a reader sees in ``text``, with counts, read without libxml2.

    An independent reader keeps text after any stray tag, so a libxml2 recovery that loses text shows
    up as low coverage instead of agreeing with itself. Hidden elements (``HIDDEN_LOCAL``, ``ac:``
    ``HIDDEN_AC``) and comments do not count; CDATA does. One forward pass: each ``<`` either starts a
    comment, CDATA section, declaration or tag found by one forward search, or is text (the standard
    library's ``html.parser`` rescans unterminated comments and took 283 s for 1 MB of them).
    """
    words: Counter[str] = Counter()
    hidden: list[str] = []
    pos, n = 0, len(text)
    while pos < n:
        lt = text.find("<", pos)
        end = n if lt < 0 else lt
        if not hidden and end > pos:
            words.update(_WORD.findall(html.unescape(text[pos:end])))
        if lt < 0:
            break
        for opener, closer, visible in (("<!--", "-->", False), ("<![CDATA[", "]]>", True),
                                        ("<!", ">", False), ("<?", ">", False)):
            if text.startswith(opener, lt):
                stop = text.find(closer, lt + len(opener))
                stop = n if stop < 0 else stop
                if visible and not hidden:
                    words.update(_WORD.findall(text[lt + len(opener) : stop]))
                pos = stop + len(closer)
                break
        else:
            tag = _READER_TAG.match(text, lt)
            if tag is None:  # a lone "<": text
                if not hidden:
                    words.update(_WORD.findall(text[lt : lt + 1]))
                pos = lt + 1
                continue
            closing, name = tag.group(1), tag.group(2).lower()
            if _hidden_html(name) and not tag.group(0).endswith("/>"):
                if not closing:
                    hidden.append(name)
                elif name in hidden:
                    while hidden and hidden.pop() != name:
                        pass
            pos = tag.end()
    return words


_READER_TAG = re.compile(r"<(/?)([A-Za-z][\w:.-]*)[^<>]*>")


def word_counts(text: str) -> Counter[str]:
    return Counter(_WORD.findall(text))


def _hidden_html(tag: str) -> bool:
    prefix, sep, local = tag.lower().partition(":")
    return bool(sep and prefix == "ac" and local in HIDDEN_AC) or (not sep and tag.lower() in HIDDEN_LOCAL)


def _html_parse(text: str) -> etree._Element:
    """The body element of an HTML parse: stray end tags in the page cannot close it early (a wrapper
    ``div`` could be closed by a stray ``</div>``, leaving the rest of the page outside it)."""
    parser = etree.HTMLParser(recover=True, huge_tree=True, no_network=True, remove_comments=True,
                              remove_pis=True)
    doc = etree.fromstring(f"<html><body>{for_html(text)}</body></html>", parser)
    body = doc.find("body") if doc is not None else None
    if body is None:
        return etree.Element("evident-root")
    body.tag = "evident-root"
    return body
