"""Learning curves of train.py variants, same seeds and same steps, side by side.

An experiment, not a tool: it produced the table of training variants (the raw and the
differential reward, the curriculum, the DAgger warm start; three seeds each) and the figure in
docs/learning_curve/, both quoted in docs/training.md ("Variance reduction, curriculum and
imitation"), with this command:

    PYTHONPATH=$PWD python scripts/experiments/learning_curve.py --variants reward=raw \\
        reward=differential --seeds 0 1 2 --out docs/learning_curve -- \\
        --preset smoke --trace azure-code@0.5-1.2 --total-timesteps 16384 --eval-every 2048

A variant is ``flag=value[,flag=value...]`` (``reward=raw``,
``reward=differential,curriculum=0``), the train.py flags it sets. Every variant runs with every
seed (one after another, in this process), the flags after ``--`` shared by all; each periodic
evaluation is collected through ``train.main(on_eval=...)``. Writes ``curves.json`` (every
evaluation of every run) and ``curves.png`` (the policy's mean SLO attainment on the held-out
windows minus best static's, against training steps: one thin line per seed, the mean over seeds
thick) under ``--out``, and prints the mean over seeds of the last and the best evaluation of
each variant.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tyro


@dataclass
class Args:
    variants: tuple[str, ...] = ("reward=raw", "reward=differential")
    """the train.py flags of each variant, ``flag=value[,flag=value...]``"""
    seeds: tuple[int, ...] = (0, 1, 2)
    """the seeds every variant runs with"""
    out: Path = Path("runs/learning_curve")
    """folder of curves.json, curves.png and the runs"""
    metric: str = "gap_to_best_static"
    """the evaluation entry plotted (gap_to_best_static, mean, gap_to_oracle, ...)"""
    replot: tuple[Path, ...] = ()
    """curves.json files of earlier runs: plot their variants together (nothing is trained)"""
    train_args: list[str] = field(default_factory=list)
    """flags shared by every run (after ``--``)"""


def variant_flags(variant: str) -> list[str]:
    """``reward=raw,curriculum=0`` -> ``["--reward", "raw", "--curriculum", "0"]``."""
    flags = []
    for part in (p for p in variant.split(",") if p):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"variant {variant!r}: {part!r} is not flag=value")
        flags += [f"--{key.strip().replace('_', '-')}", value.strip()]
    return flags


def run(args: Args) -> dict:
    import train

    out: dict = {"variants": {}, "train_args": args.train_args, "metric": args.metric}
    for variant in args.variants:
        runs = {}
        for seed in args.seeds:
            history: list[dict] = []
            name = f"{variant.replace(',', '_').replace('=', '-')}-s{seed}"
            argv = [*args.train_args, *variant_flags(variant), "--seed", str(seed),
                    "--out-dir", str(args.out / "runs"), "--run-name", name,
                    "--wandb-mode", "disabled"]
            print(f"== {variant} seed {seed}: train.py {' '.join(argv)}", flush=True)
            train.main(argv, on_eval=history.append)
            runs[seed] = history
        out["variants"][variant] = runs
    return out


def summarise(result: dict) -> dict:
    """Per variant: the mean over seeds of the last and of the best evaluation of the metric."""
    metric = result["metric"]
    summary = {}
    for variant, runs in result["variants"].items():
        last = [h[-1][metric] for h in runs.values()]
        best = [max(e[metric] for e in h) for h in runs.values()]
        summary[variant] = {"last_mean": float(np.mean(last)), "last": last,
                            "best_mean": float(np.mean(best)), "best": best}
    return summary


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = result["metric"]
    fig, ax = plt.subplots(figsize=(8, 4.2 + 0.25 * len(result["variants"])))
    for i, (variant, runs) in enumerate(result["variants"].items()):
        color = f"C{i}"
        curves = []
        for history in runs.values():
            steps = [e["step"] for e in history]
            values = [e[metric] for e in history]
            ax.plot(steps, values, color=color, alpha=0.3, lw=1)
            curves.append((steps, values))
        n = min(len(v) for _, v in curves)
        ax.plot(curves[0][0][:n], np.mean([v[:n] for _, v in curves], axis=0), color=color,
                lw=2.5, label=f"{variant} (mean of {len(curves)} seeds)")
    ax.axhline(0.0, color="k", lw=0.8, ls="--")
    ax.set_xlabel("training steps")
    ax.set_ylabel(f"{metric} (held-out SLO attainment)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=1)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    shared: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, shared = argv[:i], argv[i + 1:]
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    args.train_args = shared
    args.out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        result = {"variants": {}, "metric": args.metric, "sources": [str(p) for p in args.replot]}
        for path in args.replot:
            result["variants"].update(json.loads(path.read_text())["variants"])
    else:
        result = run(args)
    result["summary"] = summarise(result)
    (args.out / "curves.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    plot(result, args.out / "curves.png")
    for variant, s in result["summary"].items():
        print(f"{variant:>28}: {args.metric} last {s['last_mean']:+.4f} "
              f"({', '.join(f'{x:+.4f}' for x in s['last'])}), best {s['best_mean']:+.4f}")
    print(f"-> {args.out / 'curves.json'}, {args.out / 'curves.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
