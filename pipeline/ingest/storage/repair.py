"""Text-level repairs of storage-format XHTML before any parser sees it. Each is one linear pass.

- ``sanitize``: lone UTF-16 surrogates become U+FFFD, C0 control characters (but tab/newline) go.
- ``repair``: named entities become numeric references (libxml2's recover mode drops predefined ones
  after its first error), and a ``<`` or ``&`` that cannot start markup is escaped, so ``a < b``,
  ``R&D`` and ``<!channel>`` stay text. CDATA sections are left alone.
- ``limit_depth``: tags nested deeper than a bound are dropped (their text stays), because libxml2
  stops at 2,048 levels and loses everything after.
- ``for_html``: what the HTML fallback parser needs in addition: CDATA as escaped text,
  self-closing ``ac:``/``ri:`` tags written out as open + close, and no ``html``/``body``/``head`` tags
  (in a page fragment they are junk, but an HTML parser would end the document at a stray ``</body>``).
"""

from __future__ import annotations

import html
import re
from html.entities import name2codepoint

_CDATA = re.compile(r"(<!\[CDATA\[.*?(?:\]\]>|$))", re.S)
_ENTITY = re.compile(r"&(#[0-9]{1,7};|#[xX][0-9a-fA-F]{1,6};|[A-Za-z][A-Za-z0-9]{0,31};)?")
_STRAY_LT = re.compile(r"<(?![A-Za-z_/?]|!--|!\[CDATA\[|![Dd][Oo][Cc][Tt][Yy][Pp][Ee])")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# Quoted values stop at "<" too (XML forbids it there): every match attempt then ends at the next "<",
# so a page full of unterminated quotes still scans in linear time.
_ATTRS = r"""((?:"[^"<]*"|'[^'<]*'|[^<>"'])*?)"""
_TAG = re.compile(r"<(/?)([A-Za-z][\w:.-]*)" + _ATTRS + r"(/?)>")
_SELF_CLOSING = re.compile(r"<([A-Za-z][\w.-]*:[\w.-]+)" + _ATTRS + r"/>")
_DOCUMENT_TAGS = re.compile(r"</?(?:html|body|head)\b[^<>]*>", re.I)  # junk in a fragment; HTML obeys them
_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
                   "source", "track", "wbr"})


def sanitize(text: str) -> str:
    """Drop control characters and replace lone surrogates (text that cannot be encoded as UTF-8)."""
    return _SURROGATE.sub("\ufffd", _CONTROL.sub("", text))


def repair(xhtml: str) -> str:
    """Numeric entity references and escaped stray ``<``/``&``, outside CDATA sections."""
    parts = _CDATA.split(xhtml)
    for i in range(0, len(parts), 2):  # odd indices are CDATA sections
        parts[i] = _STRAY_LT.sub("&#60;", _ENTITY.sub(_fix_entity, parts[i]))
    return "".join(parts)


def _fix_entity(match: re.Match[str]) -> str:
    ref = match.group(1)
    if ref is None:
        return "&#38;"
    if ref.startswith("#"):
        value = int(ref[2:-1], 16) if ref[1] in "xX" else int(ref[1:-1])
        ok = 0 < value <= 0x10FFFF and not 0xD800 <= value <= 0xDFFF and (value >= 32 or value in (9, 10, 13))
        return match.group(0) if ok else "&#65533;"
    code = name2codepoint.get(ref[:-1])
    if code is None and ref[:-1] == "apos":
        code = 39
    return f"&#{code};" if code is not None else "&#38;" + ref


def max_depth(xhtml: str) -> int:
    """Deepest element nesting, counting tags the way ``limit_depth`` does."""
    depth = deepest = 0
    for m in _TAG.finditer(xhtml):
        closing, name, _, self_closing = m.groups()
        if self_closing or name.lower() in _VOID:
            continue
        if closing:
            depth = max(0, depth - 1)
        else:
            depth += 1
            deepest = max(deepest, depth)
    return deepest


def limit_depth(xhtml: str, limit: int) -> str:
    """Drop opening tags beyond ``limit`` levels and as many closing tags after them; keep all text."""
    if max_depth(xhtml) <= limit:
        return xhtml
    out: list[str] = []
    pos = depth = dropped = 0
    for m in _TAG.finditer(xhtml):
        closing, name, _, self_closing = m.groups()
        if self_closing or name.lower() in _VOID:
            continue
        keep = True
        if closing:
            if dropped:
                dropped -= 1
                keep = False
            else:
                depth = max(0, depth - 1)
        elif depth >= limit:
            dropped += 1
            keep = False
        else:
            depth += 1
        if not keep:
            out.append(xhtml[pos : m.start()])
            out.append(" ")
            pos = m.end()
    out.append(xhtml[pos:])
    return "".join(out)


def for_html(xhtml: str) -> str:
    """CDATA sections as escaped text; ``<ac:x .../>`` as ``<ac:x ...></ac:x>`` (HTML has no ``/>``)."""
    parts = _CDATA.split(xhtml)
    for i in range(len(parts)):
        if i % 2:
            body = parts[i][len("<![CDATA[") :]
            parts[i] = html.escape(body[:-3] if body.endswith("]]>") else body, quote=False)
        else:
            parts[i] = _DOCUMENT_TAGS.sub(" ", _SELF_CLOSING.sub(r"<\1\2></\1>", parts[i]))
    return "".join(parts)
