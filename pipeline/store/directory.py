"""The people a Confluence site knows and each page's permissions fingerprint (tables ``directory`` and
``page_access``, migration 7).

The permission sync writes both: every account it met in a group it lists (the group's members), with the
e-mail address where the site shows it and the groups it belongs to; and, per page, a fingerprint of the
permissions written to the index, so the next cycle writes only what changed. The conversation core reads the
directory to turn a chat user's e-mail address into Confluence principals.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from pipeline.access.people import Account
from pipeline.store.database import Database


class StoreDirectory(Database):
    async def replace_directory(self, source: str, accounts: Sequence[Account]) -> None:
        """Replace what ``source`` knows about people with ``accounts``, in one transaction."""
        def q() -> None:
            with self._tx() as conn:
                conn.execute("DELETE FROM directory WHERE source=?", (source,))
                conn.executemany(
                    "INSERT OR REPLACE INTO directory(source, account, email, groups) VALUES (?, ?, ?, ?)",
                    [(source, a.account, a.email.strip().lower(), json.dumps(sorted(a.groups)))
                     for a in accounts])

        await self._run(q)

    async def accounts_by_email(self, email: str) -> list[Account]:
        """The accounts with this e-mail address (any source; usually one)."""
        rows = await self._run(lambda: self._rows(
            "SELECT account, email, groups FROM directory WHERE email=? AND email != ''",
            (email.strip().lower(),)))
        return [_account(r) for r in rows]

    async def account(self, account: str) -> Account | None:
        """One account, its groups merged over the sources that know it."""
        rows = await self._run(lambda: self._rows(
            "SELECT account, email, groups FROM directory WHERE account=?", (account,)))
        if not rows:
            return None
        found = [_account(r) for r in rows]
        groups = sorted({g for a in found for g in a.groups})
        return Account(account, next((a.email for a in found if a.email), ""), tuple(groups))

    async def page_access_fingerprints(self, source: str) -> dict[str, str]:
        rows = await self._run(lambda: self._rows(
            "SELECT page_id, fingerprint FROM page_access WHERE source=?", (source,)))
        return {str(r["page_id"]): str(r["fingerprint"]) for r in rows}

    async def set_page_access_fingerprints(self, source: str, prints: Mapping[str, str | None]) -> None:
        """Record (or, for None, forget) the permissions fingerprint of pages of ``source``."""
        def q() -> None:
            with self._tx() as conn:
                conn.executemany("DELETE FROM page_access WHERE source=? AND page_id=?",
                                 [(source, pid) for pid, fp in prints.items() if fp is None])
                conn.executemany(
                    "INSERT OR REPLACE INTO page_access(source, page_id, fingerprint) VALUES (?, ?, ?)",
                    [(source, pid, fp) for pid, fp in prints.items() if fp is not None])

        await self._run(q)


def _account(row: Mapping[str, object]) -> Account:
    try:
        groups = tuple(str(g) for g in json.loads(str(row["groups"] or "[]")))
    except ValueError:
        groups = ()
    return Account(str(row["account"]), str(row["email"] or ""), groups)
