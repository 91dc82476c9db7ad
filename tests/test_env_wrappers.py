"""Training wrappers: the window pool, the curriculum's draw, and the pairing with best static."""

from __future__ import annotations

import numpy as np
import pytest

from env.serving_env import ServingEnv
from env.session import ServingSession
from env.windows import Curriculum, WindowPool, window_size
from env.wrappers import PooledWindows, StaticReference
from runtime.knobs import DEFAULT_KNOBS, Knobs, knobs_to_action

HOLD_DEFAULT = np.asarray(knobs_to_action(DEFAULT_KNOBS), dtype=np.float32)


def play(e, action, seed=None):
    e.reset(seed=seed)
    rewards, infos = [], []
    while True:
        _, r, term, trunc, info = e.step(action)
        rewards.append(r)
        infos.append(info)
        if term or trunc:
            return rewards, infos


def test_a_policy_holding_the_reference_knobs_gets_zero_differential_reward_at_every_step():
    e = StaticReference(ServingEnv(episode_s=20.0, rate_scale_range=(2.0, 2.0)), DEFAULT_KNOBS)
    rewards, infos = play(e, HOLD_DEFAULT, seed=3)
    assert len(rewards) > 70
    # (to 1e-10: the action round trip moves the ratio in its 16th digit, and the memory price
    # with it)
    assert rewards == pytest.approx([0.0] * len(rewards), abs=1e-10)
    assert infos[-1]["episode_gap"] == pytest.approx(0.0, abs=1e-10)
    assert sum(i["raw_reward"] for i in infos) == pytest.approx(
        sum(i["reference_reward"] for i in infos), abs=1e-7)


def test_the_differential_return_is_the_raw_return_minus_best_statics_replay_of_the_window():
    ref = Knobs(5.0, 1024, 0.95)
    e = StaticReference(ServingEnv(episode_s=20.0, rate_scale_range=(3.0, 3.0)), ref)
    rewards, infos = play(e, HOLD_DEFAULT, seed=1)
    raw = [i["raw_reward"] for i in infos]
    assert rewards == [r - i["reference_reward"] for r, i in zip(raw, infos)]
    # the reference side: the same window held at ``ref`` from the start, every interval after
    # the one reset() runs
    replay = ServingSession(e.unwrapped.session.trace, knobs=ref)
    held = [replay.step(ref).reward for _ in range(len(infos) + 1)]
    assert replay.window_over
    assert [i["reference_reward"] for i in infos] == held[1:]
    assert infos[-1]["episode_gap"] == pytest.approx((sum(raw) - sum(held[1:])) / len(raw))
    assert infos[-1]["episode_gap"] < 0  # the default's chunk 2048 loses to 1024 at x3 here


def test_a_window_is_replayed_for_reference_once_and_then_served_from_the_cache():
    pool = WindowPool.draw(ServingEnv().trace, 2, 20.0, (1.0, 2.0), seed=0)
    e = PooledWindows(StaticReference(ServingEnv(episode_s=20.0), DEFAULT_KNOBS), pool)
    e.set_window_probabilities([1.0, 0.0])
    for seed in range(3):
        _, info = e.reset(seed=seed)
        assert info["window_id"] == 0
    assert e.env.reference_replays == 1
    assert (e.unwrapped.start_s, e.unwrapped.rate_scale) == (pool.starts[0], pool.scales[0])


def test_a_pool_is_the_same_for_the_same_seed_and_every_window_holds_requests():
    trace = ServingEnv().trace
    a = WindowPool.draw(trace, 8, 30.0, (0.5, 2.5), seed=7)
    assert a == WindowPool.draw(trace, 8, 30.0, (0.5, 2.5), seed=7)
    assert a != WindowPool.draw(trace, 8, 30.0, (0.5, 2.5), seed=8)
    assert all(0.5 <= s <= 2.5 for s in a.scales)
    assert all(window_size(trace, t, 30.0 * s) >= 2 for t, s in zip(a.starts, a.scales))


def test_the_curriculum_draws_losing_windows_in_proportion_to_their_loss():
    c = Curriculum(4, mix=0.5)
    np.testing.assert_allclose(c.probabilities(), [0.25] * 4)  # nothing seen: uniform
    c.record(0, 0.3)  # loses 0.3 per interval to best static
    c.record(1, 0.1)
    c.record(2, -0.2)  # beats best static: no extra weight
    # window 3 unseen counts as the worst seen (0.3): losses 0.3, 0.1, 0, 0.3 of 0.7
    np.testing.assert_allclose(c.probabilities(),
                               [0.125 + 0.5 * 3 / 7, 0.125 + 0.5 / 7, 0.125, 0.125 + 0.5 * 3 / 7])
    c.record(3, 0.0)
    c.record(0, 0.1)  # memory 0.5: 0.5 * 0.3 + 0.5 * 0.1
    assert c.loss[0] == pytest.approx(0.2) and list(c.episodes) == [2, 1, 1, 1]
    np.testing.assert_allclose(c.probabilities(), [0.125 + 0.5 * 2 / 3, 0.125 + 0.5 / 3, 0.125,
                                                   0.125])
    assert list(Curriculum(3, mix=0.0).probabilities()) == [1 / 3] * 3


def test_the_curriculum_is_uniform_when_the_policy_loses_nowhere():
    c = Curriculum(2, mix=0.8)
    c.record(0, -0.1)
    c.record(1, 0.0)
    np.testing.assert_allclose(c.probabilities(), [0.5, 0.5])


def test_window_probabilities_are_refused_unless_they_are_a_distribution():
    pool = WindowPool((0.0, 1.0), (1.0, 1.0))
    e = PooledWindows(ServingEnv(episode_s=20.0), pool)
    with pytest.raises(ValueError, match="window probabilities must be 2 non-negative numbers "
                                         "summing to 1, got shape \\(3,\\) and sum 1"):
        e.set_window_probabilities([0.5, 0.25, 0.25])
    with pytest.raises(ValueError, match="Curriculum.mix must be in \\[0, 1\\], got 1.5"):
        Curriculum(2, mix=1.5)


def test_a_windows_co_tenant_demand_is_read_from_where_the_window_was_cut():
    from env.traces.cotenant import cotenant_demand
    from env.windows import window_config
    from runtime.engine.engine import EngineConfig

    demand = cotenant_demand()
    config = EngineConfig(cotenant=demand)
    later = window_config(config, 1800.0)
    assert later.cotenant.demand_gib(0.0) == demand.demand_gib(1800.0)
    assert later.cotenant.demand_gib(30.5) == demand.demand_gib(1830.5)
    assert window_config(config, 0.0) is config
    assert window_config(EngineConfig(), 1800.0).cotenant is None
    # the period is kept: an hour on is the same demand
    assert window_config(config, 3600.0) is config
    with pytest.raises(ValueError, match="finite"):
        demand.shifted(float("nan"))


def test_training_episodes_meet_the_co_tenants_demand_of_their_windows_and_so_does_the_reference():
    from env.traces.cotenant import cotenant_demand
    from runtime.engine.engine import EngineConfig

    config = EngineConfig(cotenant=cotenant_demand())
    # the co-tenant's served share is worth something, so a reference replayed under another
    # demand than the episode's would not pair to zero
    e = StaticReference(ServingEnv(episode_s=20.0, rate_scale_range=(1.0, 1.0),
                                   engine_config=config, cotenant_value=1.0), DEFAULT_KNOBS)
    demands = set()
    for start in (0.0, 900.0, 1800.0):
        e.reset(options={"start_s": start})
        u = e.unwrapped
        assert u.episode_config.cotenant.demand_gib(0.0) == config.cotenant.demand_gib(start)
        demands.add(round(u.session.engine.config.cotenant.demand_gib(0.0), 6))
        _, r, *_ = e.step(HOLD_DEFAULT)
        # the reference replays the same window under the same demand: holding its knobs is
        # worth nothing more or less than it
        assert r == pytest.approx(0.0, abs=1e-10)
    assert len(demands) == 3
