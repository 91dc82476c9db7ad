"""Shared fixtures: contract-following ONNX policies (committed under ``tests/fixtures/``, so the
runtime's tests need no torch) and observations. Engine factories live in
``tests/engine_factory.py``.

On a runtime-only install (``.[cpu,dev]``, no ``train`` extra) the test modules that import the
training stack at their top are not collected. ``make test`` runs the suite both ways: first on
the runtime-only install, then on the full one, which leaves out what passed in the first run.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from runtime.knobs import DEFAULT_KNOBS, Knobs
from runtime.observation import OBSERVATION_NAMES, example_fields, vector_from_fields

FIXTURES = Path(__file__).resolve().parent / "fixtures"
"""committed test policies: ``policy-test-1.onnx`` and ``policy-test-2.onnx``, written by
``python -m tests.policy_factory`` (seeds 0 and 1 of :func:`tests.policy_factory.make_mlp`)"""
TRAINING_STACK = ("torch", "gymnasium", "stable_baselines3", "onnx", "env", "agents", "train",
                  "tests.policy_factory")
"""modules that a runtime-only install lacks (``env``, ``agents`` and ``train`` import them)"""
HAS_TRAINING_STACK = all(importlib.util.find_spec(m) is not None
                         for m in ("torch", "gymnasium", "stable_baselines3", "onnx"))


REPO = Path(__file__).resolve().parent.parent


def imports_training_stack(path: Path, seen: set[Path] | None = None) -> bool:
    """Whether a module imports any of :data:`TRAINING_STACK` at its top level, directly or
    through a module of ``scripts/`` or ``tests/`` it imports (a test of a script that needs
    the training stack needs it too)."""
    seen = set() if seen is None else seen
    seen.add(path)
    for node in ast.parse(path.read_text()).body:
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(n == m or n.startswith(m + ".") for n in names for m in TRAINING_STACK):
            return True
        for n in names:
            local = REPO.joinpath(*n.split(".")).with_suffix(".py")
            if (n.split(".")[0] in ("scripts", "tests") and local.is_file()
                    and local not in seen and imports_training_stack(local, seen)):
                return True
    return False


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    if (not HAS_TRAINING_STACK and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_")
            and imports_training_stack(collection_path)):
        return True
    return None


PASSED_OUT = "--passed-out"
"""a file to which the run writes the ids of the tests that passed (``make test`` gives it to the
runtime-only run)"""
PASSED_IN = "--deselect-passed"
"""a file of test ids that passed in another environment of the same checkout: the run deselects
them (``make test`` gives the full run the runtime-only run's file, so that the runtime's tests
run once, where they also show that the runtime needs nothing more)"""


PASSED_OUT_HELP = "write the ids of the tests that pass to FILE"
PASSED_IN_HELP = "deselect the tests whose ids FILE lists (written by --passed-out)"


def pytest_addoption(parser) -> None:
    parser.addoption(PASSED_OUT, metavar="FILE", help=PASSED_OUT_HELP)
    parser.addoption(PASSED_IN, metavar="FILE", help=PASSED_IN_HELP)


def _passed_in(config) -> set[str]:
    path = config.getoption(PASSED_IN)
    if not path:
        return set()
    file = Path(path)
    if not file.is_file():
        raise pytest.UsageError(f"{PASSED_IN} {path}: no such file (it is written by the "
                                f"runtime-only run, `make test-runtime`)")
    return set(file.read_text().split("\n")) - {""}


def pytest_collection_modifyitems(config, items) -> None:
    """Deselect the tests that passed in the runtime-only run (:data:`PASSED_IN`); on a
    runtime-only install, skip the tests marked ``training_stack`` (they run a script or import
    a module that needs it at run time, which the collection filter above cannot see)."""
    passed = _passed_in(config)
    if passed:
        keep = [item for item in items if item.nodeid not in passed]
        gone = [item for item in items if item.nodeid in passed]
        if gone:
            config.hook.pytest_deselected(items=gone)
            items[:] = keep
            config.stash[_DESELECTED] = len(gone)
    if HAS_TRAINING_STACK:
        return
    skip = pytest.mark.skip(reason="needs the training stack (the train extra)")
    for item in items:
        if item.get_closest_marker("training_stack") is not None:
            item.add_marker(skip)


_DESELECTED = pytest.StashKey[int]()
_passed: list[str] = []
"""the ids of the tests that passed in this run, for :data:`PASSED_OUT`"""


def pytest_runtest_logreport(report) -> None:
    if report.when == "call" and report.passed:
        _passed.append(report.nodeid)
    elif report.when == "teardown" and report.failed and report.nodeid in _passed:
        _passed.remove(report.nodeid)


def pytest_sessionfinish(session, exitstatus) -> None:
    out = session.config.getoption(PASSED_OUT)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text("".join(f"{n}\n" for n in _passed))


def pytest_report_header(config) -> str | None:
    path = config.getoption(PASSED_IN)
    return f"deselecting the tests that passed in the runtime-only run ({path})" if path else None


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    n = config.stash.get(_DESELECTED, 0)
    if n:
        terminalreporter.write_line(f"{n} tests deselected: they passed in the runtime-only run "
                                    f"({config.getoption(PASSED_IN)})")


def raw_fields(knobs: Knobs = DEFAULT_KNOBS, **overrides: float) -> dict[str, float]:
    """A plausible named observation: moderate load, SLOs met, the given knobs."""
    f = example_fields(knobs)
    f.update(overrides)
    assert list(f) == list(OBSERVATION_NAMES)
    return f


def observation(knobs: Knobs = DEFAULT_KNOBS, **overrides: float) -> np.ndarray:
    return vector_from_fields(raw_fields(knobs, **overrides))


@pytest.fixture(scope="session")
def mlp():
    """The torch MLP that ``policy-test-1.onnx`` was exported from."""
    pytest.importorskip("torch")
    from tests.policy_factory import make_mlp

    return make_mlp(seed=0)


@pytest.fixture(scope="session")
def policy_bytes() -> bytes:
    """A contract-following policy, version test-1, trained_on synthetic-poisson."""
    return (FIXTURES / "policy-test-1.onnx").read_bytes()


@pytest.fixture(scope="session")
def policy_v2_bytes() -> bytes:
    """Another policy (other weights), version test-2."""
    return (FIXTURES / "policy-test-2.onnx").read_bytes()


@pytest.fixture()
def policy_dir(tmp_path: Path, policy_bytes: bytes, policy_v2_bytes: bytes) -> Path:
    """A policy folder with policy.onnx (test-1) and policy-v2.onnx (test-2)."""
    (tmp_path / "policy.onnx").write_bytes(policy_bytes)
    (tmp_path / "policy-v2.onnx").write_bytes(policy_v2_bytes)
    return tmp_path


@pytest.fixture()
def policy_path(policy_dir: Path) -> Path:
    return policy_dir / "policy.onnx"
