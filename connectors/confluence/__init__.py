"""Confluence Cloud / Data Center connector: REST client, CQL scope, incremental sync with deletions."""

from connectors.confluence.client import ConfluenceClient
from connectors.confluence.source import ConfluenceSource, to_page
from connectors.confluence.sync import SyncReport, sync_confluence

__all__ = ["ConfluenceClient", "ConfluenceSource", "SyncReport", "sync_confluence", "to_page"]
