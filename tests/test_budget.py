"""Context budget: rank order, dropping, and truncation only at row/sentence boundaries."""

from __future__ import annotations

from pipeline.answer.budget import estimate_tokens, fit_evidence, split_units, truncate_at_boundary


def words(text: str) -> int:
    return len(text.split())


def test_estimate_is_conservative_chars_over_3_5() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcdefg") == 2
    assert estimate_tokens("a" * 8) == 3


def test_everything_fits() -> None:
    items = [("a", "one two"), ("b", "three")]
    r = fit_evidence(items, budget_tokens=10, count_tokens=words)
    assert r.kept == items and r.dropped == [] and r.truncated == []


def test_lowest_ranked_dropped_first() -> None:
    items = [(f"e{i}", "w " * 10) for i in range(5)]
    r = fit_evidence(items, budget_tokens=30, count_tokens=words)
    assert [i for i, _ in r.kept] == ["e0", "e1", "e2"]
    assert r.dropped == ["e3", "e4"] and r.truncated == []


def test_per_item_overhead_counts() -> None:
    items = [(f"e{i}", "w " * 10) for i in range(3)]
    r = fit_evidence(items, budget_tokens=30, count_tokens=words, per_item_overhead=2)
    assert [i for i, _ in r.kept] == ["e0", "e1"]


def test_huge_table_never_split_inside_a_row() -> None:
    rows = [f"Row {i} in Table 1: Member is Person {i}, and Task is Write the report. Then review it."
            for i in range(1, 401)]
    table = "Table 1 of Team page\n" + "\n".join(rows)
    small = "Alice leads the team. She joined in 2021."
    for budget in (40, 97, 250, 1000, 3333):
        r = fit_evidence([("p", small), ("t", table), ("z", "tail")], budget_tokens=budget)
        kept = dict(r.kept)
        assert sum(estimate_tokens(t) for t in kept.values()) <= budget
        assert kept["p"] == small
        assert "t" in r.truncated and r.dropped == ["z"]
        lines = kept["t"].split("\n")
        assert lines[0] == "Table 1 of Team page"
        assert lines[1:] == rows[: len(lines) - 1]  # whole rows only, in order


def test_sentence_boundary_truncation() -> None:
    text = "The deadline is 5 May. Reviews happen e.g. on Fridays and v1.2 ships then. Last sentence here!"
    units = split_units(text)
    assert units == ["The deadline is 5 May. ", "Reviews happen e.g. on Fridays and v1.2 ships then. ",
                     "Last sentence here!"]
    assert (
        truncate_at_boundary(text, 14, words)
        == "The deadline is 5 May. Reviews happen e.g. on Fridays and v1.2 ships then."
    )
    assert truncate_at_boundary(text, 13, words) == "The deadline is 5 May."
    assert truncate_at_boundary(text, 4, words) == ""


def test_item_with_no_fitting_unit_is_dropped_with_the_rest() -> None:
    big = "x " * 50  # one sentence, no boundary
    r = fit_evidence(
        [("a", "one two three"), ("b", big), ("c", "tiny")], budget_tokens=10, count_tokens=words
    )
    assert r.kept == [("a", "one two three")] and r.dropped == ["b", "c"] and r.truncated == []


def test_zero_budget_drops_all() -> None:
    r = fit_evidence([("a", "x")], budget_tokens=0, count_tokens=words)
    assert r.kept == [] and r.dropped == ["a"]
