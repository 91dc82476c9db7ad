"""Engine speed and the default profile's sanity, measured side by side in one run.

    python scripts/bench_engine.py [--json] [--traces azure-conv,azure-code] [--scales 1 2 4 8]
    python scripts/bench_engine.py --traces azure-conv --scales 1 --no-capacity \
        --profiles h200-llama2-7b-40gib-roofline h100-llama3.1-8b-40gib-roofline

``--profiles`` (files or names) measures several profiles side by side in one run, interleaved
replay by replay (the machine is noisy).

1. Speed: simulated seconds per wall second of whole-trace replays at each rate scale (static
   default knobs, default profile), with the closed-form decode stretches and, at rate scale 1,
   step by step (the reference path) for the ratio between them.
2. Sanity: for each trace, the rate scale at which the static default (window 5 ms, chunk 2048,
   ratio 0.9) drops to 90% SLO attainment (bisection to 2%), and what limits it there: the
   engine's busy share split into prefill, decode and per-iteration constant, KV utilisation,
   preemptions, and which SLO term the misses break.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass

import numpy as np
import tyro

from agents.arena import find_capacity
from env.replay import replay
from env.traces import rate_scale
from env.traces.resolve import resolve_trace
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.profile import Profile
from runtime.engine.request import Status
from runtime.engine.sim_executor import SimulatedExecutor
from runtime.knobs import DEFAULT_KNOBS


def speed_row(trace, label: str, scale: float, profile: Profile, fast: bool = True) -> dict:
    t = rate_scale(trace, scale) if scale != 1 else trace
    r = replay(t, DEFAULT_KNOBS, profile=profile, config=EngineConfig(fast_path=fast))
    s = r.summary
    return {"trace": label, "rate_scale": scale, "path": "closed-form" if fast else "step",
            "requests": s.requests, "sim_seconds": s.sim_seconds, "wall_seconds": r.wall_s,
            "speedup": r.speedup, "iterations": s.iterations,
            "fast_stretches": r.engine.num_fast_stretches,
            "us_per_iteration": r.wall_s / max(s.iterations, 1) * 1e6,
            "slo_attainment": s.slo_attainment}


def limits_at(trace, scale: float, profile: Profile) -> dict:
    """Where the time goes and which SLO term fails, replaying at ``scale`` with 1-s intervals."""
    t = rate_scale(trace, scale)
    e = Engine(SimulatedExecutor(profile), DEFAULT_KNOBS)
    e.add_requests(t.arrival_s, t.prompt_tokens, t.output_tokens, t.slo_class)
    busy = prefill = decode_tokens = iters = 0.0
    kv = []
    while e.has_work():
        e.run_until(e.now + 1.0)
        iv = e.collect_interval()
        busy += iv.busy_s
        prefill += iv.prefill_tokens
        decode_tokens += iv.decode_tokens
        iters += iv.iterations
        kv.append(iv.kv_utilization)
    c = profile.cost
    const_s = iters * c.const_s
    prefill_s = prefill * c.prefill_token_s  # attention pairs left out: a lower bound
    ttft_miss = tpot_miss = 0
    for r in e.requests:
        if r.status != Status.FINISHED or r.meets_slo():
            continue
        if r.ttft_s > r.ttft_target_s:
            ttft_miss += 1
        else:
            tpot_miss += 1
    s = e.summary()
    return {"rate_scale": scale, "slo_attainment": s.slo_attainment,
            "busy_share": busy / e.now, "prefill_share_of_busy": prefill_s / busy,
            "constant_share_of_busy": const_s / busy,
            "decode_share_of_busy": 1 - (prefill_s + const_s) / busy,
            "mean_kv_utilization": float(np.mean(kv)),
            "p90_kv_utilization": float(np.percentile(kv, 90)),
            "preemptions": s.preemptions, "ooms": s.ooms,
            "misses_ttft": ttft_miss, "misses_tpot_only": tpot_miss,
            "ttft_p99_s": s.ttft_p99_s, "tpot_p99_s": s.tpot_p99_s}


@dataclass
class Args:
    traces: str = "azure-conv,azure-code"
    """traces to replay, comma-separated"""
    scales: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    """rate scales to replay each trace at"""
    profiles: tuple[str, ...] = ()
    """executor profiles, files or names, measured side by side (default: the shipped one)"""
    capacity: bool = True
    """find the static default's 90% capacity too (--no-capacity: speed only)"""
    json: bool = False
    """print one JSON object"""


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    profiles = [Profile.load(p) for p in (args.profiles or (None,))]
    profile = profiles[0]
    scales = list(args.scales)
    out: dict = {"profile": ",".join(p.name for p in profiles), "speed": [],
                 "capacity_90_static": []}
    for label in args.traces.split(","):
        try:
            trace = resolve_trace(label)
        except FileNotFoundError as e:
            print(f"bench_engine: skipping {label}: {e}", file=sys.stderr)
            continue
        for i, scale in enumerate(scales):
            for p in profiles:
                out["speed"].append({**speed_row(trace, label, scale, p), "profile": p.name})
                if i == 0:
                    out["speed"].append({**speed_row(trace, label, scale, p, fast=False),
                                         "profile": p.name})
        if not args.capacity:
            continue
        known: dict[float, float] = {}

        def attainment(s: float, trace=trace) -> float:
            t = rate_scale(trace, s)
            return replay(t, DEFAULT_KNOBS, profile=profile).summary.slo_attainment

        t0 = time.perf_counter()
        cap = find_capacity(attainment, 0.90, known)
        out["capacity_90_static"].append({"trace": label, "capacity_90": cap,
                                          "bisection_seconds": time.perf_counter() - t0,
                                          **{f"at_{k}": v for k, v in
                                             limits_at(trace, cap, profile).items()}})
    base = {(r["trace"], r["rate_scale"], r["profile"]): r for r in out["speed"]
            if r["path"] == "step"}
    for r in out["speed"]:
        b = base.get((r["trace"], r["rate_scale"], r["profile"]))
        if b and r["path"] == "closed-form":
            r["speedup_vs_step"] = b["wall_seconds"] and b["wall_seconds"] / r["wall_seconds"]
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"profile {out['profile']}\n")
    print("| profile | trace | rate x | path | requests | simulated s | wall s | sim s / wall s | "
          "us / iteration | vs step | SLO att. |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in out["speed"]:
        vs = f"{r['speedup_vs_step']:.1f}x" if "speedup_vs_step" in r else ""
        print(f"| {r['profile']} | {r['trace']} | {r['rate_scale']:g} | {r['path']} | "
              f"{r['requests']} | "
              f"{r['sim_seconds']:.0f} | {r['wall_seconds']:.2f} | {r['speedup']:.0f} | "
              f"{r['us_per_iteration']:.2f} | {vs} | {r['slo_attainment']:.1%} |")
    print("\nStatic default at 90% attainment:")
    for c in out["capacity_90_static"]:
        print(f"  {c['trace']}: rate x{c['capacity_90']:.3g}; busy {c['at_busy_share']:.0%} "
              f"(prefill {c['at_prefill_share_of_busy']:.0%}, decode "
              f"{c['at_decode_share_of_busy']:.0%}, per-iteration constant "
              f"{c['at_constant_share_of_busy']:.0%}); KV used {c['at_mean_kv_utilization']:.0%}"
              f" mean / {c['at_p90_kv_utilization']:.0%} p90; {c['at_preemptions']} preemptions; "
              f"misses: {c['at_misses_ttft']} TTFT, {c['at_misses_tpot_only']} TPOT only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
