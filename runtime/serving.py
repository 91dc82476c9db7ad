"""The serving runtime: the engine driven in-process by a decider, one decision per interval.

Every ``interval_s`` of engine time the loop closes the engine's interval
(:meth:`Engine.collect_interval`), builds the observation with the shared
:class:`runtime.observation.FeatureBuilder`, asks the decider for knobs (a direct call, no HTTP)
and applies them with :meth:`Engine.set_knobs`. It records one :class:`IntervalRecord` per
decision.

Time is the engine's own: ``engine.now`` moves by the executor's iteration times. With the
simulated executor that is simulated time and the loop runs as fast as the CPU allows. A replay
on a real executor in wall-clock time passes a :class:`WallClockPacer`, which holds each
decision until the wall clock has caught up with the engine's clock (the engine jumps over idle
time, the wall clock does not). A decider's circuit breaker should run on the same clock as the
engine, e.g. ``CircuitBreaker(clock=lambda: engine.now)``, so that its cool-down is counted in
engine seconds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from runtime.decider.decision import Decision
from runtime.engine.engine import Engine
from runtime.engine.metrics import IntervalStats
from runtime.knobs import Knobs
from runtime.observation import FeatureBuilder


class Decider(Protocol):
    """A :class:`runtime.decider.guard.GuardedDecider` (answers a Decision) or any
    :class:`runtime.decider.controller.Controller` (answers Knobs)."""

    def decide(self, observation: np.ndarray) -> Decision | Knobs: ...


class Pacer(Protocol):
    def wait_until(self, t_s: float) -> None:
        """Return once it is time to decide at engine time ``t_s``."""
        ...


class SimulatedPacer:
    """Simulated time: never waits."""

    def wait_until(self, t_s: float) -> None:
        pass


class WallClockPacer:
    """Wall-clock time: engine time 0 is the moment of the first call, or ``start`` (a
    ``time.monotonic()`` value).

    :param start: the wall-clock instant of engine time ``origin_s``
    :param origin_s: the engine time that corresponds to ``start``
    :param sleep: the sleeping function (injectable for tests)
    :param clock: monotonic seconds (injectable for tests)
    """

    def __init__(self, start: float | None = None, origin_s: float = 0.0,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.start = start
        self.origin_s = origin_s
        self.sleep = sleep
        self.clock = clock

    def wait_until(self, t_s: float) -> None:
        if self.start is None:
            self.start = self.clock()
        delay = self.start + (t_s - self.origin_s) - self.clock()
        if delay > 0:
            self.sleep(delay)


@dataclass(frozen=True, slots=True)
class IntervalRecord:
    """One decision of the serving loop."""

    end_s: float
    """engine time at which the interval closed and the decision was made"""
    stats: IntervalStats
    """the closed interval's engine stats (what the observation was built from)"""
    knobs: Knobs
    """the knobs the decision applied for the next interval"""
    source: str
    """``policy``, ``pid`` or ``static``; a plain controller's name"""
    reason: str | None
    """why the decider fell back (None when the policy decided, or for a plain controller)"""
    policy_version: str | None
    decide_us: float
    """wall-clock microseconds the decision took"""
    set_knobs_s: float
    """engine seconds that applying the knobs cost (a KV pool resize stalls the engine)"""

    @property
    def duration_s(self) -> float:
        return self.stats.duration_s

    @property
    def slo_attainment(self) -> float:
        return self.stats.slo_attainment

    @property
    def arrival_rate_rps(self) -> float:
        return self.stats.arrival_rate

    def as_dict(self) -> dict:
        s = self.stats
        return {"t_s": self.end_s, "arrivals": s.arrivals, "finished": s.finished, "met": s.met,
                "violations": s.violations, "slo_attainment": s.slo_attainment,
                "iterations": s.iterations, "preemptions": s.preemptions, "ooms": s.ooms,
                "running": s.running, "waiting": s.waiting, "kv_utilization": s.kv_utilization,
                "knobs": self.knobs.as_dict(), "source": self.source, "reason": self.reason,
                "decide_us": self.decide_us, "resize_s": self.set_knobs_s}


def decide_interval(engine: Engine, decider: Decider, features: FeatureBuilder) -> IntervalRecord:
    """Close the engine's interval, observe it, ask ``decider``, apply its knobs: the one
    decision step of every serving loop (simulated or wall-clock)."""
    stats = engine.collect_interval()
    obs = features.observe(stats, engine.knobs)
    t0 = time.perf_counter_ns()
    answer = decider.decide(obs)
    decide_us = (time.perf_counter_ns() - t0) * 1e-3
    if isinstance(answer, Knobs):
        knobs, source = answer, getattr(decider, "name", type(decider).__name__)
        reason = version = None
    else:
        knobs, source, reason, version = (answer.knobs, answer.source, answer.reason,
                                          answer.policy_version)
    decided_at = engine.now
    cost = engine.set_knobs(knobs)
    return IntervalRecord(decided_at, stats, knobs, source, reason, version, decide_us, cost)


def serve(engine: Engine, decider: Decider, interval_s: float, until_s: float, *,
          features: FeatureBuilder | None = None, pacer: Pacer | None = None,
          on_interval: Callable[[IntervalRecord], None] | None = None) -> list[IntervalRecord]:
    """Run ``engine`` until engine time ``until_s``, deciding its knobs every ``interval_s``.

    Decisions fall on the grid ``k * interval_s`` of engine time (so a second call continues the
    first one's grid). An iteration is never cut, so an interval may end a little after its grid
    point; grid points that a long iteration (or a KV resize) ran past are skipped rather than
    decided on empty intervals.

    :param engine: the engine, with its requests queued (``add_requests``) or arriving
    :param decider: a guarded decider or any controller
    :param interval_s: engine seconds between decisions
    :param until_s: engine time to stop at (the last decision is at or before it)
    :param features: the feature builder (a new one when None; pass one to carry its
        ``*_prev`` state over from an earlier run)
    :param pacer: how engine time maps to wall time (:class:`SimulatedPacer` when None)
    :param on_interval: called with each record as it is made (progress, live plots)
    :return: one record per decision, in order
    """
    if not interval_s > 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s}")
    features = features if features is not None else FeatureBuilder()
    pacer = pacer if pacer is not None else SimulatedPacer()
    records: list[IntervalRecord] = []
    k = math.floor(engine.now / interval_s + 1e-9) + 1  # the first grid point after now
    while k * interval_s <= until_s + 1e-9:
        t = k * interval_s
        engine.run_until(t)
        pacer.wait_until(engine.now)
        record = decide_interval(engine, decider, features)
        records.append(record)
        if on_interval is not None:
            on_interval(record)
        k = max(k + 1, math.floor(engine.now / interval_s + 1e-9) + 1)  # skip points behind us
    return records
