"""The Gymnasium environment: registered, checkable, seeded, and wired to the one data path."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import env  # noqa: F401  (registers batchpilot/Serving-v0)
from env.serving_env import ServingEnv
from env.traces import LogNormalLengths, poisson
from runtime.knobs import DEFAULT_KNOBS, KNOB_NAMES, NUM_KNOBS, action_to_knobs, knobs_to_action
from runtime.observation import OBS_DIM


def small_env(**kw) -> ServingEnv:
    kw.setdefault("episode_s", 20.0)
    return ServingEnv(**kw)


def rollout(e: ServingEnv, seed: int, actions: np.ndarray) -> tuple[list, list, dict]:
    obs, info = e.reset(seed=seed)
    observations, rewards = [obs], []
    for a in actions:
        obs, r, term, trunc, info = e.step(a)
        observations.append(obs)
        rewards.append(r)
        if term or trunc:
            break
    return observations, rewards, info


def test_registered_under_a_versioned_id_and_made_by_name():
    assert env.ENV_ID == "batchpilot/Serving-v0"
    assert gym.spec(env.ENV_ID).entry_point == "env.serving_env:ServingEnv"
    e = gym.make(env.ENV_ID, episode_s=10.0)
    assert e.observation_space.shape == (OBS_DIM,)
    assert e.action_space.shape == (NUM_KNOBS,)
    e.close()


def test_passes_gymnasium_env_checker():
    check_env(gym.make(env.ENV_ID, episode_s=20.0).unwrapped)


def test_two_resets_with_one_seed_give_identical_episodes():
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (200, NUM_KNOBS)).astype(np.float32)
    a = rollout(small_env(), 123, actions)
    b = rollout(small_env(), 123, actions)
    c = rollout(small_env(), 124, actions)
    assert len(a[0]) == len(b[0])
    for x, y in zip(a[0], b[0]):
        np.testing.assert_array_equal(x, y)
    assert a[1] == b[1]
    assert a[2]["window_start_s"] != c[2]["window_start_s"]


def test_episode_ends_by_truncation_when_the_window_has_played():
    e = small_env(episode_s=5.0)
    e.reset(seed=0)
    for _ in range(1000):
        _, _, term, trunc, info = e.step(np.zeros(NUM_KNOBS, np.float32))
        assert not term
        if trunc:
            break
    assert trunc
    s = info["episode_summary"]
    # nothing lost: every request of the window is finished, rejected or aborted
    assert s["finished"] + sum(s["rejected_by_reason"].values()) == s["requests"]
    assert info["time_s"] >= 5.0 - e.interval_s


def test_options_fix_the_window_and_the_rate_scale():
    e = small_env()
    _, info = e.reset(seed=0, options={"start_s": 100.0, "rate_scale": 2.0})
    assert info["rate_scale"] == 2.0 and info["window_start_s"] == 100.0


def knobs_of(info) -> tuple:
    return tuple(info[name] for name in KNOB_NAMES)


def test_actions_map_to_knobs_by_the_shared_spec():
    e = small_env(max_step=2.0)  # no slew limit
    e.reset(seed=0)
    a = np.array([0.3, -0.2, 0.5, -0.4, 0.1], np.float32)
    _, _, _, _, info = e.step(a)
    assert knobs_of(info) == action_to_knobs(a).as_tuple()
    np.testing.assert_allclose(knobs_to_action(DEFAULT_KNOBS)[2], 2 * (0.9 - 0.4) / 0.55 - 1)


def test_actions_are_slew_limited_as_the_decider_limits_them():
    e = small_env(max_step=0.5)
    e.reset(seed=0)
    start = np.asarray(knobs_to_action(DEFAULT_KNOBS))  # (-1, 0.25, 0.82, 1, -0.2)
    _, _, _, _, info = e.step(np.array([1.0, -1.0, -1.0, -1.0, 1.0], np.float32))
    assert knobs_of(info) == action_to_knobs(
        start + np.array([0.5, -0.5, -0.5, -0.5, 0.5])).as_tuple()


def test_reward_counts_violations_and_prices_memory():
    # An overloaded window: violations make the served term negative; the memory term is
    # exactly -price * ratio.
    trace = poisson(40.0, 60.0, seed=1)
    e = ServingEnv(trace, split="all", episode_s=30.0, rate_scale_range=(4.0, 4.0),
                   memory_price=0.2)
    e.reset(seed=0)
    terms = []
    for _ in range(100):
        _, r, _, trunc, info = e.step(np.array([-1, 0, 1, 1, -0.2], np.float32))
        terms.append(info["reward_terms"])
        assert r == pytest.approx(sum(info["reward_terms"].values()))
        if trunc:
            break
    assert all(t["memory"] == pytest.approx(-0.2 * 0.95) for t in terms)
    assert min(t["served"] for t in terms) < 0


def test_render_ansi_shows_the_knobs_and_the_queue():
    e = small_env(render_mode="ansi")
    e.reset(seed=0)
    e.step(np.zeros(NUM_KNOBS, np.float32))
    text = e.render()
    assert "chunk" in text and "wait" in text and "SLO" in text


@pytest.mark.parametrize("kwargs,match", [
    ({"rate_scale_range": (0.0, 1.0)}, "rate_scale_range"),
    ({"episode_s": 0.1}, "episode_s > interval_s"),
    ({"executor": "gpu"}, "executor must be 'sim', 'torch' or 'vllm'"),
    ({"render_mode": "human"}, "render_mode must be None or 'ansi'"),
])
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        small_env(**kwargs)


def test_bad_reward_weight_is_refused():
    with pytest.raises(ValueError, match="reward weight memory_price must be a finite number"):
        small_env(memory_price=-1.0)


def test_torch_executor_episode_runs_real_forward_passes():
    pytest.importorskip("torch")
    from runtime.engine.engine import EngineConfig
    from runtime.engine.slo import SloTarget

    trace = poisson(20.0, 6.0, seed=2,
                    prompt=LogNormalLengths(mean=60, p99=200, max_tokens=400),
                    output=LogNormalLengths(mean=8, p99=30, max_tokens=60))
    config = EngineConfig(slo_classes={"interactive": SloTarget(ttft_s=2.0, tpot_s=0.5)},
                          max_model_len=512)
    e = ServingEnv(trace, split="all", executor="torch", episode_s=3.0, interval_s=0.5,
                   rate_scale_range=(1.0, 1.0), engine_config=config,
                   torch_executor={"shape": "tiny", "device": "cpu"})
    obs, _ = e.reset(seed=0)
    assert type(e.session.engine.executor).__name__ == "TorchExecutor"
    done, steps = False, 0
    while not done:
        obs, r, term, trunc, info = e.step(np.zeros(NUM_KNOBS, np.float32))
        assert np.all(np.isfinite(obs)) and np.isfinite(r)
        done = term or trunc
        steps += 1
    assert e.session.engine.num_iterations > 0
    # the model produced tokens (on a busy machine a forward pass can take long enough that no
    # request of the three seconds finishes: the clock is the forward passes' own)
    produced = sum(r.num_output_tokens for r in e.session.engine.requests)
    assert produced > 0, info["episode_summary"]


def test_reward_values_batch_work_and_the_co_tenants_served_share_by_their_weights():
    from env.session import RewardWeights, ServingSession
    from env.traces.trace import Trace
    from runtime.engine.cotenant import CoTenantDemand
    from runtime.engine.engine import EngineConfig
    from runtime.engine.executor import GIB
    from runtime.engine.profile import Profile

    # One batch request (10 + 1 tokens) done in the first 0.25-s interval; the co-tenant wants
    # 1000 GiB, more than any ratio leaves, so it gets what the engine lends, all the time.
    trace = Trace("one", np.array([0.0]), np.array([10]), np.array([1]), np.array(["batch"]))
    config = EngineConfig(cotenant=CoTenantDemand(gib=np.array([1000.0])))
    weights = RewardWeights(batch_weight=3.0, cotenant_value=0.5)
    session = ServingSession(trace, config=config, weights=weights)
    step = session.step(DEFAULT_KNOBS)
    m = Profile.load().memory
    lendable = (m.free_after_weights - m.kv_bytes(0.9)
                - m.activation_bytes(DEFAULT_KNOBS.prefill_chunk_tokens + config.max_num_seqs))
    assert step.stats.batch_met == 1 and session.requests_per_interval == 1.0
    assert step.reward_terms == pytest.approx({
        "served": 3.0, "memory": -0.05 * 0.9, "cotenant": 0.5 * lendable / GIB / 1000.0,
        "oom": 0.0})
    assert step.reward == pytest.approx(sum(step.reward_terms.values()))


def test_the_episode_digest_is_the_same_on_two_runs_and_changes_with_the_rate(capsys):
    """scripts/episode_digest.py, the check that a speed change left the episodes bit-identical,
    hashes the same episodes to the same line, and other episodes (another rate) to another."""
    from scripts.episode_digest import main as digest_main

    flags = ["--traces", "synthetic", "--episodes", "2", "--episode-s", "5"]
    outs = []
    for scale in ("2", "2", "1"):
        assert digest_main([*flags, "--rate-scale", scale]) == 0
        outs.append(capsys.readouterr().out.splitlines()[-1])
    assert outs[0] == outs[1] != outs[2]
