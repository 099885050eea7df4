"""Metrics: counters/histograms move, registries are independent, the exposition parses as Prometheus text."""

from __future__ import annotations

import threading

import pytest

from pipeline.errors import AuthError, RateLimitedError, TransientError, UnreachableError
from pipeline.runtime.metrics import Counter, Histogram, Metrics, error_kind


def _families(text: str) -> dict[str, object]:
    parser = pytest.importorskip("prometheus_client.parser")
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def test_counters_move_and_registries_are_independent() -> None:
    a, b = Metrics(), Metrics()
    a.questions.inc()
    a.questions.inc(2)
    a.llm_calls.inc(role="answer")
    a.llm_calls.inc(role="answer")
    a.llm_calls.inc(role="counterfactual")
    assert a.questions.value() == 3
    assert a.llm_calls.value(role="answer") == 2
    assert a.llm_calls.value(role="counterfactual") == 1
    assert b.questions.value() == 0
    assert b.llm_calls.value(role="answer") == 0


def test_wrong_labels_and_negative_increments_are_rejected() -> None:
    m = Metrics()
    with pytest.raises(ValueError, match="role"):
        m.llm_calls.inc(kind="x")
    with pytest.raises(ValueError, match="labels"):
        m.questions.inc(role="x")
    with pytest.raises(ValueError, match="only go up"):
        m.questions.inc(-1)


def test_histogram_buckets_sum_count_and_timer() -> None:
    h = Histogram("t_seconds", "test", buckets=(1.0, 5.0))
    for v in (0.5, 1.0, 3.0, 7.0):
        h.observe(v)
    with h.time():
        pass
    assert h.count() == 5
    assert h.sum() == pytest.approx(11.5, abs=0.01)
    lines = h.expose()
    assert 't_seconds_bucket{le="1.0"} 3.0' in lines  # 0.5, 1.0 and the ~0 s timer
    assert 't_seconds_bucket{le="5.0"} 4.0' in lines
    assert 't_seconds_bucket{le="+Inf"} 5.0' in lines
    assert "t_seconds_count 5.0" in lines


def test_timer_observes_when_the_block_raises() -> None:
    m = Metrics()
    with pytest.raises(RuntimeError), m.answer_seconds.time():
        raise RuntimeError("boom")
    assert m.answer_seconds.count() == 1


def test_exposition_parses_with_expected_values() -> None:
    m = Metrics()
    m.questions.inc()
    m.llm_calls.inc(role="answer")
    m.llm_errors.inc(kind=error_kind(RateLimitedError("slow down", retry_after_s=1)))
    m.sync_pages.inc(3, result="indexed")
    m.sync_pages.inc(result='we"ird\\label\nvalue')
    m.sync_errors.inc()
    m.answer_seconds.observe(0.3)
    m.explain_seconds.observe(12.0)
    text = m.render()
    assert text.endswith("\n")
    assert "# TYPE evident_answer_seconds histogram" in text
    fams = _families(text)
    assert set(fams) >= {"evident_questions", "evident_llm_calls", "evident_llm_errors", "evident_sync_pages",
                         "evident_sync_errors", "evident_answer_seconds", "evident_explain_seconds"}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in fams.values() for s in fam.samples}  # type: ignore[attr-defined]
    assert samples[("evident_questions_total", ())] == 1
    assert samples[("evident_llm_calls_total", (("role", "answer"),))] == 1
    assert samples[("evident_llm_errors_total", (("kind", "rate_limited"),))] == 1
    assert samples[("evident_sync_pages_total", (("result", "indexed"),))] == 3
    assert samples[("evident_sync_pages_total", (("result", 'we"ird\\label\nvalue'),))] == 1
    assert samples[("evident_sync_errors_total", ())] == 1
    assert samples[("evident_answer_seconds_count", ())] == 1
    assert samples[("evident_answer_seconds_bucket", (("le", "0.5"),))] == 1
    assert samples[("evident_explain_seconds_bucket", (("le", "10.0"),))] == 0
    assert samples[("evident_explain_seconds_bucket", (("le", "+Inf"),))] == 1


def test_unlabelled_counters_are_exported_at_zero() -> None:
    text = Metrics().render()
    assert "evident_questions_total 0.0" in text
    assert "Slack or the CLI" not in text and "Slack, Teams" in text  # every platform counts
    assert "evident_sync_errors_total 0.0" in text
    assert "evident_answer_seconds_count 0.0" in text


def test_concurrent_increments_are_not_lost() -> None:
    c = Counter("c_total", "test")

    def work() -> None:
        for _ in range(2000):
            c.inc()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.value() == 8000


def test_error_kind_maps_the_exception_tree() -> None:
    assert error_kind(TransientError("x")) == "transient"
    assert error_kind(AuthError("x")) == "auth"
    assert error_kind(UnreachableError("x")) == "unreachable"
    assert error_kind(KeyError("x")) == "other"
