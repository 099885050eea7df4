"""The corpus's word counts behind the keyword-expansion vocabulary, kept current as pages change.

``TermCounts`` holds how many evidence each corpus word occurs in (``df``) and each stem the evidence
carries (``stems``, counted the same way), kept beside the vocabulary as ``<vocabulary>.counts.npz``. What
each page contributed is kept too, in ``<vocabulary>.pages.sqlite`` (one compressed row per page): a page
rewritten or deleted takes its old words out again, so a word no page uses any more leaves the vocabulary and
a query word only some deleted page used counts as unknown again. Only the pages that changed are read or
written per cycle; the counts file is one row per distinct word.

Counts kept by an earlier release (no per-page rows) are counted afresh: the next ingest or sync reads every
unchanged page once, parsed but not embedded (``pipeline.ingest.vocabulary_run``).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import uuid
import zipfile
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from pipeline.models.sparse import Bm25Encoder, tokenize

log = logging.getLogger(__name__)

# what a damaged file raises
UNREADABLE = (OSError, ValueError, KeyError, IndexError, EOFError, zipfile.BadZipFile, sqlite3.Error,
              zlib.error)
MIN_DOC_FREQ = 2
MAX_WORD = 40
MAX_TERMS = 50_000
SPILL_PAGES = 256  # changed pages held as counters before their rows go to the database
Contribution = tuple[Counter[str], Counter[str]]  # one page's (words, stems), each by evidence count


class TermCounts:
    """Word and stem counts of the indexed evidence, and what each page contributed (``set_page``,
    ``forget``); ``save`` writes both."""

    def __init__(self, pages: Path, df: Counter[str] | None = None,
                 stems: Counter[str] | None = None) -> None:
        self.df: Counter[str] = df if df is not None else Counter()
        self.stems: Counter[str] = stems if stems is not None else Counter()
        self.pages_path = pages
        self.added = 0  # changes since loading: evidence counted, pages forgotten or emptied
        self._db: sqlite3.Connection | None = None
        # a cancelled run's counting thread may still run while the run closes or saves
        self._lock = threading.RLock()
        self._changed: dict[str, Contribution | None] = {}  # page id -> its words now (None: gone)
        self._retired = False

    @staticmethod
    def contribution(texts: Iterable[str], sparse: Bm25Encoder) -> Contribution:
        """The words of ``texts`` expansion can use (alphabetic, 3 to ``MAX_WORD`` letters: ids, numbers and
        hashes cost no memory) and their stems, each counted once per text."""
        words: Counter[str] = Counter()
        stems: Counter[str] = Counter()
        for text in texts:
            words.update({t for t in tokenize(text) if 3 <= len(t) <= MAX_WORD and t.isalpha()})
            stems.update({s for s in sparse.document_terms(text) if len(s) <= MAX_WORD and s.isalpha()})
        return words, stems

    def set_page(self, page_id: str, texts: Sequence[str], sparse: Bm25Encoder) -> None:
        """``page_id``'s evidence is now ``texts``: its earlier words out, these in."""
        self.set_contribution(page_id, self.contribution(texts, sparse), len(texts))

    def set_contribution(self, page_id: str, contribution: Contribution, evidence: int) -> None:
        """``set_page`` with the page's ``contribution`` already counted (by serve's page worker) from its
        ``evidence`` texts."""
        words, stems = contribution
        with self._lock:
            if self._retired:
                return
            removed = self._take_out(page_id)
            self.df.update(words)
            self.stems.update(stems)
            self._changed[page_id] = (words, stems)
            self.added += evidence or int(removed)  # a page emptied changes the counts too
            self._spill()

    def forget(self, page_ids: Iterable[str]) -> None:
        """The pages left the index: their words out."""
        with self._lock:
            if self._retired:
                return
            for page_id in page_ids:
                self._take_out(page_id)
                self._changed[page_id] = None
                self.added += 1
            self._spill()

    def _take_out(self, page_id: str) -> bool:
        """The page's earlier words out of the counts (True when it had any)."""
        old = self._changed[page_id] if page_id in self._changed else self._stored(page_id)
        if old is None or not (old[0] or old[1]):
            return False
        for counts, minus in ((self.df, old[0]), (self.stems, old[1])):
            for word, n in minus.items():  # one pass (``Counter.subtract`` and a sweep took two)
                left = counts.get(word, 0) - n
                if left > 0:
                    counts[word] = left
                else:
                    counts.pop(word, None)
        return True

    def _spill(self, at: int = SPILL_PAGES) -> None:
        """Move the changed pages' rows into the database's open transaction once ``at`` are pending: memory
        stays bounded (44 KB a page held as counters: 2.2 GB for a cold sync of 50,000 pages), and nothing is
        committed before ``save`` writes the counts they belong to."""
        if len(self._changed) < at:
            return
        db = self._rows()
        db.executemany("DELETE FROM pages WHERE id = ?",
                       [(k,) for k, v in self._changed.items() if v is None])
        db.executemany("INSERT OR REPLACE INTO pages VALUES (?, ?)",
                       [(k, _encode(v)) for k, v in self._changed.items() if v is not None])
        self._changed.clear()

    def _stored(self, page_id: str) -> Contribution | None:
        if self._db is None and not self.pages_path.exists():
            return None
        row = self._rows().execute("SELECT terms FROM pages WHERE id = ?", (page_id,)).fetchone()
        return None if row is None else _decode(row[0])

    def _rows(self) -> sqlite3.Connection:
        if self._db is None:
            self.pages_path.parent.mkdir(parents=True, exist_ok=True)
            # one thread at a time: the callers hold ``_lock``
            self._db = sqlite3.connect(self.pages_path, timeout=30.0, check_same_thread=False)
            self._db.executescript(_SCHEMA)
        return self._db

    def close(self) -> None:
        """Close the per-page rows' database; what was not saved is rolled back."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def candidates(self, stopwords: frozenset[str]) -> list[str]:
        """The words a query word may be expanded to, most frequent first."""
        # filtered, then sorted (stable: ties keep their order, as ``most_common`` keeps it)
        kept = [w for w, c in self.df.items() if c >= MIN_DOC_FREQ and len(w) >= 3 and w.isalpha()
                and w not in stopwords]
        return sorted(kept, key=self.df.__getitem__, reverse=True)[:MAX_TERMS]

    @staticmethod
    def path_for(vocabulary: Path) -> Path:
        return vocabulary.with_name(vocabulary.stem + ".counts.npz")

    @staticmethod
    def pages_for(vocabulary: Path) -> Path:
        return vocabulary.with_name(vocabulary.stem + ".pages.sqlite")

    @classmethod
    def load(cls, vocabulary: Path) -> TermCounts:
        """The counts kept beside ``vocabulary``; empty (to be counted afresh) when there are none, they are
        unreadable, of an earlier release (no per-page rows) or of another save than the rows are."""
        pages = cls.pages_for(vocabulary)
        try:
            with np.load(cls.path_for(vocabulary)) as data:
                df = Counter(dict(zip(unpack(data["words"]), data["counts"].tolist(), strict=True)))
                stems = Counter(dict(zip(unpack(data["stems"]), data["stem_counts"].tolist(), strict=True)))
                generation = unpack(data["generation"])[0]
            if generation != _generation(pages):
                raise KeyError("the per-page rows are of another save than the counts")
            return cls(pages, df, stems)
        except UNREADABLE as exc:
            if not isinstance(exc, FileNotFoundError):
                log.warning("vocabulary counts at %s unreadable or of an earlier release (%s): counting "
                            "afresh", cls.path_for(vocabulary), exc)
            for leftover in (pages, pages.with_name(pages.name + "-journal")):
                with contextlib.suppress(OSError):  # what cannot go fails the run's counting, not the run
                    leftover.unlink(missing_ok=True)
            return cls(pages)

    def save(self, vocabulary: Path) -> None:
        """The changed pages' rows and the counts, as one generation: the counts are written to a temporary
        file, the rows committed with the generation's id, then the counts file moved into place. A crash
        between leaves counts and rows of different generations, which ``load`` counts afresh. All of it under
        the lock, so the rows committed are those the counts were written from."""
        generation = uuid.uuid4().hex
        final = self.path_for(vocabulary)
        with self._lock:
            words, stems = list(self.df.items()), list(self.stems.items())
            tmp = write_npz(final, words=pack([w for w, _ in words]),
                            counts=np.fromiter((c for _, c in words), dtype=np.int64, count=len(words)),
                            stems=pack([s for s, _ in stems]),
                            stem_counts=np.fromiter((c for _, c in stems), dtype=np.int64, count=len(stems)),
                            generation=pack([generation]))
            try:
                self._spill(at=0)
                db = self._rows()
                db.execute("INSERT OR REPLACE INTO meta VALUES ('generation', ?)", (generation,))
                db.commit()
            finally:
                self.close()
            tmp.replace(final)

    @property
    def retired(self) -> bool:
        return self._retired

    def retire(self) -> None:
        """No run uses these counts any more: close them, and let a change that still comes (a cancelled run's
        counting thread) change nothing, rather than open the rows' database again and hold it."""
        with self._lock:
            self._retired = True
            self.close()


_SCHEMA = """
CREATE TABLE IF NOT EXISTS pages (id TEXT PRIMARY KEY, terms BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def _generation(pages: Path) -> str | None:
    """The generation id committed with the per-page rows (None without the file)."""
    if not pages.exists():
        return None
    db = sqlite3.connect(f"file:{pages}?mode=ro", uri=True, timeout=30.0)
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
        db.execute("SELECT count(*) FROM pages").fetchone()  # a damaged file fails here, not mid-run
    finally:
        db.close()
    return None if row is None else str(row[0])


def _encode(contribution: Contribution) -> bytes:
    words, stems = contribution
    text = "\n".join(f"{w}\t{c}" for w, c in words.items()) + "\0" + "\n".join(
        f"{s}\t{c}" for s, c in stems.items())
    return zlib.compress(text.encode("utf-8"))


def _decode(blob: bytes) -> Contribution:
    words, stems = zlib.decompress(blob).decode("utf-8").split("\0")
    return _counter(words), _counter(stems)


def _counter(text: str) -> Counter[str]:
    return Counter({w: int(c) for w, c in (line.split("\t") for line in text.split("\n") if line)})


def pack(words: Sequence[str]) -> np.ndarray:
    """Words as one UTF-8 byte array (newline-separated; tokens never hold a newline): no pickled objects."""
    return np.frombuffer("\n".join(words).encode("utf-8"), dtype=np.uint8)


def unpack(data: np.ndarray) -> list[str]:
    text = data.tobytes().decode("utf-8")
    return text.split("\n") if text else []


def write_npz(path: Path, **arrays: np.ndarray) -> Path:
    """``arrays`` written beside ``path`` in a temporary file (returned), to be moved into place. Not
    compressed: at 50,000 pages compressing the vocabulary and its counts cost 1.6 s of CPU per cycle that
    changed them and saved 10 % of 40 MB (the vectors barely compress), and reading them back inflated
    them again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays)  # type: ignore[arg-type]
    return tmp


def save_npz(path: Path, **arrays: np.ndarray) -> None:
    write_npz(path, **arrays).replace(path)  # readers see the old file or the new one, never half of one
