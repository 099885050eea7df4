"""Retrieval metrics with the paper's definitions (a hit = an evidence whose page URL is gold)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from urllib.parse import unquote

_PAGE_ID = re.compile(r"/pages/(\d+)(?:/|$)")


def normalize_url(url: str, *, strict: bool = False) -> str:
    """The identity of a page URL for comparisons.

    Always modulo ``+``/``%20`` encoding, scheme/host case and trailing slashes. Unless ``strict``,
    a Confluence page URL (``.../pages/<id>/<slug>``) is identified by host and page id: the slug is
    cosmetic (Confluence's canonical link drops ``:``, ``,``, ``()``, ``[]``, ``&`` from the title, page
    exports keep them, and a rename changes it), so two URLs of the same page compare equal.
    """
    u = unquote(url.strip()).replace("+", " ")
    u = " ".join(u.split())
    if "://" in u:
        scheme, rest = u.split("://", 1)
        host, _, path = rest.partition("/")
        u = f"{scheme.lower()}://{host.lower()}/{path}"
        if not strict:
            m = _PAGE_ID.search("/" + path)
            if m:
                return f"{host.lower()}/pages/{m.group(1)}"
    return u.rstrip("/")


def first_hit_rank(ranked_urls: Sequence[str], gold: Iterable[str], *, strict: bool = False) -> int | None:
    """1-based rank of the first gold URL in ``ranked_urls``, or None."""
    gold_n = {normalize_url(g, strict=strict) for g in gold}
    for i, u in enumerate(ranked_urls, start=1):
        if normalize_url(u, strict=strict) in gold_n:
            return i
    return None


def p_at_1(rank: int | None) -> float:
    return 1.0 if rank == 1 else 0.0


def hit_at(rank: int | None, k: int) -> float:
    return 1.0 if rank is not None and rank <= k else 0.0


def rr_at(rank: int | None, k: int) -> float:
    return 1.0 / rank if rank is not None and rank <= k else 0.0


def ndcg_at(rank: int | None, k: int) -> float:
    """nDCG@k with binary relevance and one relevant item (the question's gold page): 1/log2(1 + rank)."""
    return 1.0 / math.log2(1 + rank) if rank is not None and rank <= k else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    idx = min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))
    return s[idx]


def turn_bucket(turn: int) -> str:
    return str(turn) if turn <= 5 else "6-10"
