"""The slow-policy guard: a policy that answers, but slower than the embedded runtime's limit,
hands its decisions to the PID, is tried again later, and gets its place back when fast; client
decisions are never timed."""

from __future__ import annotations

import time

import pytest

from runtime.decider.breaker import CircuitBreaker
from runtime.decider.decision import FALLBACK_REASONS, POLICY_SLOW
from runtime.decider.guard import GuardedDecider
from runtime.decider.slow_guard import SlowPolicyGuard
from tests.conftest import observation

LIMIT_S = 0.002


def slowed(decider: GuardedDecider, seconds: dict[str, float]) -> None:
    """Make the decider's policy take ``seconds["act"]`` longer to decide (changeable); its
    calls are counted in ``seconds["calls"]``."""
    policy = decider.policy
    assert policy is not None
    act = policy.act
    seconds.setdefault("calls", 0)

    def slow_act(obs):
        seconds["calls"] += 1
        if seconds["act"]:
            time.sleep(seconds["act"])
        return act(obs)

    policy.act = slow_act  # type: ignore[method-assign]


def test_three_slow_decisions_in_a_row_hand_over_then_the_policy_is_tried_again(policy_path):
    d = GuardedDecider(policy_path, breaker=CircuitBreaker(trip_after=0),
                       decision_limit_s=LIMIT_S)
    guard = d.slow_guard
    assert guard is not None and POLICY_SLOW in FALLBACK_REASONS
    guard.retry_after = 4
    delay = {"act": 0.0}
    slowed(d, delay)
    obs = observation()
    assert d.decide(obs).source == "policy"
    delay["act"] = 4 * LIMIT_S
    # slow answers are still the policy's: the time is spent, the knobs are good
    assert [d.decide(obs).source for _ in range(2)] == ["policy", "policy"]
    assert not guard.handed_over
    third = d.decide(obs)
    assert third.source == "policy" and guard.handed_over and guard.num_handovers == 1
    # the PID decides without running the policy
    calls = delay["calls"]
    handed = [d.decide(obs) for _ in range(4)]
    assert delay["calls"] == calls
    assert {(x.source, x.reason) for x in handed} == {("pid", POLICY_SLOW)}
    # the retry is slow again: handed over at once
    assert d.decide(obs).source == "policy" and guard.handed_over
    assert guard.num_handovers == 2 and guard.slow_decisions == 4
    for _ in range(4):
        assert d.decide(obs).reason == POLICY_SLOW
    # fast again: the retry gives the policy its place back
    delay["act"] = 0.0
    assert [d.decide(obs).source for _ in range(5)] == ["policy"] * 5
    assert not guard.handed_over
    shown = d.describe()["slow_guard"]
    assert shown["num_handovers"] == 2 and shown["limit_s"] == LIMIT_S
    assert shown["slowest_s"] >= 4 * LIMIT_S


def test_one_slow_decision_alone_hands_nothing_over(policy_path):
    d = GuardedDecider(policy_path, breaker=CircuitBreaker(trip_after=0),
                       decision_limit_s=LIMIT_S)
    delay = {"act": 0.0}
    slowed(d, delay)
    obs = observation()
    for _ in range(3):
        delay["act"] = 4 * LIMIT_S
        assert d.decide(obs).source == "policy"
        delay["act"] = 0.0
        assert d.decide(obs).source == "policy"
    assert d.slow_guard is not None and d.slow_guard.num_handovers == 0
    assert d.slow_guard.slow_decisions == 3


def test_a_reload_gives_a_new_policy_its_place_at_once(policy_path, policy_dir):
    d = GuardedDecider(policy_path, breaker=CircuitBreaker(trip_after=0),
                       decision_limit_s=LIMIT_S)
    slowed(d, {"act": 4 * LIMIT_S})
    obs = observation()
    for _ in range(3):
        d.decide(obs)
    assert d.decide(obs).reason == POLICY_SLOW
    d.reload(policy_dir / "policy-v2.onnx")
    assert d.decide(obs).source == "policy" and d.policy.policy_version == "test-2"


def test_client_decisions_are_never_timed(policy_path):
    d = GuardedDecider(policy_path, breaker=CircuitBreaker(trip_after=0),
                       decision_limit_s=LIMIT_S)
    slowed(d, {"act": 4 * LIMIT_S})
    obs = observation()
    assert [d.decide(obs, client=True).source for _ in range(4)] == ["policy"] * 4
    assert d.slow_guard is not None and d.slow_guard.slow_decisions == 0


def test_without_a_limit_nothing_is_timed(policy_path):
    d = GuardedDecider(policy_path, breaker=CircuitBreaker(trip_after=0))
    assert d.slow_guard is None and d.describe()["slow_guard"] is None
    slowed(d, {"act": 4 * LIMIT_S})
    assert [d.decide(observation()).source for _ in range(4)] == ["policy"] * 4


@pytest.mark.parametrize("limit", [0.0, -1.0, float("inf"), float("nan")])
def test_a_limit_that_is_not_a_positive_time_is_refused(limit):
    with pytest.raises(ValueError, match="decision limit"):
        SlowPolicyGuard(limit)
