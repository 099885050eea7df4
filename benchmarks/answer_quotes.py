"""What quoting beneath a rewrite would show, from stored ``evident eval answers --output`` reports: a run
with an LLM in the ``draft`` style (each turn's model answer, its draft and whether the guard showed the
draft) and optionally the same turns without an LLM (quoting). No model is called: the rule in
``pipeline.answer.draft_quotes`` is applied to the stored replies at several word shares.

    python benchmarks/answer_quotes.py LLM.json [--quoting OFFLINE.json] [--shares 0,0.5,0.667,1]

Prints per language: gold contained, token F1 and median words for the model's replies, the answers shown
(the guard's choice), the shown answers with the units they leave out quoted beneath at each share (and
"not found" replies judged by the guard as the code has it now), and quoting; and, per share, the turns where
it contains the gold and quoting does not, and the other way. History is the run's: a follow-up's
completion saw the answers as that run showed them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.answer.citations import is_out_of_scope
from pipeline.answer.draft_guard import keeps_draft
from pipeline.answer.draft_quotes import left_out_units, with_quotes
from pipeline.evaluation.answers import contains_gold, token_f1


def shown_with_quotes(turn: dict[str, Any], share: float) -> str:
    """The answer the turn would show with the units its rewrite leaves out quoted beneath it."""
    if guarded(turn) or not turn.get("draft"):
        return str(turn["answer"])  # the guard showed the draft, or there was none
    reply = own_reply(turn)
    if not reply.strip() or is_out_of_scope(reply):  # the guard's "not found" rule as the code has it now
        return str(turn["draft"]) if keeps_draft(reply, turn["question"], turn["draft"]) else reply
    return with_quotes(reply, left_out_units(reply, turn["question"], turn["draft"], share=share))


def guarded(turn: dict[str, Any]) -> bool:
    """Whether the draft guard showed the quote instead of the model's answer."""
    return turn.get("model_reply") is not None and not turn.get("quoted_beneath")


def own_reply(turn: dict[str, Any]) -> str:
    """The model's own answer (a run with quotes beneath keeps it as ``model_reply``)."""
    return str(turn["model_reply"] if turn.get("quoted_beneath") else turn["answer"])


def shown_without_quotes(turn: dict[str, Any]) -> str:
    """What the turn shows with the guard alone."""
    return str(turn["answer"]) if guarded(turn) else own_reply(turn)


def row(name: str, turns: list[dict[str, Any]], texts: list[str]) -> dict[str, Any]:
    lang = turns[0]["lang"]
    return {"answers": name,
            "contained": sum(contains_gold(x, t["gold"], lang) for t, x in zip(turns, texts, strict=True)),
            "f1": statistics.fmean(token_f1(x, t["gold"], lang) for t, x in zip(turns, texts, strict=True)),
            "words": statistics.median(len(x.split()) for x in texts), "n": len(turns)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("llm", type=Path)
    ap.add_argument("--quoting", type=Path)
    ap.add_argument("--shares", default="0,0.5,0.667,1")
    args = ap.parse_args()
    shares = [float(s) for s in args.shares.split(",")]
    turns = json.loads(args.llm.read_text())["turns"]
    offline = {}
    if args.quoting:
        stored = json.loads(args.quoting.read_text())["turns"]
        offline = {(t["lang"], t["conv_id"], t["turn"]): t for t in stored}
    for lang in sorted({t["lang"] for t in turns}):
        mine = [t for t in turns if t["lang"] == lang]
        rows = [row("model's replies", mine, [t["model_reply"] or t["answer"] for t in mine]),
                row("shown (guard)", mine, [shown_without_quotes(t) for t in mine]),
                row("shown as run", mine, [t["answer"] for t in mine])]
        quoted = {s: [shown_with_quotes(t, s) for t in mine] for s in shares}
        rows += [row(f"shown + left-out units at share {s:g}", mine, quoted[s]) for s in shares]
        pairs = [offline.get((t["lang"], t["conv_id"], t["turn"])) for t in mine]
        if args.quoting and all(pairs):
            rows.append(row("quoting (no LLM)", mine, [p["answer"] for p in pairs if p]))
        print(f"\n{lang}: {len(mine)} turns")
        for r in rows:
            print(f"  {r['answers']:<40} contained {r['contained']:>3} ({r['contained'] / r['n']:.3f})  "
                  f"F1 {r['f1']:.3f}  median words {r['words']:g}")
        if args.quoting and all(pairs):
            for s in shares:
                win = sum(contains_gold(x, t["gold"], lang) > p["containment"]
                          for t, x, p in zip(mine, quoted[s], pairs, strict=True) if p)
                lose = sum(contains_gold(x, t["gold"], lang) < p["containment"]
                           for t, x, p in zip(mine, quoted[s], pairs, strict=True) if p)
                print(f"  share {s:g} against quoting: contains the gold in {win} turns quoting misses, "
                      f"misses it in {lose}")


if __name__ == "__main__":
    main()
