"""`evident eval judge`: how far the judge model agrees with people on the RAGAS-style metrics.

The sample (``tests/data/judge_sample.json``) holds answers with hand-made labels: ``faithfulness`` (the
share of the answer's claims its sources support; null for an answer without claims), ``relevant`` (0/1),
``useful`` (per source, 0/1) and ``recall`` (the share of the reference answer the sources contain). The judge
scores every item with ``RagasJudge``; agreement is reported per metric:

- faithfulness and context recall: both sides called "supported" at 0.75 or more, then accuracy and Cohen's
  kappa over the items both scored, and the mean absolute difference;
- answer relevancy: ROC AUC of the judge's score for telling relevant from irrelevant answers (the score is a
  similarity, so no threshold is assumed), and its mean per class;
- context precision: accuracy and kappa of the judge's per-source verdicts against the labels.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.evaluation.ragas import RagasJudge, RagasScores

SUPPORTED = 0.75


@dataclass(frozen=True)
class LabelledAnswer:
    id: str
    lang: str
    question: str
    sources: tuple[str, ...]
    answer: str
    gold: str
    faithfulness: float | None
    relevant: int
    useful: tuple[int, ...]
    recall: float


def load_sample(path: Path) -> list[LabelledAnswer]:
    """The labelled answers of ``path``; ``InputError`` naming the file and item when one is malformed."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        out = []
        for item in raw["items"]:
            labels = item["labels"]
            sources = tuple(str(s) for s in item["sources"])
            useful = tuple(int(v) for v in labels["useful"])
            if len(useful) != len(sources):
                raise ValueError(
                    f"item {item['id']}: {len(useful)} 'useful' labels for {len(sources)} sources"
                )
            faith = labels["faithfulness"]
            out.append(
                LabelledAnswer(
                    str(item["id"]),
                    str(item["lang"]),
                    str(item["question"]),
                    sources,
                    str(item["answer"]),
                    str(item["gold"]),
                    None if faith is None else float(faith),
                    int(labels["relevant"]),
                    useful,
                    float(labels["recall"]),
                )
            )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: not a judge sample ({exc})") from exc
    return out


def kappa(a: Sequence[int], b: Sequence[int]) -> float | None:
    """Cohen's kappa of two binary labelings (None when undefined: fewer than 2 items or chance agreement
    1)."""
    n = len(a)
    if n < 2:
        return None
    observed = sum(x == y for x, y in zip(a, b, strict=True)) / n
    pa, pb = sum(a) / n, sum(b) / n
    chance = pa * pb + (1 - pa) * (1 - pb)
    return None if chance >= 1 else (observed - chance) / (1 - chance)


def auc(scores: Sequence[float], labels: Sequence[int]) -> float | None:
    """ROC AUC: the chance that a positive scores above a negative (ties count half); None without both."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return None
    wins = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def _binary_agreement(human: Sequence[float | None], judge: Sequence[float | None]) -> dict[str, Any]:
    pairs = [(h, j) for h, j in zip(human, judge, strict=True) if h is not None and j is not None]
    hb = [int(h >= SUPPORTED) for h, _ in pairs]
    jb = [int(j >= SUPPORTED) for _, j in pairs]
    return {
        "n": len(pairs),
        "missing": sum(h is not None and j is None for h, j in zip(human, judge, strict=True)),
        "accuracy": _round(sum(x == y for x, y in zip(hb, jb, strict=True)) / len(pairs) if pairs else None),
        "kappa": _round(kappa(hb, jb)),
        "mean_abs_diff": _round(sum(abs(h - j) for h, j in pairs) / len(pairs) if pairs else None),
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


async def judge_sample(sample: Sequence[LabelledAnswer], judge: RagasJudge) -> list[RagasScores]:
    """The judge's scores for every labelled answer, in order."""
    return [await judge.score(item.question, item.answer, item.gold, item.sources) for item in sample]


def agreement(sample: Sequence[LabelledAnswer], scores: Sequence[RagasScores]) -> dict[str, Any]:
    """Per metric, how far the judge's ``scores`` agree with the sample's labels (see the module
    docstring)."""
    relevancy = [(s.answer_relevancy, item.relevant) for item, s in zip(sample, scores, strict=True)
                 if s.answer_relevancy is not None]
    verdict_pairs = [
        (h, j)
        for item, s in zip(sample, scores, strict=True)
        if len(s.verdicts) == len(item.useful)
        for h, j in zip(item.useful, s.verdicts, strict=True)
    ]

    def mean(xs: list[float]) -> float | None:
        return _round(sum(xs) / len(xs)) if xs else None

    return {
        "items": len(sample),
        "faithfulness": _binary_agreement([i.faithfulness for i in sample], [s.faithfulness for s in scores]),
        "context_recall": _binary_agreement([i.recall for i in sample], [s.context_recall for s in scores]),
        "answer_relevancy": {
            "n": len(relevancy),
            "missing": len(sample) - len(relevancy),
            "auc": _round(auc([s for s, _ in relevancy], [y for _, y in relevancy])),
            "mean_relevant": mean([s for s, y in relevancy if y]),
            "mean_irrelevant": mean([s for s, y in relevancy if not y]),
        },
        "context_precision": {
            "sources": len(verdict_pairs),
            "missing_items": sum(
                len(s.verdicts) != len(i.useful) for i, s in zip(sample, scores, strict=True)
            ),
            "accuracy": _round(
                sum(h == j for h, j in verdict_pairs) / len(verdict_pairs) if verdict_pairs else None
            ),
            "kappa": _round(kappa([h for h, _ in verdict_pairs], [j for _, j in verdict_pairs])),
        },
    }


def format_agreement(report: dict[str, Any]) -> str:
    f, r, a, p = (
        report[k] for k in ("faithfulness", "context_recall", "answer_relevancy", "context_precision")
    )
    return "\n".join([
        f"judge agreement on {report['items']} hand-labelled answers",
        f"faithfulness       n {f['n']:>3}  accuracy {f['accuracy']}  kappa {f['kappa']}  "
        f"mean |diff| {f['mean_abs_diff']}  missing {f['missing']}",
        f"context recall     n {r['n']:>3}  accuracy {r['accuracy']}  kappa {r['kappa']}  "
        f"mean |diff| {r['mean_abs_diff']}  missing {r['missing']}",
        f"answer relevancy   n {a['n']:>3}  AUC {a['auc']}  mean relevant {a['mean_relevant']}  "
        f"mean irrelevant {a['mean_irrelevant']}  missing {a['missing']}",
        f"context precision  sources {p['sources']:>3}  accuracy {p['accuracy']}  kappa {p['kappa']}  "
        f"items missing {p['missing_items']}",
    ])
