"""Keyword expansion: query words the corpus never uses, mapped to the nearest words it does use.

A lexical (BM25) query only matches words the pages contain. A German question over English pages, a typo
("measuremnt") or a synonym ("hardship" for "difficulty") matches nothing lexically, and hybrid search then
rests on the dense side alone. The **vocabulary** is the corpus's own words (those in at least
``MIN_DOC_FREQ`` evidence, alphabetic, at least 3 letters, no stopwords; the most frequent ``MAX_TERMS``),
each embedded once by the configured embedder. At query time each query word none of whose stems occurs in
the corpus is embedded too, and its nearest vocabulary word (cosine ≥ ``min_similarity``) joins the sparse
query with weight ``weight`` (the query's own terms weigh 1.0; ``RetrievalConfig.keyword_weight``).

The vocabulary is built from the index after ingest or sync (``pipeline.ingest.vocabulary``) and kept in one
``.npz`` file next to it; ``KeywordExpander`` loads it on first use and reloads it when the file changes.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from pipeline.models.loading import normalise_rows
from pipeline.models.sparse import Bm25Encoder, term_id, tokenize
from pipeline.models.term_counts import UNREADABLE, TermCounts, pack, save_npz, unpack
from pipeline.protocols import Embedder
from pipeline.types import SparseVector

log = logging.getLogger(__name__)

BATCH = 256


@dataclass(frozen=True)
class Vocabulary:
    terms: tuple[str, ...]
    vectors: np.ndarray  # one unit-length row per term: float16 in the file, float32 once loaded to search
    stems: frozenset[str]  # every stem the corpus's evidence carries (what a query term must hit)
    embedder: str

    def save(self, path: Path) -> None:
        save_npz(path, terms=pack(self.terms), vectors=self.vectors, stems=pack(sorted(self.stems)),
                 embedder=pack([self.embedder]))

    @classmethod
    def load(cls, path: Path) -> Vocabulary:
        with np.load(path) as data:  # no pickled objects: a tampered file cannot run code
            return cls(tuple(unpack(data["terms"])), np.asarray(data["vectors"], dtype=np.float16),
                       frozenset(unpack(data["stems"])), unpack(data["embedder"])[0])


def update_vocabulary(path: Path, counts: TermCounts, sparse: Bm25Encoder, embedder: Embedder) -> Vocabulary:
    """Write the vocabulary of ``counts`` (and the counts) to ``path``; words already embedded by the same
    embedder keep their vectors, new ones are embedded in batches."""
    previous = _previous(path, embedder)
    words = counts.candidates(sparse.stopwords)
    at = {w: i for i, w in enumerate(previous.terms)}
    rows = np.fromiter((at.get(w, -1) for w in words), dtype=np.int64, count=len(words))  # -1: a new word
    vectors = np.zeros((len(words), embedder.dim), dtype=np.float16)
    kept = np.flatnonzero(rows >= 0)
    vectors[kept] = previous.vectors[rows[kept]]  # rows, not one array a word: 0.1 s of GIL at 50,000
    new = np.flatnonzero(rows < 0).tolist()
    for i in range(0, len(new), BATCH):
        batch = new[i:i + BATCH]
        vectors[batch] = normalise_rows(embedder.embed_queries([words[j] for j in batch]))
    vocab = Vocabulary(tuple(words), vectors, frozenset(counts.stems), embedder.name)
    vocab.save(path)
    counts.save(path)
    return vocab


def _previous(path: Path, embedder: Embedder) -> Vocabulary:
    """The vocabulary at ``path`` when ``embedder`` made it (its vectors are kept); else an empty one."""
    try:
        loaded = Vocabulary.load(path)
        if loaded.embedder == embedder.name and loaded.vectors.shape == (len(loaded.terms), embedder.dim):
            return loaded
    except UNREADABLE:
        pass
    return Vocabulary((), np.zeros((0, embedder.dim), dtype=np.float16), frozenset(), embedder.name)


class KeywordExpander:
    """Adds the nearest corpus words of a query's out-of-vocabulary words to its sparse vector.

    The vocabulary is read on first use. When its file changes (a sync or ingest rewrote it), it is read again
    in a background thread while questions go on with the one they had: at 50,000 words a read takes about
    0.3 s, which the first question after every sync cycle used to wait for. Its vectors are kept as float32
    rows, the form a query is compared in (not converted again for every question).
    """

    def __init__(self, path: Path, embedder: Embedder, sparse: Bm25Encoder) -> None:
        self.path = path
        self.embedder = embedder
        self.sparse = sparse
        self._vocab: Vocabulary | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._lock = threading.Lock()
        self._reloading: threading.Thread | None = None

    def vocabulary(self) -> Vocabulary | None:
        """The vocabulary file's content (None while there is none, or it belongs to another embedder); after
        the file changed, the previous content until the new one is read."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)  # a save replaces the file: a new inode
        with self._lock:
            if stamp == self._stamp:
                return self._vocab
            if self._vocab is None:  # nothing to answer with meanwhile: read it now
                self._stamp, self._vocab = stamp, self._read()
            elif self._reloading is None:
                thread = threading.Thread(target=self._reload, args=(stamp,), daemon=True,
                                          name="vocabulary-reload")
                thread.start()
                self._reloading = thread
            return self._vocab

    def wait_reloaded(self, timeout_s: float) -> bool:
        """Wait for a background reload in progress (True once none is)."""
        thread = self._reloading
        if thread is not None:
            thread.join(timeout_s)
        return self._reloading is None

    def _reload(self, stamp: tuple[int, int, int]) -> None:
        """The thread: a read that fails in any way turns expansion off until the file changes again, and
        never stops later reloads."""
        vocab: Vocabulary | None = None
        try:
            vocab = self._read()
        except Exception:  # a thread's failure has nobody to raise to: logged, expansion off
            log.exception("keyword expansion off: reading %s failed", self.path)
        finally:
            with self._lock:
                self._stamp, self._vocab, self._reloading = stamp, vocab, None

    def _read(self) -> Vocabulary | None:
        try:
            vocab = Vocabulary.load(self.path)
        except UNREADABLE as exc:
            log.warning("keyword expansion off: cannot read %s (%s)", self.path, exc)
            return None
        if vocab.embedder != self.embedder.name:
            log.warning("keyword expansion off: %s was built with %s, not %s", self.path,
                        vocab.embedder, self.embedder.name)
            return None
        return replace(vocab, vectors=vocab.vectors.astype(np.float32))

    def unknown_words(self, query: str, vocab: Vocabulary) -> list[str]:
        """The query's words (alphabetic, ≥ 3 letters, no stopwords) none of whose stems the corpus has."""
        out: list[str] = []
        for token in dict.fromkeys(tokenize(query)):
            if len(token) < 3 or not token.isalpha() or token in self.sparse.stopwords:
                continue
            if not (self.sparse.token_stems(token) & vocab.stems):
                out.append(token)
        return out

    def expansions(
        self, query: str, *, min_similarity: float, per_word: int = 1
    ) -> list[tuple[str, str, float]]:
        """(query word, corpus word, cosine) for each expansion of ``query``: the ``per_word`` nearest corpus
        words of each unknown word, at cosine ``min_similarity`` or more."""
        vocab = self.vocabulary()
        if vocab is None or not vocab.terms:
            return []
        words = self.unknown_words(query, vocab)
        if not words:
            return []
        q = normalise_rows(self.embedder.embed_queries(words))
        sims = q @ vocab.vectors.T
        out = []
        for i, word in enumerate(words):
            for j in np.argsort(-sims[i])[:per_word]:
                if sims[i, j] >= min_similarity:
                    out.append((word, vocab.terms[j], float(sims[i, j])))
        return out

    def expand(self, query: str, vector: SparseVector, *, weight: float,
               min_similarity: float) -> tuple[SparseVector, list[tuple[str, str, float]]]:
        """``vector`` (the query's sparse vector) with the expansions added at ``weight``; and the
        expansions."""
        found = self.expansions(query, min_similarity=min_similarity)
        if not found:
            return vector, []
        weights = dict(zip(vector.indices, vector.values, strict=True))
        for _, term, _ in found:
            for stem in self.sparse.query_terms(term):
                weights.setdefault(term_id(stem), weight)
        ordered = sorted(weights.items())
        return SparseVector(tuple(i for i, _ in ordered), tuple(float(v) for _, v in ordered)), found

