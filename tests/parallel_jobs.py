"""Real jobs for the executor tests: the best-static grid search's and the arena's own job
functions on a small trace file written by the project's generator and read by its reader."""

from __future__ import annotations

from pathlib import Path

from agents.registry import EvalSpec
from env.traces import bursty

KNOB_SETTINGS = [(5.0, 512, 0.5), (5.0, 2048, 0.9), (60.0, 8192, 0.7), (20.0, 256, 0.95)]
"""four grid-search settings that give four different attainments on the small trace"""
SCALES = (1.0, 3.0)


def write_small_trace(folder: Path) -> str:
    """A 40-second bursty trace (about 12 requests/s, CV 4) as a plain CSV; returns its path."""
    t = bursty(12.0, 40.0, 4.0, seed=3)
    path = folder / "small.csv"
    rows = "\n".join(f"{float(a)!r},{int(p)},{int(o)}" for a, p, o in
                     zip(t.arrival_s, t.prompt_tokens, t.output_tokens))
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows + "\n")
    return str(path)


def grid_jobs(trace_path: str) -> list[tuple]:
    """Best-static scoring jobs (``agents.controllers.best_static._score``)."""
    return [(trace_path, "all", SCALES, k, None, None) for k in KNOB_SETTINGS]


def arena_jobs(trace_path: str) -> list[tuple]:
    """Arena row jobs (``agents.arena._row_job``): three controllers at two loads."""
    spec = EvalSpec(trace_path, "all", None, 0.25)
    return [(spec, c, s, False) for c in ("static", "pid", "aimd") for s in SCALES]


def without_wall_time(rows: list[dict]) -> list[dict]:
    """Rows minus their wall-clock seconds, the one field that is not a function of the job."""
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]
