"""Loading, checking and running an ONNX policy under the contract in onnx_policy.py."""

from __future__ import annotations

import hashlib
import threading

import numpy as np
import pytest
import torch

from runtime.decider.onnx_policy import OnnxPolicy, PolicyLoadError
from runtime.knobs import NUM_KNOBS
from runtime.observation import OBS_DIM, SPEC_VERSION
from tests.conftest import observation
from tests.policy_factory import export_policy_bytes, make_mlp


def torch_action(mlp, obs: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return torch.clamp(mlp(torch.as_tensor(obs, dtype=torch.float32)), -1, 1).numpy()


def test_loads_a_contract_model_with_its_metadata(policy_path, policy_bytes):
    p = OnnxPolicy.load(policy_path)
    assert p.policy_version == "test-1"
    assert p.spec_version == SPEC_VERSION
    assert p.sha256 == hashlib.sha256(policy_bytes).hexdigest()
    info = p.describe()
    assert info["providers"] == ["CPUExecutionProvider"]
    assert info["metadata"]["batchpilot.trained_on"] == "synthetic-poisson"
    assert info["path"] == str(policy_path)


def test_act_and_act_batch_match_the_torch_policy(policy_path, mlp):
    p = OnnxPolicy.load(policy_path)
    rng = np.random.default_rng(0)
    obs = rng.uniform(-1, 1, size=(64, OBS_DIM)).astype(np.float32)
    expected = torch_action(mlp, obs)
    np.testing.assert_allclose(p.act_batch(obs), expected, atol=1e-5)
    for i in range(4):
        np.testing.assert_allclose(p.act(obs[i]), expected[i], atol=1e-5)


def test_policy_version_defaults_to_the_file_hash(tmp_path):
    data = export_policy_bytes(policy_version=None)
    p = OnnxPolicy(data)
    assert p.policy_version == "sha256:" + hashlib.sha256(data).hexdigest()[:12]


@pytest.mark.parametrize("make, reason, message", [
    (lambda: None, "model missing", r"no policy file at .*policy\.onnx"),
    # refused by its top-level fields, before onnxruntime copies and parses it
    (lambda: b"\x08\x07 this is not a protobuf", "model corrupt",
     r"policy\.onnx is not an ONNX model: field 4 has wire type 0|is not an ONNX model"),
    (lambda: export_policy_bytes()[:500], "model corrupt",
     r"is not an ONNX model: its last field runs \d+ bytes past the end"),
    (lambda: b"\0" * 100_000, "model corrupt", r"is not an ONNX model: byte 0 holds field 0"),
    # a version and a graph that is noise: onnxruntime refuses it
    (lambda: b"\x08\x07\x3a\x04\xff\xff\xff\xff", "model corrupt", r"onnxruntime cannot load"),
    (lambda: export_policy_bytes(spec_version="batchpilot-spec/0+000000000000"), "spec mismatch",
     r"exported for spec 'batchpilot-spec/0\+000000000000', the runtime's is 'batchpilot-spec/3"),
    (lambda: export_policy_bytes(spec_version=None), "spec mismatch",
     r"has no 'batchpilot.spec_version' metadata"),
    (lambda: export_policy_bytes(make_mlp(obs_dim=OBS_DIM + 1), obs_dim=OBS_DIM + 1),
     "bad model signature",
     rf"'obs' has shape \['batch', {OBS_DIM + 1}\], expected \[batch, {OBS_DIM}\]"),
    (lambda: export_policy_bytes(make_mlp(num_actions=3)), "bad model signature",
     rf"'action' has shape \['batch', 3\], expected \[batch, {NUM_KNOBS}\]"),
    (lambda: export_policy_bytes(make_mlp(obs_dim=20, num_actions=3), obs_dim=20),
     "bad model signature", rf"'obs' has shape \['batch', 20\], expected \[batch, {OBS_DIM}\]"),
    (lambda: export_policy_bytes(input_name="x"), "bad model signature",
     r"inputs are \['x'\], expected \['obs'\]"),
    (lambda: export_policy_bytes(output_name="y"), "bad model signature",
     r"outputs are \['y'\], expected \['action'\]"),
    (lambda: export_policy_bytes(dynamic_batch=False), "bad model signature",
     r"'obs' has a fixed batch axis of 1"),
])
def test_refuses_a_model_that_breaks_the_contract(tmp_path, make, reason, message):
    path = tmp_path / "policy.onnx"
    data = make()
    if data is not None:
        path.write_bytes(data)
    with pytest.raises(PolicyLoadError, match=message) as e:
        OnnxPolicy.load(path)
    assert e.value.reason == reason


def test_refuses_a_model_whose_answer_to_a_zero_observation_is_nan(tmp_path):
    with pytest.raises(PolicyLoadError, match="the action for a zero observation is not finite"):
        OnnxPolicy(export_policy_bytes(nan_above=-1.0))


def test_refuses_a_model_that_answers_nan_somewhere_in_the_spec_ranges():
    # finite for a zero observation, NaN once the first field passes 0.5 of its range: the
    # zero-observation warm-up let it through, and every real decision went to the PID
    with pytest.raises(PolicyLoadError, match=r"the action is not finite for \d+ of 512 "
                       r"observations across the spec's ranges \(first: \[nan, nan, nan, nan, "
                       r"nan\]"):
        OnnxPolicy(export_policy_bytes(nan_above=0.5))


def test_threads_that_find_the_bound_buffers_busy_still_get_their_own_answer(policy_path, mlp):
    p = OnnxPolicy.load(policy_path)
    rng = np.random.default_rng(1)
    obs = rng.uniform(-1, 1, size=(8, OBS_DIM)).astype(np.float32)
    expected = torch_action(mlp, obs)
    errors: list[str] = []

    def hammer(i: int) -> None:
        for _ in range(300):
            got = p.act(obs[i])
            if not np.allclose(got, expected[i], atol=1e-5):
                errors.append(f"thread {i}: {got} != {expected[i]}")

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_realistic_observation_gives_a_finite_action_in_range(policy_path):
    a = OnnxPolicy.load(policy_path).act(observation())
    assert len(a) == NUM_KNOBS and all(-1.0 <= x <= 1.0 for x in a)
