"""Builds the connectors' clients from the settings (the pipeline's are built in ``pipeline.factory``)."""

from __future__ import annotations

from typing import Any

from connectors.confluence.client import ConfluenceClient
from connectors.confluence.jira import JiraClient
from connectors.confluence.permissions import PermissionSweep
from connectors.confluence.source import ConfluenceSource
from connectors.settings import ConnectorSettings
from pipeline.errors import ConfigError


def make_confluence_source(settings: ConnectorSettings, **client_options: Any) -> ConfluenceSource:
    """From the ``CONFLUENCE_*`` settings: ``CONFLUENCE_USER`` set = Cloud (basic auth), unset = Data Center
    PAT."""
    if not settings.confluence.url:
        raise ConfigError("CONFLUENCE_URL is not set")
    token = settings.confluence.token.get_secret_value()
    if not token:
        raise ConfigError(
            "CONFLUENCE_TOKEN is not set (Cloud API token, or Data Center personal access token)"
        )
    client_options.setdefault("timeout_s", settings.confluence.timeout_s)
    client = ConfluenceClient(settings.confluence.url, token=token, user=settings.confluence.user or None,
                              **client_options)
    return ConfluenceSource(
        client,
        spaces=settings.confluence.spaces,
        labels_include=settings.confluence.labels_include,
        labels_exclude=settings.confluence.labels_exclude,
        ancestor=settings.confluence.ancestor,
        include_restricted=settings.confluence.include_restricted,
        overlap_s=settings.confluence.sync_overlap_s,
        zone_probe=settings.confluence.sync_zone_probe,
        listing_interval_s=settings.confluence.sync_listing_interval_s,
        blog_posts=settings.confluence.blog_posts,
        resolve_macros=settings.confluence.resolve_macros,
        attachments=settings.confluence.attachments,
        max_attachment_bytes=settings.confluence.max_attachment_bytes,
        comments=settings.confluence.comments,
        jira=make_jira_client(settings),
        permissions=PermissionSweep(client, site_groups=settings.access.site_groups)
        if settings.access.mode == "per-user" else None,
    )


def make_jira_client(settings: ConnectorSettings) -> JiraClient | None:
    """From ``JIRA_*``: summaries for Jira macros (Cloud with ``JIRA_USER``, Data Center with a token
    alone)."""
    if not settings.jira.url:
        return None
    token = settings.jira.token.get_secret_value()
    if not token:
        raise ConfigError("JIRA_TOKEN is not set (Cloud API token, or Data Center personal access token)")
    return JiraClient(settings.jira.url, token=token, user=settings.jira.user or None,
                      timeout_s=settings.confluence.timeout_s)
