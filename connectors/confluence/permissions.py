"""Who may read each page of a space, read from Confluence at every sync cycle (``EVIDENT_ACCESS=per-user``).

A page's access (``pipeline.access.scope``) is the space's view permission, then the read restrictions of
every restricted ancestor and of the page itself. Restrictions come with the space listing the sync makes
anyway (``expand=ancestors,restrictions.read…``); adding or removing one does not change a page's version, so
they are read every cycle and compared with what the index holds. Ancestors outside the listing (e.g. without
an included label) are read by id, once per cycle; one the sync account cannot see admits nobody.

Space permissions: Cloud REST v2 ``/api/v2/spaces/{id}/permissions`` (group principals are ids; names come
from
``/rest/api/group`` so ``EVIDENT_ACCESS_SITE_GROUPS`` may name them); Data Center 9.1+
``/rest/api/space/{key}/permissions`` and ``…/permissions/anonymous``, older Data Center the JSON-RPC
``getSpacePermissionSets`` (``VIEWSPACE``). A principal of a kind not known here is left out: it can only make
a page visible to fewer people.

Principals: Cloud users by account id and groups by id (and name); Data Center users by user name and groups
by
name. The members of every group the permissions name (except the site groups, which hold everyone) are listed
into the people directory, with the e-mail address where the site shows it (``directory``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from connectors.confluence.client import ConfluenceClient
from pipeline.access.people import Account
from pipeline.access.scope import EVERYONE, Clause, PageAccess, group, page_access, user
from pipeline.errors import NotFoundError, RemoteError

log = logging.getLogger("evident.confluence")

RESTRICTIONS = "restrictions.read.restrictions.user,restrictions.read.restrictions.group"
RPC = "rpc/json-rpc/confluenceservice-v2"
PAGE = 200


class PermissionSweep:
    def __init__(self, client: ConfluenceClient, *, site_groups: Sequence[str]) -> None:
        self.client = client
        self.site_groups = set(site_groups)
        self.new_run()

    def new_run(self) -> None:
        """Forget what the previous cycle read: permissions are read afresh every cycle."""
        self._spaces: dict[str, Clause] = {}
        self._outside: dict[str, Clause | None] = {}  # ancestor id outside the listing -> its own clause
        self._names: dict[str, str] | None = None  # Cloud group id -> name
        self._user_keys: dict[str, str] = {}  # Data Center user key -> user name
        self.groups: dict[str, str] = {}  # group key (Cloud id, DC name) -> name, of every group seen
        self.emails: dict[str, str] = {}  # account -> e-mail, where shown
        self.hidden_ancestors = 0

    # ------------------------------------------------------------------ pages

    async def page_accesses(self, space: str, rows: Iterable[dict[str, Any]]) -> dict[str, PageAccess]:
        """page id -> access, for the listing ``rows`` of ``space`` (expanded with ancestors and
        restrictions)."""
        rows = list(rows)
        top = await self.space_clause(space)
        own = {str(r.get("id")): self._own(r) for r in rows}
        out: dict[str, PageAccess] = {}
        for r in rows:
            levels: list[Clause] = [top]
            for a in r.get("ancestors") or ():
                aid = str(a.get("id"))
                clause = own[aid] if aid in own else await self._outside_clause(aid)
                if clause is not None:
                    levels.append(clause)
            if own[str(r.get("id"))] is not None:
                levels.append(own[str(r.get("id"))])  # type: ignore[arg-type]
            out[str(r.get("id"))] = page_access(levels)
        return out

    def _own(self, r: dict[str, Any]) -> Clause | None:
        """The principals a content object's own read restriction admits; None when it has none."""
        read = (((r.get("restrictions") or {}).get("read") or {}).get("restrictions")) or {}
        users = ((read.get("user") or {}).get("results")) or []
        groups = ((read.get("group") or {}).get("results")) or []
        if not users and not groups:
            return None
        principals: set[str] = set()
        for u in users:
            principals |= self._user_principals(u)
        for g in groups:
            principals |= self._group_principals(str(g.get("id") or ""), str(g.get("name") or ""))
        return tuple(sorted(principals))

    async def _outside_clause(self, page_id: str) -> Clause | None:
        if page_id not in self._outside:
            try:
                row = await self.client.get(f"rest/api/content/{page_id}", {"expand": RESTRICTIONS})
                self._outside[page_id] = self._own(row)
            except NotFoundError:
                self.hidden_ancestors += 1
                self._outside[page_id] = ()  # an ancestor the sync account cannot see: nobody is known to
        return self._outside[page_id]

    def _user_principals(self, u: dict[str, Any]) -> set[str]:
        account = str(u.get("accountId") or u.get("username") or "")
        if not account:
            return set()
        if u.get("email"):
            self.emails[account] = str(u["email"])
        return {user(account)}

    def _group_principals(self, gid: str, name: str) -> set[str]:
        key = gid if self.client.cloud and gid else name
        if not key:
            return set()
        self.groups[key] = name or key
        return {group(key)} | ({group(name)} if name and name in self.site_groups else set())

    # ------------------------------------------------------------------ spaces

    async def space_clause(self, key: str) -> Clause:
        """The principals the space's view permission admits (``*`` when anonymous users may view it)."""
        if key not in self._spaces:
            grants = await (self._cloud_space(key) if self.client.cloud else self._dc_space(key))
            self._spaces[key] = tuple(sorted(grants))
        return self._spaces[key]

    async def _cloud_space(self, key: str) -> set[str]:
        space_id = str((await self.client.space(key)).get("id"))
        names = await self._group_names()
        out: set[str] = set()
        path: str | None = f"api/v2/spaces/{space_id}/permissions"
        query: dict[str, Any] | None = {"limit": 250}
        while path:
            data = await self.client.get(path, query)
            for p in data.get("results") or ():
                op, who = p.get("operation") or {}, p.get("principal") or {}
                if op.get("key") != "read" or op.get("targetType") != "space":
                    continue
                kind, pid = str(who.get("type") or "").lower(), str(who.get("id") or "")
                if kind == "user" and pid:
                    out.add(user(pid))
                elif kind == "group" and pid:
                    out |= self._group_principals(pid, names.get(pid, ""))
                elif kind == "anonymous":
                    out.add(EVERYONE)
            nxt = (data.get("_links") or {}).get("next")
            path, query = (self.client._next_path(str(nxt), data), None) if nxt else (None, None)
        return out

    async def _group_names(self) -> dict[str, str]:
        if self._names is None:
            self._names = {}
            async for g in self._paged("rest/api/group"):
                if g.get("id") and g.get("name"):
                    self._names[str(g["id"])] = str(g["name"])
        return self._names

    async def _dc_space(self, key: str) -> set[str]:
        try:
            rows = (await self.client.get(f"rest/api/space/{key}/permissions")).get("results") or []
        except NotFoundError:  # before 9.1: the JSON-RPC API
            return await self._dc_rpc_space(key)
        out: set[str] = set()
        for p in rows:
            op, who = p.get("operation") or {}, p.get("subject") or {}
            if (op.get("operationKey") or op.get("key")) != "read" or (
                    op.get("targetType") or op.get("target")) != "space":
                continue
            ident = str(who.get("identifier") or who.get("name") or who.get("userKey") or "")
            if who.get("type") == "group" and ident:
                out |= self._group_principals("", ident)
            elif who.get("type") == "user" and ident:
                out.add(user(await self._user_name(ident)))
        try:
            anonymous = (await self.client.get(f"rest/api/space/{key}/permissions/anonymous")).get("results")
        except NotFoundError:
            anonymous = []
        if any((o.get("operationKey") or o.get("key")) == "read" for o in anonymous or ()
               if isinstance(o, dict)):
            out.add(EVERYONE)
        return out

    async def _dc_rpc_space(self, key: str) -> set[str]:
        data = await self.client.post(RPC, {"jsonrpc": "2.0", "method": "getSpacePermissionSets",
                                            "params": [key], "id": 1})
        if data.get("error"):
            raise RemoteError(
                f"Confluence getSpacePermissionSets({key}): {data['error']}", service="confluence"
            )
        out: set[str] = set()
        for s in data.get("result") or ():
            if s.get("type") != "VIEWSPACE":
                continue
            for p in s.get("spacePermissions") or ():
                if p.get("groupName"):
                    out |= self._group_principals("", str(p["groupName"]))
                elif p.get("userName"):
                    out.add(user(str(p["userName"])))
                else:
                    out.add(EVERYONE)  # neither user nor group: anonymous access
        return out

    async def _user_name(self, user_key: str) -> str:
        if user_key not in self._user_keys:
            try:
                found = await self.client.get("rest/api/user", {"key": user_key})
                self._user_keys[user_key] = str(found.get("username") or user_key)
            except NotFoundError:
                self._user_keys[user_key] = user_key
        return self._user_keys[user_key]

    # ------------------------------------------------------------------ people

    async def directory(self) -> list[Account]:
        """Every member of every group seen this cycle (site groups excepted: they hold everyone)."""
        groups_of: dict[str, set[str]] = {}
        for key, name in sorted(self.groups.items()):
            if key in self.site_groups or name in self.site_groups:
                continue
            path = (f"rest/api/group/{key}/membersByGroupId" if self.client.cloud
                    else f"rest/api/group/{key}/member")
            async for m in self._paged(path):
                account = next(iter(self._user_principals(m)), "")
                if account:
                    groups_of.setdefault(account.removeprefix("user:"), set()).add(key)
        accounts = set(groups_of) | set(self.emails)
        return [
            Account(a, self.emails.get(a, ""), tuple(sorted(groups_of.get(a, ())))) for a in sorted(accounts)
        ]

    async def _paged(self, path: str) -> Any:
        start = 0
        while True:
            data = await self.client.get(path, {"start": start, "limit": PAGE})
            results = data.get("results") or []
            for r in results:
                if isinstance(r, dict):
                    yield r
            if len(results) < PAGE and not (data.get("_links") or {}).get("next"):
                return
            start += len(results)
            if not results:
                return
