"""The interval and run percentiles: the short cuts give the figures of the plain formulas."""

from __future__ import annotations

import math
import random

import numpy as np

from runtime.engine.metrics import IntervalStats, fast_p99, percentiles


def nearest_rank_p99(values: list[float]) -> float:
    n = len(values)
    return 0.0 if n == 0 else sorted(values)[min(n - 1, math.ceil(0.99 * n) - 1)]


def test_fast_p99_is_the_nearest_rank_p99_at_every_length():
    rng = random.Random(3)
    for n in range(0, 260):
        for _ in range(5):
            values = [rng.lognormvariate(0.0, 1.0) for _ in range(n)]
            assert fast_p99(values) == nearest_rank_p99(values)
    assert fast_p99([2.0, 7.0, 1.0]) == 7.0
    assert fast_p99(list(range(100, 0, -1))) == 99  # from 100 values on, not the largest


def test_a_closed_interval_reads_its_p99s_once_and_an_open_one_reads_its_lists():
    iv = IntervalStats()
    iv.ttft_ratios += [0.5, 3.0]
    iv.tpot_ratios.append(0.25)
    assert (iv.ttft_p99_ratio, iv.tpot_p99_ratio) == (3.0, 0.25)
    iv.ttft_ratios.append(4.0)  # open: the list is read each time
    assert iv.ttft_p99_ratio == 4.0
    iv.close_percentiles()
    assert (iv.ttft_p99_ratio, iv.tpot_p99_ratio) == (4.0, 0.25)


def test_percentiles_are_numpys_to_the_bit():
    rng = np.random.default_rng(5)
    qs = (0.0, 1.0, 25.0, 50.0, 75.0, 90.0, 99.0, 99.9, 100.0)
    for n in (1, 2, 3, 10, 99, 100, 101, 1001, 4000):
        for x in (rng.lognormal(0.0, 1.0, n).tolist(),
                  rng.integers(0, 5, n).astype(float).tolist()):  # ties
            assert percentiles(x, qs) == [float(np.percentile(np.asarray(x), q)) for q in qs]
    assert percentiles([], (50.0, 90.0, 99.0)) == [0.0, 0.0, 0.0]
