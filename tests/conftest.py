"""Shared fixtures: contract-following ONNX policies (committed under ``tests/fixtures/``, so the
runtime's tests need no torch) and observations. Engine factories live in
``tests/engine_factory.py``.

On a runtime-only install (``.[cpu,dev]``, no ``train`` extra) the test modules that import the
training stack at their top are not collected; ``make test`` runs the suite both ways.
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


def pytest_collection_modifyitems(config, items) -> None:
    """On a runtime-only install, skip the tests marked ``training_stack`` (they run a script or
    import a module that needs it at run time, which the collection filter above cannot see)."""
    if HAS_TRAINING_STACK:
        return
    skip = pytest.mark.skip(reason="needs the training stack (the train extra)")
    for item in items:
        if item.get_closest_marker("training_stack") is not None:
            item.add_marker(skip)


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
