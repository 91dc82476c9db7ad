"""The PID fallback against the static default, side by side in one run (the project standard:
a fallback is never worse than the static default).

An experiment, not a tool: it produced the PID's capacity against the static default's quoted in
docs/arena.md (the baselines: held-out Azure code, 0.557x under fcfs and 0.576x under shed at
slack 0.5, against 0.279x; 0.285x under the rules before 2026-12-07, 0.247x without their calm
return to static; run on 2026-12-08 with ``--traces azure-code --loads 0.28,0.5,1``, 10 s) and in
runtime/decider/pid.py; the arena (``batchpilot evaluate --controllers static,pid``) measures the
first two in every run.

    PYTHONPATH=$PWD python scripts/experiments/pid_vs_static.py \\
        [--traces azure-code,azure-conv] [--loads 0.25,0.28,0.5,1,2,4] [--json]

For each held-out trace window and admission setting (fcfs, and shed at slack 0.5): capacity at
99% attainment (bisection to 2%) and SLO attainment at each load, for ``static``, the PID with
its default gains (``pid``), the PID under the rules before 2026-12-07 (``pid-before``: the chunk
back to static when calm and in every bad interval, a TPOT not measured read as calm, the chunk
grown while TTFT was calm) and those
without the calm return to static (``pid-drift``, the gains before it).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import tyro

from agents.arena import find_capacity, summary_at
from agents.registry import EvalSpec, make_controller
from runtime.decider.pid import PidController, PidGains
from runtime.engine.engine import EngineConfig

ADMISSIONS = (("fcfs", 1.0), ("shed", 0.5))
"""(admission policy, admission slack) pairs measured"""
BEFORE = {"calm_static_chunk": True, "unmeasured_tpot_holds_chunk": False,
          "bad_interval_chunk_by_tpot": False, "calm_ttft_holds_growth": False}
"""the PID's rules before 2026-12-07"""


@dataclass
class Args:
    """Command line."""

    traces: str = "azure-code,azure-conv"
    """traces, comma-separated (their held-out split is replayed)"""
    loads: str = "0.25,0.28,0.5,1,2,4"
    """rate scales attainment is reported at, comma-separated"""
    json: bool = False
    """print the rows as JSON instead of a table"""


def measure(trace: str, admission: str, slack: float, loads: list[float]) -> list[dict]:
    """One row per controller: capacity at 99% and attainment (percent) at each load."""
    config = EngineConfig(admission=admission, admission_slack=slack)
    spec = EvalSpec(trace, "eval", None, config=config)
    static = config.start_knobs(spec.static_knobs)
    controllers = {"static": make_controller("static", spec),
                   "pid": PidController(static=static),
                   "pid-before": PidController(PidGains(**BEFORE), static=static),
                   "pid-drift": PidController(PidGains(calm_static=False, **BEFORE),
                                              static=static)}
    rows = []
    for name, c in controllers.items():
        known: dict[float, float] = {}

        def att(scale: float, c=c) -> float:
            return summary_at(spec, c, scale)["slo_attainment"]

        attainment = {s: 100 * att(s) for s in loads}
        rows.append({"trace": trace, "admission": admission, "admission_slack": slack,
                     "controller": name, "capacity_99": find_capacity(att, 0.99, known),
                     "attainment_pct": attainment})
    return rows


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv)
    loads = [float(x) for x in args.loads.split(",") if x.strip()]
    rows = []
    for trace in [t for t in args.traces.split(",") if t.strip()]:
        for admission, slack in ADMISSIONS:
            for row in measure(trace, admission, slack, loads):
                rows.append(row)
                if not args.json:
                    print(f"{trace:12s} {admission}@{slack:g} {row['controller']:10s} "
                          f"cap99 {row['capacity_99']:.3f}  "
                          + "  ".join(f"x{s:g} {a:6.2f}" for s, a in
                                      row["attainment_pct"].items()), flush=True)
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
