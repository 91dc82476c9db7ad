"""Wrappers of the serving environment for training: episodes drawn from a window pool (with the
curriculum's probabilities), and every episode paired with best static's replay of its window.

Why pair. In this environment most of the variance of the reward comes from the trace, not from
the policy: a calm window pays about 1 per interval whatever the knobs, a burst pays far less
whatever the knobs. PPO's advantage then mostly measures which window the episode drew.
:class:`StaticReference` replays the episode's window once under fixed reference knobs (best
static's), with the same engine, reward and interval grid, and keeps that replay's reward per
grid interval; with ``differential=True`` the reward of each step becomes

    reward - reference reward over the same stretch of the grid

so the arrivals' share of the reward cancels and what is left is what the knobs changed: the
gain over best static, the quantity the project reports. The reference replay is cached by
window ``(start_s, rate_scale)``, so with a :class:`PooledWindows` pool each window is replayed
once per process.

Grid alignment. An interval ends at the first engine iteration boundary at or after its grid
point ``k * interval_s``; a long iteration can skip grid points. Each side's interval is filed
under the grid index of its end (``floor(end / interval_s)``), and a step is compared with the
reference intervals whose end indexes fall in the same range, so both sides always cover the same
grid cells even when one of them skipped one.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import gymnasium as gym
import numpy as np

from env.session import ServingSession
from env.windows import WindowPool
from runtime.knobs import Knobs

_EPS = 1e-9


def grid_index(t_s: float, interval_s: float) -> int:
    """The grid interval an interval ending at ``t_s`` is filed under."""
    return math.floor(t_s / interval_s + _EPS)


def reference_track(env: gym.Env, knobs: Knobs) -> np.ndarray:
    """Best static's side of the pairing: replay the window of ``env``'s current episode under
    ``knobs`` (same engine config, profile, reward weights and interval) until the window is
    over, as the episode does; returns the reward of the reference intervals filed under each
    grid index (0 where none is)."""
    u = env.unwrapped
    if getattr(u, "executor_kind", "sim") != "sim":
        raise ValueError("a reference replay needs the simulated executor")
    session = ServingSession(u.session.trace, interval_s=u.interval_s, profile=u.profile,
                             config=u.episode_config, knobs=knobs, weights=u.weights)
    rewards: dict[int, float] = {}
    while True:
        result = session.step(knobs)
        g = grid_index(session.now, u.interval_s)
        rewards[g] = rewards.get(g, 0.0) + float(result.reward)
        if session.window_over:
            break
    session.abort()
    per_cell = np.zeros(max(rewards) + 1)
    for g, r in rewards.items():
        per_cell[g] = r
    return per_cell


class StaticReference(gym.Wrapper):
    """Pairs every episode with the reference knobs' replay of its window (see the module
    docstring). Every step's info gets ``reference_reward`` (the reference's reward over the
    step's grid cells) and ``raw_reward``; the last step's info gets ``episode_gap``: the
    episode's raw reward minus the reference's, per step (positive: the policy did better).

    :param env: a :class:`env.serving_env.ServingEnv` (possibly wrapped)
    :param knobs: the reference knobs (best static's for the trace)
    :param differential: replace the reward by ``raw - reference`` (False: only report)
    :param cache_size: reference replays kept, by window
    """

    def __init__(self, env: gym.Env, knobs: Knobs, *, differential: bool = True,
                 cache_size: int = 256) -> None:
        super().__init__(env)
        self.knobs = knobs
        self.differential = differential
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[float, float], np.ndarray] = OrderedDict()
        self._track = np.zeros(1)
        self._g = 0
        self._raw = self._ref = 0.0
        self._steps = 0
        self.reference_replays = 0
        """reference replays run (cache misses)"""

    def _reference(self) -> np.ndarray:
        u = self.env.unwrapped
        key = (u.start_s, u.rate_scale)
        track = self._cache.get(key)
        if track is None:
            track = reference_track(self.env, self.knobs)
            self.reference_replays += 1
            self._cache[key] = track
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return track

    def _between(self, g0: int, g1: int) -> float:
        """The reference's reward over grid cells ``g0 + 1 .. g1``."""
        if g1 == g0 + 1:  # the usual step: one cell, read exactly
            return float(self._track[g1]) if g1 < len(self._track) else 0.0
        return float(self._track[g0 + 1:g1 + 1].sum())

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._track = self._reference()
        u = self.env.unwrapped
        self._g = grid_index(u.session.now, u.interval_s)
        self._raw = self._ref = 0.0
        self._steps = 0
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        u = self.env.unwrapped
        g = grid_index(u.session.now, u.interval_s)
        ref = self._between(self._g, g)
        self._g = g
        self._raw += reward
        self._ref += ref
        self._steps += 1
        info["raw_reward"] = reward
        info["reference_reward"] = ref
        if terminated or truncated:
            info["episode_gap"] = (self._raw - self._ref) / self._steps
        return obs, (reward - ref if self.differential else reward), terminated, truncated, info


class PooledWindows(gym.Wrapper):
    """Episodes on the windows of a :class:`env.windows.WindowPool`, drawn with probabilities the
    trainer may change (:meth:`set_window_probabilities`, the curriculum); uniform until then.
    Every step's info gets ``window_id``. A reset with ``options`` naming ``start_s`` plays that
    window instead (``window_id`` -1).

    :param env: a :class:`env.serving_env.ServingEnv` (possibly wrapped)
    :param pool: the windows
    """

    def __init__(self, env: gym.Env, pool: WindowPool) -> None:
        super().__init__(env)
        self.pool = pool
        self.probabilities = np.full(len(pool), 1.0 / len(pool))
        self.window_id = -1
        self._rng = np.random.default_rng()

    def set_window_probabilities(self, probabilities: Any) -> None:
        """Draw window ``i`` with probability ``probabilities[i]`` from the next reset on."""
        p = np.asarray(probabilities, dtype=np.float64)
        if p.shape != (len(self.pool),) or not np.all(p >= 0) or not math.isclose(p.sum(), 1.0):
            raise ValueError(f"window probabilities must be {len(self.pool)} non-negative numbers "
                             f"summing to 1, got shape {p.shape} and sum {p.sum():g}")
        self.probabilities = p

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        options = dict(options or {})
        if "start_s" in options:
            self.window_id = -1
        else:
            self.window_id = int(self._rng.choice(len(self.pool), p=self.probabilities))
            options["start_s"] = self.pool.starts[self.window_id]
            options["rate_scale"] = self.pool.scales[self.window_id]
        obs, info = self.env.reset(seed=seed, options=options)
        info["window_id"] = self.window_id
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info["window_id"] = self.window_id
        return obs, reward, terminated, truncated, info
