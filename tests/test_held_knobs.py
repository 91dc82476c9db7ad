"""--free-knobs: the held knobs stay at best static's value through cloning, PPO and export."""

from __future__ import annotations

import numpy as np
import pytest

from agents.held_knobs import HELD_LOG_STD, held_actions, hold_knobs, parse_free_knobs
from runtime.knobs import KNOB_NAMES, Knobs, knobs_to_action


def test_free_knobs_are_parsed_in_spec_order_and_unknown_ones_named():
    assert parse_free_knobs("") == KNOB_NAMES
    assert parse_free_knobs(" batch_share , kv_cache_ratio") == ("kv_cache_ratio", "batch_share")
    with pytest.raises(ValueError, match="unknown knob 'kv_ratio'.*kv_cache_ratio"):
        parse_free_knobs("kv_ratio")


def test_held_values_are_best_statics_and_traces_must_agree_on_them():
    code = Knobs(5.0, 1024, 0.5)
    conv = Knobs(5.0, 8192, 0.95)
    held = held_actions(("kv_cache_ratio",), {"azure-code": code})
    assert sorted(held) == [0, 1, 3, 4]
    assert [held[i] for i in sorted(held)] == [knobs_to_action(code)[i] for i in (0, 1, 3, 4)]
    # the chunk differs: named, with each trace's value
    with pytest.raises(ValueError, match="prefill_chunk_tokens.*azure-code 1024, azure-conv 8192"):
        held_actions(("kv_cache_ratio",), {"azure-code": code, "azure-conv": conv})
    # freeing it leaves only the window, the share and the slack held: those agree
    assert sorted(held_actions(("prefill_chunk_tokens", "kv_cache_ratio"),
                               {"azure-code": code, "azure-conv": conv})) == [0, 3, 4]


def test_held_knobs_survive_cloning_and_ppo_and_are_exported(tmp_path):
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    import env
    from agents.export import export_policy
    from agents.imitation import clone
    from runtime.decider.onnx_policy import OnnxPolicy
    from runtime.observation import OBS_DIM

    venv = VecNormalize(DummyVecEnv([lambda: gym.make(env.ENV_ID, episode_s=10.0)]))
    model = PPO("MlpPolicy", venv, n_steps=64, batch_size=32, n_epochs=2, seed=0,
                device="cpu", policy_kwargs=dict(net_arch=[16, 16]))
    anchor = Knobs(5.0, 512, 0.95, batch_share=0.1, admission_slack=0.5)
    held = held_actions(("kv_cache_ratio",), {"mixed": anchor})
    hold_knobs(model.policy, held)
    rows = sorted(held)

    # cloning toward targets that move every knob moves only the free one
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(256, OBS_DIM)).astype(np.float32)
    targets = rng.uniform(-1, 1, size=(256, len(KNOB_NAMES))).astype(np.float32)
    free_before = model.policy.action_net.bias[2].item()
    clone(model.policy, obs, targets, epochs=5)
    assert model.policy.action_net.bias[2].item() != free_before
    # then PPO
    model.learn(total_timesteps=128)
    head = model.policy.action_net
    assert torch.all(head.weight[rows] == 0.0)
    assert head.bias[rows].tolist() == pytest.approx([held[i] for i in rows])
    assert model.policy.log_std[rows].tolist() == [HELD_LOG_STD] * len(rows)

    # the exported policy outputs the held knobs on any input, the free one varies
    path = tmp_path / "policy.onnx"
    export_policy(model, venv, path, policy_version="held-test")
    actions = np.asarray(OnnxPolicy.load(path).act_batch(
        rng.normal(scale=5.0, size=(64, OBS_DIM)).astype(np.float32)))
    for i in rows:
        assert np.allclose(actions[:, i], held[i], atol=1e-6), KNOB_NAMES[i]
    assert np.ptp(actions[:, 2]) > 0
