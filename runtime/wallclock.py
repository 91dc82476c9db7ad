"""Wall-clock pacing: the engine's clock tied to the wall clock, for serving on a real executor.

The engine keeps its own clock ``now``. :class:`WallClockPacer` ties it to the wall clock in two
ways, so that one pacer serves both executors:

- A real executor is wrapped (:meth:`WallClockPacer.executor` -> :class:`WallClockExecutor`): an
  iteration reports as its duration the wall time from the engine's ``now`` to the moment the
  forward pass finished, so after every iteration ``now`` equals the elapsed wall time, and the
  scheduler's own work between iterations (the Python around the forward pass) is charged as it
  is in a real server. When the engine is idle the pacer sleeps until the next arrival, admission
  deadline or decision.
- A simulated executor runs ahead of the wall clock; the pacer holds the engine (sleeps) until
  the wall clock has caught up with it.

Memory stays bounded however long it serves: the wrapper keeps the sum, count and maximum of the
extra time it charged and the last ``lag_window`` values; ``on_lag`` sees every one (a replay
that wants them all, such as ``scripts/fidelity.py``, passes ``list.append``).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from runtime.engine.executor import Batch, DecodeCost, Executor, IterationResult

if TYPE_CHECKING:
    from runtime.session import ServingEngine

_TICK_S = 1e-9
"""the wall clock counts as level with the engine within this (float rounding of the clock)"""

LAG_WINDOW = 1024
"""iteration lags a wall-clock executor keeps (the most recent), for a live view"""


class WallClockExecutor:
    """Wraps an executor so that the engine's clock follows the pacer's wall clock.

    :param inner: the executor that does the work (it measures its own time)
    :param pacer: the pacer whose clock the engine follows
    """

    def __init__(self, inner: Executor, pacer: WallClockPacer) -> None:
        self.inner = inner
        self.memory = inner.memory
        self.max_model_len = inner.max_model_len
        self.pacer = pacer
        self.engine: ServingEngine | None = None
        """the engine it runs for (set by :meth:`WallClockPacer.start`)"""
        self.lag_s = 0.0
        """wall time charged beyond the executor's own measurement (scheduler work between
        iterations, wake-up latency), summed"""
        self.max_lag_s = 0.0
        """the largest of those charges"""
        self.num_calls = 0
        self.recent_lags: deque[float] = deque(maxlen=pacer.lag_window)
        """that extra time for the last ``lag_window`` calls, in order"""

    def _synced(self, measured: float) -> float:
        engine = self.engine
        if engine is None:
            return measured
        # The engine is behind the wall clock by its own overhead since the last iteration (or
        # a wake-up's latency); charging it keeps ``now`` on the wall clock.
        synced = max(measured, self.pacer.elapsed() - engine.now)
        lag = synced - measured
        self.lag_s += lag
        self.max_lag_s = max(self.max_lag_s, lag)
        self.num_calls += 1
        self.recent_lags.append(lag)
        if self.pacer.on_lag is not None:
            self.pacer.on_lag(lag)
        return synced

    def execute(self, batch: Batch, kv_cache_ratio: float) -> IterationResult:
        res = self.inner.execute(batch, kv_cache_ratio)
        return IterationResult(self._synced(res.duration_s), res.oom)

    def resize_kv(self, num_blocks: int, moves: dict[int, int]) -> float:
        return self._synced(self.inner.resize_kv(num_blocks, moves))

    def decode_cost(self) -> DecodeCost | None:
        return None  # no closed-form stretches: every iteration happens in real time

    def lag_summary(self) -> dict[str, float]:
        return {"lag_per_call_s": self.lag_s / max(1, self.num_calls),
                "lag_max_s": self.max_lag_s, "lag_calls": self.num_calls}


class WallClockPacer:
    """Engine time follows the wall clock from the moment the loop starts (see the module
    docstring).

    :param sleep: the sleeping function (injectable for tests)
    :param clock: monotonic seconds (injectable for tests)
    :param lag_window: how many recent iteration lags a wrapped executor keeps
    :param on_lag: called with every iteration lag (None: only the summary is kept)
    """

    realtime = True

    def __init__(self, *, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.perf_counter, lag_window: int = LAG_WINDOW,
                 on_lag: Callable[[float], None] | None = None) -> None:
        self.sleep = sleep
        self.clock = clock
        self.lag_window = lag_window
        self.on_lag = on_lag
        self.wrapped: WallClockExecutor | None = None
        self._t0: float | None = None
        self._origin_s = 0.0

    def executor(self, inner: Executor) -> WallClockExecutor:
        """The executor to build the engine on: ``inner`` charged in wall-clock time."""
        self.wrapped = WallClockExecutor(inner, self)
        return self.wrapped

    def start(self, engine: ServingEngine) -> None:
        """Tie the wall clock's present to the engine's ``now`` (on the loop's first interval)."""
        if self._t0 is not None:
            return
        self._t0, self._origin_s = self.clock(), engine.now
        if self.wrapped is not None:
            self.wrapped.engine = engine

    def lag_summary(self) -> dict[str, float]:
        return self.wrapped.lag_summary() if self.wrapped is not None else {}

    def elapsed(self) -> float:
        """The present wall time in engine seconds."""
        if self._t0 is None:
            return self._origin_s
        return self._origin_s + self.clock() - self._t0

    def _sleep_until(self, t_s: float) -> None:
        delay = t_s - self.elapsed()
        if delay > _TICK_S:
            self.sleep(delay)

    def advance(self, engine: ServingEngine, t_s: float) -> None:
        """Run ``engine`` to engine time ``t_s`` no faster than the wall clock: sleep while it is
        idle until its next event, hold it while it is ahead, and return once the wall clock has
        reached the engine's time."""
        while engine.now < t_s:
            wall = self.elapsed()
            if engine.now > wall + _TICK_S:  # an executor faster than the wall clock: hold
                self.sleep(engine.now - wall)
                continue
            if not engine.running:  # idle: nothing can happen before the next event
                self._sleep_until(min(t_s, engine.next_event_s()))
                wall = self.elapsed()
            # at least one iteration when the engine is running and level with the wall clock
            engine.run_until(min(t_s, max(wall, math.nextafter(engine.now, math.inf))))
        self._sleep_until(engine.now)
