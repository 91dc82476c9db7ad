"""Trace: the sliding 1-s peak that stats() reports, and the skipped-rows report."""

from __future__ import annotations

import numpy as np
import pytest

from env.traces.trace import Trace


def make_trace(arrival_s: list[float], skipped: dict[str, int] | None = None) -> Trace:
    n = len(arrival_s)
    return Trace(name="t", arrival_s=np.asarray(arrival_s, dtype=np.float64),
                 prompt_tokens=np.full(n, 10, dtype=np.int64),
                 output_tokens=np.full(n, 5, dtype=np.int64),
                 slo_class=np.full(n, "interactive"), skipped=skipped or {})


def test_peak_counts_a_window_that_straddles_whole_seconds():
    # Bins [0, 1) and [1, 2) hold 2 requests each; the window [0.6, 1.6) holds all 4.
    trace = make_trace([0.0, 0.6, 0.9, 1.2, 1.5, 2.7])
    assert trace.peak_requests_in(1.0) == 4


def test_peak_window_is_half_open():
    assert make_trace([0.0, 1.0, 2.0]).peak_requests_in(1.0) == 1


def test_peak_of_empty_trace_is_zero():
    assert make_trace([]).peak_requests_in(1.0) == 0


def test_peak_refuses_non_positive_window():
    with pytest.raises(ValueError, match=r"^window_s must be positive, got 0$"):
        make_trace([0.0]).peak_requests_in(0)


def test_stats_peak_is_sliding_peak_over_mean_rate():
    trace = make_trace([0.0, 0.6, 0.9, 1.2, 1.5, 2.5])
    assert trace.stats()["peak_1s_over_mean"] == pytest.approx(4 / (5 / 2.5))


def test_skipped_report_lists_each_reason_with_its_count():
    trace = make_trace([0.0], skipped={"zero_response_tokens (failed request)": 12,
                                       "zero_prompt_tokens (engine cannot serve)": 1})
    assert trace.skipped_report() == (
        "t: skipped 13 rows by rule: 12 zero_response_tokens (failed request), "
        "1 zero_prompt_tokens (engine cannot serve)")


def test_skipped_report_says_when_nothing_was_skipped():
    assert make_trace([0.0]).skipped_report() == "t: no rows skipped"


def test_skipped_report_uses_singular_for_one_row():
    assert make_trace([0.0], skipped={"x": 1}).skipped_report() == "t: skipped 1 row by rule: 1 x"
