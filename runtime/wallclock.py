"""The serving runtime's loop: replay requests through the engine with a controller retuning the
knobs every decision interval, in wall-clock time on a real executor or in simulated time.

Wall-clock mode. The engine keeps its own clock ``now``; here it is tied to the wall clock by
wrapping the executor (:class:`WallClockExecutor`): an iteration reports as its duration the wall
time from the engine's ``now`` to the moment the forward pass finished, so after every iteration
``now`` equals the elapsed wall time, and the scheduler's own work between iterations (the Python
around the forward pass) is charged as it is in a real server. When the engine is idle the loop
sleeps until the next arrival, admission deadline or decision. The engine itself is unchanged.

Simulated mode runs the same loop without the wrapper and without sleeping, so the two replays
differ only in where iteration times come from, and report the same summary.

The controller is anything with ``decide(observation) -> Knobs`` (static, PID, the ONNX decider);
observations come from :class:`runtime.observation.FeatureBuilder`, as in training.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.decider.controller import StaticController
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.executor import Batch, DecodeCost, Executor, IterationResult
from runtime.gc_pause import gc_paused
from runtime.knobs import DEFAULT_KNOBS, Knobs
from runtime.observation import FeatureBuilder
from runtime.serving import Decider, decide_interval


class WallClockExecutor:
    """Wraps an executor so that the engine's clock follows the wall clock.

    :param inner: the executor that does the work (it measures its own time)
    """

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.memory = inner.memory
        self.max_model_len = inner.max_model_len
        self._engine: Engine | None = None
        self._t0 = 0.0
        self.lag_s = 0.0
        """wall time charged beyond the executor's own measurement (scheduler work between
        iterations, wake-up latency), summed"""
        self.num_calls = 0
        self.iteration_lags: list[float] = []
        """that extra time for every ``execute`` call, in order"""

    def bind(self, engine: Engine, t0: float) -> None:
        """From now on, report durations against ``engine.now`` with time 0 at ``t0``
        (a ``time.perf_counter()`` value)."""
        self._engine = engine
        self._t0 = t0

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    def _synced(self, measured: float) -> float:
        if self._engine is None:
            return measured
        # The engine is behind the wall clock by its own overhead since the last iteration (or
        # a wake-up's latency); charging it keeps ``now`` on the wall clock.
        synced = max(measured, self.elapsed() - self._engine.now)
        self.lag_s += synced - measured
        self.num_calls += 1
        return synced

    def execute(self, batch: Batch, kv_cache_ratio: float) -> IterationResult:
        res = self.inner.execute(batch, kv_cache_ratio)
        synced = self._synced(res.duration_s)
        self.iteration_lags.append(synced - res.duration_s)
        return IterationResult(synced, res.oom)

    def resize_kv(self, num_blocks: int, moves: dict[int, int]) -> float:
        return self._synced(self.inner.resize_kv(num_blocks, moves))

    def decode_cost(self) -> DecodeCost | None:
        return None


@dataclass
class ReplayResult:
    summary: dict[str, Any]
    """``Engine.summary().as_dict()`` plus ``wall_s`` and the controller's name"""
    intervals: list[dict[str, Any]] = field(default_factory=list)
    """per decision interval: time, arrivals, completions, attainment, knobs, decision time"""
    requests: list[dict[str, Any]] = field(default_factory=list)
    """per request: arrival, TTFT, TPOT, met (for comparing replays request by request)"""
    iteration_lags: list[float] = field(default_factory=list)
    """wall-clock mode: per ``execute`` call, the wall time beyond the executor's measurement"""


def replay(executor: Executor, arrival_s: Sequence[float], prompt_tokens: Sequence[int],
           output_tokens: Sequence[int], *, controller: Decider | None = None,
           knobs: Knobs = DEFAULT_KNOBS, interval_s: float = 1.0, realtime: bool = True,
           config: EngineConfig | None = None, slo_class: Sequence[str] | None = None,
           max_s: float = math.inf,
           on_interval: Callable[[dict[str, Any]], None] | None = None) -> ReplayResult:
    """Replay requests through a fresh engine on ``executor`` until every request has finished
    (or ``max_s`` seconds of engine time, after which the rest are aborted).

    :param executor: the executor (torch for wall-clock serving, simulated otherwise)
    :param arrival_s: arrival times, sorted, starting at or after 0
    :param prompt_tokens: prompt length of every request
    :param output_tokens: output length of every request
    :param controller: decides the knobs every ``interval_s`` (None: keep ``knobs``)
    :param knobs: the knobs to start with
    :param interval_s: the decision interval, in engine seconds
    :param realtime: tie the engine's clock to the wall clock (sleep when idle)
    :param config: engine limits and SLO classes
    :param slo_class: class of every request (default: the config's default class)
    :param max_s: stop after this much engine time, aborting what is left
    :param on_interval: called with every interval's record (progress output)
    """
    if interval_s <= 0:
        raise ValueError(f"interval_s must be positive, got {interval_s}")
    arrivals = [float(a) for a in arrival_s]
    if arrivals and arrivals[0] < 0:
        raise ValueError(f"arrival_s must start at or after 0, got {arrivals[0]}")
    wall = WallClockExecutor(executor) if realtime else None
    if config is None:
        config = EngineConfig()
    eng = Engine(wall if wall is not None else executor, knobs, config)
    eng.add_requests(arrivals, prompt_tokens, output_tokens, slo_class)
    fb = FeatureBuilder()
    if controller is not None and hasattr(controller, "reset"):
        controller.reset()
    decider = controller if controller is not None else StaticController(knobs, name="none")
    intervals: list[dict[str, Any]] = []
    next_decision = interval_s
    t0 = time.perf_counter()
    if wall is not None:
        wall.bind(eng, t0)

    def decide() -> None:
        nonlocal next_decision
        rec = decide_interval(eng, decider, fb).as_dict()
        intervals.append(rec)
        if on_interval is not None:
            on_interval(rec)
        while next_decision <= eng.now:
            next_decision += interval_s

    with gc_paused():  # collector pauses would land in iteration times (see runtime.gc_pause)
        while eng.has_work() and eng.now < max_s:
            if eng.now >= next_decision:
                decide()
                continue
            if wall is None:
                eng.run_until(min(next_decision, max_s))
                continue
            if not eng.running:
                # idle: sleep until something can happen (an arrival, a window, a decision)
                wake = min(next_decision, max_s)
                i = bisect.bisect_right(arrivals, eng.now)
                if i < len(arrivals):
                    wake = min(wake, arrivals[i])
                if eng.waiting:
                    wake = min(wake, eng.waiting[0].arrival_s
                               + eng.knobs.batch_window_ms * 1e-3)
                delay = wake - wall.elapsed()
                if delay > 0:
                    time.sleep(delay)
            eng.run_until(min(wall.elapsed(), next_decision, max_s))
    if eng.has_work():
        eng.abort_all()
    wall_s = time.perf_counter() - t0
    summary = {**eng.summary().as_dict(), "wall_s": wall_s,
               "controller": getattr(controller, "name", "none"), "realtime": realtime}
    if wall is not None:
        summary["lag_per_call_s"] = wall.lag_s / max(1, wall.num_calls)
    reqs = [{"id": r.req_id, "arrival_s": r.arrival_s, "ttft_s": r.ttft_s, "tpot_s": r.tpot_s,
             "met": r.meets_slo(), "preemptions": r.num_preemptions} for r in eng.requests]
    return ReplayResult(summary, intervals, reqs,
                        list(wall.iteration_lags) if wall is not None else [])
