"""Builds the connectors' clients from the settings (the pipeline's are built in ``pipeline.factory``)."""

from __future__ import annotations

from typing import Any

from connectors.confluence.client import ConfluenceClient
from connectors.confluence.jira import JiraClient
from connectors.confluence.source import ConfluenceSource
from pipeline.errors import ConfigError
from pipeline.runtime.settings import Settings


def make_confluence_source(settings: Settings, **client_options: Any) -> ConfluenceSource:
    """From the ``CONFLUENCE_*`` settings: ``CONFLUENCE_USER`` set = Cloud (basic auth), unset = Data Center PAT."""
    if not settings.confluence_url:
        raise ConfigError("CONFLUENCE_URL is not set")
    token = settings.confluence_token.reveal()
    if not token:
        raise ConfigError("CONFLUENCE_TOKEN is not set (Cloud API token, or Data Center personal access token)")
    client_options.setdefault("timeout_s", settings.confluence_timeout_s)
    client = ConfluenceClient(settings.confluence_url, token=token, user=settings.confluence_user or None,
                              **client_options)
    return ConfluenceSource(
        client,
        spaces=settings.confluence_spaces,
        labels_include=settings.confluence_labels_include,
        labels_exclude=settings.confluence_labels_exclude,
        ancestor=settings.confluence_ancestor,
        include_restricted=settings.include_restricted,
        overlap_s=settings.sync_overlap_s,
        zone_probe=settings.sync_zone_probe,
        blog_posts=settings.confluence_blog_posts,
        resolve_macros=settings.confluence_resolve_macros,
        attachments=settings.confluence_attachments,
        max_attachment_bytes=settings.confluence_max_attachment_bytes,
        comments=settings.confluence_comments,
        jira=make_jira_client(settings),
    )


def make_jira_client(settings: Settings) -> JiraClient | None:
    """From ``JIRA_*``: summaries for Jira macros (Cloud with ``JIRA_USER``, Data Center with a token alone)."""
    if not settings.jira_url:
        return None
    token = settings.jira_token.reveal()
    if not token:
        raise ConfigError("JIRA_TOKEN is not set (Cloud API token, or Data Center personal access token)")
    return JiraClient(settings.jira_url, token=token, user=settings.jira_user or None,
                      timeout_s=settings.confluence_timeout_s)
