"""What the engine's levers are worth at fixed knobs, measured side by side in one run.

An experiment, not a tool: it produced the table of goodput past capacity under each admission
policy and the static KV frontier quoted in docs/results.md ("Levers at fixed knobs"); the arena
(``batchpilot evaluate``) now reports both for every run (goodput past capacity, the static
frontier).

    python scripts/experiments/levers.py admission --trace azure-code [--knobs 5,1024,0.9] \\
        [--slacks 0.5 0.8 1] [--json]
    python scripts/experiments/levers.py frontier --trace azure-code [--scale 0.582] [--json]

``admission``: best static's capacity at 99% attainment with first come, first served (found by
bisection on the held-out split unless ``--capacity`` is given), then goodput at 1x, 2x and 4x
that capacity for each admission candidate (``fcfs``, ``late_to_back``, ``shed``, each at the
slacks of ``--slacks``), and goodput as a share of the candidate's goodput at capacity.

``frontier``: the static frontier of memory against attainment. For each KV ratio of best
static's grid, the (window, chunk) of its grid with the highest attainment on the training split
at ``--scale``; then that setting on the held-out split: mean KV GiB, attainment and the share of
the default co-tenant's demand (env/traces/cotenant.py) that the memory left over serves.
"""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import dataclass, field

import tyro

from agents.arena import find_capacity
from agents.controllers.best_static import GRID
from env.replay import replay
from env.traces import rate_scale, split
from env.traces.cotenant import cotenant_demand
from env.traces.resolve import resolve_trace
from runtime.engine.admission import AdmissionPolicy
from runtime.engine.engine import EngineConfig
from runtime.knobs import Knobs


def parse_knobs(text: str) -> Knobs:
    window, chunk, ratio = text.split(",")
    return Knobs(float(window), int(chunk), float(ratio))


def candidates(slacks: list[float]) -> list[tuple[str, float]]:
    out = [(AdmissionPolicy.FCFS.value, 1.0)]
    for policy in (AdmissionPolicy.LATE_TO_BACK, AdmissionPolicy.SHED):
        out += [(policy.value, s) for s in slacks]
    return out


@dataclass
class Admission:
    """admission candidates past capacity"""

    trace: str = "azure-code"
    """the trace (any spec resolve_trace takes); its held-out split is replayed"""
    knobs: str = "5,1024,0.9"
    """window_ms,chunk,ratio held fixed (default: best static's on azure-code)"""
    capacity: float | None = None
    """best static's capacity at 99% attainment (default: found by bisection under fcfs)"""
    slacks: list[float] = field(default_factory=lambda: [0.5, 1.0])
    """the admission slacks tried for late_to_back and shed"""
    json: bool = False
    """print one JSON object"""


@dataclass
class Frontier:
    """the static frontier of KV memory against attainment"""

    trace: str = "azure-code"
    """the trace (any spec resolve_trace takes)"""
    scale: float = 0.582
    """the load (rate scale); default: best static's capacity on azure-code"""
    seed: int = 0
    """the co-tenant demand's seed"""
    json: bool = False
    """print one JSON object"""


def admission(args: Admission) -> dict:
    trace = split(resolve_trace(args.trace), "eval")
    knobs = parse_knobs(args.knobs)

    def run(scale: float, policy: str, slack: float):
        config = EngineConfig(admission=policy, admission_slack=slack)
        return replay(rate_scale(trace, scale), knobs, config=config).summary

    capacity = args.capacity or find_capacity(
        lambda s: run(s, AdmissionPolicy.FCFS.value, 1.0).slo_attainment, 0.99, {})
    rows = []
    for policy, slack in candidates(args.slacks):
        base = None
        for mult in (1.0, 2.0, 4.0):
            s = run(capacity * mult, policy, slack)
            base = base or s.goodput_rps
            rows.append({"policy": policy, "slack": slack, "load_x_capacity": mult,
                         "rate_scale": capacity * mult, "attainment": s.slo_attainment,
                         "goodput_rps": s.goodput_rps,
                         "goodput_share_of_capacity": s.goodput_rps / base if base else 0.0,
                         "shed": s.rejected_by_reason.get("shed", 0),
                         "sim_seconds": s.sim_seconds})
    return {"trace": args.trace, "split": "eval", "knobs": knobs.as_dict(),
            "capacity_99_fcfs": capacity, "rows": rows}


def frontier(args: Frontier) -> dict:
    train = rate_scale(split(resolve_trace(args.trace), "train"), args.scale)
    held_out = rate_scale(split(resolve_trace(args.trace), "eval"), args.scale)
    rows = []
    for ratio in GRID["kv_cache_ratio"]:
        best = max(itertools.product(GRID["batch_window_ms"], GRID["prefill_chunk_tokens"]),
                   key=lambda wc: replay(train, Knobs(wc[0], wc[1], ratio)).summary
                   .slo_attainment)
        knobs = Knobs(best[0], best[1], ratio)
        config = EngineConfig(cotenant=cotenant_demand(seed=args.seed))
        s = replay(held_out, knobs, config=config).summary
        rows.append({"kv_cache_ratio": ratio, "knobs": knobs.as_dict(),
                     "mean_kv_gib": s.mean_kv_gib, "attainment": s.slo_attainment,
                     "cotenant_served_share": s.cotenant_served_share})
    return {"trace": args.trace, "scale": args.scale, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    args = tyro.extras.subcommand_cli_from_dict(
        {"admission": Admission, "frontier": Frontier}, args=argv,
        description=__doc__.splitlines()[0])
    out = admission(args) if isinstance(args, Admission) else frontier(args)
    if args.json:
        print(json.dumps(out))
        return 0
    if isinstance(args, Admission):
        print(f"{out['trace']} (eval), knobs {out['knobs']}; best static's capacity at 99% "
              f"(fcfs): x{out['capacity_99_fcfs']:.3g}")
        print("| policy | slack | load / capacity | attainment | goodput req/s | "
              "share of goodput at capacity | shed |")
        print("|---|---|---|---|---|---|---|")
        for r in out["rows"]:
            print(f"| {r['policy']} | {r['slack']:g} | {r['load_x_capacity']:g}x | "
                  f"{r['attainment']:.1%} | {r['goodput_rps']:.3f} | "
                  f"{r['goodput_share_of_capacity']:.0%} | {r['shed']} |")
    else:
        print(f"{out['trace']} at x{out['scale']:g}: best (window, chunk) per ratio on the "
              "training split, measured on the held-out split with the default co-tenant")
        print("| KV ratio | window ms | chunk | mean KV GiB | attainment | co-tenant served |")
        print("|---|---|---|---|---|---|")
        for r in out["rows"]:
            k = r["knobs"]
            print(f"| {r['kv_cache_ratio']:g} | {k['batch_window_ms']:g} | "
                  f"{k['prefill_chunk_tokens']} | {r['mean_kv_gib']:.2f} | {r['attainment']:.2%} "
                  f"| {r['cotenant_served_share']:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
