"""``Secret``: a credential value that does not print, serialize or slice itself by accident."""

from __future__ import annotations

import hmac


class Secret:
    """A credential that never prints itself and is not a string, so ``json.dumps``, ``"".join`` or a
    slice cannot reveal it by accident: only ``reveal()`` gives the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str = "") -> None:
        self._value = str(value)

    def reveal(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __repr__(self) -> str:
        return "Secret('***')" if self._value else "Secret('')"

    def __str__(self) -> str:
        return "***" if self._value else ""

    def __format__(self, spec: str) -> str:
        return str(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and hmac.compare_digest(self._value, other._value)

    def __hash__(self) -> int:
        return hash((Secret, self._value))
