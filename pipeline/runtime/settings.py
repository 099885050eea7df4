"""The core area: where evident keeps its data, and how it logs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator

from pipeline.runtime.config import Area, OptionalPath, UserPath, setting


def _upper(value: Any) -> Any:
    return value.strip().upper() if isinstance(value, str) else value


class CoreSettings(Area):
    title = "Storage and logging"

    data_dir: UserPath = setting(
        Path(), "EVIDENT_DATA_DIR", "Where the embedded index, the store and caches live."
    )
    index_dir: OptionalPath = setting(None, "EVIDENT_INDEX_DIR",
                                      "Embedded (Qdrant Edge) index directory; default DATA_DIR/index.")
    store_path: OptionalPath = setting(None, "EVIDENT_STORE_PATH",
                                       "SQLite conversation store; default DATA_DIR/evident.db.")
    log_level: Annotated[
        Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], BeforeValidator(_upper)
    ] = setting("INFO", "EVIDENT_LOG_LEVEL", "Logging level.")
    log_format: Literal["text", "json"] = setting("text", "EVIDENT_LOG_FORMAT",
                                                  "text | json (one JSON object per line, with turn_ref).")

    @classmethod
    def env_defaults(cls, env: Mapping[str, str]) -> dict[str, Any]:
        base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        return {"data_dir": Path(base) / "evident"}

    @property
    def resolved_index_dir(self) -> Path:
        return Path(self.index_dir) if self.index_dir else Path(self.data_dir) / "index"

    @property
    def resolved_store_path(self) -> Path:
        return Path(self.store_path) if self.store_path else Path(self.data_dir) / "evident.db"
