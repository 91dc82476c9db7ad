"""The training machinery train.py's ``main`` calls, in its order: seeding, the environment copies
(one monitored copy per trace, paired with best static's replay of its window, episodes drawn
from the trace's window pool), their normalised vector, and PPO.

``cfg`` is train.py's ``Config`` (its fields are read by name; nothing here imports train.py).
The training stack (torch, SB3, gymnasium) is imported inside each function, so that train.py's
``--help`` and a bad flag answer before it loads.
"""

from __future__ import annotations

import random
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np


def parse_traces(text: str, default_range: tuple[float, float]) -> list[tuple[str, tuple]]:
    """``a@0.5-2,b`` -> ``[("a", (0.5, 2.0)), ("b", default_range)]``."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, rng = part.partition("@")
        if rng:
            lo, sep, hi = rng.partition("-")
            try:
                bounds = (float(lo), float(hi))
            except ValueError:
                raise ValueError(f"--trace {part!r}: expected TRACE@LOW-HIGH, e.g. "
                                 "azure-code@0.3-1.2") from None
            if not (sep and 0 < bounds[0] <= bounds[1]):
                raise ValueError(f"--trace {part!r}: need 0 < LOW <= HIGH")
        else:
            bounds = default_range
        out.append((name, bounds))
    if not out:
        raise ValueError("--trace names no trace")
    return out


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch; one torch thread per process (environments use the rest)."""
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)


def make_env(name: str, scale_range: tuple[float, float], env_kwargs: dict[str, Any],
             wrap: dict[str, Any] | None = None):
    """One monitored environment copy (built in the subprocess of a SubprocVecEnv): episodes
    from the trace's window pool (``wrap["windows"]`` drawn from ``wrap["seed"]``, the same in
    every copy of a trace), paired with ``wrap["reference"]`` knobs' replays (the reward
    differential when ``wrap["differential"]``)."""
    import gymnasium as gym
    from stable_baselines3.common.monitor import Monitor

    import env  # registers the id in the subprocess
    from env.windows import WindowPool
    from env.wrappers import PooledWindows, StaticReference

    e = gym.make(env.ENV_ID, trace=name, rate_scale_range=scale_range, **env_kwargs)
    wrap = wrap or {}
    if wrap.get("reference") is not None:
        e = StaticReference(e, wrap["reference"], differential=wrap["differential"])
    if wrap.get("windows"):
        pool = WindowPool.draw(e.unwrapped.trace, wrap["windows"], env_kwargs["episode_s"],
                               scale_range, wrap["seed"])
        e = PooledWindows(e, pool)
    return Monitor(e)


def env_kwargs_of(cfg) -> dict[str, Any]:
    """The training environment's arguments."""
    return dict(split="train", episode_s=cfg.episode_s, interval_s=cfg.interval_s,
                memory_price=cfg.memory_price, violation_weight=cfg.violation_weight,
                oom_penalty=cfg.oom_penalty, batch_weight=cfg.batch_weight,
                cotenant_value=cfg.cotenant_value, profile=cfg.profile,
                engine_config=cfg.engine_config(seed=cfg.seed))


def make_env_thunks(cfg, trace_ranges: list[tuple[str, tuple]], n: int,
                    references: dict[str, Any] | None = None) -> list:
    """``n`` environment constructors taking the traces round robin (``references``: best
    static's knobs per trace, for the pairing)."""
    references = references or {}
    thunks = []
    for i in range(n):
        name, scale_range = trace_ranges[i % len(trace_ranges)]
        wrap = {"reference": references.get(name), "differential": cfg.reward == "differential",
                "windows": cfg.windows, "seed": cfg.seed}
        thunks.append(partial(make_env, name, scale_range, env_kwargs_of(cfg), wrap))
    return thunks


def make_vec_env(cfg, trace_ranges: list[tuple[str, tuple]],
                 references: dict[str, Any] | None = None):
    """The normalised vector of training environments."""
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

    thunks = make_env_thunks(cfg, trace_ranges, cfg.n_envs, references)
    if cfg.vec_env == "ray":
        from agents.ray_vec_env import RayVecEnv

        venv = RayVecEnv(thunks, n_workers=cfg.ray_workers or None)
    elif cfg.vec_env == "subproc" and cfg.n_envs > 1:
        venv = SubprocVecEnv(thunks)
    else:
        venv = DummyVecEnv(thunks)
    venv.seed(cfg.seed)
    return VecNormalize(venv, norm_obs=True, norm_reward=True, clip_obs=10.0, gamma=cfg.gamma)


def make_ppo(cfg, venv, run_dir: Path):
    """PPO with a tanh MLP, logging into W&B, optionally started at the static default knobs."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import Logger

    from agents.sb3_callbacks import WandbWriter
    from runtime.knobs import DEFAULT_KNOBS, knobs_to_action

    model = PPO("MlpPolicy", venv, n_steps=cfg.n_steps, batch_size=cfg.batch_size,
                n_epochs=cfg.n_epochs, learning_rate=lambda p: cfg.learning_rate * p,
                gamma=cfg.gamma, gae_lambda=cfg.gae_lambda, clip_range=cfg.clip_range,
                ent_coef=cfg.ent_coef, target_kl=cfg.target_kl, seed=cfg.seed, verbose=0,
                device="cpu",
                policy_kwargs=dict(net_arch=dict(pi=list(cfg.net_arch), vf=list(cfg.net_arch)),
                                   activation_fn=torch.nn.Tanh, log_std_init=cfg.log_std_init))
    model.set_logger(Logger(str(run_dir), [WandbWriter()]))
    if cfg.init_at_default:
        head = model.policy.action_net
        with torch.no_grad():
            head.weight.mul_(0.01)
            head.bias.copy_(torch.tensor(knobs_to_action(DEFAULT_KNOBS), dtype=torch.float32))
    return model
