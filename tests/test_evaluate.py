"""The evaluation harness: same windows for every controller, capacity by bisection, JSON shape."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agents.arena import find_capacity, run_episode
from env.traces import poisson
from runtime.decider.controller import StaticController
from runtime.engine.metrics import burst_onsets, recovery_times
from runtime.engine.profile import Profile
from runtime.knobs import DEFAULT_KNOBS

ROOT = Path(__file__).resolve().parents[1]


def test_capacity_bisection_finds_the_edge_within_two_percent():
    calls = []

    def attainment(s):
        calls.append(s)
        return 1.0 if s <= 3.3 else 0.5

    known = {1.0: 1.0, 2.0: 1.0, 4.0: 0.5, 8.0: 0.5}
    cap = find_capacity(attainment, 0.99, known)
    assert 3.3 / 1.02 <= cap <= 3.3
    assert all(2.0 < s < 4.0 for s in calls)  # only inside the bracket the grid gave


def test_capacity_searches_below_and_above_the_grid():
    cap = find_capacity(lambda s: 1.0 if s <= 0.3 else 0.0, 0.9, {1.0: 0.0, 2.0: 0.0})
    assert 0.3 / 1.02 <= cap <= 0.3
    assert find_capacity(lambda s: 1.0, 0.9, {1.0: 1.0}) == 64.0
    assert find_capacity(lambda s: 0.0, 0.9, {1.0: 0.0}) == 0.0


def test_capacity_does_not_depend_on_the_loads_already_measured():
    # attainment not monotone in the load (a dip at 0.45-0.47, a crossing at 0.6): a bracket
    # taken from the loads a run holds found the dip in one run and the edge in another
    def attainment(s):
        return 0.95 if 0.45 <= s <= 0.47 or s > 0.6 else 1.0

    bare = find_capacity(attainment, 0.99, {})
    for held in ({0.46: attainment(0.46), 0.5: 1.0}, {0.917: 0.95, 0.489: 1.0},
                 {0.3: 1.0, 0.46: 0.95, 2.0: 0.95}):
        assert find_capacity(attainment, 0.99, dict(held)) == bare
    # the loads probed are the same grid with or without a cache of them
    probed: list[float] = []
    find_capacity(lambda s: probed.append(s) or attainment(s), 0.99, {})
    again: list[float] = []
    find_capacity(lambda s: again.append(s) or attainment(s), 0.99, {0.46: 0.95, 0.5: 1.0})
    assert set(again) <= set(probed)


def test_burst_onsets_and_recovery_on_a_made_up_series():
    interval = 0.25
    rates = np.full(800, 4.0)  # one request per interval, 4 per second
    rates[400:408] = 80.0  # 2 s at 20x: 20 requests per interval
    onsets = burst_onsets(rates, interval)
    assert onsets == [400]
    att = np.ones(800)
    att[402:420] = 0.3  # misses for 4.5 s, then recovered
    (rec,) = recovery_times(att, onsets, interval, target=0.99, hold=3)
    assert rec == pytest.approx((420 - 400) * interval)
    assert recovery_times(np.zeros(800), onsets, interval) == [math.inf]
    assert recovery_times(np.ones(800), onsets, interval) == [0.0]  # no dip: nothing to recover
    late = np.ones(800)
    late[403:404] = 0.0  # the dip trails the onset; recovered at 404..406
    assert recovery_times(late, onsets, interval) == [pytest.approx(4 * interval)]


def test_run_episode_drains_the_window_and_counts_every_request():
    trace = poisson(20.0, 30.0, seed=3)
    ep = run_episode(trace, StaticController(), interval_s=0.25, profile=Profile.load(),
                     record=True)
    s = ep.summary
    assert s["requests"] == len(trace)
    assert s["finished"] + s["rejected"] == len(trace)
    assert ep.sources == {"static": ep.decisions}
    assert len(ep.timeline["t"]) == ep.decisions
    assert ep.mean_knobs == pytest.approx(DEFAULT_KNOBS.as_tuple())
    ends = ep.timeline["t"]
    assert ep.decisions == math.ceil(ends[-1] / 0.25 - 1e-9)  # one per grid point, none skipped
    assert ends[-1] >= float(trace.arrival_s[-1])


def test_evaluate_command_prints_rows_and_capacity_as_json(tmp_path):
    rng = np.random.default_rng(1)
    arrivals = np.cumsum(rng.exponential(1 / 6.0, 600))
    lines = [f"{a:.4f},{rng.integers(100, 2500)},{rng.integers(5, 300)}" for a in arrivals]
    path = tmp_path / "tiny.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "\n".join(lines) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "agents.evaluate", "--trace", str(path), "--split", "all",
         "--controllers", "static,pid,aimd,heuristic", "--rate-scales", "1,4", "--json",
         "--workers", "1", "--out", str(tmp_path / "ev"), "--frontier-ratios", ""],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert len(result["rows"]) == 8
    row = result["rows"][0]
    for key in ("controller", "trace", "rate_scale", "slo_attainment", "goodput_rps",
                "ttft_p99_s", "tpot_p99_s", "preemptions", "ooms"):
        assert key in row
    assert {r["controller"] for r in result["rows"]} == {"static", "pid", "aimd", "heuristic"}
    assert {(c["controller"], c["trace"]) for c in result["capacity"]} == {
        (c, "tiny") for c in ("static", "pid", "aimd", "heuristic")}
    for c in result["capacity"]:
        assert c["capacity_99"] <= c["capacity_90"]
    assert (tmp_path / "ev" / "attainment_vs_load_tiny.png").stat().st_size > 1000


def test_evaluate_command_refuses_an_unknown_controller():
    out = subprocess.run([sys.executable, "-m", "agents.evaluate", "--controllers", "magic"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "unknown controller 'magic'" in out.stderr


@pytest.mark.parametrize("value, says", [
    ("1", "--load-neighbours: 1 is the load itself, not a neighbour"),
    ("0.99,-1", "--load-neighbours must be comma-separated positive numbers, got '0.99,-1'")])
def test_evaluate_command_refuses_bad_load_neighbours(value, says):
    out = subprocess.run([sys.executable, "-m", "agents.evaluate", "--load-neighbours", value],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert says in out.stderr


def test_a_trace_too_short_for_its_held_out_part_is_refused_before_any_run(tmp_path):
    """A 300 s trace has no held-out part (it starts at 2,400 s): refused at once, naming the
    trace and the part, not after best static's search has run."""
    from env.traces.plain_csv import write_plain_csv

    short = write_plain_csv(poisson(1.0, 300.0, seed=1), tmp_path / "short.csv")
    out = subprocess.run([sys.executable, "-m", "agents.evaluate", "--trace", str(short),
                          "--controllers", "static,best-static", "--rate-scales", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "trace 'short' has no request in its eval part" in out.stderr
    assert "best static" not in out.stderr.lower()  # no search began


def test_evaluate_command_keeps_the_oracle_row_on_the_trace_future():
    out = subprocess.run([sys.executable, "-m", "agents.evaluate", "--controllers", "oracle",
                          "--oracle.arrivals", "repeat"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "--oracle.arrivals repeat --oracle.output-lengths trace: the oracle row is the upper" \
        " bound" in out.stderr
    assert "oracle-forecast" in out.stderr


def test_arena_rows_carry_the_per_class_figures_and_the_lever_counts(tmp_path):
    from agents.arena import _row_job
    from agents.registry import EvalSpec
    from agents.report import markdown_table
    from runtime.engine.engine import EngineConfig

    rng = np.random.default_rng(2)
    arrivals = np.cumsum(rng.exponential(1 / 20.0, 200))
    classes = np.where(rng.random(200) < 0.25, "batch", "interactive")
    lines = [f"{a:.4f},{rng.integers(100, 3000)},{rng.integers(5, 300)},{c}"
             for a, c in zip(arrivals, classes)]
    path = tmp_path / "two_classes.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens,slo_class\n" + "\n".join(lines))
    spec = EvalSpec(str(path), "all", None, 0.25,
                    EngineConfig(admission="shed", admission_slack=0.5, batch_share=0.5))
    row = _row_job((spec, "static", 3.0, False))
    assert row["batch_requests"] == int((classes == "batch").sum())
    assert row["shed"] > 0 and row["expired"] == 0 and row["late"] == 0
    assert 0.0 <= row["interactive_attainment"] <= 1.0 and row["batch_goodput_tps"] > 0
    table = markdown_table([{**row, "mean_kv_gib": 24.7}], [])
    assert "| interactive att. | batch tok/s |" in table and f"| {row['shed']} / 0 / 0 |" in table
