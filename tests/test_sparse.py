"""BM25 sparse encoder: tokenization, stable ids, weights, and a real BM25 ranking check."""

from __future__ import annotations

import importlib.util
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from evident.settings import Settings
from pipeline.errors import ConfigError
from pipeline.factory import make_sparse_from
from pipeline.models.sparse import Bm25Encoder, make_sparse_encoder, term_id, tokenize
from pipeline.protocols import SparseEncoder
from pipeline.types import SparseVector

DOCS = [
    "The team meeting takes place every Monday in room 4.",  # 0 English, meeting
    "Die Besprechung des Teams findet jeden Montag in Raum 4 statt.",  # 1 German, Besprechung
    "Deploy release v2.1 of billing to host ab-7040 with kestrel.",  # 2 versions, hosts
    "The on-call engineer acknowledges every page within ten minutes.",  # 3 compounds
    "Disk alerts fire at 80 percent and the pruning job is monitored.",  # 4 filler
]


@pytest.fixture(scope="module")
def bm25() -> Bm25Encoder:
    return Bm25Encoder()


def rank(encoder: Bm25Encoder, query: str, docs: list[str] = DOCS) -> list[int]:
    """Score like Qdrant's IDF modifier: sum over query terms of q * doc_weight * idf(term)."""
    vectors = encoder.encode_documents(docs)
    n = len(vectors)
    df: dict[int, int] = {}
    for vec in vectors:
        for idx in vec.indices:
            df[idx] = df.get(idx, 0) + 1
    q = encoder.encode_query(query)
    scores = []
    for vec in vectors:
        weights = dict(zip(vec.indices, vec.values, strict=True))
        score = 0.0
        for idx, qv in zip(q.indices, q.values, strict=True):
            if idx in weights:
                idf = math.log(1 + (n - df[idx] + 0.5) / (df[idx] + 0.5))
                score += qv * weights[idx] * idf
        scores.append(score)
    assert max(scores) > 0, query
    return sorted(range(n), key=lambda i: -scores[i])


def test_is_a_sparse_encoder(bm25: Bm25Encoder) -> None:
    assert isinstance(bm25, SparseEncoder)
    assert bm25.name == "bm25(avg_len=88.0)"  # recorded by the index: vectors of another length never mix
    assert Bm25Encoder(avg_len=88.0000001).name != bm25.name
    assert Bm25Encoder(avg_len=40).name == "bm25"  # the earlier release's length, under its name
    for bad in (0.0, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="avg_len must be a positive number"):
            Bm25Encoder(avg_len=bad)


def test_the_average_length_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVIDENT_BM25_AVG_LEN", "60")
    encoder = make_sparse_from(Settings.load())
    assert isinstance(encoder, Bm25Encoder) and encoder.avg_len == 60.0
    for bad, message in (("0", "must be greater than 0"), ("inf", "must be a finite number"),
                         ("nan", "must be a finite number")):
        monkeypatch.setenv("EVIDENT_BM25_AVG_LEN", bad)
        with pytest.raises(ConfigError, match=f"EVIDENT_BM25_AVG_LEN={bad} {message}"):
            Settings.load()


def test_a_rare_word_in_a_long_passage_beats_shared_words_in_short_ones() -> None:
    """The 5,000-page run's miss in small: many short passages share three words of the question, the one
    that has its rare word appended to a 90-term passage. Normalized by the evidence's real mean length it
    ranks first; by 40 (the earlier default: every evidence twice the average) it ranked 31st."""
    rng = random.Random(3)
    syllables = ["tel", "plex", "vel", "mar", "nex", "ost", "rin", "dal", "gri", "lam", "sta", "ka", "mon",
                 "ver", "ob", "ul"]

    def word() -> str:
        return "".join(rng.choice(syllables) for _ in range(3))

    def sentence(n: int) -> str:
        return " ".join(word() for _ in range(n)).capitalize() + "."

    docs = [" ".join(sentence(12) for _ in range(rng.randint(2, 6))) for _ in range(200)]
    docs += [f"The rotation code word of {word().title()} {i} is zq{word()}. The rotation code word of "
             f"{word().title()} {i} is zq{word()}." for i in range(30)]
    long_passage = " ".join(sentence(12) for _ in range(7))
    docs.append(long_passage + " The rotation code word of Telulevmon is zqghracice.")
    question = "Which page names the rotation code word zqghracice?"
    assert rank(Bm25Encoder(), question, docs)[0] == len(docs) - 1
    assert rank(Bm25Encoder(avg_len=40), question, docs).index(len(docs) - 1) > 10


@pytest.mark.parametrize(
    ("query", "best"),
    [
        ("meetings", 0),
        ("When is the weekly meeting?", 0),
        ("Besprechungen", 1),
        ("Wann finden die Besprechungen statt?", 1),
        ("Besprechung", 1),
        ("v2.1", 2),
        ("ab-7040", 2),
        ("7040", 2),
        ("oncall", 3),
        ("Who is on-call?", 3),
    ],
)
def test_right_document_ranks_first(bm25: Bm25Encoder, query: str, best: int) -> None:
    assert rank(bm25, query)[0] == best


def test_tokenize_keeps_versions_and_splits_compounds() -> None:
    assert tokenize("BIOS v2.1 / 2.14.1, IP 10.0.0.1.") == ["bios", "v2.1", "2.14.1", "ip", "10.0.0.1"]
    assert tokenize("on-call host ab-7040") == ["on", "call", "oncall", "host", "ab", "7040", "ab7040"]
    assert tokenize("snake_case and acme.example/wiki") == [
        "snake",
        "case",
        "snakecase",
        "and",
        "acme",
        "example",
        "wiki",
    ]
    assert tokenize("Größe Übergabe café") == ["größe", "übergabe", "café"]
    assert tokenize("") == []


def test_documents_are_stemmed_in_their_language(bm25: Bm25Encoder) -> None:
    assert bm25.detect_language(tokenize("Die Besprechung findet am Montag statt")) == "german"
    assert bm25.detect_language(tokenize("The meeting is on Monday")) == "english"
    assert bm25.detect_language(tokenize("fra-build-01 Dell R7615")) == "english"  # default on no evidence
    assert "besprech" in bm25.document_terms("Die Besprechungen finden statt")
    assert "meet" in bm25.document_terms("The meetings are long")
    assert "1.9.3" in bm25.document_terms("BIOS 1.9.3")


def test_query_carries_every_languages_stem(bm25: Bm25Encoder) -> None:
    assert bm25.query_terms("Besprechungen") == {"besprech", "besprechungen"}  # German, English stem
    assert "meet" in bm25.query_terms("meetings")
    assert bm25.query_terms("the and die und") == set()


def test_document_weights_follow_bm25_saturation() -> None:
    enc = Bm25Encoder(k1=1.2, b=0.75, avg_len=4.0)
    vec = enc.encode_document("kestrel kestrel heron")  # 3 terms, tf 2 and 1
    norm = 1.2 * (1 - 0.75 + 0.75 * 3 / 4.0)
    expected = {
        term_id("kestrel"): 2 * 2.2 / (2 + norm),
        term_id("heron"): 1 * 2.2 / (1 + norm),
    }
    assert dict(zip(vec.indices, vec.values, strict=True)) == pytest.approx(expected)


def test_longer_documents_weigh_a_term_less() -> None:
    enc = Bm25Encoder(avg_len=5.0)
    short = enc.encode_document("kestrel pipeline")
    long = enc.encode_document("kestrel pipeline builds scans ships images heron clusters frankfurt dublin")
    k = term_id("kestrel")
    assert dict(zip(short.indices, short.values, strict=True))[k] > dict(
        zip(long.indices, long.values, strict=True)
    )[k]


def test_vectors_have_sorted_unique_indices_and_query_ones(bm25: Bm25Encoder) -> None:
    for vec in [*bm25.encode_documents(DOCS), bm25.encode_query("Besprechungen meetings v2.1 meetings")]:
        assert list(vec.indices) == sorted(set(vec.indices))
        assert len(vec.indices) == len(vec.values)
        assert all(0 <= i < 2**31 for i in vec.indices)
    assert set(bm25.encode_query("meetings meeting").values) == {1.0}


def test_empty_text_gives_empty_vector(bm25: Bm25Encoder) -> None:
    assert bm25.encode_query("") == SparseVector((), ())
    assert bm25.encode_documents(["", "the of and"]) == [SparseVector((), ()), SparseVector((), ())]
    assert bm25.encode_documents([]) == []


def test_term_ids_are_stable_across_processes() -> None:
    code = "from pipeline.models.sparse import term_id; print(term_id('besprech'), term_id('v2.1'))"
    repo = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo,
        env={"PYTHONHASHSEED": "123", "PYTHONPATH": str(repo)},
    )
    assert out.stdout.split() == [str(term_id("besprech")), str(term_id("v2.1"))]
    assert term_id("meet") == 1777783758  # crc32, pinned: indexes built earlier must stay searchable


def test_average_length_fits_corpus(bm25: Bm25Encoder) -> None:
    assert bm25.average_length(["kestrel heron", "one two three four"]) == 3.0
    assert bm25.average_length([]) == bm25.avg_len


def test_bad_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="avg_len"):
        Bm25Encoder(avg_len=0)
    with pytest.raises(ConfigError, match="stemmer"):
        Bm25Encoder(languages=("klingon",))
    with pytest.raises(ConfigError, match="unknown sparse encoder 'tfidf'"):
        make_sparse_encoder("tfidf")
    assert isinstance(make_sparse_encoder("bm25"), Bm25Encoder)


@pytest.mark.skipif(importlib.util.find_spec("FlagEmbedding") is not None,
                    reason="FlagEmbedding is installed")
def test_bge_sparse_without_extra_names_it() -> None:
    with pytest.raises(ConfigError, match=r"pip install 'evident-bot\[bge\]'"):
        make_sparse_encoder("bge-m3")


def test_remembered_words_give_what_analysing_them_afresh_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tokens, stems and term ids are remembered per word (bounded); a full cache is emptied, and the same
    text encodes the same whether its words were remembered, analysed afresh, or dropped midway."""
    import pipeline.models.sparse as sparse

    text = ("Deploy v2.1 and 10.0.0.1 on-call ab-7040 end.Next https://x.io/a_b Straße Häuser häuser "
            "Besprechungen running runs RUNNING 4GB x86_64 über_all")
    expected = ["deploy", "v2.1", "and", "10.0.0.1", "on", "call", "oncall", "ab", "7040", "ab7040", "end",
                "next", "https", "x", "io", "a", "b", "straße", "häuser", "häuser", "besprechungen",
                "running", "runs", "running", "4gb", "x86", "64", "x8664", "über", "all", "überall"]
    assert tokenize(text) == tokenize(text) == expected
    first = Bm25Encoder()
    remembered = [first.encode_document(text), first.encode_document(text)]
    monkeypatch.setattr(sparse, "CACHE_WORDS", 3)  # full after three words: emptied again and again
    for cache in (sparse._COMPOUNDS, sparse._TERM_IDS):
        cache.clear()
    small = Bm25Encoder()
    assert [small.encode_document(text), small.encode_document(text)] == remembered
    assert small.document_terms(text) == first.document_terms(text)
    assert max(len(c) for c in (sparse._COMPOUNDS, sparse._TERM_IDS, *small._stemmed.values())) <= 3
    assert remembered[0].indices == tuple(sorted({term_id(t) for t in first.document_terms(text)}))
    long = "x" * 70 + "-y"  # a token too long to keep
    assert tokenize(long) == ["x" * 70, "y", "x" * 70 + "y"] and long not in sparse._COMPOUNDS
