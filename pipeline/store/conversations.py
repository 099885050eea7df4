"""What a platform keeps about a conversation (e.g. the channel an assistant thread looks at)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pipeline.store.database import Database, now_iso


class ConversationMeta(Database):
    async def conversation_meta(self, key: str) -> dict[str, Any]:
        rows = await self._run(lambda: self._rows("SELECT meta FROM conversations WHERE key=?", (key,)))
        meta = json.loads(rows[0]["meta"] or "{}") if rows else {}
        return meta if isinstance(meta, dict) else {}

    async def set_conversation_meta(self, key: str, meta: Mapping[str, Any]) -> None:
        now = now_iso()
        await self._write("INSERT INTO conversations(key, created_at, updated_at, meta) VALUES (?, ?, ?, ?) "
                          "ON CONFLICT(key) DO UPDATE SET meta=excluded.meta, updated_at=excluded.updated_at",
                          (key, now, now, json.dumps(dict(meta), ensure_ascii=False)))
