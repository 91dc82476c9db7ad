"""``make test`` runs the runtime's tests once: the runtime-only run writes the tests that passed,
and the full run deselects them (tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import PASSED_IN, PASSED_OUT

ROOT = Path(__file__).resolve().parents[1]


def _pytest(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_full_run_leaves_out_what_passed_in_the_runtime_only_run(tmp_path):
    passed = tmp_path / "passed.txt"
    first = _pytest(f"{PASSED_OUT}={passed}", "tests/test_bisection.py",
                    "-k", "edges")
    assert first.returncode == 0, first.stdout + first.stderr
    ids = passed.read_text().split()
    assert ids and all(i.startswith("tests/test_bisection.py::") for i in ids)
    second = _pytest(f"{PASSED_IN}={passed}", "tests/test_bisection.py")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "passed" in second.stdout  # the rest of the module ran
    assert f"{len(ids)} tests deselected: they passed in the runtime-only run" in second.stdout
    assert f"{len(ids)} deselected" in second.stdout


def test_a_missing_list_of_passed_tests_is_an_error_naming_the_option(tmp_path):
    run = _pytest(f"{PASSED_IN}={tmp_path / 'none.txt'}", "tests/test_bisection.py")
    assert run.returncode != 0
    assert f"{PASSED_IN} {tmp_path / 'none.txt'}: no such file" in run.stdout + run.stderr
