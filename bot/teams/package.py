"""The Teams app package: ``manifest.json`` with the bot's app id filled in, plus the two icons, zipped
for upload in Teams (Apps → Manage your apps → Upload an app) or the Teams admin center."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

from pipeline.errors import ConfigError

PACKAGE_DIR = Path(__file__).resolve().parent / "package"
_GUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def build_package(app_id: str, out: Path, *, version: str = "0.1.0") -> Path:
    """Write the app package zip to ``out``; ``app_id`` is the Azure Bot's Microsoft App ID (a GUID)."""
    if not _GUID.fullmatch(app_id or ""):
        raise ConfigError(f"TEAMS_APP_ID must be the bot's Microsoft App ID (a GUID), got {app_id!r}")
    manifest = json.loads(
        (PACKAGE_DIR / "manifest.json").read_text(encoding="utf-8").replace("${TEAMS_APP_ID}", app_id)
    )
    manifest["version"] = version
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", json.dumps(manifest, indent=2))
        for icon in ("color.png", "outline.png"):
            z.write(PACKAGE_DIR / icon, icon)
    return out
