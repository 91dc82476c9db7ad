"""The capacity walk: the largest load at which an attainment stays at or above a target, probed on
one fixed grid of loads.

Start at ``start``; if it passes, double until a load fails, else halve until one passes; then
take geometric midpoints of the bracket until it is within ``tolerance``. The loads probed depend
on the pass or fail answers alone, never on loads a run happened to measure first: attainment is
not monotone in the load at this resolution, and a bracket taken from other loads found another
crossing in another run. :class:`FixedGridBisection` is that walk one probe at a time, so that
many settings can walk it side by side (:mod:`agents.controllers.capacity_search`) and the
arena's :func:`agents.arena.find_capacity` drives the same walk for one controller.

Two properties the searches lean on:

- Bounds. While the walk runs, its answer is known to lie in ``[lower, upper)`` (``lower``: the
  largest load of the bracket known to pass, 0 before any; ``upper``: the smallest load of the
  bracket known to fail, or ``highest`` inclusive before any): :meth:`FixedGridBisection.can_reach`.
- Dominance. If one attainment is at least another at every load of the grid, its answer is at
  least the other's: both walks take the same steps until the first load where only the better
  one passes, and from there the better one's bracket lies at or above that load, which is above
  the other's answer. So a controller that at every load does at least as well as a fixed setting
  has at least its capacity, exactly, not only within the tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Callable

TOLERANCE = 0.02
"""the walk stops when the bracket's ends are within 2% of each other (one bisection step)"""
LOWEST = 1 / 64
"""the smallest load probed: an attainment that misses even here gives a capacity of 0"""
HIGHEST = 64.0
"""the largest load probed: an attainment that holds even here gives this capacity"""


class FixedGridBisection:
    """The capacity walk (see the module docstring), one probe at a time: read :attr:`load`,
    measure the attainment there, :meth:`record` it; :attr:`result` is set once :attr:`load` is
    None."""

    def __init__(self, target: float, *, tolerance: float = TOLERANCE, lowest: float = LOWEST,
                 highest: float = HIGHEST, start: float = 1.0) -> None:
        if not 0 < lowest <= start <= highest:
            raise ValueError(f"need 0 < lowest <= start <= highest, got {lowest}, {start}, "
                             f"{highest}")
        self.target = target
        self.tolerance = tolerance
        self.lowest = lowest
        self.highest = highest
        self._phase = "first"
        self._lo = self._hi = start
        self.passed: float | None = None
        """the largest load known to pass within the walk's bracket"""
        self.failed: float | None = None
        """the smallest load known to fail within the walk's bracket"""
        self.load: float | None = start
        """the next load to probe (None: the walk is over)"""
        self.result: float | None = None
        """the capacity, once the walk is over"""

    def _done(self, value: float) -> None:
        self.result = value
        self.load = None

    def _bisect(self) -> None:
        self._phase = "bisect"
        if self._hi / self._lo > 1 + self.tolerance:
            self.load = math.sqrt(self._lo * self._hi)
        else:
            self._done(self._lo)

    def record(self, attainment: float) -> None:
        """The attainment measured at :attr:`load`."""
        if self.load is None:
            raise RuntimeError("the walk is over: nothing to record")
        ok = attainment >= self.target
        phase = self._phase
        if phase == "first":
            if ok:
                self.passed = self._lo
                self._phase = "up"
                self._step_up()
            else:
                self.failed = self._lo
                self._phase = "down"
                self._step_down()
        elif phase == "up":
            if ok:
                self.passed = self._hi
                self._step_up()
            else:
                self.failed = self._hi
                self._bisect()
        elif phase == "down":
            if ok:
                self.passed = self._lo
                self._bisect()
            else:
                self.failed = self._lo
                self._step_down()
        else:
            if ok:
                self._lo = self.passed = self.load
            else:
                self._hi = self.failed = self.load
            self._bisect()

    def _step_up(self) -> None:
        """``hi`` passed: double, unless it is the highest load."""
        if self._hi >= self.highest:
            self._done(self.highest)
            return
        self._lo, self._hi = self._hi, min(self.highest, self._hi * 2)
        self.load = self._hi

    def _step_down(self) -> None:
        """``lo`` failed: halve, unless it is the lowest load."""
        if self._lo <= self.lowest:
            self._done(0.0)
            return
        self._hi, self._lo = self._lo, max(self.lowest, self._lo / 2)
        self.load = self._lo

    @property
    def lower(self) -> float:
        """The answer is at least this (0 before a load passed)."""
        if self.result is not None:
            return self.result
        return self.passed if self.passed is not None else 0.0

    def can_reach(self, capacity: float) -> bool:
        """Whether the answer can still be at least ``capacity``."""
        if self.result is not None:
            return self.result >= capacity
        if self._phase in ("first", "up"):
            return capacity <= self.highest
        return capacity < self._hi  # the bracket's top failed: the answer stays below it


def walk(attainment: Callable[[float], float], target: float,
         known: dict[float, float] | None = None, **options: float) -> float:
    """The capacity of one attainment function: :class:`FixedGridBisection` driven to its end.
    ``known`` (loads already measured, which also gets the new ones) only saves a probe that
    lands on a load it holds."""
    known = {} if known is None else known
    b = FixedGridBisection(target, **options)
    while b.load is not None:
        load = b.load
        if load not in known:
            known[load] = attainment(load)
        b.record(known[load])
    assert b.result is not None
    return b.result
