"""Chart the ablations (ours vs the paper) from `evident eval retrieval --ablation X --output FILE` reports.

    python benchmarks/plot_ablations.py reports/ablation-context.json reports/ablation-tables.json \
        reports/ablation-ranking.json --out docs/ablations.png
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("reports", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=Path("docs/ablations.png"))
    ap.add_argument("--query", default="completed", help="query type to chart (EN+DE average)")
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    for path in args.reports:
        rep = json.loads(path.read_text(encoding="utf-8"))
        by_variant: dict[str, list[float]] = defaultdict(list)
        paper: dict[str, float | None] = {}
        kind = ""
        for row in rep["rows"]:
            if row["query"] != args.query:
                continue
            kind = row["ablation"]
            by_variant[row["variant"]].append(row["p_at_1"])
            paper[row["variant"]] = row.get("paper_p_at_1")
        panels.append((kind, {v: sum(xs) / len(xs) for v, xs in by_variant.items()}, paper))

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (kind, ours, paper) in zip(axes[0], panels, strict=True):
        names = list(ours)
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [ours[n] for n in names], width=0.4, label="evident (CPU, offline)")
        ax.bar(
            [x + 0.2 for x in xs], [paper.get(n) or 0 for n in names], width=0.4, label="paper (GPU, bge-m3)"
        )
        ax.set_xticks(list(xs), names, rotation=30)
        ax.set_ylim(0, 1)
        ax.set_title(
            f"{kind}: P@1, {args.query} questions, EN+DE\n(ours: URL match by Confluence page id)", fontsize=9
        )
        ax.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
