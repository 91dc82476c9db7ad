"""The scripts' command lines are typed (tyro): a bad value exits with status 2 and names the flag,
before any work starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def stderr_of_refused(script: str, *flags: str) -> str:
    # a script's own folder leads its sys.path: PYTHONPATH makes this checkout's packages the ones
    # it imports, whatever an editable install elsewhere provides
    out = subprocess.run([sys.executable, f"scripts/{script}.py", *flags], cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    return " ".join(out.stderr.replace("\u2502", " ").split())


@pytest.mark.parametrize("script, flags, message", [
    ("make_roofline_profile", ("--out", "x.json", "--memory-gib", "lots"),
     "Error parsing --memory-gib: could not convert string to float: 'lots'"),
    ("make_roofline_profile", ("--out", "x.json", "--model", "gpt-5"),
     "--model must be one of llama2-7b, llama3.1-8b, mistral-7b, qwen2.5-7b, llama2-70b, "
     "llama3.1-70b, got 'gpt-5'"),
    ("bench_decider", ("--calls", "1.5"),
     "Error parsing --calls: invalid literal for int() with base 10: '1.5'"),
    pytest.param("replay", ("--admission", "drop"),
                 "invalid choice 'drop' for argument '--admission'. Expected one of ('fcfs', "
                 "'shed', 'late_to_back')", marks=pytest.mark.training_stack),
    pytest.param("replay_digest", ("--only", "conv-x1", "conv-x9"),
                 "--only: unknown run(s) conv-x9; the runs are conv-x1, conv-x3",
                 marks=pytest.mark.training_stack),
    pytest.param("experiments/levers", ("admission", "--capacity", "lots"),
                 "Error parsing --capacity", marks=pytest.mark.training_stack),
])
def test_a_bad_value_is_refused_naming_the_flag(script, flags, message):
    assert message in stderr_of_refused(script, *flags)


def test_a_required_flag_that_is_missing_is_named():
    assert "--out" in stderr_of_refused("make_roofline_profile")
