"""The one interval loop: an engine driven by a decider every interval, on the interval grid,
in simulated or wall-clock time."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.decider.breaker import CircuitBreaker
from runtime.decider.controller import StaticController
from runtime.decider.guard import GuardedDecider
from runtime.engine.engine import Engine
from runtime.engine.sim_executor import SimulatedExecutor
from runtime.knobs import DEFAULT_KNOBS, Knobs
from runtime.session import Session, replay
from runtime.wallclock import WallClockPacer


def poisson_requests(rate_rps: float = 20.0, duration_s: float = 12.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    n = int(rate_rps * duration_s)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_rps, size=n))
    return arrivals, rng.integers(100, 2000, size=n), rng.integers(10, 300, size=n)


def poisson_engine(rate_rps: float = 20.0, duration_s: float = 12.0, seed: int = 0,
                   executor=None) -> Engine:
    engine = Engine(executor if executor is not None else SimulatedExecutor())
    engine.add_requests(*poisson_requests(rate_rps, duration_s, seed))
    return engine


def serve(engine: Engine, decider, interval_s: float, until_s: float, **kw) -> list:
    records: list = []
    Session(engine, interval_s=interval_s, **kw).run(decider, until_s=until_s,
                                                     on_interval=records.append)
    return records


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


def test_intervals_end_on_the_grid_without_drifting():
    """An iteration is never cut, so an interval ends a little after its grid point; the next
    one still ends at the next grid point, not one interval after the last end."""
    engine = poisson_engine(rate_rps=60.0)
    records = serve(engine, StaticController(), interval_s=0.25, until_s=10.0)
    assert len(records) == 40
    late = [r.end_s - 0.25 * (k + 1) for k, r in enumerate(records)]
    assert max(late) > 0  # some intervals did end past their grid point
    assert all(0 <= x < 0.25 for x in late)  # and none drifted to the next one


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


def test_a_long_serving_session_keeps_a_bounded_history():
    engine = poisson_engine(duration_s=30.0)
    session = Session(engine, interval_s=0.25, history=16)
    seen: list = []
    assert session.run(StaticController(), until_s=30.0, on_interval=seen.append) == 120
    assert len(session.records) == 16 and list(session.records) == seen[-16:]
    assert session.num_decisions == 120 and session.sources == {"static": 120}


def test_the_wall_clock_pacer_holds_a_fast_engine_until_the_wall_clock_catches_up():
    """A simulated executor runs far ahead of the wall clock; the pacer sleeps so that each
    decision happens when the wall clock reaches the engine's time."""
    now = [100.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    engine = poisson_engine(duration_s=3.0)
    pacer = WallClockPacer(sleep=sleep, clock=lambda: now[0])
    records = serve(engine, StaticController(), interval_s=0.5, until_s=2.0, pacer=pacer)
    assert len(records) == 4
    assert now[0] - 100.0 == pytest.approx(engine.now)
    assert sum(slept) == pytest.approx(engine.now) and len(slept) > 4


def test_the_wall_clock_executor_keeps_a_bounded_record_of_its_lags():
    lags: list[float] = []
    pacer = WallClockPacer(lag_window=8, on_lag=lags.append)
    arrivals = np.linspace(0.0, 0.2, 12)
    res = replay(SimulatedExecutor(), arrivals, [300] * 12, [6] * 12, interval_s=0.25,
                 pacer=pacer)
    wrapped = pacer.wrapped
    s = res.summary
    assert s.finished == s.requests == len(arrivals)
    assert wrapped.num_calls == len(lags) == s.iterations + s.ooms > 8
    assert list(wrapped.recent_lags) == lags[-8:]
    assert res.lag["lag_calls"] == len(lags)
    assert res.lag["lag_max_s"] == max(lags) and all(x >= 0 for x in lags)
    assert res.realtime and s.sim_seconds <= res.wall_s + 1e-3


def test_a_fixed_knob_replay_runs_straight_through_and_matches_the_interval_loop():
    reqs = poisson_requests(rate_rps=40.0, duration_s=20.0)
    straight = replay(SimulatedExecutor(), *reqs)
    looped = replay(SimulatedExecutor(), *reqs, decider=StaticController(), history=10)
    assert straight.decisions == 0 and looped.decisions > 80
    for key in ("requests", "finished", "met", "preemptions", "ooms", "iterations"):
        assert getattr(straight.summary, key) == getattr(looped.summary, key), key
    assert straight.summary.ttft_p99_s == pytest.approx(looped.summary.ttft_p99_s)


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


def test_batch_work_held_back_by_a_zero_share_is_decided_on_every_interval_then_aborted():
    # Nothing else will arrive, nothing runs, a batch request waits behind batch_share 0: the
    # loop may not jump the idle gap to an arrival that never comes (it overflowed), and a
    # decider that could open the tap is asked every interval until max_s, then the rest aborts.
    from runtime.engine.engine import EngineConfig

    res = replay(SimulatedExecutor(), [0.0], [100], [10], ["batch"],
                 config=EngineConfig(batch_share=0.0), interval_s=0.5, max_s=3.0,
                 on_interval=lambda r: None)
    assert res.decisions == 6
    assert res.summary.rejected_by_reason == {"aborted": 1}
    assert res.summary.batch_met == 0
