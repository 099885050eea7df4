"""The conversation core's area: who may ask where (the channel -> space map), limits, suggestions,
shutdown."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BeforeValidator, field_validator

from pipeline.runtime.config import Area, CommaList, setting

_CHANNEL_ID = re.compile(r"[CGD][A-Z0-9]+|19:\S+")


def parse_channel_spaces(value: Any) -> dict[str, tuple[str, ...]]:
    """``C123=ENG,OPS;C456=HR`` (or a TOML table) -> {channel id: space keys}."""
    if isinstance(value, Mapping):
        out = {
            str(k): tuple(s.strip() for s in (v.split(",") if isinstance(v, str) else v))
            for k, v in value.items()
        }
    else:
        out = {}
        for part in str(value).split(";"):
            if not part.strip():
                continue
            if "=" not in part:
                raise ValueError(f"{part.strip()!r} is not CHANNEL_ID=SPACE[,SPACE]")
            chan, spaces = part.split("=", 1)
            out[chan.strip()] = tuple(s.strip() for s in spaces.split(",") if s.strip())
    for chan in out:
        if not _CHANNEL_ID.fullmatch(chan):
            raise ValueError(
                f"{chan!r} is not a channel id (Slack C…/G…/D…, Teams 19:…); names and wildcards "
                "are not supported: use EVIDENT_DEFAULT_SPACES for everything unmapped"
            )
    return out


class ChatSettings(Area):
    title = "Conversations (every platform)"

    channel_spaces: Annotated[dict[str, tuple[str, ...]], BeforeValidator(parse_channel_spaces)] = setting(
        {}, "EVIDENT_CHANNEL_SPACES", "Per-channel space scope by channel id (Slack C…/G…, Teams 19:…), e.g. "
        "'C123=ENG,OPS;C456=HR'. Channels not listed (and DMs) get EVIDENT_DEFAULT_SPACES.")
    default_spaces: CommaList = setting(
        ("*",),
        "EVIDENT_DEFAULT_SPACES",
        "Scope of DMs and unmapped channels: '*' "
        "every indexed space, 'none' nothing (evident asks to be mapped), or a comma "
        "list of space keys.",
    )
    followup_suggestions: bool = setting(
        False,
        "EVIDENT_FOLLOWUP_SUGGESTIONS",
        "Offer 2-3 next questions as "
        "buttons under answers, added once the answer is shown (an LLM writes them; "
        "offline: questions about the cited pages).",
    )
    shutdown_timeout_s: float = setting(
        30.0,
        "EVIDENT_SHUTDOWN_TIMEOUT_S",
        "On SIGTERM/SIGINT, how long `evident "
        "serve` lets answers in flight finish; those still running are cancelled and "
        "their threads told to ask again.",
        ge=0,
    )
    user_rate_per_min: int = setting(10, "EVIDENT_USER_RATE_PER_MIN", "Questions per user per minute.", ge=0)

    @field_validator("default_spaces")
    @classmethod
    def _special_stands_alone(cls, spaces: tuple[str, ...]) -> tuple[str, ...]:
        special = {x.lower() for x in spaces} & {"*", "none"}
        if special and len(spaces) > 1:
            raise ValueError(f"'{special.pop()}' stands alone, not in a list of spaces")
        return spaces
