"""Rollout throughput of PPO on Ray environment workers, measured with 1 and 2 workers, and
projected to a cluster from the measured rates: where does the learner become the bottleneck?

    python scripts/bench_rollouts.py                       # local Ray, 1 and 2 workers
    python scripts/bench_rollouts.py --envs-per-worker 8 --project 1 2 4 8 16 32 64 128

Measured, in one run, on a local Ray of 2 CPUs (``RAY_ADDRESS``: a cluster's):

- PPO (SB3, train.py's settings) learning on :class:`agents.ray_vec_env.RayVecEnv` with 1 and
  with 2 workers of ``--envs-per-worker`` environments each: per iteration, the rollout
  (environment steps on the workers, the policy's forward pass and the round trips on the
  learner) and the update (``n_epochs`` passes of minibatch SGD on the learner), timed by a
  callback at the rollout's start and end; and the seconds each worker spent stepping its
  environments in that rollout (timed on the worker), whose slowest is what the learner waited.
- ``ray_call``: the round trip of a no-op call to an environment actor.

Projection to W workers of k environments, n steps each per rollout, from these figures:

    rollout(W) = n * (k * env + learner_step(W))     workers step in parallel; the learner waits
                                                     (env: a worker's seconds per environment
                                                     step, measured with 1 worker)
    update(W)  = u * W * k * n                        u: measured update seconds per sample
    throughput(W) = W * k * n / (rollout(W) + update(W))

``learner_step(W)``, the learner's own time per step, is the policy's forward pass on W*k
observations (timed on the learner for every batch size projected), plus one measured Ray round
trip per worker (an upper bound: the learner waits for the W answers together, but sends and
unpacks them one by one), plus the rest of its per-step work (normalisation, the rollout buffer,
callbacks: what the 1-worker rollout took beyond these, held constant). The learner is the
bottleneck from the W where its time per iteration (``n * learner_step(W) + update(W)``)
exceeds the workers' (``n * k * env``); throughput then tends to ``1 / u`` samples per second
whatever the number of workers. On a shared machine the measured rates vary run to run: read
the ratios, and rerun for the absolute numbers.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import tyro


@dataclass
class Args:
    envs_per_worker: int = 4
    """environments each Ray worker holds"""
    n_steps: int = 256
    """steps per environment per rollout"""
    batch_size: int = 256
    """PPO minibatch size"""
    n_epochs: int = 5
    """passes over each rollout"""
    iterations: int = 4
    """rollout + update iterations timed per worker count (the first is a warm-up, not counted)"""
    project: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    """worker counts of the projection"""
    project_envs_per_worker: tuple[int, ...] = (4, 16, 64)
    """environments per worker of the projection (the learner's per-step cost is taken as
    measured: it grows with the workers it waits for, assumed not with their environments)"""
    json: bool = False
    """print one JSON object"""


def time_ray_call(venv, calls: int = 200) -> float:
    """Round trip of a no-op call to one environment actor."""
    ray = venv._ray
    w = venv.workers[0]
    ray.get(w.has_attr.remote("rate_scale"))
    t0 = time.perf_counter()
    for _ in range(calls):
        ray.get(w.has_attr.remote("rate_scale"))
    return (time.perf_counter() - t0) / calls


def time_forward(model, args: Args, repeats: int = 30) -> dict[int, float]:
    """The learner's forward pass per rollout step (actions, values, log-probabilities, as
    collect_rollouts calls it) on a batch of every size the projection needs: median seconds."""
    import torch

    sizes = sorted({w * k for w in args.project for k in args.project_envs_per_worker})
    rng = np.random.default_rng(0)
    out = {}
    for b in sizes:
        obs = torch.as_tensor(rng.standard_normal((b, *model.observation_space.shape)),
                              dtype=torch.float32)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            with torch.no_grad():
                model.policy(obs)
            times.append(time.perf_counter() - t0)
        out[b] = float(np.median(times))
    return out


def time_ppo(args: Args, workers: int) -> dict:
    """PPO on a RayVecEnv of ``workers`` workers: rollout and update seconds per iteration."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import VecNormalize

    from agents.ray_vec_env import RayVecEnv
    from agents.training import make_env_thunks
    from train import Config

    n_envs = workers * args.envs_per_worker
    # train.py's environment copies (default preset: the embedded trace, 120 s episodes)
    cfg = Config()
    venv = RayVecEnv(make_env_thunks(cfg, [(cfg.trace, (cfg.rate_scale_min, cfg.rate_scale_max))],
                                     n_envs), n_workers=workers)
    rtt = time_ray_call(venv)
    venv.seed(0)
    norm = VecNormalize(venv, norm_obs=True, norm_reward=True, clip_obs=10.0, gamma=0.98)
    torch.set_num_threads(1)
    model = PPO("MlpPolicy", norm, n_steps=args.n_steps, batch_size=args.batch_size,
                n_epochs=args.n_epochs, gamma=0.98, seed=0, device="cpu", verbose=0,
                policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]),
                                   activation_fn=torch.nn.Tanh))
    marks: list[tuple[str, float]] = []
    stepping: list[list[float]] = []

    class Marks(BaseCallback):
        def _on_rollout_start(self) -> None:
            stepping.append(venv.stepping_seconds())
            marks.append(("start", time.perf_counter()))

        def _on_rollout_end(self) -> None:
            marks.append(("end", time.perf_counter()))
            stepping.append(venv.stepping_seconds())

        def _on_step(self) -> bool:
            return True

        def _on_training_end(self) -> None:
            marks.append(("start", time.perf_counter()))

    model.learn(total_timesteps=args.iterations * n_envs * args.n_steps, callback=Marks())
    norm.close()
    forward = time_forward(model, args) if workers == 1 else {}
    starts = [t for k, t in marks if k == "start"]
    ends = [t for k, t in marks if k == "end"]
    rollouts = [e - s for s, e in zip(starts, ends)][1:]  # the first is a warm-up
    updates = [s - e for e, s in zip(ends, starts[1:])][1:]
    # the slowest worker's stepping in each rollout (pairs of readings at its start and end)
    slowest = [max(np.subtract(stepping[i + 1], stepping[i])) for i in range(0, len(stepping), 2)]
    samples = n_envs * args.n_steps
    return {"workers": workers, "envs": n_envs, "ray_call_s": rtt, "forward_s": forward,
            "rollout_s": float(np.mean(rollouts)), "update_s": float(np.mean(updates)),
            "worker_stepping_s": float(np.mean(slowest[1:])),
            "rollout_steps_per_s": samples / float(np.mean(rollouts)),
            "steps_per_s": samples / float(np.mean(rollouts) + np.mean(updates))}


def project(args: Args, runs: list[dict]) -> dict:
    """The projection of the module docstring from the measured figures, for each number of
    environments per worker in ``args.project_envs_per_worker``."""
    k0, n = args.envs_per_worker, args.n_steps
    one = runs[0]
    env_s = one["worker_stepping_s"] / (n * k0)
    rtt = one["ray_call_s"]
    u = float(np.mean([r["update_s"] / (r["envs"] * n) for r in runs]))
    # the rest of the learner's time per step with 1 worker (normalisation, the rollout buffer,
    # callbacks), measured as what the rollout took beyond the stepping, the forward pass and the
    # round trip; taken as a constant per step
    rest = max(0.0, (one["rollout_s"] - one["worker_stepping_s"]) / n - one["forward_s"][k0]
               - rtt)
    tables = {}
    for k in args.project_envs_per_worker:
        rows = []
        for w in args.project:
            workers_s = n * k * env_s
            learner_s = n * (rest + one["forward_s"][w * k] + w * rtt) + u * w * k * n
            rows.append({"workers": w, "steps_per_s": w * k * n / (workers_s + learner_s),
                         "workers_s": workers_s, "learner_s": learner_s,
                         "bound": "learner" if learner_s > workers_s else "environments"})
        crossing = next((r["workers"] for r in rows if r["bound"] == "learner"), None)
        tables[k] = {"rows": rows, "learner_bound_from_workers": crossing}
    return {"env_step_s": env_s, "ray_call_s": rtt, "learner_rest_s": rest,
            "update_s_per_sample": u,
            "forward_s": one["forward_s"], "learner_limit_steps_per_s": 1.0 / u,
            "by_envs_per_worker": tables}


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    from agents.parallel import import_ray, init_ray

    ray = import_ray()
    owns = init_ray(2)
    try:
        runs = [time_ppo(args, w) for w in (1, 2)]
    finally:
        if owns:
            ray.shutdown()
    proj = project(args, runs)
    out = {"envs_per_worker": args.envs_per_worker, "n_steps": args.n_steps,
           "measured": runs, "projection": proj, "load_avg": os.getloadavg(),
           "cpus": os.cpu_count()}
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} "
          "(shared: absolute rates vary run to run)")
    env_s = proj["env_step_s"]
    print(f"one environment on a worker: {env_s * 1e3:.3f} ms/step ({1 / env_s:,.0f} steps/s)")
    print(f"Ray actor round trip: {runs[0]['ray_call_s'] * 1e3:.3f} ms\n")
    print("| Ray workers | envs | rollout steps/s | rollout s | slowest worker stepping s | "
          "update s | steps/s overall |")
    print("|---|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['workers']} | {r['envs']} | {r['rollout_steps_per_s']:,.0f} | "
              f"{r['rollout_s']:.2f} | {r['worker_stepping_s']:.2f} | {r['update_s']:.2f} | "
              f"{r['steps_per_s']:,.0f} |")
    one, two = runs
    print(f"\n2 workers / 1 worker: rollout "
          f"{two['rollout_steps_per_s'] / one['rollout_steps_per_s']:.2f}x, "
          f"overall {two['steps_per_s'] / one['steps_per_s']:.2f}x\n")
    fwd = proj["forward_s"]
    print(f"projection: learner per step = forward pass ({fwd[min(fwd)] * 1e3:.2f} ms on "
          f"{min(fwd)} observations .. {fwd[max(fwd)] * 1e3:.2f} ms on {max(fwd)}) + one Ray "
          f"round trip per worker + {proj['learner_rest_s'] * 1e3:.2f} ms of the rest; "
          f"update {proj['update_s_per_sample'] * 1e6:.1f} us/sample "
          f"(the learner's limit: {proj['learner_limit_steps_per_s']:,.0f} steps/s)")
    ks = list(proj["by_envs_per_worker"])
    print("projected steps/s (bound by: e = environments, L = learner)")
    print("| workers | " + " | ".join(f"{k} envs/worker" for k in ks) + " |")
    print("|---|" + "---|" * len(ks))
    for i, w in enumerate(args.project):
        cells = []
        for k in ks:
            r = proj["by_envs_per_worker"][k]["rows"][i]
            cells.append(f"{r['steps_per_s']:,.0f} ({'L' if r['bound'] == 'learner' else 'e'})")
        print(f"| {w} | " + " | ".join(cells) + " |")
    for k in ks:
        crossing = proj["by_envs_per_worker"][k]["learner_bound_from_workers"]
        print(f"{k} envs/worker: " + (f"the learner is the bottleneck from {crossing} workers"
                                      if crossing else "the environments stay the bottleneck "
                                      f"up to {max(args.project)} workers"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
