"""Teams' people and places for the access policy (``bot.core.access``), from the Bot Connector.

A person: ``GET {serviceUrl}/v3/conversations/{id}/members/{userId}`` gives the e-mail address or user
principal
name without any Microsoft Graph permission. Guests (``userRole`` guest or anonymous, ``#EXT#`` in the
principal name) and members of another tenant count as guests. A place: ``.../pagedmembers`` lists a group
chat's members or a channel's team roster, stopped as soon as there are more than the audience limit.

The service URL of a conversation is the one its latest verified activity named (``saw``): lookups go only
where the Bot Framework's signed token said the conversation lives.
"""

from __future__ import annotations

from urllib.parse import quote

from bot.core.access import Person, Place
from bot.teams.activity import Activity
from bot.teams.connector import ConnectorClient
from pipeline.errors import RemoteError

PAGE_SIZE = 200
MAX_CONVERSATIONS = 10_000


class TeamsPeople:
    def __init__(self, connector: ConnectorClient, tenant_id: str | None) -> None:
        self.connector = connector
        self.tenant_id = tenant_id or ""
        self._service: dict[str, str] = {}  # conversation or channel id -> service URL (verified)

    def saw(self, activity: Activity) -> None:
        """Remember where ``activity``'s conversation (and its channel) lives; called for verified ones."""
        if len(self._service) > MAX_CONVERSATIONS:
            self._service.clear()
        for key in {activity.conversation_id, activity.conversation_id.split(";", 1)[0],
                    activity.channel_id}:
            if key:
                self._service[key] = activity.service_url

    async def person(self, user_id: str, where: str) -> Person:
        body = await self.connector.get(self._url(where), f"v3/conversations/{quote(where, safe='')}/members/"
                                                          f"{quote(user_id, safe='')}")
        upn = str(body.get("userPrincipalName") or "")
        email = str(body.get("email") or upn) or None
        role = str(body.get("userRole") or "").lower()
        tenant = str(body.get("tenantId") or "")
        guest = (role in ("guest", "anonymous") or "#ext#" in upn.lower() or email is None
                 or bool(self.tenant_id and tenant and tenant != self.tenant_id))
        return Person(email, guest=guest)

    async def place(self, place_id: str, limit: int) -> Place:
        members: list[str] = []
        token = ""
        base = f"v3/conversations/{quote(place_id, safe='')}/pagedmembers?pageSize={PAGE_SIZE}"
        while True:
            page = await self.connector.get(self._url(place_id),
                                            base + (f"&continuationToken={quote(token)}" if token else ""))
            members += [str(m.get("id")) for m in page.get("members") or () if isinstance(m, dict)]
            if len(members) > limit:
                return Place("private", None)
            token = str(page.get("continuationToken") or "")
            if not token:
                return Place("private", tuple(members))

    def _url(self, where: str) -> str:
        url = self._service.get(where) or self._service.get(where.split(";", 1)[0])
        if not url:
            raise RemoteError(f"no verified activity from conversation {where[:40]} yet", service="teams")
        return url
