"""Imitation of the oracle: cloning lowers the action error on held-out windows, and DAgger labels
the states the policy itself visits."""

from __future__ import annotations

import dataclasses
import pickle
from functools import partial

import numpy as np
import pytest
import torch

from agents.imitation import (
    ImitationConfig,
    action_mse,
    as_arrays,
    clone,
    mean_actions,
    oracle_for,
    oracle_labels,
    regret_weights,
    split_by_window,
    visit_and_label,
)
from agents.oracle import FORECAST_NAME, Setting
from env.serving_env import ServingEnv
from env.windows import WindowPool, cut_window
from runtime.knobs import DEFAULT_KNOBS, KNOB_NAMES, NUM_KNOBS, Knobs, knobs_to_action

pytestmark = pytest.mark.training_stack

CFG = ImitationConfig(horizon_s=2.0, candidates="window=5;chunk=256,2048,8192;ratio=0.95",
                      epochs=100, batch_size=64, learning_rate=3e-3)
ANCHOR = Setting(Knobs(5.0, 2048, 0.95))


def tiny_policy(seed: int = 0):
    import torch
    from stable_baselines3.common.policies import ActorCriticPolicy

    torch.manual_seed(seed)
    e = ServingEnv(episode_s=10.0)
    policy = ActorCriticPolicy(e.observation_space, e.action_space, lambda _: 3e-4,
                               net_arch=dict(pi=[32, 32], vf=[32, 32]),
                               activation_fn=torch.nn.Tanh)
    with torch.no_grad():  # start at the static default, as train.py does
        policy.action_net.weight.mul_(0.01)
        policy.action_net.bias.copy_(torch.tensor(knobs_to_action(DEFAULT_KNOBS)))
    return policy


def tiny_windows(n: int = 4) -> list:
    trace = ServingEnv().trace
    pool = WindowPool.draw(trace, n, 10.0, (1.5, 4.0), seed=0)
    return [(cut_window(trace, s, x, 10.0), x) for s, x in zip(pool.starts, pool.scales)]


def test_cloning_the_oracle_lowers_the_action_error_on_held_out_windows():
    # no anchor: the oracle's choice then follows the load (ties keep its current setting)
    labels = oracle_labels(tiny_windows(), CFG, None, interval_s=0.25, profile=None)
    obs, actions = as_arrays(labels)
    train, held = split_by_window(labels, holdout=0.25)
    window = np.asarray(labels.window)
    assert sorted(set(window)) == [0, 1, 2, 3]
    assert 150 <= len(obs) <= 160  # 4 windows of 10 s: a label per 0.25 s until the last arrival
    assert list(held) == list(window == 3)  # the last window held out whole
    assert set(np.unique(actions[:, 1]).round(3)) <= {-0.5, 0.25, 0.75}  # the 3 candidates
    policy = tiny_policy()
    before = action_mse(policy, obs[held], actions[held])
    losses = clone(policy, obs[train], actions[train], epochs=CFG.epochs,
                   batch_size=CFG.batch_size, learning_rate=CFG.learning_rate)
    after = action_mse(policy, obs[held], actions[held])
    assert losses[-1] < losses[0] / 3
    assert after < before / 4, (before, after)  # measured: 0.194 -> 0.012


def test_dagger_labels_every_state_the_policy_visits_with_the_oracles_choice():
    e = ServingEnv(episode_s=10.0)
    visited = []

    def hold_default(obs):
        visited.append(obs)
        return np.asarray(knobs_to_action(DEFAULT_KNOBS), dtype=np.float32)

    pool = WindowPool.draw(e.trace, 2, 10.0, (2.0, 2.0), seed=1)
    labels = visit_and_label(e, hold_default, list(zip(pool.starts, pool.scales)), CFG, ANCHOR)
    obs, actions = as_arrays(labels)
    assert len(obs) == len(visited) and 75 <= len(obs) <= 80
    np.testing.assert_array_equal(obs, np.asarray(visited))
    assert sorted(set(labels.window)) == [0, 1]
    # the policy held the default knobs all along: the observations say so, the labels are the
    # oracle's candidates
    np.testing.assert_allclose(obs[:, -NUM_KNOBS:], np.tile(knobs_to_action(DEFAULT_KNOBS),
                                                    (len(obs), 1)), atol=1e-6)
    assert set(np.unique(actions[:, 1]).round(3)) <= {-0.5, 0.25, 0.75}
    # each label keeps the setting it was chosen as, row for row with its action and scores
    assert len(labels.settings) == len(labels.scores) == len(obs)
    chunks = np.asarray(labels.settings)[:, KNOB_NAMES.index("prefill_chunk_tokens")]
    np.testing.assert_allclose([knobs_to_action(Knobs(5.0, int(c), 0.9))[1] for c in chunks],
                               actions[:, 1], atol=1e-6)


def test_labelling_windows_in_two_processes_gives_the_labels_of_one():
    windows = tiny_windows(2)
    one = oracle_labels(windows, dataclasses.replace(CFG, workers=1), ANCHOR, interval_s=0.25,
                        profile=None)
    two = oracle_labels(windows, dataclasses.replace(CFG, workers=2), ANCHOR, interval_s=0.25,
                        profile=None)
    assert len(one) == len(two) > 0
    for name in ("observations", "actions", "window", "t_s", "scores"):
        np.testing.assert_array_equal(np.asarray(getattr(one, name)),
                                      np.asarray(getattr(two, name)))


def test_dagger_drives_its_windows_in_other_processes_with_the_policys_own_actions():
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from agents.imitation import PolicyActor, _dagger_job, mean_actions
    from agents.parallel import run_jobs

    venv = VecNormalize(DummyVecEnv([partial(ServingEnv, episode_s=10.0)]))
    labels = oracle_labels(tiny_windows(2), CFG, ANCHOR, interval_s=0.25, profile=None)
    obs, _ = as_arrays(labels)
    venv.obs_rms.update(obs.astype(np.float64))
    policy = tiny_policy(seed=3)
    actor = pickle.loads(pickle.dumps(PolicyActor(policy, venv)))
    with torch.no_grad():  # the actor is the policy's clipped mean action on normalised input
        expected = torch.clamp(mean_actions(policy, venv.normalize_obs(obs[:5])), -1, 1).numpy()
    np.testing.assert_allclose(np.stack([actor(o) for o in obs[:5]]), expected, atol=1e-6)
    pool = WindowPool.draw(ServingEnv().trace, 2, 10.0, (2.0, 2.0), seed=1)
    jobs = [(partial(ServingEnv, episode_s=10.0), actor, CFG, ANCHOR, i, s, x)
            for i, (s, x) in enumerate(zip(pool.starts, pool.scales))]
    here = run_jobs(_dagger_job, jobs, workers=1, progress=False)
    there = run_jobs(_dagger_job, jobs, workers=2, progress=False)
    assert [p.window[0] for p in there] == [0, 1]
    for a, b in zip(here, there):
        np.testing.assert_array_equal(np.asarray(a.observations), np.asarray(b.observations))
        np.testing.assert_array_equal(np.asarray(a.actions), np.asarray(b.actions))


def test_a_teacher_without_foresight_labels_from_a_forecast_and_differs_from_the_oracle():
    windows = tiny_windows(2)
    forecast = dataclasses.replace(CFG, arrivals="repeat")
    assert oracle_for(forecast, ANCHOR, 0.25).name == FORECAST_NAME
    seeing = oracle_labels(windows, CFG, ANCHOR, interval_s=0.25, profile=None)
    blind = oracle_labels(windows, forecast, ANCHOR, interval_s=0.25, profile=None)
    a, b = as_arrays(seeing)[1], as_arrays(blind)[1]
    assert len(a) == len(b) and set(np.unique(b[:, 1]).round(3)) <= {-0.5, 0.25, 0.75}
    assert (a != b).any(axis=1).mean() > 0.05  # what the future changes (measured: 28% of labels)


def test_regret_weights_count_a_label_by_what_holding_the_anchor_loses_there():
    # scores [n, candidates], the anchor first: the second label's oracle gains 2 by leaving it
    w = regret_weights(np.array([[1.0, 1.0], [0.0, 2.0], [1.0, 0.0]]))
    np.testing.assert_allclose(w, [2 / 3, 8 / 3, 2 / 3])  # regret (0, 2, 0) + its mean 2/3
    np.testing.assert_array_equal(regret_weights(np.zeros((4, 3))), np.ones(4))


def test_a_weighted_clone_fits_the_weighted_mean_of_conflicting_labels():
    # the same observation labelled -1 (weight 3) and +1 (weight 1): the weighted squared error
    # is least at -0.5, the unweighted one at 0
    obs = np.zeros((2, tiny_policy().observation_space.shape[0]), dtype=np.float32)
    actions = np.zeros((2, NUM_KNOBS), dtype=np.float32)
    actions[:, 0] = [-1.0, 1.0]
    fitted = []
    for weights in (None, np.array([3.0, 1.0])):
        policy = tiny_policy()
        clone(policy, obs, actions, epochs=400, batch_size=2, learning_rate=3e-3,
              weights=weights)
        with torch.no_grad():
            fitted.append(float(mean_actions(policy, obs[:1])[0, 0]))
    assert fitted[0] == pytest.approx(0.0, abs=0.02)
    assert fitted[1] == pytest.approx(-0.5, abs=0.02)
