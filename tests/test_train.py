"""train.py end to end, as a subprocess with tiny step counts (CleanRL's way of testing it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_smoke_run_writes_a_checkpoint_folder_with_a_checked_onnx_policy(tmp_path):
    out = subprocess.run(
        [sys.executable, "train.py", "--preset", "smoke", "--total-timesteps", "512",
         "--n-steps", "128", "--batch-size", "64", "--eval-every", "512",
         "--wandb-mode", "disabled", "--out-dir", str(tmp_path), "--run-name", "t"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "t"
    for name in ("model.zip", "vecnormalize.pkl", "policy.onnx", "card.md", "card.json",
                 "config.json", "evaluation.json"):
        assert (run / name).is_file(), name
    card = json.loads((run / "card.json").read_text())
    assert card["export"]["max_abs_diff"] <= 1e-5
    assert card["config"]["total_timesteps"] == 512
    assert "| synthetic | static |" in (run / "card.md").read_text()
    assert "ONNX policy:" in out.stdout and "| trace | controller |" in out.stdout
    from runtime.decider.onnx_policy import OnnxPolicy

    assert OnnxPolicy.load(run / "policy.onnx").describe()["policy_version"] == "t"


def test_bad_flags_are_refused_by_name():
    out = subprocess.run([sys.executable, "train.py", "--n-steps", "abc"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--n-steps expects a number" in out.stderr
    out = subprocess.run([sys.executable, "train.py", "--preset", "huge"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--preset must be one of smoke, default, full" in out.stderr
