"""The one interval loop: an engine run one decision interval at a time, on the interval grid.

Every caller that drives an engine interval by interval uses :class:`Session`: the Gymnasium
environment (``env/session.py`` adds the reward), the arena's episodes (``agents/arena.py``),
the fixed-knob replay (``env/replay.py``), the embedded serving runtime and the wall-clock
replay (``scripts/serve_replay.py``, ``scripts/fidelity.py``).

One interval (:meth:`Session.step`): run the engine to the next grid point ``k * interval_s``
under the pacer, close the engine's interval (:meth:`Engine.collect_interval`), build the
observation with the shared :class:`runtime.observation.FeatureBuilder`, ask the decider (a
direct call, no HTTP) and apply its knobs with :meth:`Engine.set_knobs`. An iteration is never
cut, so an interval may end a little after its grid point; the next one still ends at the next
grid point (no drift), and grid points that a long iteration or a KV resize ran past are skipped
rather than decided on empty intervals.

Time is the engine's own: ``engine.now`` moves by the executor's iteration times. Under the
:class:`SimulatedPacer` that is simulated time and the loop runs as fast as the CPU allows;
under :class:`runtime.wallclock.WallClockPacer` it follows the wall clock (a real executor is
charged in wall time, the loop sleeps while the engine is idle). A decider's circuit breaker
should run on the engine's clock, e.g. ``CircuitBreaker(clock=lambda: engine.now)``, so that its
cool-down is counted in engine seconds.

The loop drives any :class:`ServingEngine`: the simulator's :class:`runtime.engine.engine.Engine`
(on a simulated or a torch executor) and a live vLLM engine (``runtime/vllm/``, which keeps the
wall clock itself and is paced by its own :class:`Pacer`).

Memory stays bounded however long a session serves: it keeps the last ``history`` interval
records, counts decisions by source, and hands every record to ``on_interval`` for anything
longer-lived (a progress bar, a timeline, a log).
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from runtime.decider.controller import Decider, StaticController
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.executor import Executor
from runtime.engine.metrics import IntervalStats, RunSummary
from runtime.gc_pause import gc_paused
from runtime.knobs import DEFAULT_KNOBS, Knobs
from runtime.observation import FeatureBuilder

DEFAULT_INTERVAL_S = 0.25
"""The decision interval. Bursts in the Azure code trace build in well under a second (its 1-s
peaks are 28x the mean rate), so a controller deciding once a second reacts after the damage is
done; at 0.25 s it acts within the burst while an interval still holds several iterations of the
engine (5-50 ms each) and enough arrivals at loads of interest for rates and percentiles to mean
something."""

DEFAULT_HISTORY = 4096
"""interval records a session keeps (the most recent): about 17 minutes at 0.25 s"""

_EPS = 1e-9


class ServingEngine(Protocol):
    """What the interval loop, the pacers and :class:`RunResult` use of an engine: its clock and
    knobs, its queues' sizes, running it forward, closing an interval, and its run summary.
    :class:`runtime.engine.engine.Engine` is one; ``runtime.vllm.engine.VllmEngine`` another."""

    @property
    def now(self) -> float:
        """the engine's clock, seconds"""
        ...

    @property
    def knobs(self) -> Knobs:
        """the knobs in force"""
        ...

    @property
    def running(self) -> Sized:
        """the requests running now"""
        ...

    @property
    def waiting_batch(self) -> Sized:
        """the batch-class requests waiting for admission"""
        ...

    def set_knobs(self, knobs: Knobs) -> float:
        """Apply the knobs; returns the engine seconds that cost."""
        ...

    def collect_interval(self) -> IntervalStats:
        """Close the current interval and return its stats."""
        ...

    def run_until(self, t: float) -> None:
        """Run while ``now < t`` (the last iteration may pass it)."""
        ...

    def has_work(self) -> bool:
        """Whether any request has not yet finished or been rejected."""
        ...

    def is_idle(self) -> bool:
        """Nothing waiting or running."""
        ...

    def next_arrival_s(self) -> float:
        """When the next request not yet arrived arrives (inf when none)."""
        ...

    def next_event_s(self) -> float:
        """When an idle engine next has something to do."""
        ...

    def abort_all(self) -> int:
        """End every request in flight as aborted; returns how many."""
        ...

    def summary(self) -> RunSummary:
        """The run's figures so far."""
        ...


class Pacer(Protocol):
    """How engine time maps to wall time."""

    realtime: bool
    """whether engine time follows the wall clock"""

    def executor(self, inner: Executor) -> Executor:
        """The executor to build the engine on (the wall clock wraps it)."""
        ...

    def start(self, engine: ServingEngine) -> None:
        """Called before the session's first interval."""
        ...

    def advance(self, engine: ServingEngine, t_s: float) -> None:
        """Run ``engine`` until its ``now`` reaches ``t_s`` (the last iteration may pass it)."""
        ...

    def lag_summary(self) -> dict[str, float]:
        """What the wall clock charged beyond the executor's measurements (empty if nothing)."""
        ...


class SimulatedPacer:
    """Simulated time: never waits."""

    realtime = False

    def executor(self, inner: Executor) -> Executor:
        return inner

    def start(self, engine: ServingEngine) -> None:
        pass

    def advance(self, engine: ServingEngine, t_s: float) -> None:
        engine.run_until(t_s)

    def lag_summary(self) -> dict[str, float]:
        return {}


@dataclass(frozen=True, slots=True)
class IntervalRecord:
    """One decision of the loop."""

    end_s: float
    """engine time at which the interval closed and the decision was made"""
    stats: IntervalStats
    """the closed interval's engine stats (what the observation was built from)"""
    knobs: Knobs
    """the knobs the decision applied for the next interval"""
    source: str
    """who decided: ``policy``, ``pid`` or ``static`` from the guarded decider, or a baseline
    controller's name"""
    reason: str | None
    """why the guarded decider fell back (None when the policy or a plain controller decided)"""
    policy_version: str | None
    """the policy's version when a policy was loaded"""
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

    def as_dict(self) -> dict[str, Any]:
        s = self.stats
        return {"t_s": self.end_s, "arrivals": s.arrivals, "finished": s.finished, "met": s.met,
                "violations": s.violations, "slo_attainment": s.slo_attainment,
                "iterations": s.iterations, "preemptions": s.preemptions, "ooms": s.ooms,
                "running": s.running, "waiting": s.waiting, "kv_utilization": s.kv_utilization,
                "interactive_attainment": s.interactive_attainment, "batch_met": s.batch_met,
                "batch_goodput_tokens": s.batch_goodput_tokens, "batch_waiting": s.batch_waiting,
                "batch_running": s.batch_running, "batch_backlog_tokens": s.batch_backlog_tokens,
                "shed": s.shed, "expired": s.expired, "late": s.late,
                "mean_kv_gib": s.mean_kv_gib,
                "knobs": self.knobs.as_dict(), "source": self.source, "reason": self.reason,
                "decide_us": self.decide_us, "resize_s": self.set_knobs_s}


@dataclass
class RunResult:
    """What a run of the loop (or a straight-through fixed-knob replay) leaves behind."""

    summary: RunSummary
    """the engine's whole-run summary"""
    wall_s: float
    """wall seconds of the run (building the engine and its requests included)"""
    engine: ServingEngine
    """the engine, for per-request detail"""
    controller: str
    """the decider's name (``static`` for fixed knobs)"""
    realtime: bool
    """whether engine time followed the wall clock"""
    decisions: int = 0
    """how many intervals were decided (0 for a straight-through replay)"""
    sources: dict[str, int] = field(default_factory=dict)
    """decisions by who made them"""
    intervals: list[IntervalRecord] = field(default_factory=list)
    """the last ``history`` interval records, in order"""
    lag: dict[str, float] = field(default_factory=dict)
    """wall-clock replays on a wrapped executor: the wall time charged beyond the executor's
    measurement (``lag_per_call_s``, ``lag_max_s``, ``lag_calls``)"""

    @property
    def speedup(self) -> float:
        """Engine seconds per wall second."""
        return self.summary.sim_seconds / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The summary's fields with the run's: one flat JSON-ready object."""
        return {**self.summary.as_dict(), "wall_s": self.wall_s, "speedup": self.speedup,
                "controller": self.controller, "realtime": self.realtime,
                "decisions": self.decisions, "sources": dict(self.sources), **self.lag}


class Session:
    """An engine driven one decision interval at a time on the grid ``k * interval_s``.

    :param engine: the engine, with its requests queued (``add_requests``) or arriving; build it
        on ``pacer.executor(executor)`` for wall-clock serving
    :param interval_s: engine seconds between decisions
    :param pacer: how engine time maps to wall time (:class:`SimulatedPacer` when None)
    :param features: the feature builder (a new one when None; pass one to carry its ``*_prev``
        state over from an earlier session)
    :param history: how many interval records to keep (the most recent)
    """

    def __init__(self, engine: ServingEngine, *, interval_s: float = DEFAULT_INTERVAL_S,
                 pacer: Pacer | None = None, features: FeatureBuilder | None = None,
                 history: int = DEFAULT_HISTORY) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.engine = engine
        self.interval_s = float(interval_s)
        self.pacer: Pacer = pacer if pacer is not None else SimulatedPacer()
        self.features = features if features is not None else FeatureBuilder()
        self.records: deque[IntervalRecord] = deque(maxlen=history)
        self.sources: Counter[str] = Counter()
        self.num_decisions = 0

    @property
    def now(self) -> float:
        return self.engine.now

    def next_grid_s(self) -> float:
        """The first grid point after the engine's ``now``."""
        return (math.floor(self.engine.now / self.interval_s + _EPS) + 1) * self.interval_s

    def advance(self) -> tuple[IntervalStats, np.ndarray]:
        """Run to the next grid point and close the interval: its stats and observation."""
        engine = self.engine
        pacer = self.pacer
        pacer.start(engine)
        pacer.advance(engine, self.next_grid_s())
        stats = engine.collect_interval()
        return stats, self.features.observe(stats, engine.knobs)

    def apply(self, knobs: Knobs) -> float:
        """Set the knobs for the next interval; returns the engine seconds that cost."""
        return self.engine.set_knobs(knobs)

    def step(self, decider: Decider) -> IntervalRecord:
        """One interval: advance, observe, decide, apply; the record is kept and returned."""
        stats, obs = self.advance()
        t0 = time.perf_counter_ns()
        d = decider.decide(obs)
        decide_us = (time.perf_counter_ns() - t0) * 1e-3
        decided_at = self.engine.now
        cost = self.apply(d.knobs)
        record = IntervalRecord(decided_at, stats, d.knobs, d.source, d.reason, d.policy_version,
                                decide_us, cost)
        self.records.append(record)
        self.sources[d.source] += 1
        self.num_decisions += 1
        return record

    def run(self, decider: Decider, *, until_s: float | None = None, max_s: float = math.inf,
            on_interval: Callable[[IntervalRecord], None] | None = None) -> int:
        """Decide every interval. With ``until_s``: at every grid point up to it (serving; the
        engine may idle). Without: until every request has finished or been rejected, aborting
        what is left once engine time reaches ``max_s``. Returns the number of decisions made.

        :param on_interval: called with each record as it is made (progress, timelines)
        """
        n = 0
        engine = self.engine
        bind = getattr(decider, "bind", None)
        if bind is not None:  # a decider that reads the engine itself (the lookahead oracle)
            bind(engine)
        while (self.next_grid_s() <= until_s + _EPS if until_s is not None
               else engine.has_work() and engine.now < max_s):
            if (until_s is None and not self.pacer.realtime and engine.is_idle()
                    and not engine.waiting_batch and math.isfinite(engine.next_arrival_s())):
                # a replay's idle gap is one interval, not one per grid point: the work stays
                # proportional to the requests however far apart they arrive (not while batch
                # work waits for a share the decider may open: it decides every interval)
                last_grid = math.floor(engine.next_arrival_s() / self.interval_s) * self.interval_s
                if last_grid - self.next_grid_s() > self.interval_s:
                    engine.run_until(min(last_grid, max_s))
            record = self.step(decider)
            n += 1
            if on_interval is not None:
                on_interval(record)
        if until_s is None and engine.has_work():
            engine.abort_all()
        return n


def replay(executor: Executor, arrival_s: Sequence[float], prompt_tokens: Sequence[int],
           output_tokens: Sequence[int], slo_class: Sequence[str] | None = None, *,
           decider: Decider | None = None, knobs: Knobs = DEFAULT_KNOBS,
           interval_s: float = DEFAULT_INTERVAL_S, pacer: Pacer | None = None,
           config: EngineConfig | None = None, max_s: float = math.inf,
           on_interval: Callable[[IntervalRecord], None] | None = None,
           history: int = 0) -> RunResult:
    """Replay requests through a fresh engine until every one has finished or been rejected
    (or ``max_s`` engine seconds, after which the rest are aborted).

    With fixed knobs (``decider`` None, or a static controller holding ``knobs``), simulated
    time, no ``on_interval`` and no ``history``, nothing needs the intervals: the engine runs
    straight through, with its closed-form decode stretches uncut by grid points.

    :param executor: the executor (torch for wall-clock serving, simulated otherwise)
    :param arrival_s: arrival times, sorted, starting at or after 0
    :param prompt_tokens: prompt length of every request
    :param output_tokens: output length of every request
    :param slo_class: class of every request (default: the config's default class)
    :param decider: decides the knobs every ``interval_s`` (None: keep ``knobs``)
    :param knobs: the knobs to start with
    :param interval_s: the decision interval, in engine seconds
    :param pacer: simulated (default) or wall-clock time
    :param config: engine limits and SLO classes
    :param max_s: stop after this much engine time, aborting what is left
    :param on_interval: called with every interval's record
    :param history: interval records the result keeps (the most recent; none by default)
    """
    if len(arrival_s) and float(arrival_s[0]) < 0:
        raise ValueError(f"arrival_s must start at or after 0, got {arrival_s[0]}")
    pacer = pacer if pacer is not None else SimulatedPacer()
    name = decider_name(decider)
    with gc_paused():  # collector pauses would land in iteration times (see runtime.gc_pause)
        t0 = time.perf_counter()
        engine = Engine(pacer.executor(executor), knobs, config)
        # a static controller of the knobs the engine starts with changes nothing, unless it
        # sets something on the engine when bound (best static's admission policy)
        fixed = decider is None or (isinstance(decider, StaticController)
                                    and decider.knobs == engine.knobs
                                    and getattr(decider, "bind", None) is None)
        engine.add_requests(arrival_s, prompt_tokens, output_tokens, slo_class)
        session = Session(engine, interval_s=interval_s, pacer=pacer, history=history)
        if fixed and not pacer.realtime and on_interval is None and history == 0:
            engine.run_to_completion(max_s)
            if engine.has_work():
                engine.abort_all()
        else:
            session.run(decider if decider is not None else StaticController(engine.knobs),
                        max_s=max_s, on_interval=on_interval)
        wall_s = time.perf_counter() - t0
    return RunResult(engine.summary(), wall_s, engine, name, pacer.realtime,
                     session.num_decisions, dict(session.sources), list(session.records),
                     pacer.lag_summary())


def decider_name(decider: Decider | None) -> str:
    """The name a run result gives its decider (``static`` for fixed knobs)."""
    return "static" if decider is None else getattr(decider, "name", type(decider).__name__)


def run_engine(engine: ServingEngine, pacer: Pacer, decider: Decider | None = None, *,
               interval_s: float = DEFAULT_INTERVAL_S, max_s: float = math.inf,
               on_interval: Callable[[IntervalRecord], None] | None = None,
               history: int = DEFAULT_HISTORY) -> RunResult:
    """Run an engine that already holds its requests (a live vLLM engine, built outside the
    loop) through the interval loop until every request has finished or been rejected (or
    ``max_s`` engine seconds, after which the rest are aborted). The wall time counts the run
    only. The cyclic collector is paused, as :func:`replay` pauses it.

    :param engine: the engine, its requests queued
    :param pacer: how its time maps to wall time
    :param decider: decides the knobs every ``interval_s`` (None: keep the engine's knobs)
    """
    with gc_paused():
        t0 = time.perf_counter()
        session = Session(engine, interval_s=interval_s, pacer=pacer, history=history)
        session.run(decider if decider is not None else StaticController(engine.knobs),
                    max_s=max_s, on_interval=on_interval)
        wall_s = time.perf_counter() - t0
    return RunResult(engine.summary(), wall_s, engine, decider_name(decider), pacer.realtime,
                     session.num_decisions, dict(session.sources), list(session.records),
                     pacer.lag_summary())
