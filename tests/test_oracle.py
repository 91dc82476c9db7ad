"""The engine fork and the lookahead oracle, on hand-worked workloads.

The hand profile (``tests/engine_factory.py``): an iteration costs 10 ms + 1 ms per prefill
token, decodes are free beyond the constant; the interactive class has TTFT 1 s, TPOT 50 ms.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from agents import oracle_label
from agents.arena import is_upper_bound, run_episode
from agents.oracle import (
    CAUSAL_NAME,
    FORECAST_NAME,
    LookaheadOracle,
    OracleConfig,
    Setting,
    length_forecast,
    parse_candidates,
    score_setting,
    search,
)
from agents.registry import ORACLE, EvalSpec, make_controller
from agents.report import short_name
from env.traces.trace import Trace
from runtime.decider.controller import StaticController
from runtime.engine.engine import Engine
from runtime.engine.request import RejectReason, Request, Status, slot_copier
from runtime.engine.state import FINISH
from runtime.knobs import KNOB_NAMES, NUM_KNOBS, Knobs, knobs_to_action
from runtime.observation import OBS_DIM
from tests.engine_factory import hand_profile, make_engine, random_workload


@pytest.fixture(autouse=True)
def fixed_settings(monkeypatch):
    """The searches' anchors as a fixed setting: the tests that name an oracle by its registry
    name check what it builds, and best static's and hindsight static's capacity searches on the
    synthetic trace's full grid (tens of minutes, not cached for the default engine config) are
    not what they test (tests/test_capacity_search.py is)."""
    from agents import registry
    from agents.controllers.best_static import BestStatic

    setting = BestStatic(Knobs(5.0, 2048, 0.9), "fcfs")
    monkeypatch.setattr(registry, "best_static", lambda spec, target=0.99: setting)
    monkeypatch.setattr(registry, "hindsight_static", lambda spec, target=0.99: setting)


def _busy_engine(seed: int = 0, until: float = 3.0) -> Engine:
    e = make_engine(hand_profile(blocks_at_half=60, prefill_token_s=1e-4,
                                 decode_ctx_token_s=1e-6), chunk=256)
    e.add_requests(*random_workload(seed, 400, rate=40))
    t = 0.0
    while t < until:  # decision intervals, as a session runs them
        t += 0.25
        e.run_until(t)
        e.collect_interval()
    return e


def _outcomes(engine: Engine, ids: set[int]) -> dict[int, tuple]:
    return {r.req_id: (r.status, r.first_token_s, r.finish_s, r.num_preemptions)
            for r in engine.requests if r.req_id in ids}


def test_a_fork_runs_exactly_as_the_original_would():
    e = _busy_engine()
    assert e.waiting and e.running  # a state worth copying: queue, running batch, used blocks
    f = e.fork(5.0)
    f.check_invariants()
    end = e.now + 5.0
    for x in (e, f):
        x.run_until(end)
    ids = {r.req_id for r in f.requests}
    assert _outcomes(f, ids) == _outcomes(e, ids)
    assert (f.num_iterations, f.num_preemptions, f.now) == (e.num_iterations, e.num_preemptions,
                                                            e.now)
    f.check_invariants()


def test_running_a_fork_with_other_knobs_leaves_the_original_untouched():
    reference, e = _busy_engine(), _busy_engine()
    f = e.fork(10.0)
    f.set_knobs(Knobs(200.0, 64, 0.4))  # shrinks the pool, preempts, holds arrivals
    f.run_until(e.now + 10.0)
    for x in (reference, e):
        x.run_to_completion()
    ids = {r.req_id for r in reference.requests}
    assert _outcomes(e, ids) == _outcomes(reference, ids)
    assert e.summary() == reference.summary()


def test_a_fork_copies_the_requests_in_flight_and_the_arrivals_within_its_horizon_only():
    e = make_engine()
    e.add_requests([0.0, 0.5, 2.0, 3.0, 9.0], [100] * 5, [50] * 5)
    e.run_until(1.0)  # request 0 has finished (0.155 s), request 1 is decoding
    assert [r.status for r in e.requests[:2]] == [Status.FINISHED, Status.RUNNING]
    f = e.fork(2.5)
    assert [r.req_id for r in f.requests] == [1, 2, 3]
    assert all(a is not b for a in f.requests for b in e.requests)
    assert f.requests[0].block_ids == e.requests[1].block_ids
    assert f.requests[0].block_ids is not e.requests[1].block_ids


def test_an_engine_on_an_executor_without_fork_cannot_be_forked():
    e = make_engine()
    e.executor = object.__new__(type("DeviceExecutor", (), {}))
    with pytest.raises(TypeError, match="DeviceExecutor cannot be forked: only an executor "
                                        "with a fork"):
        e.fork(1.0)


def test_score_is_met_minus_violations_over_the_horizon_by_hand():
    # One 900-token prompt with two output tokens. Chunk 2048: it waits the 5 ms window, then one
    # prefill of 910 ms -> TTFT 0.915 s, met. Chunk 64: 900 tokens fill a chunk (no window),
    # 15 chunks cost 150 + 900 ms -> TTFT 1.05 s, a violation.
    e = make_engine()
    e.add_requests([0.0], [900], [2])
    assert score_setting(e, Setting(Knobs(5.0, 2048, 0.5)), 3.0) == 1.0
    assert score_setting(e, Setting(Knobs(5.0, 64, 0.5)), 3.0) == -1.0
    assert score_setting(e, Setting(Knobs(5.0, 64, 0.5)), 3.0, violation_weight=2.5) == -2.5
    assert e.now == 0.0 and e.requests[0].status == Status.PENDING  # the original did not move
    found = search(e, parse_candidates("window=5;chunk=64,2048;ratio=0.5"), 3.0)
    assert found.scores == (-1.0, 1.0)
    assert found.best.knobs == Knobs(5.0, 2048, 0.5)


def test_ties_keep_the_current_setting_then_the_earliest_candidate():
    e = make_engine()  # nothing to serve: every candidate scores 0
    candidates = parse_candidates("chunk=256,512,1024;ratio=0.5")
    assert search(e, candidates, 1.0).best == candidates[0]
    assert search(e, candidates, 1.0, current=candidates[2]).best == candidates[2]


def test_a_lever_beyond_the_knobs_is_searched_like_a_knob():
    # Two 600-token prompts at 0. Eight slots: both prefill in one 1.21 s iteration, both miss.
    # One slot: the first is served in 0.615 s (met), the second starts at 0.625 s and misses.
    e = make_engine()
    e.add_requests([0.0, 0.0], [600, 600], [2, 2])
    candidates = parse_candidates("chunk=2048;ratio=0.5;max_num_seqs=1,8")
    assert [c.levers for c in candidates] == [(("max_num_seqs", 1.0),), (("max_num_seqs", 8.0),)]
    found = search(e, candidates, 3.0)
    assert found.scores == (0.0, -2.0)
    assert e.config.max_num_seqs == 256  # the fork's config was replaced, the original's kept


def test_candidate_grids_are_every_combination_and_bad_ones_are_refused():
    grid = parse_candidates("window=5,20;chunk=512,1024,2048;ratio=0.9")
    assert len(grid) == 6
    assert grid[1].label() == "window=5 chunk=1024 ratio=0.9"
    with pytest.raises(ValueError, match="unknown key 'warp_factor'"):
        parse_candidates("chunk=512;warp_factor=0.5")
    with pytest.raises(ValueError, match="max_num_seqs=0 is outside its range"):
        parse_candidates("max_num_seqs=0,8")
    with pytest.raises(ValueError, match="prefill_chunk_tokens=100 is not a multiple"):
        parse_candidates("chunk=100")
    with pytest.raises(ValueError, match="OracleConfig.horizon_s must be a positive"):
        OracleConfig(horizon_s=0.0)


def test_the_oracle_searches_once_a_period_and_keeps_its_choice_in_between():
    e = _busy_engine(until=0.0)
    oracle = LookaheadOracle(OracleConfig(period_s=1.0, horizon_s=2.0,
                                          candidates="chunk=64,256,1024;ratio=0.5"),
                             anchor=Knobs(5.0, 2048, 0.5), interval_s=0.25)
    assert [c.knobs.prefill_chunk_tokens for c in oracle.candidates] == [2048, 64, 256, 1024]
    oracle.bind(e)
    chosen = []
    for _ in range(8):
        knobs = oracle.decide(None).knobs
        chosen.append(knobs)
        e.set_knobs(knobs)
        e.run_until(e.now + 0.25)
        e.collect_interval()
    assert oracle.searches == 2
    assert chosen[:4] == [chosen[0]] * 4 and chosen[4:] == [chosen[4]] * 4
    with pytest.raises(RuntimeError, match="bind"):
        LookaheadOracle().decide(None)


def test_a_request_that_outgrows_a_shrunk_pool_is_rejected_instead_of_stalling_the_engine():
    # 640 + 800 tokens need 90 blocks: admitted with 100 (ratio 0.5). Shrunk to 80 blocks while
    # it holds 41, it preempts itself when its decode needs block 81; readmission then finds it
    # larger than the pool. (The engine used to raise "engine stalled" there: the oracle's forks
    # try ratios below the running requests' eventual size.)
    e = make_engine()
    e.add_requests([0.0], [640], [800])
    e.run_until(1.0)
    e.set_knobs(Knobs(5.0, 2048, 0.4))
    assert e.pool.num_blocks == 80
    e.run_to_completion()
    (r,) = e.requests
    assert (r.status, r.reject_reason, r.num_preemptions) == (
        Status.REJECTED, RejectReason.EXCEEDS_KV_CAPACITY, 1)
    e.check_invariants()


def test_a_cloned_request_has_every_slot_of_the_original_and_its_own_block_table():
    e = _busy_engine()
    for r in (*e.running[:3], *list(e.waiting)[:3]):
        c = r.clone()
        assert {s: getattr(c, s) for s in type(r).__slots__} == {
            s: getattr(r, s) for s in type(r).__slots__}
        assert c.block_ids is not r.block_ids


def test_a_cloned_request_carries_every_slot_whatever_its_value():
    r = Request(7, 1.0, 100, 50, "interactive", 1.0, 0.05)
    values = {s: object() for s in Request.__slots__}  # a value no other slot holds
    values["block_ids"] = [3, 1, 4]
    for s, v in values.items():
        setattr(r, s, v)
    c = r.clone()
    assert type(c) is Request
    assert [s for s in Request.__slots__ if getattr(c, s) is not values[s]] == ["block_ids"]
    assert c.block_ids == [3, 1, 4] and c.block_ids is not r.block_ids


def test_theslot_copier_copies_each_slot_it_is_given_and_refuses_an_unknown_list():
    class Two:
        __slots__ = ("a", "ids", "b")
        clone = slot_copier(__slots__, own=("ids",))

    x = Two()
    x.a, x.ids, x.b = "a", [1], ("b",)
    y = x.clone()
    assert (type(y), y.a, y.ids, y.b) == (Two, "a", [1], ("b",))
    assert y.a is x.a and y.b is x.b and y.ids is not x.ids
    with pytest.raises(ValueError, match=r"own names \['blocks'\], which are not slots of "
                                         r"\('a', 'ids'\)"):
        slot_copier(("a", "ids"), own=("blocks",))


def test_the_labeller_writes_an_observation_and_the_oracle_setting_for_every_interval(tmp_path):
    out = tmp_path / "labels.npz"
    assert oracle_label.main(["--trace", "synthetic", "--windows", "2", "--window-s", "3",
                              "--rate-scales", "1", "2", "--horizon-s", "2", "--candidates",
                              "chunk=256,4096;ratio=0.9,0.95", "--no-anchor", "--out", str(out),
                              "--no-progress"]) == 0
    d = np.load(out)
    n = len(d["observations"])
    for w in (0, 1):  # a label per interval, from the first observation to the last arrival
        t = d["t_s"][d["window"] == w]
        assert len(t) >= 2 and t[0] == pytest.approx(0.25, abs=0.05)
        assert np.all((np.diff(t) > 0.2) & (np.diff(t) < 0.3))
    assert d["observations"].shape == (n, OBS_DIM) and d["observations"].dtype == np.float32
    assert list(d["setting_names"]) == list(KNOB_NAMES)
    assert list(d["candidates"]) == [
        "window=5 chunk=256 ratio=0.9", "window=5 chunk=256 ratio=0.95",
        "window=5 chunk=4096 ratio=0.9", "window=5 chunk=4096 ratio=0.95"]
    assert d["scores"].shape == (n, 4)
    grid = {(5.0, c, r, 1.0, 1.0) for c in (256.0, 4096.0) for r in (0.9, 0.95)}
    rows = {tuple(round(float(v), 6) for v in row) for row in d["settings"]}
    assert rows <= {tuple(round(v, 6) for v in g) for g in grid}
    assert d["actions"].shape == (n, NUM_KNOBS)
    for row, action, scores in zip(d["settings"], d["actions"], d["scores"]):
        knobs = Knobs(float(row[0]), int(row[1]), float(row[2]), float(row[3]), float(row[4]))
        assert np.allclose(action, knobs_to_action(knobs), atol=1e-6)
        assert scores.max() == scores[list(d["candidates"]).index(
            f"window=5 chunk={knobs.prefill_chunk_tokens} ratio={knobs.kv_cache_ratio:g}")]
    assert set(d["rate_scale"]) <= {1.0, 2.0}
    assert json.loads(str(d["config"]))["horizon_s"] == 2.0


def test_in_the_arena_the_oracle_leaves_its_anchor_when_another_setting_meets_more():
    # Five 900-token prompts, 2 s apart: at chunk 64 each first token comes at 1.05 s (a miss),
    # at chunk 2048 at 0.915 s (met); see the hand-worked score test above.
    n = 5
    window = Trace("hand", np.arange(1.0, 1.0 + 2 * n, 2.0), np.full(n, 900), np.full(n, 2),
                   np.full(n, "interactive"))
    anchor = Knobs(5.0, 64, 0.5)
    oracle = make_controller(ORACLE, EvalSpec("synthetic", "eval", None, 0.25))
    assert isinstance(oracle, LookaheadOracle) and short_name(ORACLE) == "oracle (upper bound)"
    oracle = LookaheadOracle(OracleConfig(horizon_s=3.0, candidates="chunk=64,2048;ratio=0.5",
                                          rollout=False), anchor=anchor)
    profile = hand_profile()
    static = run_episode(window, StaticController(anchor), interval_s=0.25, profile=profile)
    ahead = run_episode(window, oracle, interval_s=0.25, profile=profile)
    # the first request is served under the start-up knobs (chunk 2048) before the first decision
    assert static.summary["met"] == 1 and ahead.summary["met"] == n
    assert ahead.summary["finished"] == n and oracle.searches == ahead.decisions // 4 + 1


def test_a_rollout_holds_the_candidate_one_period_then_runs_the_tail_setting():
    # The 900-token prompt arrives at 0.5 s: a chunk-64 candidate held for the first 0.25 s
    # never touches it, so with a chunk-2048 tail it is met; held the whole horizon, it misses.
    e = make_engine()
    e.add_requests([0.5], [900], [2])
    small, large = Setting(Knobs(5.0, 64, 0.5)), Setting(Knobs(5.0, 2048, 0.5))
    assert score_setting(e, small, 4.0) == -1.0
    assert score_setting(e, small, 4.0, hold_s=0.25, tail=large) == 1.0
    assert score_setting(e, large, 4.0, hold_s=0.25, tail=small) == -1.0


def _mixed_engine(**config) -> Engine:
    e = make_engine(hand_profile(blocks_at_half=60, prefill_token_s=1e-4,
                                 decode_ctx_token_s=1e-6), chunk=256, **config)
    arrivals, prompts, outputs = random_workload(3, 400, rate=40)
    classes = ["batch" if i % 3 == 0 else "interactive" for i in range(len(arrivals))]
    e.add_requests(arrivals, prompts, outputs, classes)
    return e


def test_a_fork_of_an_engine_with_every_lever_runs_exactly_as_the_original_would():
    e = _mixed_engine(admission="shed", admission_slack=0.8, batch_share=0.5)
    t = 0.0
    while t < 3.0:
        t += 0.25
        e.run_until(t)
        e.collect_interval()
    f = e.fork(5.0)
    for x in (e, f):
        x.run_until(t + 5.0)
    ids = {r.req_id for r in f.requests}
    # times agree to rounding: the original's heap keeps stale deadlines of finished requests,
    # which split its closed-form decode stretches at other points than the fork's
    got, want = _outcomes(f, ids), _outcomes(e, ids)
    assert {i: (o[0], o[3]) for i, o in got.items()} == {i: (o[0], o[3]) for i, o in want.items()}
    for i in ids:
        for a, b in zip(got[i][1:3], want[i][1:3]):
            assert (a is None and b is None) or a == pytest.approx(b, rel=1e-12)
    iv_e, iv_f = e.collect_interval(), f.collect_interval()
    assert (iv_f.shed, iv_f.batch_met, iv_f.met, iv_f.violations) == (
        iv_e.shed, iv_e.batch_met, iv_e.met, iv_e.violations)
    f.check_invariants()


def test_the_admission_lever_is_set_on_the_forks_only_and_shows_by_name():
    e = _mixed_engine()
    e.run_until(2.0)
    candidates = parse_candidates("chunk=256;ratio=0.5;admission=fcfs,shed;admission_slack=0.8")
    assert [c.label() for c in candidates] == [
        "window=5 chunk=256 ratio=0.5 admission_slack=0.8 admission=fcfs",
        "window=5 chunk=256 ratio=0.5 admission_slack=0.8 admission=shed"]
    f = e.fork(1.0)
    candidates[1].apply(f)
    assert (f.admission, f.admission_slack) == ("shed", 0.8)
    search(e, candidates, 2.0)
    assert (e.admission, e.admission_slack) == ("fcfs", 1.0)
    with pytest.raises(ValueError, match="admission='drop' is not one of fcfs, shed, "
                                         "late_to_back"):
        parse_candidates("admission=drop")


def test_labelling_on_two_workers_gives_the_labels_of_one(tmp_path):
    """Each window is labelled by a fresh oracle, so the executor's workers cannot change a
    label: the two runs agree digit for digit."""
    args = ["--trace", "synthetic", "--windows", "3", "--window-s", "3", "--rate-scales", "1", "2",
            "--horizon-s", "2", "--candidates", "chunk=256,4096", "--no-anchor", "--no-progress"]
    one, two = tmp_path / "one.npz", tmp_path / "two.npz"
    assert oracle_label.main([*args, "--out", str(one)]) == 0
    assert oracle_label.main([*args, "--workers", "2", "--out", str(two)]) == 0
    a, b = np.load(one), np.load(two)
    assert len(a["observations"]) > 10
    for key in ("observations", "settings", "actions", "scores", "window", "t_s", "rate_scale"):
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_the_candidate_grammar_names_all_five_knobs_and_the_levers():
    grid = parse_candidates("window=5;chunk=256,1024;ratio=0.9;batch_share=0.25,1;"
                            "admission_slack=0.5;admission=fcfs,shed;max_num_seqs=64")
    assert len(grid) == 8  # 2 chunks x 2 shares x 2 policies
    first = grid[0]
    assert first.knobs == Knobs(5.0, 256, 0.9, batch_share=0.25, admission_slack=0.5)
    assert first.levers == (("admission", 0.0), ("max_num_seqs", 64.0))
    assert first.label() == ("window=5 chunk=256 ratio=0.9 batch_share=0.25 admission_slack=0.5 "
                             "admission=fcfs max_num_seqs=64")
    # a knob the grid leaves out takes the base's value (the oracle's anchor's)
    base = Knobs(20.0, 2048, 0.8, batch_share=0.5, admission_slack=2.0)
    (only,) = parse_candidates("chunk=512", base)
    assert only.knobs == Knobs(20.0, 512, 0.8, batch_share=0.5, admission_slack=2.0)
    with pytest.raises(ValueError, match=r"candidates: batch_share=1.5 is outside its range"):
        parse_candidates("batch_share=1.5")


def test_the_persistence_forecast_is_the_last_span_of_arrivals_again_one_span_later():
    e = make_engine()
    e.add_requests([0.2, 0.9, 1.4, 1.6, 5.0], [10, 20, 30, 40, 50], [2, 3, 4, 5, 6],
                   ["interactive", "batch", "interactive", "interactive", "interactive"])
    e.run_until(1.5)  # short requests: the engine is idle by then and stops at 1.5
    assert e.now == 1.5
    forecast = e.repeated_arrivals(1.0)  # arrivals in (0.5, 1.5]: requests 1 and 2
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.slo_class) for r in forecast] == [
        (1.9, 20, 3, "batch"), (2.4, 30, 4, "interactive")]
    original = {r.req_id: r for r in e.requests}
    assert [r.req_id for r in forecast] == [5, 6]  # ids no request of the engine has
    assert forecast[0].is_batch and forecast[0].deadline_s - 1.9 == pytest.approx(
        original[1].deadline_s - 0.9)
    assert forecast[1].ttft_target_s == original[2].ttft_target_s
    assert all(r.status == Status.PENDING and r.num_computed_tokens == 0 for r in forecast)
    with pytest.raises(ValueError, match="positive number of seconds"):
        e.repeated_arrivals(0.0)


def test_a_fork_on_forecast_arrivals_serves_them_and_not_the_trace_future():
    e = make_engine()
    e.add_requests([0.0, 0.5, 2.0, 3.0], [100] * 4, [50] * 4)
    e.run_until(1.0)
    forecast = e.repeated_arrivals(1.0)  # request 1 (0.5 s) again at 1.5 s, as request 4
    f = e.fork(2.5, forecast)
    assert [r.req_id for r in f.requests] == [1, 4]  # in flight, then the forecast
    assert all(a is not b for a in f.requests for b in (*e.requests, *forecast))
    f.run_until(3.5)
    assert [r.status for r in f.requests] == [Status.FINISHED, Status.FINISHED]
    assert forecast[0].status == Status.PENDING  # the fork ran copies
    assert [r.status for r in e.requests[2:]] == [Status.PENDING, Status.PENDING]
    with pytest.raises(ValueError, match="must come after now"):
        e.fork(2.5, [e.requests[1]])


def test_the_forecast_oracle_decides_alike_on_two_traces_that_differ_only_ahead():
    # The same two short requests, then nothing or a 900-token prompt at 2.1 s: at chunk 64 its
    # first token misses, at chunk 2048 it is met (the hand-worked score test above).
    def decisions(future: bool, arrivals: str) -> list[int]:
        e = make_engine()
        e.add_requests([0.1, 0.3, *([2.1] if future else [])], [10, 10, 900][:2 + future],
                       [2, 2, 2][:2 + future])
        oracle = LookaheadOracle(OracleConfig(period_s=0.25, horizon_s=3.0, rollout=False,
                                              candidates="chunk=64,2048;ratio=0.5",
                                              arrivals=arrivals),
                                 anchor=Knobs(5.0, 64, 0.5), interval_s=0.25)
        oracle.bind(e)
        chosen = []
        for k in range(1, 9):
            knobs = oracle.decide(None).knobs
            chosen.append(knobs.prefill_chunk_tokens)
            e.set_knobs(knobs)
            e.run_until(k * 0.25)
            e.collect_interval()
        return chosen

    assert decisions(False, "repeat") == decisions(True, "repeat") == [64] * 8
    assert decisions(False, "trace") == [64] * 8
    # the upper bound sees the prompt coming once its miss at chunk 64 (certain at 3.1 s) falls
    # within the horizon
    assert decisions(True, "trace") == [64] + [2048] * 7


def test_the_forecast_oracle_is_named_apart_from_the_upper_bound():
    c = make_controller(FORECAST_NAME, EvalSpec("synthetic", "eval", None, 0.25))
    assert isinstance(c, LookaheadOracle) and c.config.arrivals == "repeat"
    assert c.name == FORECAST_NAME and not is_upper_bound(c.name)
    assert short_name(FORECAST_NAME) == "oracle's search, arrivals forecast"
    assert make_controller(ORACLE, EvalSpec("synthetic", "eval", None, 0.25)).name == ORACLE
    with pytest.raises(ValueError, match="arrivals must be 'trace' or 'repeat'"):
        OracleConfig(arrivals="psychic")  # type: ignore[arg-type]


def test_the_length_forecast_is_the_mean_of_the_finished_requests_longer_than_what_was_made():
    def finished(length: int, cls: str = "interactive") -> Request:
        r = Request(0, 0.0, 10, length, cls, 1.0, 0.05)
        r.status = Status.FINISHED
        return r

    running = Request(1, 0.0, 10, 999, "interactive", 1.0, 0.05)
    running.status = Status.RUNNING
    forecast = length_forecast([finished(10), finished(20), finished(60), running,
                                finished(500, "batch")])
    fresh = Request(2, 0.0, 10, 999, "interactive", 1.0, 0.05)
    assert forecast(fresh) == 30  # (10 + 20 + 60) / 3: the request in flight is not counted
    fresh.num_output_tokens = 15
    assert forecast(fresh) == 40  # longer than 15: (20 + 60) / 2
    fresh.num_output_tokens = 60
    assert forecast(fresh) == 120  # none longer: twice what it has
    assert forecast(Request(3, 0.0, 10, 7, "batch", 1.0, 0.05)) == 500
    assert forecast(Request(4, 0.0, 10, 7, "other", 1.0, 0.05)) == 1  # no history: one token


def test_a_fork_on_forecast_lengths_runs_each_request_to_its_forecast_and_moves_its_deadline():
    e = make_engine()
    e.add_requests([0.0, 0.0], [100, 100], [50, 50])
    e.run_until(0.3)  # both decoding, a few tokens each
    made = [r.num_output_tokens for r in e.requests]
    assert all(0 < m < 50 for m in made)
    f = e.fork(10.0, [], output_tokens=lambda r: r.num_output_tokens + 5)
    assert [r.output_tokens for r in f.requests] == [m + 5 for m in made]
    assert [r.output_tokens for r in e.requests] == [50, 50]  # the original keeps its own
    tpot = {r.req_id: t for t, _, kind, r in f._deadlines if kind == FINISH}
    for r, m in zip(f.requests, made):
        assert tpot[r.req_id] == pytest.approx(r.first_token_s + r.tpot_target_s * (m + 4))
    f.run_until(5.0)
    assert [r.num_output_tokens for r in f.requests] == [m + 5 for m in made]
    assert all(r.status == Status.FINISHED for r in f.requests)
    f.check_invariants()


def test_the_causal_search_is_its_own_controller_and_needs_forecast_arrivals():
    c = make_controller(CAUSAL_NAME, EvalSpec("synthetic", "eval", None, 0.25))
    assert c.name == CAUSAL_NAME and c.config.output_lengths == "forecast"
    assert c.config.arrivals == "repeat" and not is_upper_bound(c.name)
    assert short_name(CAUSAL_NAME) == "oracle's search, arrivals and lengths forecast"
    with pytest.raises(ValueError, match="output_lengths 'forecast' needs arrivals 'repeat'"):
        OracleConfig(output_lengths="forecast")


@pytest.mark.parametrize("rate", [2.0, 40.0])
def test_a_search_runs_a_tail_once_per_state_and_scores_every_candidate_exactly(rate):
    """Candidates whose period leaves the engine in the same state share one tail; every score
    is still the one :func:`score_setting` gives that candidate on its own."""
    e = make_engine(hand_profile(prefill_token_s=1e-4, decode_ctx_token_s=1e-6), chunk=512)
    arrivals, prompts, outputs = random_workload(5, 200, rate, prompt_mean=200)
    e.add_requests(arrivals, prompts, outputs)
    e.run_until(1.0)
    candidates = parse_candidates("window=5;chunk=64,128,1024,2048,4096;ratio=0.5")
    tail = candidates[2]
    found = search(e, candidates, 4.0, hold_s=0.25, tail=tail)
    alone = tuple(score_setting(e, c, 4.0, hold_s=0.25, tail=tail) for c in candidates)
    assert found.scores == alone
    assert 1 <= found.rollouts < len(candidates)  # the large chunks reach the same state
