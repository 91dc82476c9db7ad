"""Sweep train.py's seeds and hyper-parameters with Ray Tune, logging every trial to W&B.

    python scripts/sweep.py --seeds 0 1 2 --grid learning_rate=1e-4,3e-4 gamma=0.98,0.99
    RAY_ADDRESS=ray://head:10001 python scripts/sweep.py --preset default --seeds 0 1 2 3 \
        -- --trace azure-conv --n-envs 4 --vec-env dummy

Every combination of the grid runs once per seed, as one Tune trial: ``train.py`` with the
preset, the trial's values and the flags after ``--`` (train.py's own flags, so its own checks
apply; they are checked here before anything starts). A trial reports each periodic evaluation
of the policy to Tune (``eval_mean``: mean SLO attainment over the held-out evaluation windows,
``best_eval_mean``) and, at its end, the final evaluation's attainment of the trained policy
per trace and load (``final/<trace>/x<scale>``). Ray Tune's ``WandbLoggerCallback`` logs every
trial as a W&B run in one group named after the sweep (offline unless an API key is
configured, like train.py; ``--wandb-mode disabled`` in tests); the trials' own train.py runs
log nothing to W&B, so that no trial is logged twice. The trials' run folders (model, ONNX
policy, card) land in ``<out-dir>/<name>/runs/``, Tune's records in ``<out-dir>/<name>/``.

Ray: the cluster at ``RAY_ADDRESS`` (this checkout is shipped to it, see docs/ray.md), or a local
Ray of ``--cpus`` CPUs. Each trial holds ``--cpus-per-trial`` CPUs; a trial's final evaluation
runs in its own process (``--workers 1``) unless the flags after ``--`` say otherwise.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tyro

import train
from agents.parallel import RAY_ADDRESS_ENV, import_ray, init_ray
from agents.tracking import wandb_mode


@dataclass
class Args:
    preset: str = "smoke"
    """train.py preset every trial starts from"""
    seeds: tuple[int, ...] = (0, 1)
    """seeds; every grid combination runs once per seed"""
    grid: tuple[str, ...] = ()
    """hyper-parameters as FIELD=V1,V2 with train.py's field names (learning_rate=1e-4,3e-4);
    a value with spaces is several tokens (net_arch=64 64,128 128)"""
    train_args: tuple[str, ...] = ()
    """further train.py flags for every trial, verbatim: everything after a lone -- on the
    command line"""
    cpus: int = 2
    """CPUs of the local Ray (ignored on a cluster: RAY_ADDRESS)"""
    cpus_per_trial: float = 1.0
    """CPUs each trial holds"""
    name: str = ""
    """sweep name: W&B group and folder (default: sweep-<preset>-<date>)"""
    out_dir: str = "runs/sweeps"
    """the sweep's folder is created under this"""
    wandb_mode: str = "auto"
    """online | offline | disabled | auto (online if an API key is configured, else offline)"""
    wandb_project: str = "batchpilot"
    """Weights & Biases project"""
    json: bool = False
    """print one JSON object instead of the table"""


def parse_grid(grid: tuple[str, ...]) -> dict[str, list[str]]:
    """``("learning_rate=1e-4,3e-4",)`` -> ``{"learning_rate": ["1e-4", "3e-4"]}``."""
    fields = {f.name for f in dataclasses.fields(train.Config)}
    out: dict[str, list[str]] = {}
    for item in grid:
        name, sep, values = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not values.strip():
            raise ValueError(f"--grid {item!r}: expected FIELD=V1,V2,...")
        if name not in fields:
            raise ValueError(f"--grid {item!r}: train.py has no field {name!r}")
        if name in ("seed", "preset", "run_name", "out_dir", "wandb_mode"):
            raise ValueError(f"--grid {item!r}: {name} is set by the sweep itself")
        out[name] = [v.strip() for v in values.split(",") if v.strip()]
    return out


def trial_argv(args: Args, seed: int, params: dict[str, str], run_name: str,
               runs_dir: str) -> list[str]:
    """train.py's command line for one trial."""
    argv = ["--preset", args.preset, "--seed", str(seed), "--run-name", run_name,
            "--out-dir", runs_dir, "--wandb-mode", "disabled", "--workers", "1"]
    for name, value in params.items():
        argv += [f"--{name.replace('_', '-')}", *value.split()]
    return argv + list(args.train_args)


def run_trial(config: dict[str, Any]) -> None:
    """One Tune trial: train.py with the trial's values, its evaluations reported to Tune."""
    from ray import tune

    # the trial's own jobs (its final evaluation) stay in its process, on the CPUs it holds
    os.environ.pop(RAY_ADDRESS_ENV, None)
    params = {k: config[k] for k in config["grid_fields"]}
    # a run name W&B accepts as an artifact name: letters, digits, dashes, underscores, dots
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", "-".join(
        [f"s{config['seed']}", *(f"{k}-{v}" for k, v in params.items())]))
    argv = trial_argv(config["args"], config["seed"], params, name, config["runs_dir"])
    best = {"value": -1.0}

    def on_eval(res: dict[str, float]) -> None:
        best["value"] = max(best["value"], res["mean"])
        tune.report({"step": res["step"], "eval_mean": res["mean"],
                     "best_eval_mean": best["value"],
                     **{f"eval/{k}": v for k, v in res.items() if k not in ("step", "mean")}})

    code = train.main(argv, on_eval=on_eval)
    if code != 0:
        raise RuntimeError(f"train.py {' '.join(argv)} exited with {code}")
    evaluation = json.loads((Path(config["runs_dir"]) / name / "evaluation.json").read_text())
    final = {f"final/{r['trace']}/x{r['rate_scale']:g}": r["slo_attainment"]
             for r in evaluation["rows"] if r["controller"].startswith("policy:")}
    tune.report({"best_eval_mean": best["value"], "run_dir": str(Path(config["runs_dir"]) / name),
                 **final})


def sweep(args: Args) -> dict[str, Any]:
    """Run the sweep; returns ``{"name", "folder", "trials": [...], "best": {...}}``."""
    from ray import tune
    from ray.air.integrations.wandb import WandbLoggerCallback

    grid = parse_grid(args.grid)
    name = args.name or f"sweep-{args.preset}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    folder = Path(args.out_dir).resolve() / name
    runs_dir = str(folder / "runs")
    for values in itertools.product(*grid.values()):  # every trial's flags, checked up front
        train.parse_config(trial_argv(args, args.seeds[0], dict(zip(grid, values)), "check",
                                      runs_dir))
    mode = wandb_mode(args.wandb_mode)
    if mode in ("offline", "disabled"):
        os.environ["WANDB_MODE"] = mode  # Tune's callback asks for an API key otherwise
    init_ray(args.cpus)
    param_space = {"seed": tune.grid_search(list(args.seeds)),
                   **{k: tune.grid_search(v) for k, v in grid.items()},
                   "grid_fields": list(grid), "args": args, "runs_dir": runs_dir}
    tuner = tune.Tuner(
        tune.with_resources(run_trial, {"cpu": args.cpus_per_trial}),
        param_space=param_space,
        tune_config=tune.TuneConfig(metric="best_eval_mean", mode="max"),
        run_config=tune.RunConfig(
            name=name, storage_path=str(folder.parent), verbose=0,
            callbacks=[WandbLoggerCallback(project=args.wandb_project, group=name, mode=mode,
                                           excludes=["args", "grid_fields", "runs_dir"])]))
    results = tuner.fit()
    trials = []
    for r in results:
        if r.error:
            raise RuntimeError(f"a trial failed: {r.error}")
        trials.append({"seed": r.config["seed"], **{k: r.config[k] for k in grid},
                       **{k: v for k, v in r.metrics.items()
                          if k == "best_eval_mean" or k.startswith("final/")},
                       "run_dir": r.metrics.get("run_dir")})
    trials.sort(key=lambda t: [t["seed"], *(t[k] for k in grid)])
    best = max(trials, key=lambda t: t["best_eval_mean"])
    out = {"name": name, "folder": str(folder), "wandb_mode": mode, "grid": grid,
           "trials": trials, "best": best}
    (folder / "sweep.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


def table(result: dict[str, Any]) -> str:
    keys = ["seed", *result["grid"], "best_eval_mean",
            *sorted({k for t in result["trials"] for k in t if k.startswith("final/")})]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for t in result["trials"]:
        lines.append("| " + " | ".join(f"{t[k]:.2%}" if isinstance(t.get(k), float)
                                       else str(t.get(k, "-")) for k in keys) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    rest: list[str] = []
    if "--" in argv:
        argv, rest = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    args = dataclasses.replace(args, train_args=args.train_args + tuple(rest))
    try:
        import_ray()
        result = sweep(args)
    except (ValueError, ImportError) as e:
        print(f"sweep: {e}", file=sys.stderr)
        return 2
    finally:
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()
    if args.json:
        print(json.dumps(result))
    else:
        print(table(result))
        print(f"\nbest: {result['best']}\nsweep folder: {result['folder']} (sweep.json, runs/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
