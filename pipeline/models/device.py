"""Which torch device a model runs on: ``EVIDENT_EMBED_DEVICE`` = auto (CUDA when present) | cpu | cuda."""

from __future__ import annotations

from typing import Any

from pipeline.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")


def pick_device(device: str, torch: Any = None) -> str:
    """"cuda" or "cpu"; ``ConfigError`` for an unknown value or for cuda without a GPU."""
    if device not in DEVICES:
        raise ConfigError(f"EVIDENT_EMBED_DEVICE must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cpu":
        return "cpu"
    if torch is None:
        try:
            import torch
        except ImportError:
            if device == "cuda":
                raise ConfigError("EVIDENT_EMBED_DEVICE=cuda needs torch") from None
            return "cpu"
    cuda = bool(torch.cuda.is_available())
    if device == "cuda" and not cuda:
        raise ConfigError("EVIDENT_EMBED_DEVICE=cuda but torch sees no CUDA device")
    return "cuda" if cuda else "cpu"
