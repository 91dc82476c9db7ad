"""The capacity walk: the same answers as the arena's bisection always gave, bounds that hold while
it runs, and dominance (at least as good at every load: at least the capacity)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agents.bisection import FixedGridBisection, walk


def reference(attainment, target, known, *, tolerance=0.02, lowest=1 / 64, highest=64.0,
              start=1.0):
    """The arena's bisection as it was written before the walk became a class."""

    def att(s):
        if s not in known:
            known[s] = attainment(s)
        return known[s]

    lo = hi = start
    if att(start) >= target:
        while att(hi) >= target:
            if hi >= highest:
                return highest
            lo, hi = hi, min(highest, hi * 2)
    else:
        while att(lo) < target:
            if lo <= lowest:
                return 0.0
            hi, lo = lo, max(lowest, lo / 2)
    while hi / lo > 1 + tolerance:
        mid = math.sqrt(lo * hi)
        if att(mid) >= target:
            lo = mid
        else:
            hi = mid
    return lo


def rough(seed: int):
    """An attainment that falls with the load, with noise: not monotone near the target."""
    rng = np.random.default_rng(seed)
    knee = float(np.exp(rng.uniform(np.log(0.05), np.log(40))))
    wobble = rng.uniform(0, 0.02)

    def f(load: float) -> float:
        h = (hash((seed, round(math.log(load), 9))) % 1000) / 1000 - 0.5
        return 1.0 / (1.0 + (load / knee) ** 4) + wobble * h

    return f


@pytest.mark.parametrize("seed", range(40))
def test_the_walk_answers_what_the_arenas_bisection_answered(seed):
    f = rough(seed)
    for target in (0.99, 0.9):
        assert walk(f, target) == reference(f, target, {})


@pytest.mark.parametrize("seed", range(20))
def test_the_bounds_hold_at_every_step_of_the_walk(seed):
    f = rough(seed)
    answer = walk(f, 0.99)
    b = FixedGridBisection(0.99)
    while b.load is not None:
        assert b.lower <= answer and b.can_reach(answer)
        if b.failed is not None:  # the bracket's top failed: the answer stays under it
            assert answer < b.failed and not b.can_reach(b.failed)
        b.record(f(b.load))
    assert b.result == answer


@pytest.mark.parametrize("seed", range(30))
def test_better_at_every_load_means_at_least_the_capacity(seed):
    f = rough(seed)
    rng = np.random.default_rng(seed + 100)
    bonus = rng.uniform(0, 0.05)

    def g(load: float) -> float:  # at least f at every load, more at some
        return f(load) + (bonus if (hash((seed, round(load, 9))) % 3 == 0) else 0.0)

    for target in (0.99, 0.9):
        assert walk(g, target) >= walk(f, target)


def test_the_edges_of_the_grid():
    assert walk(lambda s: 1.0, 0.99) == 64.0
    assert walk(lambda s: 0.0, 0.99) == 0.0
    with pytest.raises(RuntimeError):
        b = FixedGridBisection(0.99)
        while b.load is not None:
            b.record(1.0)
        b.record(1.0)
