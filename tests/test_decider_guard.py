"""The guard: every fallback path, the slew and range clamps, batches; decide never raises."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from runtime.decider.breaker import CircuitBreaker
from runtime.decider.guard import GuardedDecider, slew_limit
from runtime.decider.onnx_policy import OnnxPolicy
from runtime.decider.pid import PidController
from runtime.knobs import DEFAULT_KNOBS, NUM_KNOBS, Knobs, action_to_knobs, knobs_to_action
from runtime.observation import OBS_DIM, OBSERVATION_INDEX, SPEC_VERSION
from tests.conftest import observation
from tests.policy_factory import export_policy_bytes, make_mlp

NO_BREAKER = CircuitBreaker(trip_after=0)


def constant_policy(action: tuple[float, ...], **kwargs) -> OnnxPolicy:
    """A policy whose action is ``action`` whatever it observes."""
    mlp = make_mlp()
    with torch.no_grad():
        mlp[-1].weight.zero_()
        mlp[-1].bias.copy_(torch.tensor(action))
    return OnnxPolicy(export_policy_bytes(mlp, policy_version="const", **kwargs))


def decider(policy=None, **kwargs) -> GuardedDecider:
    kwargs.setdefault("breaker", CircuitBreaker(trip_after=0))
    return GuardedDecider(policy, **kwargs)


def test_a_trusted_policy_decides_and_says_so(policy_path):
    obs = observation()
    d = decider(policy_path, max_step=2.0).decide(obs)
    assert d.source == "policy" and d.reason is None
    assert d.policy_version == "test-1" and d.spec_version == SPEC_VERSION
    assert d.knobs == action_to_knobs(OnnxPolicy.load(policy_path).act(obs))


@pytest.mark.parametrize("make, reason", [
    (lambda tmp: None, "model missing"),
    (lambda tmp: tmp / "absent.onnx", "model missing"),
    (lambda tmp: _write(tmp, b"not onnx at all"), "model corrupt"),
    (lambda tmp: _write(tmp, export_policy_bytes(spec_version="batchpilot-spec/9+x")),
     "spec mismatch"),
    (lambda tmp: _write(tmp, export_policy_bytes(make_mlp(obs_dim=OBS_DIM - 1),
                                                 obs_dim=OBS_DIM - 1)), "bad model signature"),
])
def test_without_a_usable_model_the_pid_decides_and_names_the_reason(tmp_path, make, reason):
    d = decider(make(tmp_path), max_step=2.0)
    obs = observation()
    decision = d.decide(obs)
    assert decision.source == "pid" and decision.reason == reason
    assert decision.policy_version is None
    assert decision.knobs == PidController().decide(obs).knobs
    assert d.missing_reason == reason


def _write(tmp, data: bytes):
    path = tmp / "policy.onnx"
    path.write_bytes(data)
    return path


def test_a_non_finite_field_the_pid_does_not_read_leaves_the_pid_in_charge(policy_path):
    obs = observation()
    obs[OBSERVATION_INDEX["arrival_rate_rps"]] = np.nan
    d = decider(policy_path, max_step=2.0).decide(obs)
    assert (d.source, d.reason, d.policy_version) == ("pid", "non-finite input", "test-1")
    assert d.knobs == PidController().decide(obs).knobs


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_a_non_finite_field_the_pid_reads_moves_the_knobs_toward_the_static_ones(policy_path,
                                                                                   value):
    current = Knobs(100.0, 8192, 0.5)
    obs = observation(current)
    obs[OBSERVATION_INDEX["kv_utilization"]] = value
    d = decider(policy_path, max_step=0.25).decide(obs)
    if np.isinf(value):  # the PID clips an infinite KV error to the range: it can still decide
        assert (d.source, d.reason) == ("pid", "non-finite input")
        return
    assert (d.source, d.reason) == ("static", "non-finite input; pid failed")
    cur = np.asarray(knobs_to_action(current))
    expected = slew_limit(np.asarray(knobs_to_action(DEFAULT_KNOBS)),
                          obs[-NUM_KNOBS:].astype(float), 0.25)
    assert d.knobs == action_to_knobs(expected)
    assert d.knobs != DEFAULT_KNOBS and np.all(np.abs(expected - cur) <= 0.25 + 1e-6)


def test_non_finite_current_knobs_fall_back_to_the_static_knobs_as_they_are(policy_path):
    obs = observation()
    obs[-2] = np.nan
    d = decider(policy_path).decide(obs)
    assert (d.source, d.reason) == ("static", "non-finite input; pid failed")
    assert d.knobs == DEFAULT_KNOBS


@pytest.mark.parametrize("obs", [np.zeros(OBS_DIM + 1, np.float32), np.zeros((1, OBS_DIM)),
                                 [], None, "twenty numbers", [[1, 2], [3]],
                                 np.array(["x"] * OBS_DIM), np.ones(OBS_DIM, dtype=bool)])
def test_an_observation_of_another_shape_gets_the_static_knobs(policy_path, obs):
    d = decider(policy_path).decide(obs)
    assert (d.source, d.reason, d.knobs) == ("static", "bad input shape; pid failed",
                                             DEFAULT_KNOBS)


def test_a_list_of_numbers_is_an_observation_too(policy_path):
    obs = observation()
    assert decider(policy_path).decide(obs.tolist()) == decider(policy_path).decide(obs)


def test_an_unexpected_exception_still_gets_an_answer(policy_path, monkeypatch):
    d = decider(policy_path)
    monkeypatch.setattr(d, "_decide", lambda obs, feed_breaker: 1 / 0)
    decision = d.decide(observation())
    assert (decision.source, decision.reason) == ("static", "policy error; pid failed")
    assert "ZeroDivisionError" in d.last_error


def test_a_policy_that_answers_nan_hands_that_decision_to_the_pid():
    # NaN only past the spec's ranges (the load check draws within them), which the guard
    # still meets: a vector from a caller that did not clip its fields
    policy = OnnxPolicy(export_policy_bytes(nan_above=1.5, policy_version="nan"))
    d = decider(policy, max_step=2.0)
    calm = observation(arrival_rate_rps=1.0)  # first entry ~0.08: the model answers
    hot = observation(arrival_rate_rps=4000.0)
    hot[0] = 2.0  # > 1.5: NaN
    assert d.decide(calm).source == "policy"
    decision = d.decide(hot)
    assert (decision.source, decision.reason, decision.policy_version) == (
        "pid", "non-finite output", "nan")
    assert decision.knobs == PidController().decide(hot).knobs


def test_an_exception_in_the_policy_hands_the_decision_to_the_pid(policy_path, monkeypatch):
    d = decider(policy_path, max_step=2.0)

    def boom(obs):
        raise RuntimeError("onnxruntime exploded at node 7")

    monkeypatch.setattr(d.policy, "act", boom)
    decision = d.decide(observation())
    assert (decision.source, decision.reason) == ("pid", "policy error")
    assert "RuntimeError: onnxruntime exploded at node 7" in d.last_error


def test_when_the_pid_raises_too_the_static_knobs_decide(policy_path, monkeypatch):
    d = decider(policy_path)
    monkeypatch.setattr(d.policy, "act", lambda obs: 1 / 0)
    monkeypatch.setattr(d.pid, "action", lambda obs: [][1])
    decision = d.decide(observation())
    assert (decision.source, decision.reason) == ("static", "policy error; pid failed")
    assert "pid: IndexError" in d.last_error


F09 = float(np.float32(0.9))  # what a float32 model answers for 0.9


def test_the_slew_rate_limits_each_knob_change_around_the_observed_knobs():
    policy = constant_policy((0.9, -0.9, 0.9, -0.9, 0.9))
    current = action_to_knobs((-0.8, 0.8, -0.8, 0.8, -0.8))
    obs = observation(current)
    d = decider(policy, max_step=0.5).decide(obs)
    c = obs[-NUM_KNOBS:].astype(float)
    assert d.source == "policy"
    assert d.knobs == action_to_knobs(c + [0.5, -0.5, 0.5, -0.5, 0.5])


def test_the_range_clamp_applies_after_the_slew():
    policy = constant_policy((0.9, -0.9, 0.9, -0.9, 0.9))
    obs = observation(action_to_knobs((0.8, -0.8, 0.8, -0.8, 0.8)))
    d = decider(policy, max_step=2.0).decide(obs)
    assert d.knobs == action_to_knobs((F09, -F09, F09, -F09, F09))
    assert slew_limit(np.array([3.0, -3.0, 0.0]), np.array([0.9, -0.9, 0.0]), 0.5).tolist() == [
        1.0, -1.0, 0.0]


def test_the_pid_is_slew_limited_too(tmp_path):
    obs = observation(ttft_p99_ratio=50.0, ttft_p99_ratio_prev=0.01, kv_utilization=1.0,
                      kv_utilization_prev=0.0, preemptions=30.0)
    unlimited = PidController().action(obs)
    c = obs[-NUM_KNOBS:].astype(float)
    assert max(abs(u - x) for u, x in zip(unlimited, c)) > 0.1
    d = decider(None, max_step=0.1).decide(obs)
    assert d.source == "pid"
    assert d.knobs == action_to_knobs(slew_limit(np.asarray(unlimited), c, 0.1))


def test_decide_batch_matches_decide_row_by_row(policy_path):
    rows = [observation(Knobs(20.0, 512, 0.6)), observation(arrival_rate_rps=900.0),
            observation(), observation(Knobs(150.0, 16384, 0.95), slo_attainment=0.2)]
    rows[2][3] = np.nan
    batch = np.stack(rows)
    one = decider(policy_path)
    many = decider(policy_path)
    assert many.decide_batch(batch) == [one.decide(r) for r in rows]
    assert [d.source for d in many.decide_batch(batch)] == ["policy", "policy", "pid", "policy"]


def test_decide_batch_without_a_policy_and_with_a_failing_one(policy_path, monkeypatch):
    rows = np.stack([observation(), observation(Knobs(50.0, 1024, 0.8))])
    assert [d.source for d in decider(None).decide_batch(rows)] == ["pid", "pid"]
    d = decider(policy_path)
    monkeypatch.setattr(d.policy, "act_batch", lambda x: 1 / 0)
    out = d.decide_batch(rows)
    assert [(x.source, x.reason) for x in out] == [("pid", "policy error")] * 2
    assert d.decide_batch(np.zeros((0, OBS_DIM))) == []
    with pytest.raises(ValueError, match=rf"observations has shape \[n, {OBS_DIM}\], got \[3, 4\]"):
        d.decide_batch(np.zeros((3, 4)))


def test_the_guard_refuses_a_slew_rate_that_is_not_positive():
    with pytest.raises(ValueError, match="max_step must be > 0 action units per decision, got 0"):
        GuardedDecider(None, max_step=0)


def test_describe_says_what_is_loaded_and_why_not(policy_path, tmp_path):
    info = decider(policy_path).describe()
    assert info["loaded"] and info["policy"]["policy_version"] == "test-1"
    info = decider(tmp_path / "nope.onnx").describe()
    assert not info["loaded"] and info["missing_reason"] == "model missing"
    assert "no policy file at" in info["last_error"]
    assert math.isfinite(info["max_step"])


def test_the_scalar_and_batch_slew_limits_and_knob_mappings_agree():
    """The decider limits one decision with unrolled floats and a REST batch with numpy: the
    two must give the same knobs for the same actions."""
    from runtime.decider.guard import slew_limit, slew_limit_one
    from runtime.knobs import action_to_knobs, actions_to_knobs

    rng = np.random.default_rng(7)
    actions = rng.uniform(-1.6, 1.6, (500, NUM_KNOBS))
    current = rng.uniform(-1.0, 1.0, (500, NUM_KNOBS))
    batch = slew_limit(actions, current, 0.5)
    one = np.array([slew_limit_one(a, c, 0.5) for a, c in zip(actions, current)])
    assert np.array_equal(batch, one)
    assert np.abs(one - current).max() <= 0.5 + 1e-12 and np.abs(one).max() <= 1.0
    assert actions_to_knobs(batch) == [action_to_knobs(a) for a in one]


def test_a_spec2_policy_decides_the_first_three_knobs_and_the_static_knobs_the_rest():
    # the spec-2 fixture (20 inputs, 3 outputs) through its adapter: its decision is the one it
    # made under spec 2, on the vector spec 2 built, with the two new knobs the static ones
    from tests.conftest import FIXTURES
    from tests.policy_factory import SPEC2, make_spec2_mlp

    static = Knobs(5.0, 2048, 0.9, batch_share=0.4, admission_slack=0.5)
    d = decider(FIXTURES / "policy-spec2.onnx", max_step=2.0, static_knobs=static)
    assert d.policy.spec_version == SPEC2.version and d.policy.num_actions == 3
    rows = np.stack([observation(), observation(Knobs(50.0, 1024, 0.6, 0.1, 4.0),
                                                arrival_rate_rps=900.0, batch_running_requests=30)])
    with torch.no_grad():
        spec2 = torch.clamp(make_spec2_mlp(seed=0)(torch.as_tensor(rows[:, SPEC2.index])), -1, 1)
    for row, a in zip(rows, spec2.numpy()):
        got = d.decide(row)
        assert got.source == "policy"
        want = action_to_knobs([*a.tolist(), *knobs_to_action(static)[3:]])
        assert got.knobs.as_tuple()[3:] == (0.4, 0.5)
        assert got.knobs.as_tuple()[:3] == pytest.approx(want.as_tuple()[:3], rel=1e-5)
    assert d.decide_batch(rows) == [d.decide(r) for r in rows]
