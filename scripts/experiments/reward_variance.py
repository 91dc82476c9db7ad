"""How much of the reward's spread the pairing with best static removes, on the same windows.

An experiment, not a tool: it produced the spread of an episode's mean reward, raw and
differential, quoted in docs/training.md ("Variance reduction, curriculum and imitation"):

    PYTHONPATH=$PWD python scripts/experiments/reward_variance.py --trace azure-code \\
        --scale-low 0.5 --scale-high 1.2 --windows 32 --json

Plays every window of a seeded pool (as training draws them) under fixed behaviours: the static
default's knobs held, and uniformly random actions (seeded, the same sequence on every window).
For each it reports, over the windows, the spread of an episode's mean reward per step, raw (the
environment's) and differential (minus best static's over the same intervals,
:class:`env.wrappers.StaticReference`): the noise a policy-gradient estimate sees when episodes
land on different windows. It also reports the spread of the difference between the two
behaviours, window by window: what PPO must tell apart.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import numpy as np
import tyro

from env.serving_env import ServingEnv
from env.windows import WindowPool
from env.wrappers import StaticReference
from runtime.knobs import DEFAULT_KNOBS, NUM_KNOBS, knobs_to_action


@dataclass
class Args:
    trace: str = "azure-code"
    """the trace (its train split)"""
    scale_low: float = 0.5
    """lowest rate scale of a window"""
    scale_high: float = 1.2
    """highest rate scale of a window"""
    windows: int = 32
    """windows of the pool played"""
    episode_s: float = 60.0
    """simulated seconds per window"""
    seed: int = 0
    """seed of the pool and of the random actions"""
    json: bool = False
    """print one JSON object"""


def play(env: StaticReference, start: float, scale: float, actions) -> tuple[float, float]:
    """(mean raw reward, mean differential reward) per step of one window."""
    env.reset(options={"start_s": start, "rate_scale": scale})
    raw, diff = [], []
    for t in range(1 << 30):
        _, r, term, trunc, info = env.step(actions(t))
        raw.append(info["raw_reward"])
        diff.append(r)
        if term or trunc:
            return float(np.mean(raw)), float(np.mean(diff))
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    from agents.controllers.best_static import best_static_knobs

    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    reference = best_static_knobs(args.trace, part="train")
    env = StaticReference(ServingEnv(args.trace, episode_s=args.episode_s), reference)
    pool = WindowPool.draw(env.unwrapped.trace, args.windows, args.episode_s,
                           (args.scale_low, args.scale_high), args.seed)
    rng = np.random.default_rng(args.seed)
    random_actions = rng.uniform(-1, 1, (100_000, NUM_KNOBS)).astype(np.float32)
    default = np.asarray(knobs_to_action(DEFAULT_KNOBS), dtype=np.float32)
    behaviours = {"static default": lambda t: default, "random": lambda t: random_actions[t]}
    results = {name: np.array([play(env, s, x, act) for s, x in zip(pool.starts, pool.scales)])
               for name, act in behaviours.items()}
    out: dict = {"trace": args.trace, "windows": args.windows, "episode_s": args.episode_s,
                 "rate_scales": [args.scale_low, args.scale_high],
                 "reference_knobs": reference.as_dict()}
    for name, r in results.items():
        out[name] = {"raw_mean": float(r[:, 0].mean()), "raw_std": float(r[:, 0].std()),
                     "differential_mean": float(r[:, 1].mean()),
                     "differential_std": float(r[:, 1].std()),
                     "std_ratio": float(r[:, 1].std() / r[:, 0].std())}
    a, b = results["static default"], results["random"]
    gap = a - b  # per window; the same for raw and differential (the reference cancels)
    out["static default - random"] = {
        "mean": float(gap[:, 0].mean()), "std": float(gap[:, 0].std()),
        "snr_raw_episodes": float(gap[:, 0].mean() / a[:, 0].std()),
        "snr_differential_episodes": float(gap[:, 1].mean() / a[:, 1].std())}
    if args.json:
        print(json.dumps(out))
    else:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
