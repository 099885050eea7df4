"""People, groups and space permissions for the fake Confluence (``FakeConfluence(directory=...)``).

Cloud: ``GET /wiki/api/v2/spaces/{id}/permissions`` (cursor paging; principals user/group by id, and
``anonymous``), ``/wiki/rest/api/group`` (names and ids), ``/wiki/rest/api/group/{id}/membersByGroupId``
(users
with ``email`` where it is visible). Data Center: ``/rest/api/space/{key}/permissions`` and
``…/permissions/anonymous`` (9.1+; ``dc_rest_permissions=False`` answers 404 as older sites do, which then
serve ``POST /rpc/json-rpc/confluenceservice-v2`` ``getSpacePermissionSets``),
``/rest/api/group/{name}/member``
and ``/rest/api/user?key=``. Restricted pages render their users and groups as each flavour does.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Person:
    account: str  # Cloud account id; Data Center user key
    username: str
    email: str
    email_visible: bool = True
    groups: set[str] = field(default_factory=set)  # group names


@dataclass
class SiteDirectory:
    people: dict[str, Person] = field(default_factory=dict)  # account -> person
    # space key -> what its view permission grants: ("group", name) | ("user", account) | ("anonymous", "")
    space_readers: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    dc_rest_permissions: bool = True  # Data Center 9.1+ (False: only the JSON-RPC API)
    page_size: int = 2  # small, so paging is exercised

    def group_id(self, name: str) -> str:
        return "gid-" + base64.b32encode(name.encode()).decode().strip("=").lower()

    def groups(self) -> set[str]:
        named = {name for p in self.people.values() for name in p.groups}
        granted = {who for grants in self.space_readers.values() for kind, who in grants if kind == "group"}
        return named | granted

    def group_name(self, key: str) -> str | None:
        return next((g for g in self.groups() if key in (g, self.group_id(g))), None)

    def readers(self, space: str) -> list[tuple[str, str]]:
        return self.space_readers.get(space, [("group", "confluence-users")])

    def render_user(self, account: str, cloud: bool) -> dict[str, Any]:
        p = self.people.get(account) or Person(account, account, "")
        if cloud:
            return {"type": "known", "accountId": p.account, "displayName": p.username,
                    "email": p.email if p.email_visible else ""}
        return {"type": "known", "username": p.username, "userKey": p.account, "displayName": p.username}

    def render_group(self, name: str, cloud: bool) -> dict[str, Any]:
        return {"type": "group", "name": name, **({"id": self.group_id(name)} if cloud else {})}


def add_routes(app: web.Application, fake: Any) -> None:
    d: SiteDirectory = fake.directory
    ctx = fake.context
    cloud = fake.mode == "cloud"

    def paged(request: web.Request, rows: list[dict[str, Any]]) -> web.Response:
        start, limit = int(request.query.get("start", "0")), int(request.query.get("limit", "25"))
        size = min(limit, d.page_size)
        window = rows[start:start + size]
        links = {"next": "more"} if start + size < len(rows) else {}
        return web.json_response({"results": window, "start": start, "limit": size, "size": len(window),
                                  "_links": links})

    async def v2_permissions(request: web.Request) -> web.Response:
        space = next((s for s in fake.spaces() if fake.space_id(s) == request.match_info["id"]), None)
        if space is None:
            return web.json_response({"errors": [{"status": 404}]}, status=404)
        rows = [{"id": str(i), "principal": {"type": kind, "id": d.group_id(who) if kind == "group" else who},
                 "operation": {"key": "read", "targetType": "space"}}
                for i, (kind, who) in enumerate(d.readers(space))]
        rows.append({"id": "x", "principal": {"type": "group", "id": "gid-admins"},
                     "operation": {"key": "administer", "targetType": "space"}})  # not a read grant
        start = (
            int(base64.urlsafe_b64decode(request.query["cursor"]).decode())
            if "cursor" in request.query
            else 0
        )
        window = rows[start:start + d.page_size]
        links: dict[str, str] = {}
        if start + d.page_size < len(rows):
            cursor = base64.urlsafe_b64encode(str(start + d.page_size).encode()).decode()
            links["next"] = f"{ctx}/api/v2/spaces/{request.match_info['id']}/permissions?cursor={cursor}"
        return web.json_response({"results": window, "_links": links})

    async def group_list(request: web.Request) -> web.Response:
        return paged(request, [d.render_group(g, cloud) for g in sorted(d.groups())])

    async def members(request: web.Request) -> web.Response:
        name = d.group_name(request.match_info["key"])
        if name is None:
            return web.json_response({"statusCode": 404, "message": "no such group"}, status=404)
        return paged(
            request, [d.render_user(p.account, cloud) for p in d.people.values() if name in p.groups]
        )

    async def dc_permissions(request: web.Request) -> web.Response:
        if not d.dc_rest_permissions:
            return web.json_response({"statusCode": 404, "message": "null for uri"}, status=404)
        rows = [{"subject": {"type": kind, "identifier": who},
                 "operation": {"operationKey": "read", "targetType": "space"}}
                for kind, who in d.readers(request.match_info["key"]) if kind != "anonymous"]
        return web.json_response(rows)

    async def dc_anonymous(request: web.Request) -> web.Response:
        if not d.dc_rest_permissions or ("anonymous", "") not in d.readers(request.match_info["key"]):
            return web.json_response({"statusCode": 404, "message": "no anonymous permissions"}, status=404)
        return web.json_response([{"operationKey": "read", "targetType": "space"}])

    async def dc_user(request: web.Request) -> web.Response:
        p = d.people.get(request.query.get("key", ""))
        if p is None:
            return web.json_response({"statusCode": 404, "message": "no such user"}, status=404)
        return web.json_response(d.render_user(p.account, cloud=False))

    async def rpc(request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("method") != "getSpacePermissionSets":
            return web.json_response({"jsonrpc": "2.0", "id": body.get("id"), "error": {"message": "no"}})
        perms = [{"type": "VIEWSPACE",
                  "groupName": who if kind == "group" else None,
                  "userName": d.people[who].username if kind == "user" else None}
                 for kind, who in d.readers(body["params"][0])]
        return web.json_response({"jsonrpc": "2.0", "id": body.get("id"),
                                  "result": [{"type": "VIEWSPACE", "spacePermissions": perms},
                                             {"type": "EDITSPACE", "spacePermissions": []}]})

    if cloud:
        app.router.add_get(ctx + "/api/v2/spaces/{id}/permissions", v2_permissions)
        app.router.add_get(ctx + "/rest/api/group/{key}/membersByGroupId", members)
        app.router.add_get(ctx + "/rest/api/group", group_list)
    else:
        app.router.add_get(ctx + "/rest/api/space/{key}/permissions", dc_permissions)
        app.router.add_get(ctx + "/rest/api/space/{key}/permissions/anonymous", dc_anonymous)
        app.router.add_get(ctx + "/rest/api/group/{key}/member", members)
        app.router.add_get(ctx + "/rest/api/user", dc_user)
        app.router.add_post(ctx + "/rpc/json-rpc/confluenceservice-v2", rpc)
