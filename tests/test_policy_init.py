"""train.py --init-from: a policy started from an exported ONNX file acts as that file does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.training_stack

ROOT = Path(__file__).resolve().parents[1]


def fresh_model(tmp_path: Path, seed: int):
    import train

    cfg = train.parse_config(["--preset", "smoke", "--n-envs", "1", "--windows", "0",
                              "--reward", "raw", "--curriculum", "0", "--seed", str(seed)])
    train.seed_everything(seed)
    venv = train.make_vec_env(cfg, train.parse_traces(cfg.trace, (0.5, 2.5)))
    return train.make_ppo(cfg, venv, tmp_path), venv


def test_a_policy_started_from_an_exported_file_answers_as_the_file_does(tmp_path):
    import onnxruntime as ort
    import torch

    from agents.export import export_policy, torch_actions
    from agents.policy_init import init_from

    source, source_norm = fresh_model(tmp_path, seed=1)
    with torch.no_grad():  # a policy unlike a fresh one: random weights everywhere
        for p in source.policy.parameters():
            p.normal_(0.0, 0.3)
    obs = np.random.default_rng(0).uniform(0, 1, (512, source_norm.observation_space.shape[0]))
    source_norm.obs_rms.update(obs)
    source_norm.training = False
    path = tmp_path / "policy.onnx"
    export_policy(source, source_norm, path, policy_version="src", num_checks=256)

    model, venv = fresh_model(tmp_path, seed=2)
    report = init_from(model, venv, path)
    assert report["kind"] == "onnx" and "obs_mean" in report["copied"]
    venv.training = False
    x = obs.astype(np.float32)
    got = torch_actions(model, venv, x)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"obs": x})[0]
    assert np.abs(got - want).max() < 1e-5


def test_a_policy_of_another_spec_is_refused_naming_both_specs(tmp_path):
    from agents.policy_init import init_from
    from runtime.observation import SPEC_VERSION

    model, venv = fresh_model(tmp_path, seed=0)
    spec1 = ROOT / "tests" / "fixtures" / "policy-spec1.onnx"  # the first build's shipped policy
    with pytest.raises(ValueError, match=f"was exported under batchpilot-spec/1.*this build trains "
                                         f"{SPEC_VERSION.replace('+', '[+]')}"):
        init_from(model, venv, spec1)
