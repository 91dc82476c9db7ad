"""The circuit breaker: closed -> open -> half-open -> closed, with an injected clock."""

from __future__ import annotations

import pytest

from runtime.decider.breaker import CircuitBreaker
from runtime.decider.guard import GuardedDecider
from tests.conftest import observation


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(policy_path, clock, **kwargs) -> GuardedDecider:
    params = dict(target=0.9, trip_after=3, cooldown_s=30.0, close_after=2, clock=clock)
    params.update(kwargs)
    return GuardedDecider(policy_path, breaker=CircuitBreaker(**params))


def run(d: GuardedDecider, attainments: list[float]) -> list[tuple[str, str | None]]:
    return [(x.source, x.reason) for x in
            (d.decide(observation(slo_attainment=a)) for a in attainments)]


POLICY = ("policy", None)
OPEN = ("pid", "circuit open")


def test_trips_after_consecutive_low_readings_under_the_policy(policy_path):
    clock = FakeClock()
    d = make(policy_path, clock)
    # the first reading follows no policy decision; then two lows, a recovery, three lows
    assert run(d, [0.1, 0.5, 0.5, 0.95, 0.5, 0.5]) == [POLICY] * 6
    assert d.breaker.state == "closed"
    assert run(d, [0.5]) == [OPEN]
    assert d.breaker.state == "open" and d.breaker.num_trips == 1
    assert d.breaker.opened_at == 1000.0


def test_stays_open_for_the_cool_down_whatever_the_readings(policy_path):
    clock = FakeClock()
    d = make(policy_path, clock)
    run(d, [1.0, 0.1, 0.1, 0.1])
    clock.t += 29.9
    assert run(d, [1.0, 1.0, 0.0]) == [OPEN] * 3
    clock.t += 0.1
    assert run(d, [1.0]) == [POLICY]
    assert d.breaker.state == "half_open"


def test_half_open_closes_after_good_readings_under_the_policy(policy_path):
    clock = FakeClock()
    d = make(policy_path, clock)
    run(d, [1.0, 0.1, 0.1, 0.1])
    clock.t += 30.0
    # the first half-open reading describes the PID's interval: it neither closes nor reopens
    assert run(d, [0.2]) == [POLICY]
    assert run(d, [0.95, 0.99]) == [POLICY, POLICY]
    assert d.breaker.state == "closed"
    # closed again: it takes trip_after lows to reopen, not one
    assert run(d, [0.5, 0.5]) == [POLICY, POLICY]
    assert run(d, [0.5]) == [OPEN]
    assert d.breaker.num_trips == 2


def test_a_low_reading_in_half_open_reopens_and_restarts_the_cool_down(policy_path):
    clock = FakeClock()
    d = make(policy_path, clock)
    run(d, [1.0, 0.1, 0.1, 0.1])
    clock.t += 31.0
    assert run(d, [1.0, 0.95]) == [POLICY, POLICY]
    assert run(d, [0.3]) == [OPEN]
    assert d.breaker.state == "open" and d.breaker.opened_at == clock.t
    clock.t += 29.0
    assert run(d, [1.0]) == [OPEN]
    clock.t += 1.0
    assert run(d, [1.0]) == [POLICY]


def test_readings_after_a_guard_fallback_are_not_charged_to_the_policy(policy_path):
    clock = FakeClock()
    d = make(policy_path, clock)
    run(d, [1.0, 0.1, 0.1])
    bad = observation(slo_attainment=0.1)
    bad[0] = float("nan")
    assert d.decide(bad).reason == "non-finite input"
    # the next reading follows a PID decision: not counted, so the count is still 2
    assert run(d, [0.1]) == [POLICY]
    assert run(d, [0.1]) == [OPEN]


def test_trip_after_zero_disables_it(policy_path):
    d = make(policy_path, FakeClock(), trip_after=0)
    assert run(d, [0.0] * 20) == [POLICY] * 20
    assert d.breaker.describe()["enabled"] is False


def test_a_reload_closes_the_circuit(policy_path, policy_dir):
    clock = FakeClock()
    d = make(policy_path, clock)
    run(d, [1.0, 0.1, 0.1, 0.1])
    assert d.breaker.state == "open"
    d.reload(policy_dir / "policy-v2.onnx")
    assert d.breaker.state == "closed"
    assert run(d, [0.1]) == [POLICY]


@pytest.mark.parametrize("kwargs, message", [
    (dict(target=1.5), r"breaker target must lie in \[0, 1\], got 1.5"),
    (dict(trip_after=-1), r"breaker trip_after must be >= 0 \(0 disables it\), got -1"),
    (dict(cooldown_s=-2.0), r"breaker cooldown_s must be >= 0, got -2.0"),
    (dict(close_after=0), r"breaker close_after must be >= 1, got 0"),
])
def test_refuses_settings_out_of_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CircuitBreaker(**kwargs)
