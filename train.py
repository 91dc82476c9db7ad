"""Train a PPO batching policy, track it in Weights & Biases, export it to ONNX.

    python train.py                      # the default preset on the embedded synthetic trace
    python train.py --preset smoke       # under a minute, for a quick check
    python train.py --preset full --trace azure-conv,azure-code

Reads top to bottom: config, seeding, environments, PPO, training with periodic evaluation
against the baselines on held-out windows (keeping the best model), ONNX export checked against
the torch policy, the final evaluation table, and the run folder with its card.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from env.session import RewardWeights
from runtime.session import DEFAULT_INTERVAL_S


@dataclass
class Config:
    preset: str = "default"
    """smoke (under a minute) | default (under 15 minutes on 2 cores) | full (as long as it
    takes); a preset sets the fields below that the command line does not"""
    trace: str = "synthetic"
    """training traces, comma-separated: synthetic | azure-conv | azure-code | PATH, each
    optionally with its own rate-scale range as TRACE@LOW-HIGH (e.g. azure-code@0.3-1.2);
    environment copies take them round robin"""
    seed: int = 0
    """seed of python, numpy, torch and the environments"""
    total_timesteps: int = 250_000
    """environment steps (decision intervals) to train for"""
    n_envs: int = 4
    """parallel environment copies"""
    vec_env: str = "subproc"
    """subproc (one process per copy) or dummy (all in this process)"""
    n_steps: int = 512
    """steps per environment per rollout"""
    batch_size: int = 256
    """minibatch size of the PPO update"""
    n_epochs: int = 5
    """passes over each rollout"""
    learning_rate: float = 2e-4
    """Adam learning rate (linearly decayed to 0)"""
    gamma: float = 0.98
    """discount per decision interval (0.98 looks ~12 s ahead at 0.25 s: a burst's queue)"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    clip_range: float = 0.2
    """PPO clip range"""
    ent_coef: float = 0.0
    """entropy bonus"""
    target_kl: float = 0.02
    """stop an update's epochs early once the policy moved this far (KL); runs without it
    peaked and then drifted down as updates overshot"""
    log_std_init: float = -1.0
    """initial log standard deviation of the actions (std 0.37 action units: a knob explores
    around its mean instead of bouncing between the ends of its range)"""
    init_at_default: bool = True
    """start the policy at the static default knobs (its action head's bias set to their action
    coordinates, its weights shrunk), so that before any learning it behaves as engines do
    today and learns deviations from there"""
    net_arch: tuple[int, ...] = (64, 64)
    """hidden layers of the policy and value MLPs"""
    episode_s: float = 120.0
    """simulated seconds per episode"""
    rate_scale_min: float = 0.5
    """lowest rate scale an episode is drawn at"""
    rate_scale_max: float = 2.5
    """highest rate scale an episode is drawn at"""
    interval_s: float = DEFAULT_INTERVAL_S
    """decision interval (simulated seconds)"""
    memory_price: float = RewardWeights.memory_price
    """reward: price of the KV ratio per interval"""
    violation_weight: float = RewardWeights.violation_weight
    """reward: weight of an SLO violation against an SLO-meeting completion"""
    oom_penalty: float = RewardWeights.oom_penalty
    """reward: penalty per OOM"""
    eval_every: int = 50_000
    """evaluate against the baselines every this many steps"""
    eval_rate_scales: tuple[float, ...] = ()
    """rate scales of the periodic evaluation (empty: the quartiles of each trace's training
    range on a log scale)"""
    eval_episode_s: float = 300.0
    """seconds of the eval split the periodic evaluation replays"""
    final_rate_scales: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    """rate scales of the final evaluation table"""
    final_controllers: str = "static,best-static,pid,aimd,heuristic"
    """baselines of the final evaluation (the trained policy is added)"""
    final_capacity: bool = True
    """bisect every controller's capacity in the final evaluation"""
    final_match_static: float = 0.68
    """also compare every controller at the load where the static default attains this share
    (the design documents' headline is 68% -> 99.95%); 0 to skip"""
    out_dir: str = "runs"
    """the run folder is created under this"""
    run_name: str = ""
    """name of the run (default: batchpilot-<preset>-<date>-<seed>)"""
    wandb_mode: str = "auto"
    """online | offline | disabled | auto (online if an API key is configured, else offline)"""
    wandb_project: str = "batchpilot"
    """Weights & Biases project"""
    workers: int = 2
    """processes for the final evaluation"""


PRESETS: dict[str, dict] = {
    "smoke": dict(total_timesteps=2048, n_envs=2, vec_env="dummy", n_steps=256, batch_size=128,
                  n_epochs=2, episode_s=30.0, eval_every=2048, eval_rate_scales=(1.5,),
                  eval_episode_s=60.0, final_rate_scales=(1.5,), final_controllers="static",
                  final_capacity=False, final_match_static=0.0),
    "default": {},
    "full": dict(trace="azure-conv@1.0-2.5,azure-code@0.3-1.2", total_timesteps=600_000,
                 n_envs=4, n_steps=1024, batch_size=512, n_epochs=5, eval_every=50_000,
                 episode_s=240.0, memory_price=0.02),
}


def parse_config(argv: list[str] | None = None) -> Config:
    """Every field of :class:`Config` is a flag (``--total-timesteps 1000``); the preset fills
    the fields the command line does not set."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    docs = _field_docs()
    for f in dataclasses.fields(Config):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            ap.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=None,
                            help=docs.get(f.name))
        elif f.type.startswith("tuple"):
            ap.add_argument(flag, type=str, default=None, help=f"{docs.get(f.name)} (comma-sep.)")
        else:
            ap.add_argument(flag, type=str, default=None, help=docs.get(f.name))
    args = ap.parse_args(argv)
    preset = args.preset or Config.preset
    if preset not in PRESETS:
        ap.error(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    values = dict(PRESETS[preset])
    for f in dataclasses.fields(Config):
        raw = getattr(args, f.name)
        if raw is None:
            continue
        if f.type.startswith("tuple"):
            cast = int if "int" in f.type else float
            values[f.name] = tuple(cast(x) for x in str(raw).split(",") if x.strip())
        elif f.type in ("int", "float"):
            try:
                values[f.name] = (int if f.type == "int" else float)(raw)
            except ValueError:
                ap.error(f"--{f.name.replace('_', '-')} expects a number, got {raw!r}")
        else:
            values[f.name] = raw
    values["preset"] = preset
    cfg = Config(**values)
    if cfg.n_steps * cfg.n_envs < cfg.batch_size:
        ap.error(f"n_steps * n_envs ({cfg.n_steps * cfg.n_envs}) must be at least batch_size "
                 f"({cfg.batch_size})")
    if cfg.vec_env not in ("subproc", "dummy"):
        ap.error(f"--vec-env must be subproc or dummy, got {cfg.vec_env!r}")
    if cfg.wandb_mode not in ("online", "offline", "disabled", "auto"):
        ap.error(f"--wandb-mode must be online, offline, disabled or auto, got {cfg.wandb_mode!r}")
    return cfg


def _field_docs() -> dict[str, str]:
    """The one-line docstring under each Config field, for --help."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(Config))
    body = tree.body[0].body
    docs = {}
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and \
                isinstance(b.value, ast.Constant):
            docs[a.target.id] = " ".join(str(b.value.value).split())
    return docs


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


def wandb_mode(requested: str) -> str:
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    netrc = Path.home() / ".netrc"
    configured = os.environ.get("WANDB_API_KEY") or (
        netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore"))
    return "online" if configured else "offline"


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(argv)
    t_start = time.time()

    # heavy imports after argument parsing, so --help is instant; W&B's own banner would
    # misread this project's `agents` package as OpenAI's Agents SDK, and we print where the
    # run went ourselves
    os.environ.setdefault("WANDB_SILENT", "true")
    import torch
    import wandb
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import KVWriter, Logger
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

    import env as env_pkg
    from agents.arena import run_episode
    from agents.export import export_policy, stamp_metadata
    from agents.registry import EvalSpec, make_controller
    from agents.report import markdown_table, plot
    from agents.sb3_controller import SB3PolicyController
    from env.traces import rate_scale, split, time_window
    from env.traces.resolve import resolve_trace, trace_label
    from runtime.engine.profile import Profile

    # ---------------------------------------------------------------- seeding and the run folder
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(1)
    date = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_name = cfg.run_name or f"batchpilot-{cfg.preset}-{date}-s{cfg.seed}"
    run_dir = Path(cfg.out_dir) / run_name
    run_dir.mkdir(parents=True, exist_ok=True)
    trace_ranges = parse_traces(cfg.trace, (cfg.rate_scale_min, cfg.rate_scale_max))
    traces = [t for t, _ in trace_ranges]
    for t in traces:  # fail early, with the reader's message, on a bad trace
        resolve_trace(t)
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=1) + "\n")
    print(f"run {run_name}: preset {cfg.preset}, traces {', '.join(traces)}, "
          f"{cfg.total_timesteps:,} steps on {cfg.n_envs} environments -> {run_dir}")

    # ---------------------------------------------------------------- Weights & Biases
    mode = wandb_mode(cfg.wandb_mode)
    wandb_run = wandb.init(project=cfg.wandb_project, name=run_name, mode=mode,
                           dir=str(run_dir), config=dataclasses.asdict(cfg),
                           settings=wandb.Settings(silent=True))

    class WandbWriter(KVWriter):
        """SB3's logger into W&B (losses under train/, rollout stats under rollout/)."""

        def write(self, key_values, key_excluded, step=0):
            wandb.log({k: v for k, v in key_values.items()
                       if isinstance(v, (int, float, np.floating, np.integer))}, step=step)

        def close(self):
            pass

    # ---------------------------------------------------------------- environments
    env_kwargs = dict(split="train", episode_s=cfg.episode_s,
                      interval_s=cfg.interval_s, memory_price=cfg.memory_price,
                      violation_weight=cfg.violation_weight, oom_penalty=cfg.oom_penalty)

    def make_env(rank: int):
        def thunk():
            import gymnasium as gym
            from stable_baselines3.common.monitor import Monitor

            import env  # noqa: F401  (registers the id in the subprocess)

            name, scale_range = trace_ranges[rank % len(trace_ranges)]
            e = gym.make(env_pkg.ENV_ID, trace=name, rate_scale_range=scale_range, **env_kwargs)
            return Monitor(e)
        return thunk

    vec_cls = SubprocVecEnv if (cfg.vec_env == "subproc" and cfg.n_envs > 1) else DummyVecEnv
    venv = vec_cls([make_env(i) for i in range(cfg.n_envs)])
    venv.seed(cfg.seed)
    venv = VecNormalize(venv, norm_obs=True, norm_reward=True, clip_obs=10.0, gamma=cfg.gamma)

    # ---------------------------------------------------------------- PPO
    model = PPO("MlpPolicy", venv, n_steps=cfg.n_steps, batch_size=cfg.batch_size,
                n_epochs=cfg.n_epochs, learning_rate=lambda p: cfg.learning_rate * p,
                gamma=cfg.gamma, gae_lambda=cfg.gae_lambda, clip_range=cfg.clip_range,
                ent_coef=cfg.ent_coef, target_kl=cfg.target_kl, seed=cfg.seed, verbose=0,
                device="cpu",
                policy_kwargs=dict(net_arch=dict(pi=list(cfg.net_arch), vf=list(cfg.net_arch)),
                                   activation_fn=torch.nn.Tanh, log_std_init=cfg.log_std_init))
    model.set_logger(Logger(str(run_dir), [WandbWriter()]))
    if cfg.init_at_default:
        from runtime.knobs import DEFAULT_KNOBS, knobs_to_action

        head = model.policy.action_net
        with torch.no_grad():
            head.weight.mul_(0.01)
            head.bias.copy_(torch.tensor(knobs_to_action(DEFAULT_KNOBS), dtype=torch.float32))

    # ---------------------------------------------------------------- periodic evaluation
    profile = Profile.load()
    eval_windows = []
    for t, (lo, hi) in trace_ranges:
        held_out = split(resolve_trace(t), "eval")
        window = time_window(held_out, float(held_out.arrival_s[0]),
                             float(held_out.arrival_s[0]) + cfg.eval_episode_s)
        scales = cfg.eval_rate_scales or tuple(round(lo * (hi / lo) ** q, 3)
                                               for q in (0.25, 0.5, 0.75))
        for s in scales:
            eval_windows.append((trace_label(t), s, rate_scale(window, s) if s != 1 else window))

    def evaluate_controller(controller) -> dict:
        out = {}
        for label, s, window in eval_windows:
            ep = run_episode(window, controller, interval_s=cfg.interval_s, profile=profile)
            out[f"{label}/x{s:g}"] = ep.summary["slo_attainment"]
        out["mean"] = float(np.mean(list(out.values())))
        return out

    spec0 = EvalSpec(traces[0], "eval", None, cfg.interval_s)
    baseline_eval = {name: evaluate_controller(make_controller(name, spec0))
                     for name in ("static", "pid")}
    print("periodic evaluation windows: " + ", ".join(f"{k}" for k in baseline_eval["static"]
                                                      if k != "mean"))
    for name, res in baseline_eval.items():
        print(f"  {name:>7}: mean SLO attainment {res['mean']:.2%}")

    class Periodic(BaseCallback):
        """Serving metrics of each rollout, and evaluation + best model every eval_every steps."""

        def __init__(self):
            super().__init__()
            self.best = -1.0
            self.next_eval = cfg.eval_every
            self.history = []
            self._acc: dict[str, list[float]] = {}

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                for k in ("slo_attainment", "goodput_rps", "ttft_p99_ratio", "tpot_p99_ratio",
                          "preemptions", "ooms", "batch_window_ms", "prefill_chunk_tokens",
                          "kv_cache_ratio", "rate_scale"):
                    self._acc.setdefault(k, []).append(float(info[k]))
            if self.num_timesteps >= self.next_eval:
                self.next_eval += cfg.eval_every
                self.evaluate()
            return True

        def _on_rollout_end(self) -> None:
            wandb.log({f"serving/{k}": float(np.mean(v)) for k, v in self._acc.items()},
                      step=self.num_timesteps)
            self._acc = {}

        def evaluate(self) -> None:
            res = evaluate_controller(SB3PolicyController(self.model, venv))
            self.history.append({"step": self.num_timesteps, **res})
            wandb.log({f"eval/policy/{k}": v for k, v in res.items()}
                      | {f"eval/{n}/mean": r["mean"] for n, r in baseline_eval.items()},
                      step=self.num_timesteps)
            if res["mean"] > self.best:
                self.best = res["mean"]
                self.model.save(run_dir / "best_model.zip")
                venv.save(str(run_dir / "best_vecnormalize.pkl"))
            tqdm_write(f"step {self.num_timesteps:,}: eval mean SLO attainment "
                       f"{res['mean']:.2%} (best {self.best:.2%}; static "
                       f"{baseline_eval['static']['mean']:.2%}, pid "
                       f"{baseline_eval['pid']['mean']:.2%})")

    def tqdm_write(msg: str) -> None:
        try:
            from tqdm import tqdm
            tqdm.write(msg)
        except ImportError:
            print(msg)

    # ---------------------------------------------------------------- train
    periodic = Periodic()
    t0 = time.time()
    model.learn(total_timesteps=cfg.total_timesteps, callback=periodic, progress_bar=True)
    train_s = time.time() - t0
    periodic.evaluate()  # the final weights compete for best too
    steps_per_s = cfg.total_timesteps / train_s
    print(f"trained {cfg.total_timesteps:,} steps in {train_s:.0f} s ({steps_per_s:.0f} steps/s)")
    model.save(run_dir / "last_model.zip")
    venv.save(str(run_dir / "last_vecnormalize.pkl"))

    # ---------------------------------------------------------------- best model -> ONNX
    best_model = PPO.load(run_dir / "best_model.zip", device="cpu")
    best_norm = VecNormalize.load(str(run_dir / "best_vecnormalize.pkl"), DummyVecEnv(
        [make_env(0)]))
    best_norm.training = False
    shutil.copy(run_dir / "best_model.zip", run_dir / "model.zip")
    shutil.copy(run_dir / "best_vecnormalize.pkl", run_dir / "vecnormalize.pkl")
    onnx_path = run_dir / "policy.onnx"
    export = export_policy(best_model, best_norm, onnx_path, policy_version=run_name,
                           metadata={"batchpilot.trained_on": ",".join(traces),
                                     "batchpilot.preset": cfg.preset})
    print(f"exported {onnx_path} ({export.bytes:,} bytes): ONNX vs torch max |diff| "
          f"{export.max_abs_diff:.2g} on {export.num_checked} observations; operators "
          f"{export.operators}")

    # ---------------------------------------------------------------- final evaluation
    from agents.arena import evaluate

    controllers = [c for c in cfg.final_controllers.split(",") if c] + [f"policy:{onnx_path}"]
    result = evaluate(traces, controllers, cfg.final_rate_scales, part="eval",
                      interval_s=cfg.interval_s, capacity=cfg.final_capacity,
                      workers=cfg.workers, match_static=cfg.final_match_static or None)
    plots = plot(result["rows"], run_dir / "plots")
    for r in result["rows"]:
        r.pop("timeline", None)
    table = markdown_table(result["rows"], result["capacity"])
    (run_dir / "evaluation.json").write_text(json.dumps(result, indent=1) + "\n")
    summary = {f"{r['trace']}/x{r['rate_scale']:g}": round(r["slo_attainment"], 4)
               for r in result["rows"] if r["controller"].startswith("policy:")}
    stamp_metadata(onnx_path, {"batchpilot.eval_summary": json.dumps(summary)})

    # ---------------------------------------------------------------- the card
    card = {
        "run": run_name, "date": dt.datetime.now().isoformat(timespec="seconds"),
        "config": dataclasses.asdict(cfg), "traces": traces,
        "training": {"seconds": train_s, "env_steps_per_s": steps_per_s,
                     "best_periodic_eval_mean_attainment": periodic.best,
                     "periodic_evaluations": periodic.history,
                     "baselines_periodic_eval": baseline_eval},
        "export": export.as_dict(), "evaluation": result,
    }
    (run_dir / "card.json").write_text(json.dumps(card, indent=1, default=str) + "\n")
    (run_dir / "card.md").write_text(
        f"# Policy card: {run_name}\n\n"
        f"- date: {card['date']}\n- preset: {cfg.preset}; seed {cfg.seed}\n"
        f"- training traces: {', '.join(traces)} (train split: first 40 minutes)\n"
        f"- training: {cfg.total_timesteps:,} steps in {train_s:.0f} s "
        f"({steps_per_s:.0f} env steps/s)\n"
        f"- export: max |ONNX - torch| = {export.max_abs_diff:.2g} on {export.num_checked} "
        f"observations; operators {export.operators}\n\n"
        f"## Evaluation on held-out windows (eval split: after minute 40)\n\n{table}\n\n"
        f"## Config\n\n```json\n{json.dumps(dataclasses.asdict(cfg), indent=1)}\n```\n")

    # ---------------------------------------------------------------- W&B artifacts and summary
    columns = sorted({k for r in result["rows"] for k in r} - {"decision_sources"})
    wandb.log({"final/evaluation": wandb.Table(
        columns=columns, data=[[r.get(k) for k in columns] for r in result["rows"]])})
    for p in plots:
        wandb.log({f"plots/{p.stem}": wandb.Image(str(p))})
    artifact = wandb.Artifact(f"policy-{run_name}", type="model",
                              metadata={"spec_version": export_spec_version(onnx_path)})
    artifact.add_file(str(onnx_path))
    artifact.add_file(str(run_dir / "card.md"))
    wandb_run.log_artifact(artifact)
    wandb_run.summary.update({"train_seconds": train_s, "env_steps_per_s": steps_per_s,
                              "best_eval_mean_attainment": periodic.best})
    wandb_dir = Path(wandb_run.dir).parent
    wandb.finish()
    venv.close()

    print(f"\n{table}\n")
    print(f"ONNX policy: {onnx_path}")
    print(f"run folder:  {run_dir} (model.zip, vecnormalize.pkl, policy.onnx, card.md, plots/)")
    if mode == "offline":
        print(f"W&B run (offline): {wandb_dir}; sync it with `wandb sync {wandb_dir}`")
    elif mode == "online":
        print(f"W&B run: {wandb_run.url}")
    print(f"total {time.time() - t_start:.0f} s")
    return 0


def export_spec_version(path: Path) -> str:
    import onnx

    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    return props.get("batchpilot.spec_version", "")


if __name__ == "__main__":
    sys.exit(main())
