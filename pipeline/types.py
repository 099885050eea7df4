"""Dataclasses that carry data between pipeline stages.

Stages exchange these plain values, never library objects, so each stage can be tested alone and the
index/LLM backends stay swappable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # annotations only: the access rules depend on nothing here
    from pipeline.access.scope import AccessScope, PageAccess

EvidenceKind = Literal["passage", "list", "table", "row"]
EVIDENCE_KINDS: tuple[EvidenceKind, ...] = ("passage", "list", "table", "row")


@dataclass(frozen=True)
class Page:
    """One Confluence page as a connector delivers it. ``body`` is storage-format XHTML."""

    id: str
    title: str
    url: str
    space: str
    body: str
    version: int | None = None
    updated: str | None = None  # ISO 8601, UTC
    ancestors: tuple[str, ...] = ()  # ancestor titles, root first
    labels: tuple[str, ...] = ()
    access: PageAccess | None = None  # who may read it (``pipeline.access.scope``); None: not known


# ---------------------------------------------------------------- parsed page elements


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    """Running text: paragraphs, code blocks, quotes, macro bodies."""

    text: str


@dataclass(frozen=True)
class ListBlock:
    """A (possibly nested) list. ``items`` are flattened, nested items indented by two spaces per level."""

    items: tuple[str, ...]
    ordered: bool = False


@dataclass(frozen=True)
class Table:
    """A table with expanded row/colspans: every row has exactly ``len(headers)`` cells."""

    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    caption: str = ""


Element = Heading | Paragraph | ListBlock | Table


# ---------------------------------------------------------------- evidence


@dataclass(frozen=True)
class Evidence:
    """One retrievable unit (paper: passage, list, table, or verbalized table row).

    ``text`` is the raw content; the contextualized text for indexing and prompting is derived from it
    together with ``title``/``headings``/``before``/``after`` (see ``pipeline.ingest.contextualize``).
    """

    id: str  # stable uuid5 string
    page_id: str
    title: str
    url: str
    space: str
    kind: EvidenceKind
    position: int  # order within the page
    text: str
    headings: tuple[str, ...] = ()  # heading path, outermost first
    before: str = ""  # nearest neighbouring evidence text (a row/item for tables/lists)
    after: str = ""
    breadcrumb: tuple[str, ...] = ()  # ancestor page titles
    table_index: int | None = None  # 1-based table number within the page, for table/row
    row_index: int | None = None  # 1-based row number, for rows
    access: PageAccess | None = None  # its page's (``pipeline.access.scope``); None: not known

    @property
    def heading(self) -> str:
        """The nearest preceding heading (the paper's 'heading' context item)."""
        return self.headings[-1] if self.headings else ""


@dataclass(frozen=True)
class SparseVector:
    indices: tuple[int, ...]
    values: tuple[float, ...]


@dataclass(frozen=True)
class IndexPoint:
    """What an ``Index`` stores for one evidence."""

    evidence: Evidence
    content: str  # contextualized text that was embedded
    dense: tuple[float, ...]
    sparse: SparseVector
    page_hash: str  # content hash of the page version this evidence came from


@dataclass(frozen=True)
class Hit:
    """One retrieved evidence with its score and 1-based rank in the list it came from."""

    evidence: Evidence
    score: float
    rank: int
    content: str = ""


RetrievalMode = Literal["lexical", "dense", "hybrid"]


@dataclass(frozen=True)
class SearchRequest:
    """A query against the index, within ``scope``: the spaces and readers it may return evidence for."""

    dense: tuple[float, ...] | None
    sparse: SparseVector | None
    scope: AccessScope
    mode: RetrievalMode = "hybrid"
    lexical_k: int = 10
    dense_k: int = 10
    limit: int = 10
    fusion: Literal["rrf", "dbsf"] = "rrf"  # rank fusion, or score pooling (distribution-based score fusion)
    rrf_k: int = 60
    weights: tuple[float, float] | None = None  # (lexical, dense) for weighted RRF


# ---------------------------------------------------------------- answers


@dataclass(frozen=True)
class Citation:
    """A page cited by an answer. ``number`` is the ``[n]`` shown to the user."""

    number: int
    url: str
    title: str
    space: str
    evidence_ids: tuple[str, ...]


@dataclass
class AnswerTrace:
    """How an answer came about, for ``ask --trace``, the store and explain."""

    raw_answer: str | None = None  # the generator's text before citation parsing
    dropped_for_budget: list[str] = field(default_factory=list)  # evidence ids cut to fit the context
    prompt: list[ChatMessage] | None = None  # only when tracing
    warning: str | None = None
    notice: str | None = None
    model_reply: str | None = None  # the model's own answer where the shown one differs: the draft guard
    # showed the quote instead, or quoted units beneath it (``quoted_beneath``)
    draft: str | None = None  # ``draft`` style: the quote the model was given to rewrite ("[Source n]" cited)
    quoted_beneath: int = 0  # ``draft`` style: the draft's units the rewrite left out, quoted beneath it
    # what explanations regenerate against where it is not ``raw_answer``: the model's answer without the
    # units quoted beneath it (they are the sources' own words, cited)
    explained: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    question_terms: list[str] = field(default_factory=list)  # extractive answers: the terms matched
    unit_scores: list[float] = field(default_factory=list)  # extractive answers: the chosen units' scores


@dataclass
class Answer:
    text: str
    citations: list[Citation] = field(default_factory=list)
    out_of_scope: bool = False
    extractive: bool = False
    model: str = ""
    evidence: list[Hit] = field(default_factory=list)  # the numbered sources shown to the generator
    trace: AnswerTrace = field(default_factory=AnswerTrace)
    confidence: str | None = None  # retrieval's: high | medium | low (``pipeline.answer.confidence``)


@dataclass(frozen=True)
class ChatMessage:
    role: Literal["system", "user", "assistant"]
    content: str
