"""`python -m agents.choose`: the set's choice rule, on three minutes of the real Azure code
trace (240 s to 420 s) with the default co-tenant, and its refusals of bad input. The command
runs once for the module; the tests check its ranking against its own rows and against the
arena's data path run directly. Skipped where the trace is absent."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agents.arena import summary_at
from agents.choose import deployment_mismatch, rank, table
from agents.choose import main as choose_main
from agents.controllers.best_static import parse_grid
from agents.registry import EvalSpec, make_controller
from env.engine_choice import EngineChoice
from env.traces.locations import azure_trace_path, traces_dir
from env.traces.plain_csv import write_plain_csv
from env.traces.resolve import resolve_trace
from env.traces.transforms import time_window
from runtime.engine.admission import AdmissionPolicy
from runtime.locations import CHECKPOINTS_DIR_ENV
from tests.test_arena_figures import private_checkpoints

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
STATIC_GRID = "window=5;chunk=1024,2048;ratio=0.5,0.95"
"""best static's capacity search walks this small grid here"""
CHOICE = EngineChoice(admission=AdmissionPolicy.SHED, admission_slack=0.5, cotenant=True)


@pytest.fixture(scope="module")
def chosen(tmp_path_factory):
    """(the window's spec, the command's JSON, the run folder given as a candidate)."""
    try:
        azure_trace_path("code")
    except FileNotFoundError:
        pytest.skip(f"Azure code trace not found in {traces_dir()}")
    tmp = tmp_path_factory.mktemp("choose")
    window = time_window(resolve_trace("azure-code"), 240.0, 420.0)
    path = write_plain_csv(window, tmp / "code240.csv")
    run = tmp / "run-a"  # a run folder, as train.py writes it (its policy.onnx is what counts)
    run.mkdir()
    shutil.copy(FIXTURES / "policy-test-1.onnx", run / "policy.onnx")
    checkpoints, env = private_checkpoints(tmp)
    out = subprocess.run(
        [sys.executable, "-m", "agents.choose", "--trace", str(path), "--split", "all",
         "--candidates", f"{run},{FIXTURES / 'policy-test-2.onnx'}", "--tuning-scales", "1",
         "--admission", "shed", "--admission-slack", "0.5", "--cotenant", "--workers", "1",
         "--static-grid", STATIC_GRID, "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv(CHECKPOINTS_DIR_ENV, str(checkpoints))  # the spec below reads that cache
    yield (EvalSpec(str(path), "all", None, 0.25, CHOICE.engine_config(), tuning_scales=(1.0,),
                    static_grid=parse_grid(STATIC_GRID)),
           json.loads(out.stdout), run)
    monkeypatch.undo()


def test_loads_are_multiples_of_best_statics_capacity_and_every_candidate_runs_there(chosen):
    _, result, run = chosen
    assert result["capacity_99"] > 0
    assert result["rate_scales"] == [round(m * result["capacity_99"], 4) for m in (0.5, 1.0)]
    assert result["hold_capacity"] is False
    entries = result["entries"]
    assert [e["candidate"] for e in entries] == [
        "best-static", str(run), str(FIXTURES / "policy-test-2.onnx")]
    for e in entries:
        assert [d["rate_scale"] for d in e["loads"]] == result["rate_scales"]


def test_the_rows_are_the_arenas_own(chosen):
    spec, result, _ = chosen
    policy = result["entries"][2]
    scale = policy["loads"][1]["rate_scale"]
    s = summary_at(spec, make_controller(policy["controller"], spec), scale)
    assert s["interactive_attainment"] == policy["loads"][1]["interactive_attainment"]
    assert s["mean_kv_gib"] == policy["loads"][1]["mean_kv_gib"]


def test_the_choice_is_the_eligible_candidate_with_least_memory(chosen):
    _, result, _ = chosen
    ref, *cands = result["entries"]
    for e in cands:
        gap = e["mean_interactive_attainment"] - ref["mean_interactive_attainment"]
        assert e["gap"] == pytest.approx(gap)
        i = result["rate_scales"].index(round(result["capacity_99"], 4))
        assert e["holds_capacity"] == (e["loads"][i]["interactive_attainment"]
                                       >= ref["loads"][i]["interactive_attainment"])
        assert e["eligible"] == (gap >= -result["within"] - 1e-12)  # --hold-capacity is off
    eligible = [e for e in cands if e["eligible"]]
    assert eligible  # both test policies hold this window (no refusal is tested here: see below)
    best = min(eligible, key=lambda e: e["mean_kv_gib"])
    assert result["chosen"] == best["candidate"]
    assert [e["chosen"] for e in cands] == [e is best for e in cands]
    if Path(result["chosen"]).is_dir():
        assert result["install"].startswith(f"batchpilot install-policy --run {result['chosen']}")
    else:
        assert result["install"] is None  # an ONNX file is not a run the installer takes


def _row(controller: str, scale: float, att: float, kv: float) -> dict:
    return {"controller": controller, "rate_scale": scale, "interactive_attainment": att,
            "mean_kv_gib": kv}


def test_rank_keeps_the_half_point_and_takes_the_least_memory_among_the_eligible():
    rows = [_row("best-static", 1.0, 0.990, 26.0), _row("best-static", 0.5, 1.0, 26.0),
            _row("a", 1.0, 0.984, 12.0), _row("a", 0.5, 1.0, 12.0),  # 0.3 pt under: eligible
            _row("b", 1.0, 0.980, 10.0), _row("b", 0.5, 1.0, 10.0),  # 0.5 pt under: eligible
            _row("c", 1.0, 0.970, 5.0), _row("c", 0.5, 1.0, 5.0)]    # 1 pt under: out
    entries = rank(rows, {"a": "run-a", "b": "run-b", "c": "run-c"}, 0.005)
    assert [(e["candidate"], e["eligible"], e["chosen"]) for e in entries[1:]] == [
        ("run-a", True, False), ("run-b", True, True), ("run-c", False, False)]
    assert [d["rate_scale"] for d in entries[1]["loads"]] == [0.5, 1.0]
    entries = rank(rows, {"c": "run-c"}, 0.005)
    assert not entries[1]["chosen"]


def test_hold_capacity_puts_out_a_candidate_under_best_static_at_its_capacity():
    rows = [_row("best-static", 1.0, 0.9894, 26.0), _row("best-static", 0.5, 1.0, 26.0),
            _row("a", 1.0, 0.9890, 10.0), _row("a", 0.5, 1.0, 10.0),  # under best static at 1
            _row("b", 1.0, 0.9894, 15.0), _row("b", 0.5, 1.0, 15.0)]  # level with it
    names = {"a": "run-a", "b": "run-b"}
    judged = rank(rows, names, 0.005, hold_at=1.0, hold=True)
    assert [(e["holds_capacity"], e["eligible"], e["chosen"]) for e in judged[1:]] == [
        (False, False, False), (True, True, True)]
    assert "out: under best static at its capacity" in table(judged, 0.005)
    # by default the column is reported and the memory figure alone decides
    shown = rank(rows, names, 0.005, hold_at=1.0)
    assert [(e["holds_capacity"], e["chosen"]) for e in shown[1:]] == [(False, True),
                                                                         (True, False)]
    assert "| no |" in table(shown, 0.005) and "| yes |" in table(shown, 0.005)
    with pytest.raises(ValueError, match="no row at x2"):
        rank(rows, names, 0.005, hold_at=2.0)


@pytest.mark.parametrize("args, message", [
    (["--candidates", "tests/fixtures/policy-test-1.onnx", "--loads", "0.5,2",
      "--hold-capacity"], "--loads must hold 1"),
    (["--candidates", ""], "--candidates names nothing"),
    (["--candidates", "no/such/run"], "no/such/run: no run folder with a policy.onnx"),
    (["--candidates", "tests/fixtures/policy-test-1.onnx", "--loads", "0.5,x"], "--loads"),
    (["--candidates", "tests/fixtures/policy-test-1.onnx", "--loads", "0"], "--loads"),
    (["--candidates", "tests/fixtures/policy-test-1.onnx", "--within", "2"], "--within"),
    (["--candidates", "tests/fixtures/policy-test-1.onnx", "--tuning-scales", "1,a"],
     "--tuning-scales"),
    (["--candidates", "tests/fixtures/policy-test-1.onnx,tests/fixtures/policy-test-1.onnx"],
     "one policy twice"),
    (["--candidates", "tests/fixtures/policy-old-spec.onnx"], "spec"),
])
def test_bad_input_is_refused_with_the_flag_named(args, message, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert choose_main(["--trace", "synthetic", *args]) == 2
    assert message in capsys.readouterr().err


def _run_folder(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(FIXTURES / "policy-test-1.onnx", run / "policy.onnx")
    (run / "config.json").write_text(json.dumps(
        {"slo": None, "batch_share": 1.0, "admission": "shed", "admission_slack": 0.5,
         "cotenant": True, "preset": "full"}))
    return run


def test_a_run_trained_under_another_deployment_is_refused_with_the_flag_named(
        tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    run = _run_folder(tmp_path)
    # the flags of the deployment the run recorded, but first come first served
    assert choose_main(["--trace", "synthetic", "--candidates", str(run), "--cotenant",
                        "--admission-slack", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "--admission 'shed'" in err and "--admission 'fcfs'" in err and str(run) in err
    # --any-deployment lets it through to the checks that follow (here a bad tuning scale)
    assert choose_main(["--trace", "synthetic", "--candidates", str(run), "--any-deployment",
                        "--tuning-scales", "1,a"]) == 2
    err = capsys.readouterr().err
    assert "--tuning-scales" in err and "--admission" not in err


def test_the_deployment_check_reads_every_recorded_field(tmp_path):
    run = _run_folder(tmp_path)
    assert deployment_mismatch(CHOICE, str(run)) is None
    assert deployment_mismatch(CHOICE, str(FIXTURES / "policy-test-1.onnx")) is None  # a file
    for flag, other in [("cotenant", False), ("admission_slack", 1.0), ("batch_share", 0.5),
                        ("slo", "long-context")]:
        why = deployment_mismatch(dataclasses.replace(CHOICE, **{flag: other}), str(run))
        assert why is not None and "--" + flag.replace("_", "-") in why
    for text in ("{not json", "[1, 2]"):
        (run / "config.json").write_text(text)
        with pytest.raises(ValueError, match="config.json"):
            deployment_mismatch(CHOICE, str(run))
