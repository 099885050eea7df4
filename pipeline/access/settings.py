"""The access area: whether answers follow each person's Confluence permissions, and how people are mapped."""

from __future__ import annotations

from typing import Annotated, Literal

from pipeline.runtime.config import Area, CommaList, Lower, OptionalPath, setting


class AccessSettings(Area):
    title = "Who sees what"

    mode: Annotated[Literal["space", "per-user"], Lower] = setting(
        "space", "EVIDENT_ACCESS",
        "space: a place's mapped spaces, whoever asks (restricted pages are not indexed) | per-user: each "
        "answer only from what everyone reading it may open in Confluence (docs/access.md).")
    identity_map: OptionalPath = setting(
        None, "EVIDENT_ACCESS_IDENTITY_MAP",
        "CSV of email,account[,groups]: chat e-mail -> Confluence account id (Data Center: user key), and "
        "optionally its groups (';'-separated), for sites that do not reveal e-mail addresses.")
    identity_ttl_s: int = setting(
        600, "EVIDENT_ACCESS_IDENTITY_TTL_S",
        "How long a person's resolved permissions and a place's member list are reused (at most 900).",
        ge=0, le=900)
    audience_max: int = setting(
        100, "EVIDENT_ACCESS_AUDIENCE_MAX",
        "Places with more members than this (and public channels) get only what the whole site may read.",
        ge=1)
    site_groups: CommaList = setting(
        ("confluence-users",), "EVIDENT_ACCESS_SITE_GROUPS",
        "Groups every employee belongs to (Cloud: their ids): what the whole site may read is what these "
        "groups or anonymous users may read.")
