"""BM25 sparse vectors for the lexical half of hybrid retrieval.

Documents carry only BM25's term-frequency saturation ``tf*(k1+1) / (tf + k1*(1-b+b*len/avg_len))``;
the index multiplies in IDF (Qdrant ``Modifier.IDF``), so a query is just 1.0 per unique term. ``avg_len``
is fixed when a document is encoded (the index cannot divide by a mean it computes later, as Lucene does):
``EVIDENT_BM25_AVG_LEN``, 88 terms, the mean of ConfQuestions' 3,406 evidence as indexed (contextualized:
title, headings and neighbours bound most of the length). 40, used before, treated every evidence as twice
the average length, so a rare word at the end of a long passage lost to common words in short ones.

Multilingual choice: a document is stemmed with **one** stemmer, the language whose stopwords it
uses most (ties and stopword-free snippets such as table rows go to the first language). A query is
stemmed with **every** stemmer and carries each distinct stem. So German questions match German
pages by German stems and English pages by English stems (and shared words such as product names,
numbers, "Server"), while document vectors are not inflated; the query-side expansion is free.

Term ids are ``crc32(stem) & 0x7FFFFFFF``: stable across processes and machines (never ``hash()``).
"""

from __future__ import annotations

import math
import re
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from pipeline.errors import ConfigError
from pipeline.models.settings import ModelSettings
from pipeline.protocols import SparseEncoder
from pipeline.types import SparseVector


def _words(block: str) -> frozenset[str]:
    return frozenset(block.split())


_ENGLISH_STOP = _words("""
a about above after again against all am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has have
having he her here hers herself him himself his how i if in into is it its itself just me more most
my myself no nor not now of off on once only or other our ours ourselves out over own same she
should so some such than that the their theirs them themselves then there these they this those
through to too under until up very was we were what when where which while who whom why will with
would you your yours yourself yourselves also may might must shall us let get got yes
""")

_GERMAN_STOP = _words("""
aber alle allem allen aller alles als also am an ander andere anderem anderen anderer anderes auch
auf aus bei beim bin bis bist da damit dann das dass dasselbe dazu dein deine deinem deinen deiner
dem den denn der des desselben dessen dich die dies diese dieselbe dieselben diesem diesen dieser
dieses dir doch dort du durch ein eine einem einen einer eines einig einige einigem einigen einiger
einiges einmal er es etwas euch euer eure eurem euren eurer für gegen gewesen hab habe haben hat
hatte hatten hier hin hinter ich ihm ihn ihnen ihr ihre ihrem ihren ihrer ihres im in indem ins
ist jede jedem jeden jeder jedes jene jenem jenen jener jenes jetzt kann kein keine keinem keinen
keiner keines können könnte machen man manche manchem manchen mancher manches mein meine meinem
meinen meiner meines mich mir mit muss musste nach nicht nichts noch nun nur ob oder ohne sehr
sein seine seinem seinen seiner seines selbst sich sie sind so solche solchem solchen solcher
solches soll sollte sondern sonst über um und uns unsere unserem unseren unserer unter viel vom
von vor während war waren warst was weg weil weiter welche welchem welchen welcher welches wenn
werde werden wie wieder will wir wird wirst wo wollen wollte würde würden zu zum zur zwar zwischen
wer wann wieso warum welche gibt gab
""")

STOPWORDS: dict[str, frozenset[str]] = {"english": _ENGLISH_STOP, "german": _GERMAN_STOP}

# A raw token: letters/digits joined by . - / : _ (so "v2.1", "ab-7040", "on_call" stay together first).
_RAW = re.compile(r"[^\W_]+(?:[._\-/:][^\W_]+)*")
_VERSION = re.compile(r"^v?\d+(?:\.\d+)+[a-z]?$|^\d+(?:[.:]\d+)+$")
_JOINERS = re.compile(r"[-_]")
_SPLITTERS = re.compile(r"[._\-/:]")


LEGACY_AVG_LEN = 40.0  # BM25's length before it was measured and recorded (see ``Bm25Encoder``)


def tokenize(text: str) -> list[str]:
    """Lowercased terms, before stopwords and stemming.

    Version-like tokens ("v2.1", "2.14.1", "10.0.0.1") stay whole; hyphen/underscore compounds
    ("on-call", "ab-7040") give their parts plus the joined form ("oncall", "ab7040") so both
    spellings match; other dotted/slashed tokens (URLs, paths, "end.Next") give their parts.
    """
    terms: list[str] = []
    for raw in _RAW.findall(text.lower()):
        if raw.isalnum():  # no . - / : _ inside (most words): the token itself
            terms.append(raw)
        else:
            parts: tuple[str, ...] = _remembered(_COMPOUNDS, raw, _compound_terms)
            terms.extend(parts)
    return terms


def _compound_terms(raw: str) -> tuple[str, ...]:
    if _VERSION.match(raw):
        return (raw,)
    parts = [p for p in _SPLITTERS.split(raw) if p]
    if _JOINERS.search(raw) and not re.search(r"[./:]", raw):
        parts.append("".join(parts))
    return tuple(parts)


_T = TypeVar("_T")
# Words seen are remembered (a dict lookup instead of regexes, Snowball and CRC for each occurrence): the
# sync of a page spends most of its CPU here, on the same few thousand words. Bounded: cleared when full.
CACHE_WORDS = 100_000
_COMPOUNDS: dict[str, tuple[str, ...]] = {}


CACHE_WORD_CHARS = 64  # longer tokens (URLs, hashes) are analysed each time, never kept


def _remembered(cache: dict[str, _T], key: str, make: Callable[[str], _T]) -> _T:
    found = cache.get(key)
    if found is None:
        found = make(key)
        if len(key) <= CACHE_WORD_CHARS:
            if len(cache) >= CACHE_WORDS:
                cache.clear()
            cache[key] = found
    return found


def term_id(term: str) -> int:
    """Deterministic 31-bit id for a stemmed term (same on every machine and process)."""
    return zlib.crc32(term.encode("utf-8")) & 0x7FFFFFFF


_TERM_IDS: dict[str, int] = {}


def _to_sparse(weights: dict[int, float]) -> SparseVector:
    ordered = sorted(weights.items())
    return SparseVector(indices=tuple(i for i, _ in ordered), values=tuple(float(v) for _, v in ordered))


class Bm25Encoder:
    """BM25 document/query vectors with English + German stopwords and Snowball stemming.

    ``avg_len`` (default: the ``EVIDENT_BM25_AVG_LEN`` setting's default; ``make_sparse_from`` passes the
    configured value) is part of ``name``, so an index records it and vectors normalized by another length
    are never mixed (``pipeline.index.common.check_manifest``). 40, the length before it was recorded, keeps
    that release's name ``bm25``: an index encoded then opens with ``EVIDENT_BM25_AVG_LEN=40``, its pages'
    content hashes unchanged, until it is rebuilt."""

    idf = True  # term frequencies here; the index weighs terms by IDF

    def __init__(
        self,
        k1: float = 1.2,
        b: float = 0.75,
        avg_len: float | None = None,
        languages: Sequence[str] = ("english", "german"),
    ) -> None:
        if avg_len is None:
            avg_len = float(ModelSettings.model_fields["bm25_avg_len"].default)
        if not languages:
            raise ConfigError("bm25 needs at least one language")
        if not (math.isfinite(avg_len) and avg_len > 0):
            raise ConfigError(f"bm25 avg_len must be a positive number, got {avg_len}")
        self.name = "bm25" if avg_len == LEGACY_AVG_LEN else f"bm25(avg_len={float(avg_len)!r})"
        try:
            import Stemmer
        except ImportError as exc:
            raise ConfigError("bm25 needs PyStemmer: pip install PyStemmer") from exc
        self.k1 = k1
        self.b = b
        self.avg_len = float(avg_len)
        self.languages = tuple(languages)
        try:
            self._stemmers = {lang: Stemmer.Stemmer(lang) for lang in self.languages}
        except KeyError as exc:
            raise ConfigError(f"bm25: no Snowball stemmer for language {exc}") from exc
        self._stop = frozenset().union(*(STOPWORDS.get(lang, frozenset()) for lang in self.languages))
        self._stemmed: dict[str, dict[str, str]] = {lang: {} for lang in self.languages}  # token -> stem

    def __reduce__(self) -> tuple[type[Bm25Encoder], tuple[float, float, float, tuple[str, ...]]]:
        """Pickled as its parameters: another process (serve's page worker) rebuilds the same encoder."""
        return Bm25Encoder, (self.k1, self.b, self.avg_len, self.languages)

    # ------------------------------------------------------------------ analysis

    def detect_language(self, tokens: Sequence[str]) -> str:
        """The configured language whose stopwords occur most in ``tokens`` (first one on ties)."""
        best, best_count = self.languages[0], 0
        for lang in self.languages:
            count = sum(map(STOPWORDS.get(lang, frozenset()).__contains__, tokens))
            if count > best_count:
                best, best_count = lang, count
        return best

    def document_terms(self, text: str) -> list[str]:
        """Stemmed, stopword-free terms of a document, stemmed in its detected language."""
        tokens = tokenize(text)
        language = self.detect_language(tokens)
        stemmer, stemmed = self._stemmers[language], self._stemmed[language]
        stop = self._stop
        terms: list[str] = []
        for token in tokens:
            if token not in stop:
                stem = stemmed.get(token)  # inline: the hot path of a sync (one lookup, no call)
                terms.append(stem if stem is not None else
                             _remembered(stemmed, token, lambda w: self._stem(stemmer, w)))
        return terms

    @property
    def stopwords(self) -> frozenset[str]:
        """The stopwords of every configured language (never indexed, never queried)."""
        return self._stop

    def token_stems(self, token: str) -> set[str]:
        """A query token's stems, one per configured language (digits keep it verbatim)."""
        return {self._stem(stemmer, token) for stemmer in self._stemmers.values()}

    def query_terms(self, text: str) -> set[str]:
        """Every distinct stem of every non-stopword query token, in all languages."""
        terms: set[str] = set()
        for token in tokenize(text):
            if token not in self._stop:
                terms |= self.token_stems(token)
        return terms

    @staticmethod
    def _stem(stemmer: object, token: str) -> str:
        if any(ch.isdigit() for ch in token):
            return token  # ids, versions and model numbers must match verbatim
        return str(stemmer.stemWord(token))  # type: ignore[attr-defined]

    def average_length(self, texts: Iterable[str]) -> float:
        """Mean document length in terms: pass it as ``avg_len`` for a corpus-fitted encoder."""
        lengths = [len(self.document_terms(t)) for t in texts]
        return (sum(lengths) / len(lengths)) if lengths and sum(lengths) else self.avg_len

    # ------------------------------------------------------------------ SparseEncoder

    def encode_document(self, text: str) -> SparseVector:
        terms = self.document_terms(text)
        if not terms:
            return SparseVector((), ())
        norm = self.k1 * (1.0 - self.b + self.b * len(terms) / self.avg_len)
        weights: dict[int, float] = {}
        for term, tf in Counter(terms).items():
            idx = _TERM_IDS.get(term)
            if idx is None:
                idx = _remembered(_TERM_IDS, term, term_id)
            weights[idx] = weights.get(idx, 0.0) + tf * (self.k1 + 1.0) / (tf + norm)
        return _to_sparse(weights)

    def encode_documents(self, texts: Sequence[str]) -> list[SparseVector]:
        return [self.encode_document(t) for t in texts]

    def encode_query(self, text: str) -> SparseVector:
        return _to_sparse({term_id(t): 1.0 for t in self.query_terms(text)})


def make_sparse_encoder(name: str, *, embedder: object | None = None, avg_len: float | None = None
                        ) -> SparseEncoder:
    """Build the sparse encoder ``Settings.sparse_encoder`` names (``avg_len``: BM25's, see ``Bm25Encoder``).

    ``bge-m3`` reuses ``embedder`` when it is a ``BgeM3Embedder`` (one model for both halves), else
    loads bge-m3 itself.
    """
    key = name.strip()
    if key == "bm25":
        return Bm25Encoder(avg_len=avg_len)
    if key == "bge-m3":
        from pipeline.models.hf_embedders import BgeM3Embedder

        model = embedder if isinstance(embedder, BgeM3Embedder) else BgeM3Embedder()
        return model.sparse_encoder()
    raise ConfigError(f"unknown sparse encoder '{name}': choose bm25, bge-m3")
