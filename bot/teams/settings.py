"""The Microsoft Teams area: the Azure Bot registration and where evident listens."""

from __future__ import annotations

from pipeline.runtime.config import Area, CommaList, HttpUrl, SecretStr, setting


class TeamsSettings(Area):
    title = "Microsoft Teams"

    app_id: str | None = setting(None, "TEAMS_APP_ID",
                                 "The bot's Microsoft App ID (client id); set it to serve Teams.")
    app_password: SecretStr = setting(
        SecretStr(""), "TEAMS_APP_PASSWORD", "The app registration's client secret."
    )
    tenant_id: str | None = setting(
        None, "TEAMS_TENANT_ID", "Tenant of a single-tenant bot (its token authority)."
    )
    port: int = setting(
        3978, "EVIDENT_TEAMS_PORT", "Port of the Teams messaging endpoint (/api/messages).", ge=0, le=65535
    )
    openid_url: HttpUrl = setting("https://login.botframework.com/v1/.well-known/openidconfiguration",
                                  "EVIDENT_TEAMS_OPENID_URL", "OpenID metadata whose keys sign Bot Framework "
                                  "channel tokens.")
    tenant_openid_url: HttpUrl = setting(
        None,
        "EVIDENT_TEAMS_TENANT_OPENID_URL",
        "OpenID metadata whose keys sign "
        "the tenant's own Entra ID tokens; default login.microsoftonline.com/"
        "<tenant>/v2.0/.well-known/openid-configuration.",
    )
    token_url: HttpUrl = setting(
        None,
        "EVIDENT_TEAMS_TOKEN_URL",
        "Token endpoint for replies; default the tenant's "
        "login.microsoftonline.com/<tenant>/oauth2/v2.0/token.",
    )
    explain_reactions: CommaList = setting(
        ("surprised",),
        "EVIDENT_TEAMS_EXPLAIN_REACTIONS",
        "Teams reactions that request an explanation (like, heart, laugh, surprised, sad, angry).",
    )
