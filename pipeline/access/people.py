"""Who a chat user is in Confluence: an e-mail address -> the principals that person holds.

In order: the operator's identity map (``EVIDENT_ACCESS_IDENTITY_MAP``, a CSV of ``email,account[,groups]``,
e.g. an identity-provider export; its groups are used where given), then the directory the permission sync
keeps (accounts whose e-mail the site shows, with their groups). A person found in neither gets what the whole
site may read (anonymous access and ``EVIDENT_ACCESS_SITE_GROUPS``); a guest or an external person who is not
in the identity map gets only what anonymous users may read. Every answer says which rule it used (``how``),
for the operator's logs and ``evident ask --as``.
"""

from __future__ import annotations

import asyncio
import csv
import io
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pipeline.access.scope import EVERYONE, Reader, group, user
from pipeline.access.settings import AccessSettings
from pipeline.errors import ConfigError


@dataclass(frozen=True)
class Account:
    """A Confluence account: its id (Cloud account id, Data Center user key), e-mail ("" when hidden) and
    the groups it belongs to (Cloud group ids, Data Center group names)."""

    account: str
    email: str
    groups: tuple[str, ...]


class Directory(Protocol):
    """What the store keeps about a site's people (``pipeline.store.directory``)."""

    async def accounts_by_email(self, email: str) -> list[Account]: ...

    async def account(self, account: str) -> Account | None: ...


@dataclass(frozen=True)
class Identity:
    reader: Reader
    how: str  # "identity map" | "directory" | "unmapped: site-wide" | "guest: anonymous only" | ...
    account: str = ""


@dataclass(frozen=True)
class _Mapped:
    account: str
    groups: tuple[str, ...] | None  # None: not given (take them from the directory)


class People:
    """E-mail -> principals, cached for ``identity_ttl_s``; the identity map is re-read when its file
    changes."""

    def __init__(self, directory: Directory, settings: AccessSettings) -> None:
        self.directory = directory
        self.settings = settings
        self.site: frozenset[str] = frozenset({EVERYONE, *(group(g) for g in settings.site_groups)})
        self._map: dict[str, _Mapped] = {}
        self._map_stamp: float | None = None
        self._cache: dict[tuple[str, bool], tuple[float, Identity]] = {}

    async def identity(self, email: str | None, *, guest: bool = False) -> Identity:
        """The principals of the person with ``email`` (None or "": not known)."""
        key = ((email or "").strip().lower(), guest)
        hit = self._cache.get(key)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.settings.identity_ttl_s:
            return hit[1]
        found = await self._resolve(*key)
        self._cache[key] = (now, found)
        return found

    async def _resolve(self, email: str, guest: bool) -> Identity:
        mapped = (await self._identity_map()).get(email) if email else None
        if mapped is not None:
            groups = mapped.groups
            if groups is None:
                known = await self.directory.account(mapped.account)
                groups = known.groups if known else ()
            return self._person(mapped.account, groups, guest, "identity map")
        if email and not guest:
            accounts = await self.directory.accounts_by_email(email)
            if len(accounts) == 1:
                return self._person(accounts[0].account, accounts[0].groups, guest, "directory")
        if guest:
            return Identity(frozenset({EVERYONE}), "guest: anonymous only")
        return Identity(self.site, "unmapped: site-wide" if email else "no e-mail: site-wide")

    def _person(self, account: str, groups: Sequence[str], guest: bool, how: str) -> Identity:
        principals = {EVERYONE, user(account), *(group(g) for g in groups)}
        if not guest:
            principals |= self.site
        return Identity(frozenset(principals), how, account)

    async def _identity_map(self) -> dict[str, _Mapped]:
        path = self.settings.identity_map
        if path is None:
            return {}
        try:
            stamp = (await asyncio.to_thread(Path(path).stat)).st_mtime
        except OSError as exc:
            raise ConfigError(f"EVIDENT_ACCESS_IDENTITY_MAP: cannot read {path}: {exc.strerror}") from None
        if stamp != self._map_stamp:
            text = await asyncio.to_thread(Path(path).read_text, encoding="utf-8-sig")
            self._map, self._map_stamp = parse_identity_map(text, str(path)), stamp
            self._cache.clear()
        return self._map


def parse_identity_map(text: str, where: str) -> dict[str, _Mapped]:
    """``email,account[,groups]`` rows (groups ';'-separated; a header row naming ``email`` is skipped)."""
    out: dict[str, _Mapped] = {}
    for n, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        cells = [c.strip() for c in row]
        if not cells or not any(cells) or cells[0].startswith("#"):
            continue
        if n == 1 and cells[0].lower() == "email":
            continue
        if len(cells) < 2 or "@" not in cells[0] or not cells[1]:
            raise ConfigError(
                f"EVIDENT_ACCESS_IDENTITY_MAP {where} line {n}: expected email,account[,groups]"
            )
        groups = (
            tuple(g.strip() for g in cells[2].split(";") if g.strip())
            if len(cells) > 2 and cells[2]
            else None
        )
        out[cells[0].lower()] = _Mapped(cells[1], groups)
    return out
