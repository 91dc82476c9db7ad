"""A digest of the environment's episodes, to show that a speed change left them bit-identical.

    python scripts/episode_digest.py [--traces azure-conv azure-code mixed] [--episodes 3]

Runs ``episodes`` episodes on each trace, the even ones with seeded random actions (the knobs,
the KV ratio included, move every step, so pool resizes and the slew limit are exercised), the
odd ones with the static default's action (the benchmark's path), and hashes every
observation's bytes, every reward as a float64 and every info dictionary (its ``repr``, keys
sorted). Prints one line per trace and one line for all of them; run it on two checkouts and
compare the lines: equal digests mean equal episodes, bit for bit.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field

import numpy as np
import tyro

from env.serving_env import ServingEnv
from runtime.knobs import DEFAULT_KNOBS, knobs_to_action


@dataclass
class Args:
    traces: list[str] = field(default_factory=lambda: ["azure-conv", "azure-code", "mixed"])
    """the traces to run episodes on"""
    episodes: int = 4
    """episodes per trace (episode i: window seed i, action seed i)"""
    episode_s: float = 60.0
    """simulated seconds per episode"""
    rate_scale: float = 2.0
    """rate scale of every episode"""


def episode_digest(env: ServingEnv, seed: int) -> tuple[str, int]:
    """The hex digest of one episode and its number of steps."""
    h = hashlib.sha256()
    rng = np.random.default_rng(seed)
    static = np.asarray(knobs_to_action(DEFAULT_KNOBS), dtype=np.float32)
    obs, info = env.reset(seed=seed)
    h.update(obs.tobytes())
    h.update(repr(sorted(info.items())).encode())
    steps = 0
    done = False
    while not done:
        action = (static if seed % 2 else
                  rng.uniform(-1.0, 1.0, env.action_space.shape).astype(np.float32))
        obs, reward, term, trunc, info = env.step(action)
        h.update(obs.tobytes())
        h.update(np.float64(reward).tobytes())
        h.update(repr(sorted(info.items())).encode())
        steps += 1
        done = term or trunc
    return h.hexdigest(), steps


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    total = hashlib.sha256()
    for trace in args.traces:
        env = ServingEnv(trace, episode_s=args.episode_s,
                         rate_scale_range=(args.rate_scale, args.rate_scale))
        h = hashlib.sha256()
        steps = 0
        for ep in range(args.episodes):
            d, n = episode_digest(env, ep)
            h.update(d.encode())
            steps += n
        total.update(h.hexdigest().encode())
        print(f"{trace:>12} {args.episodes} episodes {steps:5d} steps {h.hexdigest()[:24]}")
    print(f"{'all':>12} {total.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
