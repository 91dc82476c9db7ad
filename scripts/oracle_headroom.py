"""Headroom of run-time control: the lookahead oracle against best static and static, one run.

    PYTHONPATH=$PWD python scripts/oracle_headroom.py --traces azure-code azure-conv \\
        --rate-scales 0.7 0.9

On each trace's held-out split, every controller replays the whole split through the arena's
data path (``agents.arena.run_episode``) at: the given rate scales, and multiples of best
static's capacity at 99% attainment (``--capacity-multiples``). Then each controller's own
capacity at 99% is found by bisection to within 2% (started from the loads already measured).
Prints attainment and goodput side by side, the oracle's gain over best static in points, and
the capacities with the oracle's ratio to best static. The oracle is an upper bound (it knows
the future arrivals) and is labelled so.
"""

from __future__ import annotations

import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import tyro

from agents.arena import _window, find_capacity, run_episode
from agents.controllers.best_static import BestStaticController, best_static_knobs
from agents.oracle import ORACLE_LABEL, LookaheadOracle, OracleConfig
from agents.registry import EvalSpec
from env.traces.resolve import trace_label
from runtime.decider.controller import StaticController
from runtime.engine.profile import Profile
from runtime.knobs import DEFAULT_KNOBS

CONTROLLERS = ("static", "best-static", "oracle")


@dataclass
class HeadroomConfig:
    """Which traces and loads, and how the oracle searches."""

    traces: tuple[str, ...] = ("azure-code", "azure-conv")
    """trace specs (synthetic | azure-conv | azure-code | a file)"""
    split: str = "eval"
    """the held-out part replayed"""
    rate_scales: tuple[float, ...] = ()
    """rate scales (x the trace's own rate) run on every trace"""
    capacity_multiples: tuple[float, ...] = (1.0, 1.1, 1.25)
    """loads as multiples of best static's capacity at 99%, run on every trace"""
    capacity: bool = True
    """also bisect each controller's own capacity at 99% attainment"""
    controllers: tuple[str, ...] = CONTROLLERS
    """which of static, best-static, oracle to run"""
    interval_s: float = 0.25
    """the decision interval"""
    workers: int = 1
    """processes replaying in parallel"""
    out: Path | None = None
    """also write every figure to this JSON file"""
    oracle: OracleConfig = field(default_factory=OracleConfig)
    """how the oracle searches"""


def _controller(name: str, trace: str, cfg: HeadroomConfig):
    if name == "static":
        return StaticController(DEFAULT_KNOBS)
    anchor = best_static_knobs(trace, part="train")
    if name == "best-static":
        return BestStaticController(anchor)
    if name == "oracle":
        return LookaheadOracle(cfg.oracle, anchor=anchor, interval_s=cfg.interval_s)
    raise ValueError(f"unknown controller {name!r}; expected one of {', '.join(CONTROLLERS)}")


def _run(args: tuple) -> dict:
    cfg, trace, name, scale = args
    spec = EvalSpec(trace, cfg.split, None, cfg.interval_s)
    t0 = time.perf_counter()
    ep = run_episode(_window(spec, scale), _controller(name, trace, cfg),
                     interval_s=cfg.interval_s, profile=Profile.load())
    s = ep.summary
    return {"trace": trace_label(trace), "controller": name, "rate_scale": scale,
            "slo_attainment": s["slo_attainment"], "goodput_rps": s["goodput_rps"],
            "mean_chunk": ep.mean_knobs[1], "sim_s": s["sim_seconds"],
            "wall_s": time.perf_counter() - t0}


def _capacity(args: tuple) -> dict:
    cfg, trace, name, known = args
    known = dict(known)
    cap = find_capacity(lambda s: _run((cfg, trace, name, s))["slo_attainment"], 0.99, known)
    return {"trace": trace_label(trace), "controller": name, "capacity_99": cap,
            "evaluations": len(known), "known": sorted(known.items())}


def _name(c: str) -> str:
    return ORACLE_LABEL if c == "oracle" else c


def main(argv: list[str] | None = None) -> int:
    cfg = tyro.cli(HeadroomConfig, args=argv, description=__doc__.splitlines()[0])
    t0 = time.perf_counter()
    rows: list[dict] = []
    caps: list[dict] = []
    with ProcessPoolExecutor(max_workers=max(1, cfg.workers)) as pool:
        base = {}
        if cfg.capacity or cfg.capacity_multiples:
            base = {t: next(pool.map(_capacity, [(cfg, t, "best-static", {})]))
                    for t in cfg.traces}
        jobs = []
        for t in cfg.traces:
            cap = base[t]["capacity_99"] if base else math.nan
            scales = sorted({*cfg.rate_scales, *(round(cap * m, 4) for m in
                                                 cfg.capacity_multiples)})
            jobs += [(cfg, t, c, s) for s in scales for c in cfg.controllers]
        jobs.sort(key=lambda j: j[2] != "oracle")  # the long ones first
        for i, r in enumerate(pool.map(_run, jobs), 1):
            rows.append(r)
            print(f"\r  {i}/{len(jobs)} runs ({time.perf_counter() - t0:.0f} s)", end="",
                  file=sys.stderr, flush=True)
        print(file=sys.stderr)
        if cfg.capacity:
            cjobs = []
            for t in cfg.traces:
                for c in cfg.controllers:
                    if c == "best-static":
                        caps.append(base[t])
                        continue
                    known = {r["rate_scale"]: r["slo_attainment"] for r in rows
                             if r["trace"] == trace_label(t) and r["controller"] == c}
                    cjobs.append((cfg, t, c, known))
            caps.extend(pool.map(_capacity, cjobs))
    print(f"oracle: {asdict(cfg.oracle)}; split {cfg.split}; wall {time.perf_counter() - t0:.0f} s")
    names = [c for c in CONTROLLERS if c in cfg.controllers]
    print("\n| trace | rate x | x best-static cap | "
          + " | ".join(f"{_name(c)} att." for c in names)
          + " | oracle - best static | " + " | ".join(f"{_name(c)} goodput rps" for c in names)
          + " | oracle wall s |")
    print("|" + "---|" * (4 + 2 * len(names) + 1))
    for t in cfg.traces:
        label = trace_label(t)
        cap = base[t]["capacity_99"] if base else math.nan
        by = {(r["controller"], r["rate_scale"]): r for r in rows if r["trace"] == label}
        for s in sorted({r["rate_scale"] for r in rows if r["trace"] == label}):
            got = [by[c, s] for c in names]
            gain = "-"
            if ("oracle", s) in by and ("best-static", s) in by:
                pts = (by["oracle", s]["slo_attainment"]
                       - by["best-static", s]["slo_attainment"]) * 100
                gain = f"{pts:+.2f} pt"
            print(f"| {label} | {s:.3g} | {s / cap:.2f} | ".replace("nan", "-")
                  + " | ".join(f"{g['slo_attainment']:.2%}" for g in got) + f" | {gain} | "
                  + " | ".join(f"{g['goodput_rps']:.3f}" for g in got) + " | "
                  + (f"{by['oracle', s]['wall_s']:.0f}" if ("oracle", s) in by else "-") + " |")
    if caps:
        print("\n| trace | " + " | ".join(f"{_name(c)} capacity @99%" for c in names)
              + " | oracle / best static |")
        print("|" + "---|" * (2 + len(names)))
        for t in cfg.traces:
            label = trace_label(t)
            c = {x["controller"]: x["capacity_99"] for x in caps if x["trace"] == label}
            ratio = (f"{c['oracle'] / c['best-static']:.3f}" if c.get("best-static")
                     and "oracle" in c else "-")
            print(f"| {label} | " + " | ".join(f"{c[n]:.3f}" for n in names) + f" | {ratio} |")
    if cfg.out is not None:
        cfg.out.parent.mkdir(parents=True, exist_ok=True)
        cfg.out.write_text(json.dumps({"config": json.loads(json.dumps(asdict(cfg), default=str)),
                                       "rows": rows, "capacity": caps}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
