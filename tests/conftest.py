"""Shared fixtures: contract-following ONNX policies (exported once a session), observations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runtime.knobs import DEFAULT_KNOBS, Knobs
from runtime.observation import OBSERVATION_NAMES, vector_from_fields
from tests.policy_factory import export_policy_bytes, make_mlp


def raw_fields(knobs: Knobs = DEFAULT_KNOBS, **overrides: float) -> dict[str, float]:
    """A plausible named observation: moderate load, SLOs met, the given knobs."""
    f = {
        "arrival_rate_rps": 40.0, "arrival_rate_change_rps": -3.0, "prompt_tokens_mean": 900.0,
        "prompt_tokens_std": 400.0, "waiting_requests": 5.0, "waiting_prompt_tokens": 4500.0,
        "running_requests": 60.0, "kv_utilization": 0.7, "kv_fragmentation": 0.1,
        "preemptions": 0.0, "ooms": 0.0, "ttft_p99_ratio": 0.6, "tpot_p99_ratio": 0.8,
        "slo_attainment": 0.97, "ttft_p99_ratio_prev": 0.5, "tpot_p99_ratio_prev": 0.7,
        "kv_utilization_prev": 0.65,
        **knobs.as_dict(),
    }
    f.update(overrides)
    assert list(f) == list(OBSERVATION_NAMES)
    return f


def observation(knobs: Knobs = DEFAULT_KNOBS, **overrides: float) -> np.ndarray:
    return vector_from_fields(raw_fields(knobs, **overrides))


@pytest.fixture(scope="session")
def mlp():
    return make_mlp(seed=0)


@pytest.fixture(scope="session")
def policy_bytes(mlp) -> bytes:
    return export_policy_bytes(mlp, policy_version="test-1",
                               metadata={"batchpilot.trained_on": "synthetic-poisson"})


@pytest.fixture(scope="session")
def policy_v2_bytes() -> bytes:
    return export_policy_bytes(make_mlp(seed=1), policy_version="test-2")


@pytest.fixture()
def policy_dir(tmp_path: Path, policy_bytes: bytes, policy_v2_bytes: bytes) -> Path:
    """A policy folder with policy.onnx (test-1) and policy-v2.onnx (test-2)."""
    (tmp_path / "policy.onnx").write_bytes(policy_bytes)
    (tmp_path / "policy-v2.onnx").write_bytes(policy_v2_bytes)
    return tmp_path


@pytest.fixture()
def policy_path(policy_dir: Path) -> Path:
    return policy_dir / "policy.onnx"
