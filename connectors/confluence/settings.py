"""The Confluence and Jira areas: which site, which spaces and what of them to sync."""

from __future__ import annotations

from pipeline.runtime.config import Area, CommaList, HttpUrl, SecretStr, setting


class ConfluenceSettings(Area):
    title = "Confluence"

    url: HttpUrl = setting(None, "CONFLUENCE_URL", "Site URL (Cloud: https://x.atlassian.net/wiki).")
    user: str | None = setting(None, "CONFLUENCE_USER", "Cloud: account e-mail. Unset: Data Center PAT.")
    token: SecretStr = setting(SecretStr(""), "CONFLUENCE_TOKEN", "Cloud API token or Data Center PAT.")
    spaces: CommaList = setting((), "CONFLUENCE_SPACES", "Space keys to sync (comma list).")
    labels_include: CommaList = setting((), "CONFLUENCE_LABELS_INCLUDE", "Only pages with a label.")
    labels_exclude: CommaList = setting((), "CONFLUENCE_LABELS_EXCLUDE", "Skip pages with a label.")
    ancestor: str | None = setting(None, "CONFLUENCE_ANCESTOR", "Only this page id's subtree.")
    blog_posts: bool = setting(
        False,
        "CONFLUENCE_BLOG_POSTS",
        "Index the spaces' blog posts too (their evidence shows 'Blog' as breadcrumb).",
    )
    attachments: bool = setting(False, "CONFLUENCE_ATTACHMENTS", "Index PDF, Word (.docx), Markdown and text "
                                "attachments of the synced pages (their page as breadcrumb).")
    max_attachment_bytes: int = setting(20 * 2**20, "CONFLUENCE_MAX_ATTACHMENT_BYTES",
                                        "Larger attachments are reported, not downloaded.", ge=1)
    comments: bool = setting(False, "CONFLUENCE_COMMENTS",
                             "Index the comments on synced pages, each as evidence under its page.")
    resolve_macros: bool = setting(
        True,
        "CONFLUENCE_RESOLVE_MACROS",
        "Replace include, excerpt-include and "
        "children macros with what they show (a few requests per such macro, cached per "
        "sync).",
    )
    timeout_s: float = setting(
        30.0,
        "CONFLUENCE_TIMEOUT_S",
        "Per-request timeout; a results page that times out "
        "twice is asked for again with half as many pages.",
        ge=1,
    )
    include_restricted: bool = setting(False, "CONFLUENCE_INCLUDE_RESTRICTED",
                                       "Index read-restricted pages. Exposes them to every mapped channel!")
    sync_overlap_s: int = setting(
        600,
        "EVIDENT_SYNC_OVERLAP_S",
        "Overlap of incremental sync queries behind the "
        "checkpoint, for the search index's lag behind edits; 1 h more for daylight saving when the "
        "site's CQL time zone is measured, 13 h more when it is not known.",
        ge=0,
    )
    sync_listing_interval_s: int = setting(
        3600,
        "EVIDENT_SYNC_LISTING_INTERVAL_S",
        "How often a sync lists every page of a space, to see what no edit time shows: deletions, moves, "
        "read restrictions added or lifted without an edit. Between listings a cycle asks only what changed "
        "(one request a space when nothing did). 0: every cycle; per-user access lists every cycle.",
        ge=0,
    )
    sync_zone_probe: bool = setting(
        True,
        "EVIDENT_SYNC_ZONE_PROBE",
        "Measure the time zone Confluence reads CQL "
        "dates in (a few tiny requests every 6 h), so the overlap need not cover every "
        "zone.",
    )


class JiraSettings(Area):
    title = "Jira (summaries of Jira macros)"

    url: HttpUrl = setting(
        None, "JIRA_URL", "Jira site for the summaries of Jira macros (keys only without it)."
    )
    user: str | None = setting(None, "JIRA_USER", "Jira Cloud: account e-mail. Unset: Data Center PAT.")
    token: SecretStr = setting(SecretStr(""), "JIRA_TOKEN", "Jira Cloud API token or Data Center PAT.")
