"""The embedded serving loop: an engine driven by a decider in-process every interval."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.decider.breaker import CircuitBreaker
from runtime.decider.controller import StaticController
from runtime.decider.guard import GuardedDecider
from runtime.engine.engine import Engine
from runtime.engine.sim_executor import SimulatedExecutor
from runtime.knobs import DEFAULT_KNOBS, Knobs
from runtime.serving import WallClockPacer, serve


def poisson_engine(rate_rps: float = 20.0, duration_s: float = 12.0, seed: int = 0) -> Engine:
    rng = np.random.default_rng(seed)
    n = int(rate_rps * duration_s)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_rps, size=n))
    engine = Engine(SimulatedExecutor())
    engine.add_requests(arrivals, rng.integers(100, 2000, size=n), rng.integers(10, 300, size=n))
    return engine


def test_the_policy_sets_the_engine_knobs_every_interval(policy_path):
    engine = poisson_engine()
    decider = GuardedDecider(policy_path, breaker=CircuitBreaker(trip_after=0))
    records = serve(engine, decider, interval_s=1.0, until_s=10.0)
    assert len(records) == 10
    assert [r.source for r in records] == ["policy"] * 10
    assert {r.policy_version for r in records} == {"test-1"}
    assert engine.knobs == records[-1].knobs
    ends = [r.end_s for r in records]
    assert ends == sorted(ends) and all(e >= k + 1 for k, e in enumerate(ends))
    assert sum(r.arrival_rate_rps * r.duration_s for r in records) == pytest.approx(
        sum(1 for r in engine.requests if r.arrival_s <= engine.now), abs=1)
    assert all(r.decide_us > 0 for r in records)


def test_without_a_policy_the_pid_drives_the_engine(tmp_path):
    engine = poisson_engine(rate_rps=60.0)
    records = serve(engine, GuardedDecider(tmp_path / "none.onnx"), interval_s=0.5, until_s=5.0)
    assert len(records) == 10
    assert {(r.source, r.reason) for r in records} == {("pid", "model missing")}


def test_a_plain_controller_drives_it_too():
    engine = poisson_engine()
    knobs = Knobs(50.0, 1024, 0.8)
    records = serve(engine, StaticController(knobs), interval_s=2.0, until_s=8.0)
    assert [(r.source, r.knobs, r.reason) for r in records] == [("static", knobs, None)] * 4
    assert engine.knobs == knobs and records[0].set_knobs_s > 0  # the ratio changed: a resize


def test_the_loop_continues_from_where_the_engine_is():
    engine = poisson_engine()
    serve(engine, StaticController(), interval_s=1.0, until_s=3.0)
    records = serve(engine, StaticController(), interval_s=1.0, until_s=6.0)
    assert len(records) == 3 and records[0].end_s >= 4.0
    assert engine.knobs == DEFAULT_KNOBS


def test_the_wall_clock_pacer_waits_for_the_wall_clock_to_catch_up():
    now = [100.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    pacer = WallClockPacer(sleep=sleep, clock=lambda: now[0])
    pacer.wait_until(0.0)
    pacer.wait_until(1.5)
    now[0] += 3.0  # the engine fell behind the wall clock: no waiting
    pacer.wait_until(2.0)
    assert slept == [1.5]


def test_refuses_a_non_positive_interval():
    with pytest.raises(ValueError, match="interval_s must be > 0, got 0"):
        serve(poisson_engine(), StaticController(), interval_s=0, until_s=1.0)


def test_the_breaker_counts_its_cool_down_in_engine_seconds(policy_path):
    """The test policy is random weights: at 20 req/s its knobs lose the SLOs within seconds, the
    breaker hands control to the PID and offers it back after 5 engine seconds."""
    engine = poisson_engine(duration_s=30.0)
    breaker = CircuitBreaker(target=0.9, trip_after=2, cooldown_s=5.0, clock=lambda: engine.now)
    records = serve(engine, GuardedDecider(policy_path, breaker=breaker), 1.0, 25.0)
    sources = [r.source for r in records]
    assert "pid" in sources and breaker.num_trips >= 1
    first_open = sources.index("pid")
    back = sources.index("policy", first_open)
    assert all(r.reason == "circuit open" for r in records[first_open:back])
    assert records[back].end_s - records[first_open].end_s >= 5.0
