"""Slack's people and places for the access policy (``bot.core.access``), and where a Slack answer is read.

- A person: ``users.info`` (the e-mail address needs the ``users:read.email`` scope); guests (single- and
  multi-channel), Slack Connect people from other organisations (``is_stranger``) and deactivated accounts
  count as guests; bots are left out of audiences.
- A place: ``conversations.info`` says public, private or shared with another organisation
  (``is_ext_shared``); its members come from ``conversations.members`` (paged, stopped as soon as there are
  more than the audience limit). A person of another workspace (Slack Connect) counts as a guest.
- Where an answer is read (``SlackPlaces.asker``): in a channel, by its members; in a DM or an assistant
  thread,
  by the asker alone, with the space mapping of the channel an assistant thread is looking at. Questions,
  follow-ups, suggestion buttons and explanations all take it from here.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from bot.core.access import Asker, Person, Place
from pipeline.errors import RemoteError

MEMBERS_PAGE = 200


class ViewedChannels(Protocol):
    """The channel an assistant thread is looking at (``bot.slack.assistant.ThreadContexts``)."""

    async def viewed_channel(self, channel_id: str, thread_ts: str) -> str | None: ...


class SlackPeople:
    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        self._home: str | None = None  # the workspace evident is installed in (auth.test)

    async def person(self, user_id: str, where: str) -> Person:
        user = (await self._call("users_info", user=user_id)).get("user") or {}
        email = str((user.get("profile") or {}).get("email") or "") or None
        guest = any(bool(user.get(flag)) for flag in ("is_restricted", "is_ultra_restricted", "is_stranger",
                                                      "deleted"))
        if self._home is None:
            self._home = str((await self._call("auth_test")).get("team_id") or "")
        team = str(user.get("team_id") or "")
        if team and self._home and team != self._home:  # Slack Connect: another organisation's person
            guest = True
        return Person(email, guest=guest, bot=bool(user.get("is_bot")) or user_id == "USLACKBOT")

    async def place(self, place_id: str, limit: int) -> Place:
        info = (await self._call("conversations_info", channel=place_id)).get("channel") or {}
        if info.get("is_ext_shared") or info.get("is_pending_ext_shared"):
            return Place("external", None)
        kind: Literal["private", "public"] = (
            "public" if info.get("is_channel") and not info.get("is_private") else "private")
        members: list[str] = []
        cursor = ""
        while True:
            page = await self._call("conversations_members", channel=place_id, limit=MEMBERS_PAGE,
                                    **({"cursor": cursor} if cursor else {}))
            members += [str(m) for m in page.get("members") or ()]
            if len(members) > limit:
                return Place(kind, None)
            cursor = str((page.get("response_metadata") or {}).get("next_cursor") or "")
            if not cursor:
                return Place(kind, tuple(members))

    async def _call(self, method: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = await getattr(self.client, method)(**kwargs)
        except SlackApiError as exc:
            raise RemoteError(
                f"slack {method}: {exc.response.get('error', 'error')}", service="slack"
            ) from None
        except SlackClientError as exc:
            raise RemoteError(f"slack {method}: {type(exc).__name__}", service="slack") from None
        return dict(response.data) if isinstance(response.data, dict) else {}


class SlackPlaces:
    """Where an answer in Slack is read and which channel's space mapping applies."""

    def __init__(self, viewed: ViewedChannels) -> None:
        self.viewed = viewed

    async def asker(self, user: str, channel: str, thread: str | None, *, private: bool = False) -> Asker:
        """``private``: the answer is shown to the asker alone (an ephemeral reply)."""
        if channel.startswith("D"):
            mapped = await self.viewed.viewed_channel(channel, thread) if thread else None
            return Asker(user, mapped or channel)
        return Asker(user, channel, shared_in=None if private else channel)
