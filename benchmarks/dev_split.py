"""What the retrieval benchmarks share: the ConfQuestions dev split's arguments and its cached eval index."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from connectors.local import LocalFolderConnector
from evident.settings import Settings
from pipeline.evaluation.data import QATurn, load_conversations
from pipeline.evaluation.index_cache import eval_expander, open_eval_index

REPO = Path(__file__).resolve().parent.parent


def add_dev_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--questions", type=Path, default=REPO.parent / "shared/confquestions/qa-dev.json")
    ap.add_argument("--documents", type=Path, default=REPO.parent / "shared/confquestions/documents")


async def open_dev(args: argparse.Namespace,
                   settings: Settings) -> tuple[list[list[QATurn]], Any, Any, Any, Any]:
    """The dev conversations and the (cached) index of the documents: conversations, index, embedder, sparse,
    and the keyword expander over the index's vocabulary (None when expansion is off)."""
    docs = args.documents.resolve()
    index, embedder, sparse, _ = await open_eval_index(
        settings, str(docs), lambda: LocalFolderConnector([docs]).iter_pages(), progress=False)
    expander = eval_expander(settings, str(docs), embedder, sparse)
    return load_conversations(args.questions), index, embedder, sparse, expander
