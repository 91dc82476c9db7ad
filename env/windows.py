"""Training windows: how an episode's stretch of trace is drawn, a fixed pool of them, and the
curriculum that draws more often the windows where the policy loses to best static.

An episode replays ``episode_s`` simulated seconds of a trace split, starting at a uniform point
of the split and compressed by a log-uniform rate scale (:func:`draw_window`, the one draw the
environment's ``reset`` makes). A :class:`WindowPool` fixes ``n`` such windows from a seed, so
that an outcome on a window can be remembered: best static's replay of it (the differential
reward's reference, :mod:`env.wrappers`) and how far the policy falls behind best static there
(the curriculum).

The curriculum (:class:`Curriculum`). Each window keeps ``loss``: how far the policy's reward fell
short of best static's on the window, per decision interval, averaged over its episodes with
weight ``1 - memory`` on the newest (an exponential average; ``memory`` 0.5 by default). The
probability of drawing window ``i`` of ``n`` is

    p_i = (1 - mix) / n + mix * max(loss_i, 0) / sum_j max(loss_j, 0)

so a share ``1 - mix`` of the episodes stays uniform (every window keeps being seen, and a window
the policy has learnt is checked again) and the rest goes to the windows in proportion to what
the policy loses there. A window never played counts as losing as much as the worst window seen
(1 before any is seen): each window gets tried early. When the policy loses nowhere the draw is
uniform. ``mix`` 0 turns the curriculum off.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from env.traces import rate_scale, time_window
from env.traces.trace import Trace
from runtime.engine.engine import EngineConfig


def draw_window(rng: np.random.Generator, trace: Trace, episode_s: float,
                rate_scale_range: tuple[float, float]) -> tuple[float, float]:
    """``(start_s, rate_scale)`` of a window of ``trace``: the scale log-uniform over the range,
    the start uniform over the part of the trace a window of ``episode_s`` seconds (after
    scaling) fits in, redrawn (up to 100 times) until the window holds at least 2 requests."""
    lo, hi = rate_scale_range
    scale = lo if lo == hi else math.exp(rng.uniform(math.log(lo), math.log(hi)))
    span = episode_s * scale  # trace seconds that become episode_s after scaling
    t0, t1 = float(trace.arrival_s[0]), float(trace.arrival_s[-1])
    latest = max(t0, t1 - span)
    for _ in range(100):
        start = float(rng.uniform(t0, latest))
        if window_size(trace, start, span) >= 2:
            return start, scale
    raise ValueError(f"trace {trace.name!r} has no {span:g} s stretch with two requests in 100 "
                     "draws")


def window_size(trace: Trace, start_s: float, span_s: float) -> int:
    """Requests of ``trace`` arriving in ``[start_s, start_s + span_s)``."""
    lo, hi = np.searchsorted(trace.arrival_s, [start_s, start_s + span_s], side="left")
    return int(hi - lo)


def window_config(config: EngineConfig | None, start_s: float) -> EngineConfig | None:
    """The engine config an episode of the window cut at ``start_s`` runs under: ``config``
    with its co-tenant's demand read from ``start_s`` on, the time the window was cut from (the
    co-tenant keeps the traffic's clock). Every episode would otherwise see the first two
    minutes of the co-tenant's hour-long cycle, about 3 GiB of its 3 to 9 (spikes add 6): the
    policies trained so met one demand and none of those the held-out windows bring."""
    if config is None or config.cotenant is None:
        return config
    shifted = config.cotenant.shifted(start_s)
    return config if shifted is config.cotenant else dataclasses.replace(config,
                                                                         cotenant=shifted)


def cut_window(trace: Trace, start_s: float, scale: float, episode_s: float) -> Trace:
    """The window ``(start_s, scale)``: ``episode_s * scale`` trace seconds from ``start_s``,
    re-based to 0 and compressed by ``scale``."""
    window = time_window(trace, start_s, start_s + episode_s * scale)
    return rate_scale(window, scale) if scale != 1.0 else window


@dataclass(frozen=True)
class WindowPool:
    """A fixed list of windows of one trace split, drawn from a seed."""

    starts: tuple[float, ...]
    """each window's start, seconds of the split"""
    scales: tuple[float, ...]
    """each window's rate scale"""

    @classmethod
    def draw(cls, trace: Trace, n: int, episode_s: float, rate_scale_range: tuple[float, float],
             seed: int) -> WindowPool:
        """``n`` windows drawn as an episode draws one (:func:`draw_window`), from ``seed``."""
        if n < 1:
            raise ValueError(f"a window pool needs at least 1 window, got {n}")
        rng = np.random.default_rng(seed)
        drawn = [draw_window(rng, trace, episode_s, rate_scale_range) for _ in range(n)]
        return cls(tuple(s for s, _ in drawn), tuple(x for _, x in drawn))

    def __len__(self) -> int:
        return len(self.starts)


@dataclass
class Curriculum:
    """What the policy loses to best static on each window of a pool, and the draw that follows
    (see the module docstring for the rule)."""

    n: int
    """windows in the pool"""
    mix: float = 0.5
    """share of the draws that go by loss (0: uniform, the curriculum off)"""
    memory: float = 0.5
    """weight of a window's previous loss when a new episode's comes in"""
    loss: np.ndarray = field(init=False)
    """per window: reward per interval best static got and the policy did not (NaN: unseen)"""
    episodes: np.ndarray = field(init=False)
    """per window: episodes seen"""

    def __post_init__(self) -> None:
        if not 0.0 <= self.mix <= 1.0:
            raise ValueError(f"Curriculum.mix must be in [0, 1], got {self.mix}")
        if not 0.0 <= self.memory < 1.0:
            raise ValueError(f"Curriculum.memory must be in [0, 1), got {self.memory}")
        self.loss = np.full(self.n, np.nan)
        self.episodes = np.zeros(self.n, dtype=np.int64)

    def record(self, window: int, loss_per_interval: float) -> None:
        """A finished episode on ``window`` lost ``loss_per_interval`` to best static (negative:
        it beat it)."""
        old = self.loss[window]
        self.loss[window] = (loss_per_interval if math.isnan(old)
                             else self.memory * old + (1.0 - self.memory) * loss_per_interval)
        self.episodes[window] += 1

    def probabilities(self) -> np.ndarray:
        """The probability of drawing each window next."""
        uniform = np.full(self.n, 1.0 / self.n)
        if self.mix == 0.0:
            return uniform
        seen = ~np.isnan(self.loss)
        worst = float(np.max(self.loss[seen])) if seen.any() else 1.0
        positive = np.maximum(np.where(seen, self.loss, max(worst, 0.0)), 0.0)
        total = positive.sum()
        if total <= 0.0:
            return uniform
        return (1.0 - self.mix) * uniform + self.mix * positive / total
