"""The arena's figures for the levers, on three minutes of the real Azure code trace (240 s to
420 s, 332 requests) with batch drops: per-class columns, goodput past capacity, memory and the
static frontier, the oracle labelled as an upper bound, the Pareto plot, and the scorecard
block for a policy of the current spec. One arena command runs once for the module (admission
shed at slack 0.5, the default co-tenant); each test checks its figures against the arena's own
data path run directly or against its own rows. Skipped where the trace is absent."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.arena import (
    LOAD_NEIGHBOURS,
    SCORECARD_LOADS,
    _row_job,
    run_episode,
    static_default,
    summary_at,
)
from agents.controllers.best_static import GRID, BestStaticController, parse_grid, select_best
from agents.evaluate import main as evaluate_main
from agents.registry import EvalSpec, best_static, make_controller, policy_file
from agents.report import markdown_table, plot, scorecard_table, write_json
from agents.scorecard import NEVER_WORSE_THAN, batch_goodput
from env.engine_choice import EngineChoice
from env.replay import replay
from env.traces.locations import azure_trace_path, traces_dir
from env.traces.mixed import BatchDrops, mixed
from env.traces.plain_csv import write_plain_csv
from env.traces.resolve import resolve_trace
from env.traces.transforms import rate_scale, time_window
from runtime.engine.admission import AdmissionPolicy
from runtime.engine.profile import Profile
from runtime.knobs import DEFAULT_KNOBS, Knobs
from runtime.locations import CHECKPOINTS_DIR_ENV, profiles_dir
from tests.test_policy_set import write_set

ROOT = Path(__file__).resolve().parents[1]
SCALES = (1.0, 2.0)
RATIOS = (0.5, 0.6)
"""0.5 is in best static's grid (read from its search), 0.6 is not (searched)"""
CHOICE = EngineChoice(admission=AdmissionPolicy.SHED, admission_slack=0.5, cotenant=True)
POLICY = "policy:tests/fixtures/policy-test-1.onnx"
"""a policy of the current spec (tests/policy_factory.py)"""
CONTROLLERS = ("static", "best-static", "pid", POLICY)
STATIC_GRID = "window=5;chunk=512,2048;ratio=0.5,0.95"
"""best static's capacity search walks this small grid here (the full one walks 90 settings)"""


@pytest.fixture(scope="module")
def arena(tmp_path_factory):
    """(the window's spec, the arena's JSON) with the best-static caches in a folder of the
    test's own, so that nothing is written into the repository."""
    try:
        azure_trace_path("code")
    except FileNotFoundError:
        pytest.skip(f"Azure code trace not found in {traces_dir()}")
    tmp = tmp_path_factory.mktemp("arena")
    window = mixed(time_window(resolve_trace("azure-code"), 240.0, 420.0),
                   BatchDrops(every_s=60.0, first_s=20.0, size=40), seed=0)
    path = write_plain_csv(window, tmp / "code240.csv", classes=True)
    checkpoints, env = private_checkpoints(tmp)
    out = subprocess.run(
        [sys.executable, "-m", "agents.evaluate", "--trace", str(path), "--split", "all",
         "--controllers", ",".join(CONTROLLERS), "--rate-scales", ",".join(map(str, SCALES)),
         "--match-static", "0.68", "--capacity-controllers", "static,best-static," + POLICY,
         "--tuning-scales", "1", "--past-capacity", "2,4",
         "--frontier-ratios", ",".join(map(str, RATIOS)), "--admission", "shed",
         "--admission-slack", "0.5", "--cotenant", "--workers", "1", "--json",
         "--static-grid", STATIC_GRID,
         "--out", str(tmp / "ev")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    spec = EvalSpec(str(path), "all", None, 0.25, CHOICE.engine_config(), tuning_scales=(1.0,),
                    static_grid=parse_grid(STATIC_GRID))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CHECKPOINTS_DIR_ENV, str(checkpoints))
        yield spec, json.loads(out.stdout), tmp


def private_checkpoints(tmp: Path) -> tuple[Path, dict[str, str]]:
    """A checkpoints folder under ``tmp`` (the shipped profiles linked in) and the environment
    that points a command at it: best static's searches cache there, not in the repository."""
    checkpoints = tmp / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / "profiles").symlink_to(profiles_dir())
    return checkpoints, {**os.environ, CHECKPOINTS_DIR_ENV: str(checkpoints)}


def _rows(result: dict, controller: str, **flags) -> list[dict]:
    return [r for r in result["rows"] if r["controller"] == controller
            and all(r.get(k) == v for k, v in flags.items())]


def test_rows_carry_per_class_memory_and_admission_figures_of_the_window(arena):
    spec, result, _ = arena
    assert result["deployment"]["admission"] == "shed"
    assert result["deployment"]["admission_slack"] == 0.5
    assert result["deployment"]["cotenant"].startswith("cotenant_demand(")
    (row,) = [r for r in _rows(result, "static") if r["rate_scale"] == 2.0
              and "past_capacity_multiple" not in r]
    ep = run_episode(rate_scale(resolve_trace(spec.trace), 2.0), make_controller("static", spec),
                     interval_s=0.25, profile=Profile.load(), config=spec.config)
    s = ep.summary
    assert row["upper_bound"] is False and row["label"] == "static"
    window = resolve_trace(spec.trace)
    assert row["requests"] == s["requests"] == len(window)
    assert row["batch_requests"] == s["batch_requests"] == 120  # 3 drops of 40
    assert row["interactive_attainment"] == s["interactive_attainment"]
    assert row["batch_goodput_tps"] == s["batch_goodput_tps"] > 0
    assert row["batch_backlog_requests"] == s["batch_unfinished"]
    assert row["batch_backlog_tokens_mean"] == pytest.approx(ep.mean_batch_backlog_tokens)
    assert row["batch_backlog_tokens_mean"] > 0
    assert row["shed"] == s["rejected_by_reason"]["shed"] > 0
    assert row["late"] == 0  # moving late requests back is the other policy
    assert row["mean_kv_gib"] == s["mean_kv_gib"]
    assert row["cotenant_served_share"] == s["cotenant_served_share"]
    assert 0 < row["cotenant_served_share"] < 1
    assert row["mean_kv_cache_ratio"] == pytest.approx(DEFAULT_KNOBS.kv_cache_ratio)


def test_goodput_past_capacity_is_each_goodput_shown_over_the_goodput_at_capacity(arena):
    spec, result, _ = arena
    caps = {c["controller"]: c for c in result["capacity"]}
    reference = caps["best-static"]["capacity_99"]
    assert 0 < reference < 64
    entries = {e["controller"]: e for e in result["past_capacity"]}
    assert set(entries) == {"static", "best-static", POLICY}  # the PID's capacity not searched
    for name, e in entries.items():
        assert e["reference_capacity_99"] == reference
        assert e["capacity_99"] == caps[name]["capacity_99"]
        base = e["goodput_at_capacity_99_rps"]
        assert base == caps[name]["goodput_at_capacity_99_rps"]
        assert [p["multiple"] for p in e["points"]] == [2.0, 4.0]
        for p in e["points"]:
            (row,) = _rows(result, name, past_capacity_multiple=p["multiple"])
            assert p["rate_scale"] == row["rate_scale"] == p["multiple"] * reference
            assert p["goodput_rps"] == row["goodput_rps"]
            assert p["goodput_share"] == row["goodput_rps"] / base
            assert p["shed"] == row["shed"] > 0
    # the goodput at capacity is the one a replay at that load measures
    static = entries["static"]
    direct = summary_at(spec, make_controller("static", spec), static["capacity_99"])
    assert static["goodput_at_capacity_99_rps"] == direct["goodput_rps"]
    # capacity is judged on interactive attainment, as every figure at these loads is (the
    # batch requests, all met, would lift an all-class attainment over 99% past it)
    assert direct["interactive_attainment"] >= 0.99
    best = summary_at(spec, make_controller("best-static", spec), reference)
    assert best["interactive_attainment"] >= 0.99
    # best static is the capacity search's choice on the train split, which on this window (it
    # ends before minute 40) is the window the arena replays: the same walk, the same answer
    found = result["fixed_settings"]["code240"]
    assert found["best_static_99"]["best"]["capacity"] == reference
    assert found["best_static_99"]["best"]["knobs"] == caps["best-static"]["setting_99"]["knobs"]
    assert found["best_static_90"]["best"]["capacity"] == caps["best-static"]["capacity_90"]
    assert 1 <= len(found["best_static_99"]["top"]) <= 5


@pytest.mark.parametrize("ratio", [0.5, 0.6])
def test_each_frontier_point_is_best_static_at_its_ratio(arena, ratio):
    spec, result, _ = arena
    points = result["frontier"]
    loads = [ld["rate_scale"] for ld in result["scorecard"]["loads"]]
    assert sorted((p["kv_cache_ratio"], p["rate_scale"]) for p in points) == sorted(
        itertools.product(RATIOS, [*SCALES, *loads]))
    # best static's search at the ratio, by hand: every other knob of its grid replayed on the
    # training split (the whole window: it ends before 2400 s) at the tuning scale
    trace = resolve_trace(spec.trace)
    grid = {**GRID, "kv_cache_ratio": (ratio,)}
    table = []
    for combo in itertools.product(*grid.values()):
        knobs = Knobs(**dict(zip(grid, combo)))
        att = replay(trace, knobs, config=spec.config).summary.slo_attainment
        table.append({"knobs": list(knobs.as_tuple()), "mean_attainment": att})
    assert len(table) == math.prod(len(v) for k, v in GRID.items() if k != "kv_cache_ratio")
    best = select_best(table)["knobs"][:3]
    (point,) = [p for p in points if p["kv_cache_ratio"] == ratio and p["rate_scale"] == 1.0]
    assert list(point["knobs"].values())[:3] == best
    # then best static's admission lever search around those knobs, and the setting replayed
    setting = best_static(spec, ratio)
    assert point["knobs"] == setting.knobs.as_dict() and point["admission"] == setting.admission
    s = summary_at(spec, BestStaticController(setting.knobs, setting.admission), 1.0)
    assert point["mean_kv_gib"] == s["mean_kv_gib"]
    assert point["interactive_attainment"] == s["interactive_attainment"]
    assert point["cotenant_served_share"] == s["cotenant_served_share"]
    # a smaller pool than best static's own lends more to the co-tenant
    row = _rows(result, "best-static", rate_scale=1.0)[0]
    mine = row["mean_kv_cache_ratio"]
    if ratio != pytest.approx(mine):
        smaller = ratio < mine
        assert (point["mean_kv_gib"] < row["mean_kv_gib"]) is smaller
        assert (point["cotenant_served_share"] > row["cotenant_served_share"]) is smaller


def test_the_oracle_is_labelled_an_upper_bound_in_the_table_json_and_pareto_plot(arena):
    spec, result, tmp = arena
    oracle = _row_job((spec, "oracle", 1.0, False))
    assert oracle["upper_bound"] is True
    rows = [*result["rows"], oracle]
    table = markdown_table(rows, result["capacity"], result["past_capacity"], result["frontier"])
    assert "| code240 | oracle (upper bound) | 1 |" in table
    l_star = next(c["capacity_99"] for c in result["capacity"] if c["controller"] == "best-static")
    assert f"| code240 | static | {4 * l_star:.3g} (4x" in table.split(
        "Goodput past capacity")[0]  # the rows at 4x best static's capacity
    assert "| code240 | 1 | 0.5 | batch_window_ms=" in table  # the frontier's rows
    paths = plot(rows, tmp / "plots", result["frontier"])
    pareto = tmp / "plots" / "pareto_code240.png"
    assert pareto in paths and pareto.stat().st_size > 10_000
    written = json.loads(write_json({**result, "rows": rows}, tmp / "r.json").read_text())
    assert written["rows"][-1]["label"] == "oracle (upper bound)"
    assert written["rows"][-1]["upper_bound"] is True


def test_the_scorecard_stands_on_the_arenas_own_rows(arena):
    spec, result, _ = arena
    f = result["scorecard"]
    rows = result["rows"]
    caps = {c["controller"]: c for c in result["capacity"]}
    l_star = caps["best-static"]["capacity_99"]
    # the scorecard loads are multiples of best static's capacity, every controller ran there
    assert f["loads"] == [{"trace": "code240", "rate_scale": m * l_star, "multiple": m}
                          for m in SCORECARD_LOADS]

    def row(name: str, scale: float) -> dict:
        (r,) = [r for r in rows if r["controller"] == name and r["rate_scale"] == scale]
        return r

    for ld in f["loads"]:
        for name in CONTROLLERS:
            assert row(name, ld["rate_scale"])["scorecard_load_multiple"] == ld["multiple"]
    groups = {(g["target"], g["rate_scale"]): g for g in f["table"]}
    for ld in f["loads"]:
        s = ld["rate_scale"]
        mem = groups["cotenant_memory", s]
        assert mem["best_static"]["value"] == row("best-static", s)["mean_kv_gib"]
        cell = mem["controllers"][POLICY]
        r = row(POLICY, s)
        assert cell["mean_kv_gib"] == r["mean_kv_gib"]
        assert cell["interactive_attainment"] == r["interactive_attainment"]
        assert cell["kv_ratio"] == r["mean_kv_gib"] / row("best-static", s)["mean_kv_gib"]
        ok = (cell["attainment_gap_pt"] >= -0.5 and cell["kv_ratio"] <= 0.7)
        assert cell["pass"] is ok
        batch = groups["batch_goodput", s]
        assert batch["best_static"]["value"] == batch_goodput(row("best-static", s))
    # the oracle did not run: its column and every share of its gain say so
    assert "every share of the oracle's gain: no oracle among --controllers" in f["not_measured"]
    share = groups["oracle_share_capacity_99", None]
    assert share["oracle"]["verdict"] == "not measured: no oracle run"
    assert share["controllers"][POLICY]["pass"] is None
    cap = groups["capacity_99", None]
    assert "pid" not in caps  # --capacity-controllers left it out
    assert cap["controllers"]["pid"]["verdict"] == (
        "not measured: no capacity search (--capacity-controllers)")
    assert cap["controllers"][POLICY]["value"] == caps[POLICY]["capacity_99"]
    assert cap["controllers"][POLICY]["pass"] is (caps[POLICY]["capacity_99"] >= l_star)
    # the headline's load is where the static default, first come first served, attains 68%
    # of interactive requests; every controller ran there under the arena's own deployment
    (match,) = result["static_match"]
    assert match["static_deployment"]["admission"] == "fcfs"
    default = EvalSpec(spec.trace, "all", None, 0.25, static_default(spec.config))
    direct = summary_at(default, make_controller("static", default), match["rate_scale"])
    assert match["static_attainment"] == direct["interactive_attainment"] >= 0.68
    head = groups["headline", match["rate_scale"]]
    matched = row(POLICY, match["rate_scale"])
    assert matched["matched_static"] is True
    assert head["controllers"][POLICY]["value"] == matched["interactive_attainment"]
    assert head["controllers"][POLICY]["batch_on_time"] == (
        matched["batch_met"] / matched["batch_requests"])
    # never worse than the PID: the least margin over every load both ran at; past best
    # static's capacity every controller also ran at the load's neighbours, and the margin
    # there is the mean over the load and them
    own = [r for r in rows if r["controller"] == POLICY and "neighbour_of" not in r]
    assert len(own) == len(SCALES) + 1 + 2 + len(SCORECARD_LOADS)  # + match + 2x, 4x cap.
    margins = []
    for r in own:
        s = r["rate_scale"]
        near = [x["rate_scale"] for x in rows
                if x["controller"] == POLICY and x.get("neighbour_of") == s]
        if s > l_star:
            assert sorted(x / s for x in near) == pytest.approx(LOAD_NEIGHBOURS)
        else:
            assert near == []
        at = [(row(POLICY, x)["slo_attainment"] - row("pid", x)["slo_attainment"]) * 100
              for x in (s, *near)]
        margins.append(sum(at) / len(at))
    assert any(r["rate_scale"] > l_star for r in own)
    worst = groups["never_worse", None]["controllers"][POLICY]
    assert worst["margin_pt"] == pytest.approx(min(margins), abs=1e-9)
    assert worst["against"] in NEVER_WORSE_THAN
    assert set(groups["never_worse", None]["controllers"]) == {"static", POLICY}
    table = scorecard_table(f)
    assert table.splitlines()[2] == ("| trace | target | load | bar | best static | hindsight "
                                     "static | oracle (upper bound) | static | pid | "
                                     "policy:fixtures/policy-test-1 |")


def test_report_prints_the_tables_of_a_saved_run_scorecard_included(arena, capsys):
    _, result, tmp = arena
    assert evaluate_main(["--report", str(tmp / "ev" / "results.json")]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith(scorecard_table(result["scorecard"]))
    assert out.startswith("| trace | controller | rate x |")


def test_the_arena_gives_each_trace_its_workloads_policy(policy_dir):
    path = str(write_set(policy_dir))
    assert policy_file(path, "azure-code") == str(policy_dir / "policy-v2.onnx")
    assert policy_file(path, "mixed") == str(policy_dir / "policy.onnx")
    # a trace file is named by its stem
    write_set(policy_dir, workloads={"my_trace": "policy-v2.onnx"})
    assert policy_file(path, "/data/traces/my_trace.csv") == str(policy_dir / "policy-v2.onnx")
    # a plain ONNX file runs on every trace
    assert policy_file("x/policy.onnx", "azure-code") == "x/policy.onnx"
