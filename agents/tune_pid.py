"""Tune the PID fallback's gains by random search on training windows.

    batchpilot tune-pid [--candidates 48] [--traces synthetic,azure-conv,azure-code]

Each candidate replays the same training windows (the first ``--window-s`` seconds of each
trace's train split, at the loads listed in :data:`TUNING_LOADS`, near where the static default
starts to miss) and is scored by its mean SLO attainment. Prints the best gains beside the
current defaults and the static default, and writes every candidate's score to ``--out``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tyro

from agents.arena import run_episode
from agents.parallel import run_jobs
from env.traces import rate_scale, split, time_window
from env.traces.resolve import resolve_trace
from runtime.decider.controller import StaticController
from runtime.decider.pid import PidController, PidGains
from runtime.engine.profile import Profile
from runtime.session import DEFAULT_INTERVAL_S

TUNING_LOADS = {"synthetic": (1.25, 1.5), "azure-conv": (1.25, 1.5, 1.75),
                "azure-code": (0.5, 0.75, 1.0)}
"""rate scales per trace: from where the static default is fine to where it misses a lot"""


def windows(traces: list[str], window_s: float) -> list:
    out = []
    for t in traces:
        tr = split(resolve_trace(t), "train")
        w = time_window(tr, float(tr.arrival_s[0]), float(tr.arrival_s[0]) + window_s)
        for s in TUNING_LOADS.get(t, (1.0, 1.5)):
            out.append((t, s, rate_scale(w, s)))
    return out


def score(args) -> tuple[dict, list[float]]:
    gains, traces, window_s, interval_s = args
    profile = Profile.load()
    controller = (StaticController() if gains is None else PidController(PidGains(**gains)))
    atts = [run_episode(w, controller, interval_s=interval_s, profile=profile, tally=False)
            .summary["slo_attainment"] for _, _, w in windows(traces, window_s)]
    return gains, atts


def sample_gains(rng: np.random.Generator) -> dict:
    def logu(lo, hi):
        return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))

    return {
        "window_kp": logu(0.01, 0.3), "window_ki": logu(0.005, 0.2),
        "chunk_kp": logu(0.01, 0.3), "chunk_ki": logu(0.005, 0.2),
        "kv_kp": logu(0.05, 1.0), "kv_ki": logu(0.02, 0.5),
        "ttft_setpoint": float(rng.uniform(0.2, 0.7)),
        "tpot_setpoint": float(rng.uniform(0.4, 0.9)),
        "kv_setpoint": float(rng.uniform(0.6, 0.95)),
        "preempt_push": float(rng.uniform(0.0, 0.5)),
        "oom_push": float(rng.uniform(0.3, 2.0)),
    }


@dataclass
class Config:
    traces: str = "synthetic,azure-conv,azure-code"
    """traces to tune on, comma-separated (a missing one is skipped with a note)"""
    candidates: int = 48
    """random gain sets to try besides the current ones"""
    window_s: float = 600.0
    """seconds of each trace's training split to replay"""
    interval_s: float = DEFAULT_INTERVAL_S
    """the decision interval, engine seconds"""
    seed: int = 0
    """seed of the random search"""
    workers: int = 2
    """worker processes (or the CPUs of a local Ray with --ray)"""
    ray: bool = False
    """score the candidates on Ray (docs/ray.md); RAY_ADDRESS alone also does"""
    out: Path = Path("runs/tune_pid.json")
    """where every candidate's score is written"""


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Config, args=argv, description=__doc__.splitlines()[0])
    for flag, value in (("--candidates", args.candidates), ("--workers", args.workers),
                        ("--window-s", args.window_s), ("--interval-s", args.interval_s)):
        if not value > 0:
            print(f"tune_pid: {flag} must be > 0, got {value}", file=sys.stderr)
            return 2
    traces = []
    for t in args.traces.split(","):
        try:
            resolve_trace(t)
            traces.append(t)
        except FileNotFoundError as e:
            print(f"tune_pid: skipping {t}: {e}", file=sys.stderr)
    rng = np.random.default_rng(args.seed)
    current = dataclasses.asdict(PidGains())
    cands = [None, current] + [sample_gains(rng) for _ in range(args.candidates)]
    jobs = [(c, traces, args.window_s, args.interval_s) for c in cands]
    labels = [f"{t} x{s:g}" for t, s, _ in windows(traces, args.window_s)]
    results = [{"gains": gains, "attainment": atts, "mean": float(np.mean(atts))}
               for gains, atts in run_jobs(score, jobs, workers=args.workers,
                                           ray=args.ray or None, desc="candidates")]
    static, cur = results[0], results[1]
    best = max(results[1:], key=lambda r: r["mean"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"windows": labels, "static": static, "current": cur,
                                    "best": best, "all": results}, indent=1) + "\n")
    print("| controller | " + " | ".join(labels) + " | mean |")
    print("|---|" + "---|" * (len(labels) + 1))
    for name, r in (("static default", static), ("PID (current gains)", cur),
                    ("PID (best found)", best)):
        print(f"| {name} | " + " | ".join(f"{a:.1%}" for a in r["attainment"])
              + f" | {r['mean']:.2%} |")
    print("\nbest gains: " + json.dumps(best["gains"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
