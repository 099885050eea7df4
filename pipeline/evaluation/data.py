"""Reading ConfQuestions-shaped question files."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import InputError


@dataclass(frozen=True)
class QATurn:
    conv_id: str
    turn: int
    q: dict[str, str]  # lang -> conversational question
    completed: dict[str, str]  # lang -> completed question
    gold_urls: tuple[str, ...]
    source: str  # passage | list | table
    q_type: str  # simple | complex
    answer: str


def load_conversations(path: Path) -> list[list[QATurn]]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InputError(f"questions file not found: {path}") from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"questions file {path} is not JSON: {exc}") from exc
    if not isinstance(data, list):
        raise InputError(f"questions file {path}: expected a list of conversations")
    convs: list[list[QATurn]] = []
    for conv in data:
        turns: list[QATurn] = []
        for t in conv.get("turns", []):
            langs = [k[2:] for k in t if k.startswith("q_") and k != "q_type"]
            turns.append(
                QATurn(
                    conv_id=str(conv.get("conv_id", len(convs) + 1)),
                    turn=int(t.get("turn_id", len(turns) + 1)),
                    q={lang: t[f"q_{lang}"] for lang in langs},
                    completed={lang: t.get(f"completed_q_{lang}", t[f"q_{lang}"]) for lang in langs},
                    gold_urls=tuple(t.get("a_url") or ()),
                    source=str(t.get("a_source", "")),
                    q_type=str(t.get("q_type", "")),
                    answer=str(t.get("a", "")),
                )
            )
        if turns:
            convs.append(turns)
    if not convs:
        raise InputError(f"questions file {path} holds no conversations")
    return convs
