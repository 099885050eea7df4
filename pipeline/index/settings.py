"""The index area: the embedded Qdrant Edge index or a Qdrant server/cluster."""

from __future__ import annotations

from typing import Literal

from pipeline.runtime.config import Area, HttpUrl, OptionalPath, SecretStr, setting


class IndexSettings(Area):
    title = "Index"

    qdrant_url: HttpUrl = setting(
        None, "QDRANT_URL", "Qdrant server/cluster URL. Unset: embedded Qdrant Edge."
    )
    qdrant_api_key: SecretStr = setting(SecretStr(""), "QDRANT_API_KEY", "API key for the Qdrant server.")
    collection: str = setting("evident", "EVIDENT_COLLECTION", "Qdrant collection name.")
    shard_number: int = setting(
        1, "EVIDENT_SHARD_NUMBER", "Shards when creating the collection on a cluster.", ge=1
    )
    replication_factor: int = setting(
        1, "EVIDENT_REPLICATION_FACTOR", "Replicas per shard on a cluster.", ge=1
    )
    write_consistency_factor: int = setting(1, "EVIDENT_WRITE_CONSISTENCY_FACTOR",
                                            "Replicas that must ack a write.", ge=1)
    index_process: Literal["auto", "yes", "no"] = setting(
        "auto",
        "EVIDENT_INDEX_PROCESS",
        "Run the embedded index in a worker process: auto (in serve: yes) | yes | "
        "no. Qdrant Edge holds the GIL while it builds segments; in a worker the bot never stalls.",
    )
    index_wait_s: float = setting(
        600.0,
        "EVIDENT_INDEX_WAIT_S",
        "How long a command waits for the embedded index while another process uses it.",
        ge=0,
    )
    index_build_quiet_s: float = setting(
        20.0,
        "EVIDENT_INDEX_BUILD_QUIET_S",
        "In the index worker (serve): build the segments a sync filled once no request has come for this "
        "many seconds, so searches never queue behind a build. 0: at the end of each sync.",
        ge=0,
    )
    index_build_max_pending: int = setting(
        20_000,
        "EVIDENT_INDEX_BUILD_MAX_PENDING",
        "In the index worker (serve): build at once when this many written points wait (they are searched "
        "exhaustively until built).",
        ge=0,
    )
    index_trace_file: OptionalPath = setting(
        None,
        "EVIDENT_INDEX_TRACE_FILE",
        "Diagnostics: serve's index worker appends a JSON line per request here (operation, ms queued "
        "behind other requests (writes and maintenance; a question's go at once), round trip, execution and "
        "CPU in the worker); the file grows until removed. "
        "Only with the index in a worker process (EVIDENT_INDEX_PROCESS). Unset: off.",
    )
