"""A generated Confluence site for ``wiki_scale.py``: pages in page trees with realistic text sizes, headings,
paragraphs, lists, tables, info and code macros, includes (some across spaces), Markdown attachments,
comments and edit histories, served by the test suite's fake Confluence (Cloud: REST v2 pages and bodies,
v1 CQL) in a process of its own.

The fake answers from in-memory lists; here they are indexed by space (``ScaleConfluence``) so that the
site, not the product, stays cheap at 50,000 pages. Text is drawn from a synthetic vocabulary (Zipf
distributed, so the wiki's vocabulary grows with it like a real one) mixed with English function words.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from typing import Any
from urllib.parse import unquote

from aiohttp import web
from fake_confluence import FakeConfluence, FakePage, _space_id

COMMON = (
    "the", "of", "and", "to", "in", "is", "for", "on", "with", "as", "by", "that", "this", "be", "are",
    "from", "or", "it", "at", "an", "will", "can", "should", "must", "each", "all", "new", "when", "which",
    "we", "you", "our", "not", "if", "use", "after", "before", "team", "service", "page",
)
SYLLABLES = (
    "ka", "ro", "mi", "ten", "dal", "ver", "sta", "pol", "gri", "nex", "lu", "for", "bin", "ar", "com",
    "ser", "dex", "tri", "mon", "vel", "pro", "ul", "sen", "tor", "qua", "plex", "rin", "ost", "ev", "ad",
    "mar", "tel", "cor", "fin", "lam", "ges", "ob", "rat",
)
VOCABULARY = 40_000


class Text:
    """Seeded text: words of a synthetic vocabulary of ``VOCABULARY`` words (Zipf) and English function
    words."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        words: dict[str, None] = {}
        while len(words) < VOCABULARY:
            words["".join(self.rng.choice(SYLLABLES) for _ in range(self.rng.randint(2, 4)))] = None
        self.words = list(words)
        total, self.cum = 0.0, []
        for rank in range(1, len(self.words) + 1):
            total += 1.0 / rank
            self.cum.append(total)

    def phrase(self, n: int) -> str:
        picks = self.rng.choices(self.words, cum_weights=self.cum, k=n)
        return " ".join(w if self.rng.random() < 0.55 else self.rng.choice(COMMON) for w in picks)

    def sentence(self, lo: int = 8, hi: int = 22) -> str:
        s = self.phrase(self.rng.randint(lo, hi))
        return s[:1].upper() + s[1:] + "."

    def paragraph(self) -> str:
        return " ".join(self.sentence() for _ in range(self.rng.randint(2, 6)))


def _table(t: Text) -> str:
    cols = t.rng.randint(3, 5)
    head = "".join(f"<th>{t.phrase(t.rng.randint(1, 2)).title()}</th>" for _ in range(cols))
    rows = "".join(
        "<tr>" + "".join(f"<td>{t.phrase(t.rng.randint(1, 6))}</td>" for _ in range(cols)) + "</tr>"
        for _ in range(t.rng.randint(3, 10))
    )
    return f"<table><tbody><tr>{head}</tr>{rows}</tbody></table>"


def _section(t: Text) -> str:
    parts = [f"<h2>{t.phrase(t.rng.randint(2, 5)).title()}</h2>"]
    parts += [f"<p>{t.paragraph()}</p>" for _ in range(t.rng.randint(1, 3))]
    roll = t.rng.random()
    if roll < 0.35:
        parts.append("<ul>" + "".join(f"<li>{t.sentence(4, 12)}</li>" for _ in range(t.rng.randint(3, 8)))
                     + "</ul>")
    elif roll < 0.6:
        parts.append(_table(t))
    elif roll < 0.7:
        parts.append('<ac:structured-macro ac:name="info"><ac:rich-text-body>'
                     f"<p>{t.sentence()}</p></ac:rich-text-body></ac:structured-macro>")
    elif roll < 0.76:
        parts.append('<ac:structured-macro ac:name="code"><ac:plain-text-body><![CDATA['
                     + "\n".join(f"{t.phrase(2).replace(' ', '_')} = {t.rng.randint(0, 9999)}"
                                 for _ in range(t.rng.randint(2, 8)))
                     + "]]></ac:plain-text-body></ac:structured-macro>")
    return "".join(parts)


def _include(space: str, title: str) -> str:
    return ('<ac:structured-macro ac:name="include" ac:schema-version="1"><ac:parameter ac:name="">'
            f'<ac:link><ri:page ri:content-title="{title}" ri:space-key="{space}"/></ac:link></ac:parameter>'
            "</ac:structured-macro>")


def generate(pages: int, spaces: int, seed: int = 7) -> list[FakePage]:
    """``pages`` pages in ``spaces`` spaces (page trees: each page a child of an earlier one of its space),
    versions 1-20 with edit times over the last two years; 3 % of pages include another page (one in five
    of another space); then 1 % get a Markdown attachment and 3 % one to three comments."""
    t = Text(seed)
    keys = [f"S{i:02d}" for i in range(spaces)]
    now = datetime.now(UTC)
    out: list[FakePage] = []
    by_space: dict[str, list[FakePage]] = defaultdict(list)
    for n in range(pages):
        space = keys[n % spaces]
        siblings = by_space[space]
        body = "".join(_section(t) for _ in range(t.rng.randint(2, 8)))
        if siblings and t.rng.random() < 0.03:
            other = t.rng.choice(by_space[t.rng.choice(keys)] or siblings) if t.rng.random() < 0.2 \
                else t.rng.choice(siblings)
            body += _include(other.space, other.title)
        page = FakePage(
            id=str(1_000_000 + n), title=f"{t.phrase(t.rng.randint(2, 5)).title()} {n}", space=space,
            body=body, when=now - timedelta(days=730) * (1 - n / pages) - timedelta(minutes=1),
            version=t.rng.randint(1, 20),
            parent=t.rng.choice(siblings[-200:]).id if siblings else None,
        )
        siblings.append(page)
        out.append(page)
    return out


def decorate(site: FakeConfluence, pages: list[FakePage], seed: int = 7) -> dict[str, int]:
    """Attachments and comments on a share of ``pages`` (they are content of their own)."""
    t, counts = Text(seed + 1), Counter[str]()
    for page in pages:
        if t.rng.random() < 0.01:
            doc = "# " + t.phrase(3).title() + "\n\n" + "\n\n".join(t.paragraph() for _ in range(4))
            site.attach(f"att{page.id}", page.id, f"notes-{page.id}.md", doc.encode(),
                        media_type="text/markdown", when=page.when)
            counts["attachments"] += 1
        if t.rng.random() < 0.03:
            for k in range(t.rng.randint(1, 3)):
                site.comment(str(5_000_000 + int(page.id) * 4 + k), page.id, f"<p>{t.paragraph()}</p>",
                             when=page.when)
                counts["comments"] += 1
    return dict(counts)


_SPACE = re.compile(r'space\s*=\s*"?([A-Za-z0-9_]+)"?', re.IGNORECASE)


class ScaleConfluence(FakeConfluence):
    """The fake, indexed by space (CQL ``space = X`` and v2 ``space-id`` scan one space) and by attachment
    name, and counting requests and bodies served."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counts: Counter[str] = Counter()
        self.on_request = self._count
        self.last_request = 0.0
        self.reindex()

    def _count(self, path_qs: str) -> None:
        self.requests.clear()  # the fake keeps every request; millions here
        self.counts["requests"] += 1
        if "/download/" in path_qs or "body-format=storage" in path_qs or "body.storage" in unquote(path_qs):
            self.counts["with bodies"] += 1
        self.last_request = time.monotonic()

    def _by_space(self) -> dict[str, list[FakePage]]:
        groups: dict[str, list[FakePage]] = defaultdict(list)
        for p in self.pages.values():
            groups[p.space].append(p)
        return groups

    def _run_cql(self, cql: str) -> list[FakePage]:
        match = _SPACE.search(cql)
        if match is None:
            return super()._run_cql(cql)
        saved, self.pages = self.pages, {p.id: p for p in self.spaces_index.get(match.group(1), [])}
        try:
            return super()._run_cql(cql)
        finally:
            self.pages = saved

    async def _contents_v2(self, request: web.Request) -> web.Response:
        wanted = set(request.query.get("space-id", "").split(",")) - {""}
        if not wanted:
            return await super()._contents_v2(request)
        subset = {p.id: p for key, rows in self.spaces_index.items() if _space_id(key) in wanted
                  for p in rows}
        saved, self.pages = self.pages, subset
        try:
            return await super()._contents_v2(request)
        finally:
            self.pages = saved

    async def _download(self, request: web.Request) -> web.Response:
        p = self.downloads.get((request.match_info["pid"], request.match_info["name"]))
        if p is None:
            return web.Response(status=404, text="no such attachment")
        return web.Response(body=p.data, content_type=p.media_type)

    def reindex(self) -> None:
        self.spaces_index = self._by_space()
        self.downloads = {(p.parent, p.title): p for p in self.pages.values() if p.kind == "attachment"}


def edit_share(site: ScaleConfluence, share: float, seed: int) -> list[dict[str, str]]:
    """Edit ``share`` of the pages: each gets a new version with a sentence naming a new code word; returns
    (page id, title, code word) for asking about them."""
    rng = random.Random(seed)
    pages = [p for p in site.pages.values() if p.kind == "page"]
    out = []
    for page in rng.sample(pages, max(1, round(len(pages) * share))):
        word = "zq" + "".join(rng.choice("abcdefghijklmnoprstuvwxy") for _ in range(8))
        site.edit(page.id, body=page.body + f"<p>The rotation code word of {page.title} is {word}.</p>")
        out.append({"id": page.id, "title": page.title, "word": word})
    return out


def serve_site(conn: Connection, pages: int, spaces: int, seed: int, port: int = 0) -> None:
    """The site's process: generate, serve (on ``port``; 0: a free one), then answer ``stats`` / ``edit`` /
    ``stop`` over ``conn``."""

    async def main() -> None:
        generated = generate(pages, spaces, seed)
        site = ScaleConfluence(generated, mode="cloud")
        extras = decorate(site, generated, seed)
        site.reindex()
        await site.start(port)
        conn.send({"url": site.url, "port": site.port, "user": site.user, "token": site.token,
                   "spaces": sorted(site.spaces()), "extras": extras,
                   "bodies_bytes": sum(len(p.body) for p in generated)})
        while True:
            command, arg = await asyncio.to_thread(conn.recv)
            if command == "stats":
                conn.send(dict(site.counts))
            elif command == "edit":
                edited = edit_share(site, arg["share"], arg["seed"])
                site.reindex()
                conn.send(edited)
            elif command == "sample":
                rng = random.Random(arg)
                population = [p for p in generated if p.kind == "page"]
                conn.send([{"id": p.id, "title": p.title, "body": p.body}
                           for p in rng.sample(population, min(200, len(population)))])
            else:
                await site.close()
                conn.send("stopped")
                return

    asyncio.run(main())
