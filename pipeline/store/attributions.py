"""The attribution cache: an explanation per (turn, method, parameters), computed once."""

from __future__ import annotations

import json
from typing import Any

from pipeline.store.database import Database, now_iso


class Attributions(Database):
    async def get_attribution(self, turn_id: int, method: str, params_hash: str) -> Any | None:
        rows = await self._run(lambda: self._rows(
            "SELECT result FROM attributions WHERE turn_id=? AND method=? AND params_hash=?",
            (turn_id, method, params_hash)))
        return json.loads(rows[0]["result"]) if rows else None

    async def put_attribution(self, turn_id: int, method: str, params_hash: str, result: Any) -> None:
        await self._write(
            "INSERT INTO attributions(turn_id, method, params_hash, result, created_at) VALUES (?, ?, ?, ?, "
            "?) "
            "ON CONFLICT(turn_id, method, params_hash) DO UPDATE SET result=excluded.result, "
            "created_at=excluded.created_at",
            (turn_id, method, params_hash, json.dumps(result, ensure_ascii=False), now_iso()),
        )
