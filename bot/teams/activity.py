"""An incoming Bot Framework activity, read tolerantly into typed fields (unknown fields ignored, wrong
types treated as absent), and the text of a message with the bot's own mention removed."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Any

_AT = re.compile(r"<at\b[^>]*>(.*?)</at>", re.IGNORECASE | re.DOTALL)
_TAGS = re.compile(r"<[^>]+>")
_ASK = re.compile(r"^ask\s+(?=\S)", re.IGNORECASE)


def _s(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _d(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Activity:
    type: str
    id: str
    service_url: str
    conversation_id: str
    conversation_type: str  # personal | groupChat | channel
    tenant_id: str
    user_id: str  # the sender's Entra object id where Teams gives it, else its channel id
    recipient_id: str
    text: str = ""
    name: str = ""  # invoke name
    reply_to_id: str = ""
    value: dict[str, Any] = field(default_factory=dict)
    channel_id: str = ""  # the Teams channel (for scope), "" outside channels
    team_id: str = ""
    mentions: tuple[tuple[str, str], ...] = ()  # (mentioned id, the <at> text)
    reactions_added: tuple[str, ...] = ()
    bot_channel: str = ""  # the Bot Framework ``channelId`` ("msteams"): what signing keys are endorsed for

    @classmethod
    def parse(cls, body: dict[str, Any]) -> Activity:
        conv, sender, recipient = (
            _d(body.get("conversation")),
            _d(body.get("from")),
            _d(body.get("recipient")),
        )
        data = _d(body.get("channelData"))
        mentions = tuple(
            (_s(_d(e.get("mentioned")).get("id")), _s(e.get("text")))
            for e in body.get("entities") or [] if isinstance(e, dict) and e.get("type") == "mention"
        )
        reactions = tuple(_s(_d(r).get("type")) for r in body.get("reactionsAdded") or [])
        return cls(
            type=_s(body.get("type")),
            id=_s(body.get("id")),
            service_url=_s(body.get("serviceUrl")),
            conversation_id=_s(conv.get("id")),
            conversation_type=_s(conv.get("conversationType")),  # "" (not said): not assumed personal
            tenant_id=_s(conv.get("tenantId")) or _s(_d(data.get("tenant")).get("id")),
            user_id=_s(sender.get("aadObjectId")) or _s(sender.get("id")),
            recipient_id=_s(recipient.get("id")),
            text=_s(body.get("text")),
            name=_s(body.get("name")),
            reply_to_id=_s(body.get("replyToId")),
            value=_d(body.get("value")),
            channel_id=_s(_d(data.get("channel")).get("id")),
            team_id=_s(_d(data.get("team")).get("id")),
            mentions=mentions,
            reactions_added=reactions,
            bot_channel=_s(body.get("channelId")),
        )

    @property
    def mentions_bot(self) -> bool:
        return any(mid == self.recipient_id for mid, _ in self.mentions)

    @property
    def scope(self) -> str:
        """The id whose space mapping applies: the Teams channel, else the chat itself."""
        return self.channel_id or self.conversation_id.split(";", 1)[0]

    @property
    def shared_in(self) -> str | None:
        """Where others read evident's reply: the channel or the group chat; None in a personal chat."""
        return None if self.conversation_type == "personal" else self.scope

    @property
    def conversation_key(self) -> str:
        """One conversation per personal chat, group chat or channel reply chain (``;messageid=``
        included)."""
        return f"teams:{self.tenant_id or '-'}:{self.conversation_id}"

    def question(self) -> str:
        """The message text without the bot's own mention(s), tags and entities, whitespace collapsed."""
        bot_names = {t for mid, t in self.mentions if mid == self.recipient_id}
        text = _AT.sub(lambda m: "" if m.group(0) in bot_names else m.group(1), self.text)
        text = " ".join(html.unescape(_TAGS.sub(" ", text)).split())
        return _ASK.sub("", text, count=1)  # the manifest's "ask" command word
