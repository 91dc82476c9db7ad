"""Environment speed against the bare engine, measured side by side in one run.

    python scripts/bench_env.py [--json] [--trace azure-conv] [--rate-scale 2] [--episodes 6]
    python scripts/bench_env.py --actions random

Both replay the same windows of the trace's train split at the same rate scale with the static
default knobs: the bare engine in one ``run_until`` to the end of each window, the environment
one decision interval per ``step`` (observation, reward and info included). ``env_steps_per_s``
is decisions per wall second; ``overhead_vs_engine`` is how much longer the environment takes to
cover the same simulated time (0.3 = 30% more wall time). Neither side's time includes building
its engine and the window's requests or the first interval, which the environment's ``reset``
runs: the bare engine is built and run to the same point untimed, and both time the same span.

``--actions random`` steps the environment with seeded uniform actions instead (what a policy
sends early in training: every knob, the KV ratio too, moves nearly every step), and the bare
engine then applies the knobs the environment applied, at the same engine times
(``run_until``, ``set_knobs``); the KV pool's resizes are then part of both sides.

Each episode is timed ``repeats`` times on each side, alternating, and the fastest of each side
is kept (as ``timeit`` does): on a shared machine the other processes only ever add time, so the
minimum is the least disturbed measurement of both.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import tyro

from env.serving_env import DEFAULT_INTERVAL_S, ServingEnv
from runtime.engine.engine import Engine
from runtime.engine.sim_executor import SimulatedExecutor
from runtime.knobs import DEFAULT_KNOBS, NUM_KNOBS, Knobs, knobs_to_action


@dataclass
class Args:
    trace: str = "azure-conv"
    """the trace the episodes replay"""
    rate_scale: float = 2.0
    """rate scale of every episode"""
    episodes: int = 6
    """episodes to time"""
    repeats: int = 3
    """timings of each episode on each side (the fastest is kept)"""
    episode_s: float = 120.0
    """simulated seconds per episode"""
    interval_s: float = DEFAULT_INTERVAL_S
    """decision interval, simulated seconds"""
    actions: Literal["static", "random"] = "static"
    """``static`` (the static default's action every step) or ``random`` (seeded uniform)"""
    json: bool = False
    """print one JSON object"""


def knob_schedule(env: ServingEnv, seed: int, actions: np.ndarray) -> list[tuple[float, Knobs]]:
    """(engine time, knobs) of every knob change of an episode: when each step applied which
    knobs (an untimed run; the episode is the same on every repeat)."""
    env.reset(seed=seed)
    schedule = []
    for a in actions:
        t = env.session.now
        _, _, term, trunc, _ = env.step(a)
        schedule.append((t, env.session.engine.knobs))
        if term or trunc:
            break
    else:
        raise RuntimeError("the episode ran past its steps")
    return schedule


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    try:
        env = ServingEnv(args.trace, episode_s=args.episode_s, interval_s=args.interval_s,
                         rate_scale_range=(args.rate_scale, args.rate_scale))
    except FileNotFoundError as e:
        print(f"bench_env: {e}", file=sys.stderr)
        return 2
    static = np.asarray(knobs_to_action(DEFAULT_KNOBS), dtype=np.float32)
    executor = SimulatedExecutor(env.profile)
    max_steps = math.ceil(args.episode_s / args.interval_s) + 2  # an episode's steps, at most

    env_wall = env_sim = engine_wall = engine_sim = 0.0
    steps = 0
    for ep in range(args.episodes):
        actions = schedule = None
        if args.actions == "random":
            actions = np.random.default_rng(ep).uniform(
                -1.0, 1.0, (max_steps, NUM_KNOBS)).astype(np.float32)
            schedule = knob_schedule(env, ep, actions)
        best_env = best_engine = math.inf
        for _ in range(max(1, args.repeats)):
            env.reset(seed=ep)
            window = env.session.trace  # the same requests, for the bare engine
            start_now = env.session.now
            n = 0
            t0 = time.perf_counter()
            done = False
            while not done:
                _, _, term, trunc, _ = env.step(static if actions is None else actions[n])
                n += 1
                done = term or trunc
            best_env = min(best_env, time.perf_counter() - t0)
            end = env.session.now

            # built and run to where the environment's reset left off, untimed, as the reset
            # is: both sides then time the same simulated span from the same state
            engine = Engine(executor, DEFAULT_KNOBS)
            engine.add_requests(window.arrival_s, window.prompt_tokens, window.output_tokens,
                                window.slo_class)
            engine.run_until(start_now)
            engine_start = engine.now
            t0 = time.perf_counter()
            for t, knobs in schedule or ():
                engine.run_until(t)
                engine.set_knobs(knobs)
            engine.run_until(end)
            best_engine = min(best_engine, time.perf_counter() - t0)
        env_wall += best_env
        env_sim += end - start_now
        engine_wall += best_engine
        engine_sim += engine.now - engine_start
        steps += n

    env_speed = env_sim / env_wall
    engine_speed = engine_sim / engine_wall
    out = {"trace": args.trace, "rate_scale": args.rate_scale, "interval_s": args.interval_s,
           "actions": args.actions, "episodes": args.episodes, "repeats": args.repeats,
           "env_steps": steps,
           "env_steps_per_s": steps / env_wall,
           "env_sim_s_per_wall_s": env_speed, "engine_sim_s_per_wall_s": engine_speed,
           "overhead_vs_engine": engine_speed / env_speed - 1.0}
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>24}: {v:.4g}" if isinstance(v, float) else f"{k:>24}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
