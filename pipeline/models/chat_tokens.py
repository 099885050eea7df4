"""Chat-template control tokens in untrusted text (page content, questions)."""

from __future__ import annotations

import re

_SPECIAL_TOKEN = re.compile(r"<\|[\w.-]{1,40}\|>|\[/?INST\]|<(?:start|end)_of_turn>|</?s>")


def neutralize_special_tokens(text: str) -> str:
    """Remove chat control tokens from untrusted text, so no tokenizer can read one as special."""
    return _SPECIAL_TOKEN.sub("", text)
