"""Who may read an evidence, and whose eyes an answer is for: the one rule every retrieval passes.

**Principals** are strings: ``user:<account>`` (a Confluence account id, or a Data Center user key),
``group:<group>`` (a Cloud group id, or a Data Center group name) and ``*`` (everyone, anonymous included).

**A page's access** (``PageAccess``) is a conjunction of clauses; each clause is the principals one level of
Confluence admits: the space's view permission, then the view restrictions of every restricted ancestor and of
the page itself (a level without restrictions adds no clause). A person may read the page when every clause
names one of their principals: Confluence's semantics (each restricted level must admit, and within a level a
listed user or any listed group admits). ``None`` means the page's permissions are not known (an index built
before permissions were synced, or ``EVIDENT_ACCESS=space``).

The index stores the clauses as ``ACL_FIELDS`` keyword payload fields, so both backends filter on them inside
the search. More clauses than fields are folded: two clauses become the principals named in both, which admits
a subset of the people both admit (never more), so folding can hide a page, never show one.

**An access scope** (``AccessScope``) is whose eyes an answer is for: the readers (one principal set per
person
of the audience; an evidence is visible when *every* reader may read it) and the spaces the place is mapped to
(an upper bound). ``readers=None`` is space mode: no per-person filter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

EVERYONE = "*"
NOBODY = "\x00nobody"  # a value no payload holds: a filter that matches nothing
ACL_FIELDS: tuple[str, ...] = ("acl0", "acl1", "acl2")

Clause = tuple[str, ...]
PageAccess = tuple[Clause, ...]  # () = anyone may read; None (not this type) = unknown
Reader = frozenset[str]  # one person's principals, EVERYONE included


def user(account: str) -> str:
    return f"user:{account}"


def group(name: str) -> str:
    return f"group:{name}"


def page_access(levels: Iterable[Iterable[str]]) -> PageAccess:
    """The access of a page from its levels: the space permission first (kept first, ``*`` when anonymous
    users
    may view the space), then each restricted ancestor and the page itself. A restriction admitting
    ``EVERYONE``
    constrains nothing and is left out; an empty level admits nobody (kept, as a clause no reader matches).
    Keeping the space clause first lets space mode tell restricted pages apart
    (``AccessScope.space_only``)."""
    clauses: list[Clause] = []
    for n, level in enumerate(levels):
        clause = tuple(sorted(set(level)))
        if n == 0:
            clauses.append(clause if EVERYONE not in clause else (EVERYONE,))
        elif EVERYONE not in clause and clause not in clauses[1:]:
            clauses.append(clause)
    if clauses == [(EVERYONE,)]:
        return ()
    return fold(tuple(clauses))


def fold(clauses: PageAccess, width: int = len(ACL_FIELDS)) -> PageAccess:
    """At most ``width`` clauses: the last ones intersected into one (admits fewer people, never more)."""
    if len(clauses) <= width:
        return clauses
    merged = set(clauses[width - 1])
    for clause in clauses[width:]:
        merged &= set(clause)
    return (*clauses[: width - 1], tuple(sorted(merged)))


def admits(access: PageAccess | None, reader: Reader) -> bool:
    """Whether one person with principals ``reader`` may read a page of ``access`` (unknown: no)."""
    if access is None:
        return False
    return all(reader.intersection(clause) for clause in access)


def acl_payload(access: PageAccess | None) -> dict[str, list[str]]:
    """The payload fields that carry ``access`` (none when unknown: the filter then matches nothing)."""
    if access is None:
        return {}
    padded = list(access) + [(EVERYONE,)] * (len(ACL_FIELDS) - len(access))
    return {name: list(clause) for name, clause in zip(ACL_FIELDS, padded, strict=True)}


def access_from_payload(payload: Mapping[str, Any]) -> PageAccess | None:
    """The access a payload carries (the inverse of ``acl_payload``), None when it carries none."""
    if ACL_FIELDS[0] not in payload:
        return None
    clauses = [tuple(str(p) for p in payload.get(name) or ()) for name in ACL_FIELDS]
    while clauses and clauses[-1] == (EVERYONE,):
        clauses.pop()
    return tuple(clauses)


def fingerprint(access: PageAccess | None) -> str:
    """A short stable digest of ``access``, to notice changes without keeping the clauses."""
    text = "unknown" if access is None else "|".join(",".join(c) for c in access)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def minimal(readers: Iterable[Reader]) -> tuple[Reader, ...]:
    """The readers that constrain: a reader whose principals include another's adds nothing (whatever the
    smaller set may read, the larger may too). Deduplicated, in a stable order."""
    unique = sorted(set(readers), key=lambda r: (len(r), sorted(r)))
    kept: list[Reader] = []
    for r in unique:
        if not any(k <= r for k in kept):
            kept.append(r)
    return tuple(kept)


@dataclass(frozen=True)
class AccessScope:
    """Whose eyes an answer is for. Build one with ``space_only`` or ``for_readers``; every search, evidence
    read and listing takes one (there is no default), so nothing is retrieved without deciding this."""

    spaces: tuple[str, ...] | None  # the place's spaces (None: every space; () nothing)
    # one principal set per person; None: space mode (no per-person filter)
    readers: tuple[Reader, ...] | None
    audience: str = ""  # who the readers are, for logs and the turn record (e.g. "U123", "channel C1")
    unrestricted_only: bool = False  # space mode: pages with read restrictions are never shown

    @classmethod
    def space_only(cls, spaces: Sequence[str] | None, audience: str = "") -> AccessScope:
        """``EVIDENT_ACCESS=space``: the place's spaces, whoever asks; pages with read restrictions (indexed
        by
        an earlier per-user sync) are never shown."""
        return cls(None if spaces is None else tuple(spaces), None, audience, unrestricted_only=True)

    @classmethod
    def for_readers(cls, readers: Iterable[Reader], spaces: Sequence[str] | None,
                    audience: str = "") -> AccessScope:
        """Per-user mode: what every one of ``readers`` may read, within ``spaces``."""
        with_everyone = (frozenset(r) | {EVERYONE} for r in readers)
        return cls(None if spaces is None else tuple(spaces), minimal(with_everyone), audience)

    @property
    def per_user(self) -> bool:
        return self.readers is not None

    def admits(self, space: str, access: PageAccess | None) -> bool:
        """Whether an evidence of ``space`` with ``access`` is visible in this scope (the filter the index
        applies, in Python: for reads by id and for checks)."""
        if self.spaces is not None and space not in self.spaces:
            return False
        if self.readers is None:
            return not self.unrestricted_only or access is None or all(EVERYONE in c for c in access[1:])
        return bool(self.readers) and all(admits(access, r) for r in self.readers)

    def conditions(self) -> list[tuple[str, list[str]]]:
        """The keyword filter the index applies, as (field, any of these values) pairs, all required."""
        out: list[tuple[str, list[str]]] = []
        if self.spaces is not None:
            out.append(("space", list(self.spaces) or [NOBODY]))
        if self.readers is not None and not self.readers:
            out.append((ACL_FIELDS[0], [NOBODY]))  # an audience of no one reads nothing
        for r in self.readers or ():
            out.extend((name, sorted(r)) for name in ACL_FIELDS)
        return out

    def open_fields(self) -> tuple[str, ...]:
        """Fields that must be absent or hold ``*`` (space mode: the restriction clauses, after the
        space's)."""
        return ACL_FIELDS[1:] if self.unrestricted_only else ()


# Every indexed evidence, whoever's: for the operator's tools (evaluation, `evident ask` without `--as`).
EVERYTHING = AccessScope(None, None, "operator")
