"""Confluence storage-format XHTML -> page elements, tolerant of whatever a real wiki holds.

``parse_page`` (``pipeline.ingest.storage.parse``) is the entry point; ``repair``, ``tree``, ``walker`` and
``tables`` are its stages.
"""

from pipeline.ingest.storage.parse import ParseLimits, ParseResult, parse_page

__all__ = ["ParseLimits", "ParseResult", "parse_page"]
