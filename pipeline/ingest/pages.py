"""The page schema evident ingests: a JSON object validated field by field into a ``Page``.

Two shapes are read (docs/ingest.md has the reference):

- **export** (ConfQuestions, the sample space): ``id``, ``title``, ``url``, ``space``, ``content``
  (storage-format XHTML), optional ``date``, ``version``, ``ancestors``, ``labels``;
- **Confluence REST ``content``**: ``id``, ``title``, ``body.storage.value``, ``space.key`` (or a string),
  ``version.number``/``version.when``, ``_links.webui`` (+ ``_links.base`` or the site URL), ``ancestors``
  (objects with ``title``), ``metadata.labels.results`` (objects with ``name``).

A field of the wrong type is an ``InputError`` naming the field and the type found; nothing is
stringified (a list id once became the string "[1, 2]"). Strings lose control characters and lone
surrogates (which cannot be encoded, e.g. into the embedding cache's keys). Unknown fields are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pipeline.errors import InputError
from pipeline.types import Page

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # single-line fields keep no tab/newline either
_SURROGATE = re.compile(r"[\ud800-\udfff]")
MAX_ID_CHARS = 255
MAX_LINE_CHARS = 2_000


def clean_text(value: str) -> str:
    """Lone surrogates -> U+FFFD (a body keeps its tabs and newlines; ``clean_line`` for one-liners)."""
    return _SURROGATE.sub("\ufffd", value)


def clean_line(value: str) -> str:
    return " ".join(_CONTROL.sub(" ", clean_text(value)).split())


def page_from_record(record: Any, *, space: str | None = None, site_url: str | None = None) -> Page:
    """Validate one page object (export or REST shape) into a ``Page``; ``space`` overrides its space."""
    if not isinstance(record, Mapping):
        raise InputError(f"a page must be a JSON object, got {_kind(record)}")
    links = record.get("_links")
    present = {
        "id": record.get("id"),
        "title": record.get("title"),
        "url": record.get("url") or (links.get("webui") if isinstance(links, Mapping) else None) or site_url,
        "space": space or record.get("space"),
        "content": record.get("content") if record.get("content") not in (None, "") else record.get("body"),
    }
    missing = [name for name, value in present.items() if value is None or value == ""]
    if missing:
        raise InputError(f"JSON page lacks required fields: {', '.join(missing)}")
    page_id = _id(record.get("id"))
    title = _line(record, "title", required=False) or page_id
    body = _body(record)
    space_key = space or _space(record.get("space"))
    version, updated = _version(record)
    return Page(
        id=page_id,
        title=title,
        url=_url(record, page_id, site_url),
        space=space_key,
        body=body,
        version=version,
        updated=updated,
        ancestors=_names(record.get("ancestors"), "ancestors", "title"),
        labels=_labels(record),
    )


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)


def _id(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InputError(f"id must be a string or an integer, got {_kind(value)}")
    text = clean_line(str(value))
    if not text:
        raise InputError("id is empty")
    if len(text) > MAX_ID_CHARS:
        raise InputError(f"id is {len(text)} characters long (limit {MAX_ID_CHARS})")
    return text


def _line(record: Mapping[str, Any], field: str, *, required: bool = True) -> str:
    value = record.get(field)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise InputError(f"{field} must be a string, got {_kind(value)}")
    text = clean_line(value)[:MAX_LINE_CHARS]
    if required and not text:
        raise InputError(f"{field} is empty")
    return text


def _body(record: Mapping[str, Any]) -> str:
    for field in ("content", "body"):
        value = record.get(field)
        if value is None:
            continue
        if isinstance(value, str):
            return clean_text(value)
        storage = value.get("storage") if isinstance(value, Mapping) else None
        inner = storage.get("value") if isinstance(storage, Mapping) else None
        if isinstance(inner, str):
            return clean_text(inner)
        raise InputError(
            f"{field} must be storage-format text or an object with storage.value text, "
            f"got {_kind(value)}" + (" without storage.value" if isinstance(value, Mapping) else "")
        )
    raise InputError("page has no content (neither content nor body.storage.value)")


def _space(value: Any) -> str:
    if isinstance(value, Mapping):
        value = value.get("key")
    if not isinstance(value, str) or not clean_line(value):
        raise InputError(f"space must be a space key (a string, or an object with key), got {_kind(value)}")
    return clean_line(value)


def _version(record: Mapping[str, Any]) -> tuple[int | None, str | None]:
    value = record.get("version")
    when = record.get("date") or record.get("updated")
    if isinstance(value, Mapping):
        when = value.get("when") or when
        value = value.get("number")
    if when is not None and not isinstance(when, str):
        raise InputError(f"date must be a string, got {_kind(when)}")
    if value is None:
        return None, clean_line(when) if when else None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"version must be a non-negative integer, got {_kind(value)}")
    return value, clean_line(when) if when else None


def _url(record: Mapping[str, Any], page_id: str, site_url: str | None) -> str:
    if record.get("url") is not None:
        return _line(record, "url")
    links = record.get("_links")
    if isinstance(links, Mapping) and isinstance(links.get("webui"), str):
        webui = clean_line(links["webui"])
        base = links.get("base") if isinstance(links.get("base"), str) else site_url
        if webui.startswith("http"):
            return webui
        if base:
            return clean_line(base).rstrip("/") + "/" + webui.lstrip("/")
    if site_url:
        return site_url.rstrip("/") + f"/pages/viewpage.action?pageId={page_id}"
    raise InputError("page has no url (neither url nor _links.webui with _links.base)")


def _names(value: Any, field: str, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InputError(f"{field} must be a list, got {_kind(value)}")
    out: list[str] = []
    for item in value:
        if isinstance(item, Mapping):
            item = item.get(key)
        if not isinstance(item, str):
            raise InputError(f"{field} must hold strings or objects with {key}, got {_kind(item)}")
        if clean_line(item):
            out.append(clean_line(item)[:MAX_LINE_CHARS])
    return tuple(out)


def _labels(record: Mapping[str, Any]) -> tuple[str, ...]:
    if "labels" in record:
        return _names(record["labels"], "labels", "name")
    metadata = record.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    if isinstance(labels, Mapping):
        return _names(labels.get("results"), "metadata.labels.results", "name")
    return ()
