"""Pool several ``evident eval attribution --output`` files (chunks of one sample run one after another, so a
slow local LLM's run can stop between them) and report accuracy, the faithfulness metrics and the paired
sign-flip tests against ``naive`` per language and pooled, as the eval reports one file.

    python benchmarks/attribution_pool.py faith-A-en.json faith-A-de.json faith-B-en.json faith-B-de.json

A question measured in two files counts once (the last file's row).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from pipeline.evaluation.faithfulness import METRICS, Faithfulness, paired, summary

Key = tuple[str, str, int]


def load(paths: list[Path]) -> dict[str, dict[Key, dict[str, Any]]]:
    """method -> (lang, conversation, turn) -> the question's row."""
    rows: dict[str, dict[Key, dict[str, Any]]] = defaultdict(dict)
    for path in paths:
        for row in json.loads(path.read_text())["questions"]:
            rows[row["method"]][(row["lang"], str(row["conv_id"]), int(row["turn"]))] = row
    return rows


def report(rows: dict[str, dict[Key, dict[str, Any]]], lang: str | None) -> str:
    chosen = {m: {k: r for k, r in by.items() if lang is None or k[0] == lang} for m, by in rows.items()}
    faith = {m: {k: Faithfulness(**{x: r[x] for x in METRICS}) for k, r in by.items() if METRICS[0] in r}
             for m, by in chosen.items()}
    lines = [f"## {lang or 'pooled'}", "| method | n | accuracy | " + " | ".join(METRICS) + " |",
             "|---" * (3 + len(METRICS)) + "|"]
    for method, by in chosen.items():
        accuracy = sum(r["correct"] for r in by.values()) / len(by) if by else 0.0
        means = summary(list(faith[method].values()))
        lines.append(f"| {method} | {len(by)} | {accuracy:.3f} | "
                     + " | ".join(f"{means[x]:.4f}" if means[x] is not None else "-" for x in METRICS) + " |")
    for row in paired(faith):
        lines.append(f"{row['method']} - naive (n {row['n']}): " + ", ".join(
            f"{x} {row[x + '_diff']:+.4f} (p {row[x + '_p']:.4f})" for x in METRICS
            if row[x + "_diff"] is not None))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outputs", nargs="+", type=Path, help="evident eval attribution --output files")
    a = ap.parse_args()
    rows = load(a.outputs)
    langs = sorted({k[0] for by in rows.values() for k in by})
    print("\n\n".join(report(rows, lang) for lang in [*langs, None]))


if __name__ == "__main__":
    main()
