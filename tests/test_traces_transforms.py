"""Transforms: time window, rate scale, jitter and the train/eval split."""

from __future__ import annotations

import re

import numpy as np
import pytest

from env.traces.trace import Trace
from env.traces.transforms import TRAIN_SPLIT_S, jitter, rate_scale, split, time_window


def make_trace(arrival_s: list[float]) -> Trace:
    n = len(arrival_s)
    return Trace(name="t", arrival_s=np.asarray(arrival_s, dtype=np.float64),
                 prompt_tokens=np.arange(1, n + 1, dtype=np.int64),
                 output_tokens=np.arange(1, n + 1, dtype=np.int64) * 10,
                 slo_class=np.array([("interactive", "batch")[i % 2] for i in range(n)]),
                 source="src", skipped={"x": 2})


def test_time_window_keeps_start_inclusive_end_exclusive_and_rebases_on_start():
    window = time_window(make_trace([0.0, 1.0, 2.0, 3.0, 4.0]), 1.0, 3.0)
    assert window.arrival_s.tolist() == [0.0, 1.0]
    assert window.prompt_tokens.tolist() == [2, 3]
    assert window.slo_class.tolist() == ["batch", "interactive"]
    assert window.source == "src [window 1 s to 3 s]"
    assert window.skipped == {"x": 2}


def test_time_window_starts_at_the_window_not_the_first_request():
    assert time_window(make_trace([0.0, 5.5]), 5.0, 10.0).arrival_s.tolist() == [0.5]


def test_time_window_may_be_empty():
    assert len(time_window(make_trace([0.0, 1.0]), 2.0, 3.0)) == 0


@pytest.mark.parametrize("start_s, end_s", [(3.0, 3.0), (4.0, 3.0), (float("nan"), 3.0)])
def test_time_window_refuses_an_empty_or_undefined_interval(start_s, end_s):
    message = f"time window needs a finite start_s < end_s, got start_s={start_s}, end_s={end_s}"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        time_window(make_trace([0.0]), start_s, end_s)


def test_rate_scale_divides_arrival_times_by_the_factor():
    scaled = rate_scale(make_trace([0.0, 1.0, 3.0]), 2.0)
    assert scaled.arrival_s.tolist() == [0.0, 0.5, 1.5]
    assert scaled.prompt_tokens.tolist() == [1, 2, 3]
    assert scaled.mean_rate == pytest.approx(2 * make_trace([0.0, 1.0, 3.0]).mean_rate)
    assert scaled.source == "src [rate x2]"


@pytest.mark.parametrize("factor", [0.0, -1.0, float("inf"), float("nan")])
def test_rate_scale_refuses_a_factor_that_is_not_positive_and_finite(factor):
    with pytest.raises(ValueError, match=re.escape(
            f"rate scale factor must be a finite number > 0, got {factor}")):
        rate_scale(make_trace([0.0]), factor)


def test_jitter_spreads_requests_that_share_a_timestamp_over_the_step():
    quantised = make_trace([0.0] * 500 + [3.0] * 500)
    spread = jitter(quantised, 3.0, np.random.default_rng(0))
    assert np.all(np.diff(spread.arrival_s) >= 0)
    first, second = spread.arrival_s[:500], spread.arrival_s[500:]
    assert first.min() >= 0.0 and first.max() < 3.0
    assert second.min() >= 3.0 and second.max() < 6.0
    assert len(np.unique(spread.arrival_s)) == 1000
    # uniform over the step: the mean offset is half a step, within 4 standard errors
    assert (first.mean() - 1.5) == pytest.approx(0.0, abs=4 * 3.0 / np.sqrt(12 * 500))
    assert sorted(spread.prompt_tokens.tolist()) == list(range(1, 1001))
    assert spread.source == "src [jitter 3 s]"


def test_jitter_moves_lengths_and_classes_with_their_request():
    spread = jitter(make_trace([0.0, 0.0, 0.0, 0.0]), 3.0, np.random.default_rng(1))
    assert (spread.output_tokens == spread.prompt_tokens * 10).all()
    classes = {1: "interactive", 2: "batch", 3: "interactive", 4: "batch"}
    assert spread.slo_class.tolist() == [classes[p] for p in spread.prompt_tokens.tolist()]


def test_jitter_is_deterministic_given_the_generator():
    trace = make_trace([0.0, 0.0, 3.0, 3.0, 6.0])
    one = jitter(trace, 3.0, np.random.default_rng(7))
    two = jitter(trace, 3.0, np.random.default_rng(7))
    assert one.arrival_s.tolist() == two.arrival_s.tolist()
    assert one.prompt_tokens.tolist() == two.prompt_tokens.tolist()


def test_jitter_refuses_a_step_that_is_not_positive():
    with pytest.raises(ValueError, match=r"^jitter step_s must be a finite number of seconds > 0, "
                                         r"got 0\.0$"):
        jitter(make_trace([0.0]), 0.0, np.random.default_rng(0))


def test_train_split_is_the_first_40_minutes():
    assert TRAIN_SPLIT_S == 2400.0
    train = split(make_trace([0.0, 100.0, 2399.9, 2400.0, 3000.0]), "train")
    assert train.arrival_s.tolist() == [0.0, 100.0, 2399.9]
    assert train.source == "src [train: before 2400 s]"


def test_eval_split_is_the_rest_rebased_to_the_split():
    evaluation = split(make_trace([0.0, 100.0, 2399.9, 2400.0, 3000.0]), "eval")
    assert evaluation.arrival_s.tolist() == [0.0, 600.0]
    assert evaluation.prompt_tokens.tolist() == [4, 5]
    assert evaluation.source == "src [eval: from 2400 s, re-based]"


def test_all_split_is_the_whole_trace():
    trace = make_trace([0.0, 3000.0])
    assert split(trace, "all") is trace


def test_split_refuses_an_empty_part():
    message = ("trace 't' has no request in its eval part: it spans 0 s to 1800 s and the split "
               "is at 2400 s")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        split(make_trace([0.0, 1800.0]), "eval")


def test_split_refuses_an_unknown_part():
    with pytest.raises(ValueError, match=r"^unknown split part 'test'; expected train, eval or "
                                         r"all$"):
        split(make_trace([0.0]), "test")
