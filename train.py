"""Train a PPO batching policy, track it in Weights & Biases, export it to ONNX.

    python train.py                      # the default preset on the embedded synthetic trace
    python train.py --preset smoke       # under a minute, for a quick check
    python train.py --preset full        # the shipped policy's recipe (Azure traces, mixed)
    batchpilot train --help              # the same, installed (every Config field is a flag)

    python train.py --trace my_trace.csv --init-from checkpoints/shipped/policy.onnx

Reads top to bottom: the config (every field a flag, a preset filling the rest), then the steps
of ``main``: seeding, environments, PPO, an optional warm start (a trained policy, or imitation
of the lookahead oracle: behaviour cloning, then DAgger), training with periodic evaluation
against the baselines on the train split's busiest minutes (keeping the best model; the held-out
split is left to the final evaluation), ONNX export checked against the torch policy, the final
evaluation table, and the run folder with its card. The machinery of each step lives in
``agents/``: environments and PPO in agents/training.py, imitation in agents/imitation.py, the
periodic evaluation in agents/periodic_eval.py, export in agents/export.py, the final evaluation
and the card in agents/card.py, W&B in agents/tracking.py.

Variance. Episodes are drawn from a fixed pool of windows per trace (``--windows``), and each is
paired with best static's replay of the same window (cached per window): by default the reward
of every step is the policy's minus best static's over the same interval (``--reward
differential``, env/wrappers.py), so the trace's share of the reward cancels and PPO's advantage
measures what the knobs changed. The curriculum (``--curriculum``) draws more often the windows
where the policy loses to best static (env/windows.py states the rule).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, NoReturn

import numpy as np
import tyro

from agents.card import final_evaluation, write_card
from agents.held_knobs import held_actions, hold_knobs, parse_free_knobs
from agents.periodic_eval import SELECT_ON, evaluate_controller, periodic_eval_windows
from agents.tracking import log_to_wandb, wandb_mode
from agents.training import make_ppo, make_vec_env, parse_traces, seed_everything
from env.engine_choice import EngineChoice
from env.session import RewardWeights
from runtime.engine.admission import AdmissionPolicy
from runtime.knobs import KNOB_NAMES
from runtime.session import DEFAULT_INTERVAL_S


@dataclass
class Config(EngineChoice):
    """Every field is a flag; the engine's SLO classes and levers (``--slo --batch-share
    --admission --admission-slack --cotenant``, env/engine_choice.py) come first."""

    preset: Literal["smoke", "default", "full"] = "default"
    """smoke (under a minute) | default (the main command: under 15 minutes on 2 cores, late
    requests shed at slack 0.5) | full (the shipped policy's recipe: PRESETS states it); a preset
    sets the fields the command line does not"""
    trace: str = "synthetic"
    """training traces, comma-separated: synthetic | azure-conv | azure-code | PATH, each
    optionally with its own rate-scale range as TRACE@LOW-HIGH (e.g. azure-code@0.3-1.2);
    environment copies take them round robin"""
    seed: int = 0
    """seed of python, numpy, torch and the environments"""
    profile: str | None = None
    """executor profile: a file or a name such as h100-llama3.1-8b-40gib-roofline (see
    scripts/list_profiles.py); default the shipped roofline H200 Llama-2-7B profile"""
    total_timesteps: int = 250_000
    """environment steps (decision intervals) to train for"""
    n_envs: int = 4
    """parallel environment copies"""
    vec_env: Literal["subproc", "dummy", "ray"] = "subproc"
    """subproc (one process per copy), dummy (all in this process) or ray (Ray actors, on the
    cluster at RAY_ADDRESS or a local Ray; the optional ray extra, docs/ray.md)"""
    ray_workers: int = 0
    """with --vec-env ray: the actors that hold the environment copies, in contiguous blocks
    (0: one per copy)"""
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
    batch_weight: float = RewardWeights.batch_weight
    """reward: value of a batch request finished by its deadline against an interactive one met"""
    cotenant_value: float = RewardWeights.cotenant_value
    """reward: value per interval of serving the co-tenant's whole demand (with --cotenant)"""
    reward: Literal["differential", "raw"] = "differential"
    """differential: each step's reward minus best static's over the same interval of the same
    window (a cached replay; env/wrappers.py), which takes the trace's share out of the
    reward's variance; raw: the environment's reward"""
    windows: int = 64
    """windows per training trace that episodes are drawn from (env/windows.py); best static's
    replay of each is cached; 0: a fresh window every episode (each paired with a replay of its
    own, no curriculum)"""
    curriculum: float = 0.5
    """share of episodes drawn in proportion to what the policy loses to best static on each
    window (env/windows.py's rule); 0: uniform"""
    warm_start: Literal["none", "bc", "dagger"] = "none"
    """imitation of the lookahead oracle before PPO: bc (cloning on the states the oracle
    visits) or dagger (bc, then --dagger-rounds rounds on the states the policy visits)"""
    dagger_rounds: int = 2
    """with --warm-start dagger: rounds after cloning"""
    imitation_windows: int = 8
    """windows per training trace (the pool's first) the oracle labels per round"""
    imitation_horizon_s: float = 4.0
    """simulated seconds the labelling oracle looks ahead (it searches every interval)"""
    imitation_epochs: int = 60
    """passes over the labels per cloning"""
    imitation_candidates: str = ""
    """the labelling oracle's candidate grid, ``key=v1,v2;...`` over the knobs and levers
    (agents/oracle.py's parse_candidates; empty: its DEFAULT_CANDIDATES, chunk sizes only: name
    batch_share and admission_slack values to imitate those knobs too)"""
    imitation_memory_price: float = 0.0
    """the labelling oracle's score per GiB of KV pool held on average (0: memory is free to
    it); with --cotenant and ratio values in --imitation-candidates, the oracle lends memory
    where that costs it no more than this in SLO-meeting requests"""
    imitation_weighting: Literal["none", "regret"] = "none"
    """how much each label counts in cloning: alike (none), or by what holding best static's
    setting would have lost there, in the labelling oracle's score (regret)"""
    imitation_arrivals: Literal["trace", "repeat"] = "trace"
    """what the labelling oracle sees arrive: the trace's future (trace), or the last horizon of
    arrivals again (repeat: a teacher that cannot see the future, as the policy cannot)"""
    init_from: str = ""
    """start from a trained policy: a run folder (model.zip, vecnormalize.pkl) or an exported
    policy.onnx of this spec (the shipped one: checkpoints/shipped/policy.onnx); with a --trace
    of your own, this fine-tunes it on your traffic"""
    free_knobs: str = ""
    """the knobs the policy moves, comma-separated (empty: all five); the others hold best
    static's value on the training traces (which must agree on them) in the clone, in PPO and
    in the exported policy. Free only the levers where the oracle finds room (docs/results.md,
    "Headroom of run-time control, per lever"): ``kv_cache_ratio`` is the one the imitation
    oracle searches"""
    eval_every: int = 50_000
    """evaluate against the baselines every this many steps (0: only before and after training;
    the kept model is the better of the two)"""
    select_on: Literal["all", "interactive"] = "all"
    """the attainment the periodic evaluation ranks models by: of every request, or of the
    interactive ones (the scorecard judges those first; batch requests then count only
    through its batch-on-time target)"""
    select_within: float = 0.005
    """with --cotenant, the kept model is the best score (attainment plus the memory terms) among
    evaluations whose mean attainment is within this of best static's (the scorecard's
    co-tenant memory target: half a point); while none is, the best attainment"""
    eval_oracle: bool = True
    """run the lookahead oracle's search (anchored on best static; it sees the future, but no
    bound is proven for it) once on the periodic evaluation's windows, so every evaluation logs
    the policy's gap to it"""
    eval_rate_scales: tuple[float, ...] = ()
    """rate scales of the periodic evaluation (empty: the quartiles of each trace's training
    range on a log scale)"""
    eval_episode_s: float = 300.0
    """seconds the periodic evaluation replays: the busiest stretch of each trace's train split
    (the held-out split is read only by the final evaluation)"""
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
    wandb_mode: Literal["online", "offline", "disabled", "auto"] = "auto"
    """online | offline | disabled | auto (online if an API key is configured, else offline)"""
    wandb_project: str = "batchpilot"
    """Weights & Biases project"""
    workers: int = 2
    """processes for the oracle's labelling and the final evaluation (or CPUs of its local Ray
    with --ray True)"""
    static_grid: str = ""
    """the knob grid best static's capacity search walks (training's reference, the periodic
    and final evaluations' best static), ``window=..;chunk=..;ratio=..`` (empty: the full grid
    of 90 settings, whose searches for the presets' deployments are cached in
    checkpoints/best_static/)"""
    ray: bool = False
    """run the final evaluation's jobs on Ray (they also do when RAY_ADDRESS is set)"""


SHED_AT_HALF = dict(admission=AdmissionPolicy.SHED, admission_slack=0.5)
"""late requests shed at half a TTFT target of slack: the deployment best static picks and every
shipped figure uses (docs/results.md, "Levers at fixed knobs")"""
PRESETS: dict[str, dict] = {
    # a quick check: best static searches a grid of four settings (the full one would take
    # longer than the whole preset)
    "smoke": dict(total_timesteps=2048, n_envs=2, vec_env="dummy", n_steps=256, batch_size=128,
                  n_epochs=2, episode_s=30.0, eval_every=2048, eval_rate_scales=(1.5,),
                  eval_episode_s=60.0, final_rate_scales=(1.5,), final_controllers="static",
                  final_capacity=False, final_match_static=0.0, windows=16, dagger_rounds=1,
                  imitation_windows=2, imitation_horizon_s=2.0, imitation_epochs=30,
                  static_grid="window=5;chunk=1024,2048;ratio=0.9,0.95"),
    # shed at half: under first come first served the preset's policy lent memory at the price
    # of the queue and fell to 11.65% at twice the trace's rate, where the static default held
    # 27.64%; shed, it holds 95.65% there against the static default's 95.03% (README, Results)
    "default": dict(SHED_AT_HALF),
    # the shipped policy's recipe: the Azure traces, the mixed workload and the training family
    # of synthetic traffic (env/traces/families.py: load, burstiness, diurnal shape and lengths
    # drawn every two minutes, long prompts up to the context included), memory lent to a
    # co-tenant and late requests shed (best static's admission), imitation of the oracle
    # searching the KV ratio (the one lever whose headroom passes 10%: docs/results.md,
    # "Headroom of run-time control, per lever"), then PPO on the reward differential to best static
    "full": dict(trace="azure-code@0.3-1.2,azure-conv@1.0-2.5,mixed@0.7-2.8,family:train@0.5-2",
                 n_envs=4,
                 cotenant=True, **SHED_AT_HALF,
                 cotenant_value=0.02, memory_price=0.0, warm_start="dagger", dagger_rounds=2,
                 imitation_windows=6, imitation_candidates="ratio=0.5,0.6,0.7,0.8,0.9,0.95",
                 imitation_memory_price=0.01, total_timesteps=150_000, eval_every=50_000,
                 final_rate_scales=(0.5, 1.0, 2.0)),
}


def parse_config(argv: list[str] | None = None) -> Config:
    """Every field of :class:`Config` is a flag (``--total-timesteps 1000``, ``--init-at-default
    False``); the preset fills the fields the command line does not set. A bad value exits with
    status 2 and a message naming the flag."""
    argv = sys.argv[1:] if argv is None else list(argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", default=Config.preset)
    preset = pre.parse_known_args(argv)[0].preset
    if preset not in PRESETS:
        refuse(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    default = dataclasses.replace(Config(), preset=preset, **PRESETS[preset])
    cfg = tyro.cli(Config, args=argv, default=default, description=__doc__.splitlines()[0],
                   config=(tyro.conf.FlagConversionOff,))
    if cfg.n_steps * cfg.n_envs < cfg.batch_size:
        refuse(f"--n-steps * --n-envs ({cfg.n_steps * cfg.n_envs}) must be at least "
               f"--batch-size ({cfg.batch_size})")
    if not 0.0 <= cfg.curriculum <= 1.0:
        refuse(f"--curriculum must be in [0, 1], got {cfg.curriculum}")
    if not 0.0 <= cfg.select_within <= 1.0:
        refuse(f"--select-within must be in [0, 1] (a share of requests), got "
               f"{cfg.select_within}")
    if cfg.windows < 0 or cfg.imitation_windows < 1 or cfg.dagger_rounds < 0:
        refuse(f"--windows ({cfg.windows}) and --dagger-rounds ({cfg.dagger_rounds}) must be "
               f">= 0 and --imitation-windows ({cfg.imitation_windows}) >= 1")
    if cfg.eval_every < 0:
        refuse(f"--eval-every must be >= 0 (0: no periodic evaluation), got {cfg.eval_every}")
    if cfg.warm_start != "none" and cfg.windows < 1:
        refuse("--warm-start labels windows of the pool: it needs --windows >= 1")
    try:
        parse_free_knobs(cfg.free_knobs)
    except ValueError as e:
        refuse(str(e))
    if not 0 <= cfg.ray_workers <= cfg.n_envs:
        refuse(f"--ray-workers must be in 0..{cfg.n_envs} (--n-envs), got {cfg.ray_workers}")
    return cfg


def refuse(message: str) -> NoReturn:
    """Exit as argparse does on a bad flag: the message on stderr, status 2."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None, *,
         on_eval: Callable[[dict[str, float]], None] | None = None) -> int:
    """Train, export, evaluate (see the module docstring); ``on_eval`` gets every periodic
    evaluation of the policy (``{"step", "mean", "<trace>/x<scale>", ...}``), as a sweep's
    trial reports them to Ray Tune (scripts/sweep.py)."""
    cfg = parse_config(argv)
    t_start = time.time()
    # W&B's own banner would misread this project's `agents` package as OpenAI's Agents SDK, and
    # we print where the run went ourselves
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    from agents.controllers.best_static import parse_grid
    from agents.export import export_best
    from agents.imitation import imitate
    from agents.oracle import SEARCH_ONLY_NAME
    from agents.registry import EvalSpec, make_controller, reference_knobs
    from agents.sb3_callbacks import CurriculumCallback, ObservationRecorder, PeriodicEval
    from env.traces import TRAIN_SPLIT_S, split
    from env.traces.resolve import resolve_trace, trace_label
    from env.windows import Curriculum
    from runtime.engine.profile import Profile

    # ---------------------------------------------------------------- seeding and the run folder
    seed_everything(cfg.seed)
    date = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_name = cfg.run_name or f"batchpilot-{cfg.preset}-{date}-s{cfg.seed}"
    run_dir = Path(cfg.out_dir) / run_name
    trace_ranges = parse_traces(cfg.trace, (cfg.rate_scale_min, cfg.rate_scale_max))
    traces = [t for t, _ in trace_ranges]
    for t in traces:  # fail early, with the reader's message, on a bad trace
        trace = resolve_trace(t)
        for part in ("train", "eval"):  # episodes come from one, the final evaluation the other
            try:
                split(trace, part)
            except ValueError as e:
                refuse(f"--trace {t}: {e} (training draws its episodes from the first "
                       f"{TRAIN_SPLIT_S:g} s and the final evaluation replays the rest)")
    profile = Profile.load(cfg.profile)  # and on a bad profile
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=1) + "\n")
    print(f"run {run_name}: preset {cfg.preset}, traces {', '.join(traces)}, "
          f"{cfg.total_timesteps:,} steps on {cfg.n_envs} environments -> {run_dir}")
    # best static's knobs per trace, as the arena's best static chooses them (the highest
    # capacity at 99% on the train split, levers included, under the deployment's admission):
    # the pairing's reference and the imitation oracle's anchor (cached searches; a trace of
    # one's own gets its search here, once)
    engine_config = cfg.engine_config(seed=cfg.seed)
    grid = parse_grid(cfg.static_grid) if cfg.static_grid else None
    # (a search not cached yet runs here, on the run's workers, with its progress shown)
    references = {t: reference_knobs(EvalSpec(t, "train", cfg.profile, cfg.interval_s,
                                              engine_config, static_grid=grid),
                                     workers=cfg.workers, progress=True)
                  for t in traces}
    for t, k in references.items():
        print(f"best static on {trace_label(t)} (train split): {k}")
    # every episode is paired with best static's replay of its window when the reward is
    # differential or the curriculum needs the gap (without a pool, each episode replays anew)
    paired = cfg.reward == "differential" or (cfg.windows > 0 and cfg.curriculum > 0)

    # ---------------------------------------------------------------- W&B, environments, PPO
    mode = wandb_mode(cfg.wandb_mode)
    wandb_run = wandb.init(project=cfg.wandb_project, name=run_name, mode=mode,
                           dir=str(run_dir), config=dataclasses.asdict(cfg),
                           settings=wandb.Settings(silent=True))
    venv = make_vec_env(cfg, trace_ranges, references if paired else None)
    model = make_ppo(cfg, venv, run_dir)

    # ---------------------------------------------------------------- warm start
    warm: dict[str, Any] = {}
    taught = None  # the observations imitation labelled (if it ran)
    if cfg.init_from:
        from agents.policy_init import init_from

        warm["init_from"] = init_from(model, venv, cfg.init_from)
        print(f"started from {cfg.init_from}: {', '.join(warm['init_from']['copied'])}")
    free = parse_free_knobs(cfg.free_knobs)
    if free != KNOB_NAMES:
        try:
            held = held_actions(free, {trace_label(t): k for t, k in references.items()})
        except ValueError as e:
            refuse(str(e))
        hold_knobs(model.policy, held)
        warm["held_knobs"] = {KNOB_NAMES[i]: getattr(next(iter(references.values())),
                                                     KNOB_NAMES[i]) for i in held}
        print("held at best static's value: " + ", ".join(f"{k} {v:g}"
                                                           for k, v in warm["held_knobs"].items()))
    if cfg.warm_start != "none":
        report = imitate(cfg, model, venv, trace_ranges, references)
        warm["imitation"] = report.as_dict()
        taught = report.observations

    # ---------------------------------------------------------------- periodic evaluation
    windows = periodic_eval_windows(cfg, trace_ranges)

    def baseline(name: str):
        return lambda trace: make_controller(name, EvalSpec(trace, "eval", cfg.profile,
                                                            cfg.interval_s, engine_config,
                                                            static_grid=grid))

    names = ("static", "pid", "best-static") + ((SEARCH_ONLY_NAME,) if cfg.eval_oracle else ())
    weights = RewardWeights(violation_weight=cfg.violation_weight, memory_price=cfg.memory_price,
                            oom_penalty=cfg.oom_penalty, batch_weight=cfg.batch_weight,
                            cotenant_value=cfg.cotenant_value)
    attainment = SELECT_ON[cfg.select_on]
    baselines = {name: evaluate_controller(baseline(name), windows, cfg.interval_s, profile,
                                           engine_config, weights, attainment)
                 for name in names}
    print("periodic evaluation windows: " + ", ".join(k for k in baselines["static"]
                                                      if k not in ("mean", "score")))
    for name, res in baselines.items():
        print(f"  {name:>11}: mean {'interactive' if cfg.select_on == 'interactive' else 'SLO'} "
              f"attainment {res['mean']:.2%}"
              + (f", score {res['score']:.4f}" if "score" in res else ""))
    periodic = PeriodicEval(
        partial(evaluate_controller, windows=windows, interval_s=cfg.interval_s,
                profile=profile, config=engine_config, weights=weights, attainment=attainment),
        venv, run_dir, baselines, cfg.eval_every, on_evaluate=on_eval,
        interval_s=cfg.interval_s,
        attainment_floor=baselines["best-static"]["mean"] - cfg.select_within)
    recorder = ObservationRecorder(seed=cfg.seed)
    callbacks = [periodic, recorder]
    curriculum = None
    if paired and cfg.windows > 0 and cfg.curriculum > 0:
        labels = [trace_label(t) for t, _ in trace_ranges]
        curricula = {lab: Curriculum(cfg.windows, mix=cfg.curriculum) for lab in labels}
        curriculum = CurriculumCallback([labels[i % len(labels)] for i in range(cfg.n_envs)],
                                        curricula)
        callbacks.append(curriculum)

    # ---------------------------------------------------------------- train
    # the starting point competes for best too: the kept model is never worse on the evaluation
    # windows than where training started (the static default, a clone, or --init-from)
    periodic.init_callback(model)
    periodic.evaluate()
    t0 = time.time()
    model.learn(total_timesteps=cfg.total_timesteps, callback=callbacks, progress_bar=True)
    train_s = time.time() - t0
    periodic.evaluate()  # the final weights compete for best too
    steps_per_s = cfg.total_timesteps / train_s
    print(f"trained {cfg.total_timesteps:,} steps in {train_s:.0f} s ({steps_per_s:.0f} steps/s)")
    model.save(run_dir / "last_model.zip")
    venv.save(str(run_dir / "last_vecnormalize.pkl"))

    # ---------------------------------------------------------------- export, evaluate, card
    if recorder.seen == 0 and taught is not None:  # no PPO step: where the clone was taught
        recorder.add(taught)
    onnx_path, export = export_best(cfg, run_dir, run_name, traces, trace_ranges,
                                    recorder.sample())
    result, plots, table = final_evaluation(cfg, traces, onnx_path, run_dir)
    training = {"seconds": train_s, "env_steps_per_s": steps_per_s,
                "best_periodic_eval_mean_attainment": periodic.best_entry["mean"],
                **({"best_periodic_eval_score": periodic.best_entry["score"]}
                   if "score" in periodic.best_entry else {}),
                "periodic_evaluations": periodic.history, "kept_evaluation": periodic.best_entry,
                "baselines_periodic_eval": baselines,
                "reward": cfg.reward, "best_static_knobs": {t: k.as_dict()
                                                            for t, k in references.items()},
                "warm_start": warm}
    if curriculum is not None:
        training["curriculum"] = {t: {"episodes": c.episodes.tolist(),
                                      "loss": [None if np.isnan(x) else x for x in c.loss],
                                      "probabilities": c.probabilities().tolist()}
                                  for t, c in curriculum.curricula.items()}
    write_card(cfg, run_dir, run_name, traces, training, export, result, table)
    log_to_wandb(wandb_run, result, plots, onnx_path, run_dir, run_name,
                 {"train_seconds": train_s, "env_steps_per_s": steps_per_s,
                  "best_eval_mean_attainment": periodic.best_entry["mean"]})
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


if __name__ == "__main__":
    sys.exit(main())
