"""The connectors' settings: the pipeline's areas plus those of each source."""

from __future__ import annotations

from connectors.confluence.settings import ConfluenceSettings, JiraSettings
from pipeline.runtime.config import Area, HttpUrl, setting
from pipeline.settings import PipelineSettings


class LocalSettings(Area):
    title = "Local folders"

    base_url: HttpUrl = setting(
        None,
        "EVIDENT_LOCAL_BASE_URL",
        "Where ingested local files are published (e.g. "
        "https://docs.example.com/runbooks/): answers cite this plus the file's path in its "
        "folder instead of a file:// URL.",
    )


class ConnectorSettings(PipelineSettings):
    confluence: ConfluenceSettings
    jira: JiraSettings
    local: LocalSettings
