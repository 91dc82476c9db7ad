"""The engine's semantics on tiny traces whose numbers are worked out by hand.

The hand profile: an iteration costs 10 ms + 1 ms per prefill token (decodes are free beyond the
constant); 100 KV blocks of 16 tokens at ratio 0.5.
"""

from __future__ import annotations

import numpy as np
import pytest

from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.metrics import IntervalStats
from runtime.engine.profile import Profile
from runtime.engine.recording import RecordingExecutor
from runtime.engine.request import RejectReason, Status
from runtime.engine.sim_executor import SimulatedExecutor
from runtime.engine.state import EngineState
from runtime.knobs import DEFAULT_KNOBS, NUM_KNOBS, Knobs, action_to_knobs
from tests.engine_factory import hand_profile, make_engine, random_workload


def run(engine: Engine, arrivals, prompts, outputs) -> Engine:
    engine.add_requests(arrivals, prompts, outputs)
    engine.run_to_completion()
    engine.check_invariants()
    return engine


def test_ttft_and_tpot_of_a_lone_request_by_hand():
    # Arrives at 1.0, waits the 5 ms window, one 100-token prefill (10 + 100 ms) samples the
    # first token, then 4 decodes of 10 ms each.
    e = run(make_engine(), [1.0], [100], [5])
    (r,) = e.requests
    assert r.status == Status.FINISHED
    assert r.admitted_s == pytest.approx(1.005)
    assert r.first_token_s == pytest.approx(1.115)
    assert r.ttft_s == pytest.approx(0.115)
    assert r.finish_s == pytest.approx(1.155)
    assert r.tpot_s == pytest.approx(0.010)


def test_chunked_prefill_splits_the_prompt_over_iterations():
    # chunk 64: 100 waiting tokens fill a chunk, so no window; 64 tokens (74 ms), then 36 (46 ms)
    e = run(make_engine(chunk=64), [0.0], [100], [1])
    (r,) = e.requests
    assert r.admitted_s == 0.0
    assert r.first_token_s == pytest.approx(0.074 + 0.046)
    assert r.finish_s == r.first_token_s  # one output token: done with the prefill
    assert e.num_iterations == 2


def test_window_holds_arrivals_and_admits_them_together():
    # Two arrivals 10 ms apart with a 50 ms window: both admitted when the first's window ends,
    # prefilled in one iteration (10 + 20 ms).
    e = run(make_engine(window_ms=50), [0.0, 0.010], [10, 10], [1, 1])
    a, b = e.requests
    assert a.admitted_s == pytest.approx(0.050) and b.admitted_s == pytest.approx(0.050)
    assert a.first_token_s == pytest.approx(0.080) and b.first_token_s == pytest.approx(0.080)
    assert e.num_iterations == 1


def test_a_full_chunk_of_waiting_tokens_is_admitted_without_waiting_for_the_window():
    e = run(make_engine(window_ms=200, chunk=64), [0.0], [64], [1])
    assert e.requests[0].admitted_s == 0.0


def test_decodes_do_not_count_against_the_prefill_chunk():
    # A decoding request and a 64-token prefill with chunk 64 share one iteration.
    e = make_engine(chunk=64, window_ms=5)
    e.add_requests([0.0, 0.2], [16, 64], [100, 1])
    e.run_until(0.2)
    assert e.requests[0].num_output_tokens > 1
    e.run_until(0.2 + 1e-9)
    e.run_to_completion()
    b = e.requests[1]
    assert b.admitted_s == pytest.approx(0.2, abs=0.011)  # at the first iteration start >= 0.2
    # its prefill ran in a single iteration next to the decode: 10 + 64 ms
    assert b.first_token_s - b.admitted_s == pytest.approx(0.074)


def test_preempts_newest_when_blocks_run_out():
    # 10 blocks (ratio 0.5 of a 20-block pool... ) : three requests of 2 blocks each grow until
    # the pool is exhausted; the newest is preempted first and recomputed later.
    e = make_engine(hand_profile(blocks_at_half=10), window_ms=5, watermark=0.0)
    e.add_requests([0.0, 0.001, 0.002], [32, 32, 32], [60, 60, 60])
    e.run_to_completion()
    e.check_invariants()
    a, b, c = e.requests
    assert all(r.status == Status.FINISHED for r in e.requests)
    assert c.num_preemptions >= 1
    assert a.num_preemptions == 0
    assert e.num_preemptions == sum(r.num_preemptions for r in e.requests)


def test_request_larger_than_the_pool_is_rejected_with_a_reason():
    # 10 blocks = 160 tokens; 200 + 10 tokens can never fit
    e = run(make_engine(hand_profile(blocks_at_half=10)), [0.0, 0.1], [200, 10], [10, 10])
    big, small = e.requests
    assert big.status == Status.REJECTED
    assert big.reject_reason == RejectReason.EXCEEDS_KV_CAPACITY
    assert small.status == Status.FINISHED


def test_request_longer_than_max_model_len_is_rejected():
    e = run(make_engine(max_model_len=100), [0.0], [90], [20])
    assert e.requests[0].reject_reason == RejectReason.EXCEEDS_MAX_MODEL_LEN


def test_zero_length_request_is_rejected_as_invalid():
    e = run(make_engine(), [0.0], [0], [5])
    assert e.requests[0].reject_reason == RejectReason.INVALID


def test_oom_costs_time_is_counted_and_retried_with_a_smaller_chunk():
    # ratio 0.9: workspace = 0.1 * 2000 blocks * 16 KiB = 3,276,800 B = 5120 tokens at 640 B/token.
    # A 8192-token chunk does not fit; the retry with 4096 does.
    p = hand_profile(blocks_at_half=1000, prefill_token_s=0.0001, act_bytes_per_token=640)
    e = make_engine(p, chunk=8192, ratio=0.9, max_model_len=20000)
    e.add_requests([0.0], [8000], [1])
    e.run_to_completion()
    r = e.requests[0]
    assert e.num_ooms == 1
    assert r.status == Status.FINISHED
    # window 5 ms, OOM 50 ms, then 4096 tokens and 3904 tokens (10 ms + 0.1 ms/token each)
    assert r.first_token_s == pytest.approx(0.005 + 0.05 + (0.010 + 0.4096) + (0.010 + 0.3904))


def test_changing_the_ratio_costs_its_resize_time():
    e = make_engine(hand_profile(resize_fixed_s=0.25))
    assert e.set_knobs(Knobs(5.0, 2048, 0.6)) == pytest.approx(0.25)
    assert e.now == pytest.approx(0.25)
    assert e.pool.num_blocks == 120
    assert e.set_knobs(Knobs(20.0, 2048, 0.6)) == 0.0  # no pool change, no cost


def test_shrinking_the_ratio_below_blocks_in_use_preempts_newest():
    e = make_engine(hand_profile(blocks_at_half=80), window_ms=5, watermark=0.0)
    e.add_requests([0.0, 0.001, 0.002], [320, 320, 320], [200, 200, 200])
    e.run_until(1.5)  # all three running, 20 blocks of prompt each and growing
    assert len(e.running) == 3
    used_before = e.pool.num_used
    assert used_before > 64
    e.set_knobs(Knobs(5.0, 2048, 0.4))  # 64 blocks: only two fit
    e.check_invariants()
    assert e.pool.num_blocks == 64 and e.pool.num_used <= 64 < used_before
    assert [r.req_id for r in e.running] == [0, 1]
    assert e.requests[2].num_preemptions == 1
    e.run_to_completion()
    e.check_invariants()
    assert all(r.status == Status.FINISHED for r in e.requests)


def test_a_wait_shrink_preempts_nothing_and_reaches_the_ratio_as_requests_finish():
    """``kv_shrink="wait"``: a cut below what three requests hold leaves the pool that and the room
    for their next tokens, preempts none of them, and each later application of the low ratio
    (as a session applies its knobs every interval) shrinks the pool further, to the ratio
    itself once they have finished; the knobs say the ratio applied."""
    from runtime.engine.engine import KV_ROOM_BLOCKS, KV_ROOM_PER_RUNNING

    e = make_engine(hand_profile(blocks_at_half=100), window_ms=5, watermark=0.0,
                    kv_shrink="wait")
    e.add_requests([0.0, 0.001, 0.002, 30.0], [352, 352, 352, 64], [100, 100, 100, 20])
    e.run_until(1.5)
    used_before, blocks_before = e.pool.num_used, e.pool.num_blocks
    low = Knobs(5.0, 2048, 0.4)
    e.set_knobs(low)
    e.check_invariants()
    assert e.num_preemptions == 0 and len(e.running) == 3
    assert (e.pool.num_used + KV_ROOM_PER_RUNNING * 3 + KV_ROOM_BLOCKS <= e.pool.num_blocks
            < blocks_before)
    assert 0.4 < e.knobs.kv_cache_ratio < 0.5 and e.pool.num_used == used_before
    sizes = [e.pool.num_blocks]
    t = 1.5
    while e.knobs != low:
        t += 0.25
        assert t < 30.0, "the pool never reached the ratio"
        e.run_until(t)
        e.set_knobs(low)
        e.check_invariants()
        sizes.append(e.pool.num_blocks)
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] == 80
    e.run_to_completion()
    assert e.num_preemptions == 0
    assert all(r.status == Status.FINISHED for r in e.requests)


def test_a_wait_shrink_is_refused_by_name_when_misspelt():
    with pytest.raises(ValueError, match="kv_shrink must be one of preempt, wait, got 'drain'"):
        EngineConfig(kv_shrink="drain")


def test_abort_ends_every_request_in_flight_with_a_reason():
    e = make_engine()
    arrivals, prompts, outputs = random_workload(0, 200, rate=50)
    e.add_requests(arrivals, prompts, outputs)
    e.run_until(1.0)
    n = e.abort_all()
    assert n > 0
    assert all(r.status in (Status.FINISHED, Status.REJECTED) for r in e.requests)
    assert sum(r.reject_reason == RejectReason.ABORTED for r in e.requests) == n
    assert e.pool.num_used == 0


@pytest.mark.parametrize("seed,rate,blocks", [(0, 2, 400), (1, 20, 60), (2, 60, 40), (3, 8, 25)])
def test_every_request_ends_finished_or_rejected(seed, rate, blocks):
    e = make_engine(hand_profile(blocks_at_half=blocks, prefill_token_s=1e-5,
                                 decode_ctx_token_s=1e-6), chunk=256)
    arrivals, prompts, outputs = random_workload(seed, 300, rate)
    e.add_requests(arrivals, prompts, outputs)
    t = 0.0
    while e.has_work():
        t += 0.37
        e.run_until(t)
        e.check_invariants()
    s = e.summary()
    assert s.finished + s.rejected == 300
    assert all(r.status == Status.FINISHED or r.reject_reason is not None for r in e.requests)


@pytest.mark.parametrize("scale", [0.5, 1.0, 3.0])
def test_closed_form_decode_agrees_with_step_by_step(scale):
    """The fast path must reproduce the step-by-step simulation: same iterations, same times."""
    profile = Profile.load()  # the shipped roofline profile: a linear cost with context terms
    rng = np.random.default_rng(7)
    n = 400
    arrivals = np.cumsum(rng.exponential(1.0 / (8.0 * scale), n))
    prompts = rng.integers(1, 3000, n)
    outputs = rng.integers(1, 600, n)
    results = []
    for fast in (True, False):
        e = Engine(SimulatedExecutor(profile), Knobs(10.0, 1024, 0.45),
                   EngineConfig(fast_path=fast))
        e.add_requests(arrivals, prompts, outputs)
        t = 0.0
        while e.has_work():  # decision intervals cut stretches, as in the environment
            t += 0.25
            e.run_until(t)
        e.check_invariants()
        results.append(e)
    fast, slow = results
    assert fast.num_fast_stretches > 0 and slow.num_fast_stretches == 0
    assert fast.num_iterations == slow.num_iterations
    assert fast.num_preemptions == slow.num_preemptions
    for a, b in zip(fast.requests, slow.requests):
        assert a.status == b.status
        assert a.first_token_s == pytest.approx(b.first_token_s, rel=1e-9, abs=1e-9)
        assert a.finish_s == pytest.approx(b.finish_s, rel=1e-9, abs=1e-9)
        assert a.num_preemptions == b.num_preemptions


def test_interval_counts_a_waiting_request_as_a_violation_once_it_passes_its_ttft_target():
    # A 4000-token prompt at chunk 64 takes 63 iterations of 10 ms (first token at 0.63 s); a
    # second request's 8000 tokens are prefilled behind it (first token at 1.88 s), so it passes
    # its 1 s TTFT target while waiting: counted in the interval where that became certain.
    e = make_engine(chunk=64, max_model_len=20000, ratio=0.9,
                    profile=hand_profile(blocks_at_half=1000, prefill_token_s=0.0))
    e.add_requests([0.0, 0.0001], [4000, 8000], [2, 2])
    e.run_until(0.9)
    assert e.collect_interval().violations == 0
    e.run_until(1.2)
    iv = e.collect_interval()
    assert iv.violations == 1  # the second: no first token 1 s after arrival
    e.run_to_completion()
    assert e.collect_interval().violations == 0  # counted once, not again at its first token
    first, second = e.requests
    assert first.meets_slo() and not second.meets_slo()
    assert second.ttft_s == pytest.approx(1.88, abs=0.011)


def test_fragmentation_is_zero_for_a_fresh_pool_and_rises_when_free_blocks_scatter():
    from runtime.engine.block_pool import BlockPool

    pool = BlockPool(10)
    assert pool.fragmentation() == 0.0
    ids = pool.allocate(10)
    pool.free(ids[::2])  # free 0, 2, 4, 6, 8: five gaps of one
    assert pool.fragmentation() == pytest.approx(1 - 5 / 25)
    assert list(pool.free_gaps()) == [1, 1, 1, 1, 1]


def test_default_profile_loads_and_says_it_is_derived():
    p = Profile.load()
    assert p.kind == "roofline"
    assert "not measured" in p.derivation["note"]
    assert p.memory.kv_bytes_per_token == 512 * 1024
    assert p.memory.total_bytes == 40 * 1024 ** 3


def test_profile_errors_name_the_file_and_field(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text('{"format": "batchpilot-profile/1", "name": "x", "kind": "roofline"}')
    with pytest.raises(ValueError, match=r"p\.json: missing field memory"):
        Profile.load(bad)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"p\.json: not valid JSON \(line 1, column 2\)"):
        Profile.load(bad)


def test_knobs_refuse_out_of_range_values_naming_the_knob():
    with pytest.raises(ValueError, match="kv_cache_ratio=0.99 is outside its range"):
        Knobs(5.0, 2048, 0.99)
    with pytest.raises(ValueError, match="not a multiple of the KV block size"):
        Knobs(5.0, 100, 0.9)
    with pytest.raises(ValueError, match="batch_share=1.5 is outside its range"):
        Knobs(5.0, 2048, 0.9, batch_share=1.5)
    with pytest.raises(ValueError, match=r"admission_slack=0.1 is outside its range "
                                         r"\[0.25, 8\] TTFT targets"):
        Knobs(5.0, 2048, 0.9, admission_slack=0.1)
    assert DEFAULT_KNOBS.as_tuple() == (5.0, 2048, 0.9, 1.0, 1.0)
    assert Knobs.clamped(1000, 1e9, 0.1, -2.0, 0.333) == Knobs(200.0, 16384, 0.4, 0.0, 0.33)


def test_batch_action_mapping_agrees_with_the_single_one():
    from runtime.knobs import action_to_knobs, actions_to_knobs

    rng = np.random.default_rng(0)
    actions = rng.uniform(-1.2, 1.2, (5000, NUM_KNOBS))
    actions[:3] = [[-1.0], [1.0], [0.0]]
    assert actions_to_knobs(actions) == [action_to_knobs(a) for a in actions]
    with pytest.raises(ValueError, match="must be finite"):
        actions_to_knobs(np.array([[0.0, np.nan, 0.0, 0.0, 0.0]]))


def test_the_engine_state_declares_exactly_the_attributes_an_engine_holds():
    # The mixins are type-checked against EngineState: it must name every attribute, and no more.
    declared = set(EngineState.__annotations__)
    e = make_engine(admission="late_to_back", admission_slack=0.5)
    assert set(vars(e)) == declared
    e.add_requests(*random_workload(3, 200, rate=50))
    e.run_until(2.0)
    e.collect_interval()
    e.set_knobs(Knobs(20.0, 512, 0.4, batch_share=0.5, admission_slack=2.0))
    e.run_to_completion()
    assert set(vars(e)) == declared
    assert set(vars(e.fork())) == declared



def _rebuilt_at_every_event(e: Engine) -> Engine:
    """``e`` with the lazy decode clock's state dropped after every stretch and step, so that
    each is computed afresh from every request's own token counts and blocks (the engine as it
    ran before its state was kept from event to event)."""
    e._rebuild_every_event = True
    return e


def _trajectory(e: Engine, until: float, interval_s: float, knobs_seed: int | None = None
                ) -> list:
    """Every interval's stats (fragmentation included: block ids matter) and every request's
    outcome, exactly; with ``knobs_seed``, seeded random knobs set at every interval (the pool
    grows and shrinks, preempting requests mid-decode)."""
    rng = np.random.default_rng(knobs_seed)
    rows = []
    while e.has_work() and e.now < until:
        e.run_until(e.now + interval_s)
        e.check_invariants()
        iv = e.collect_interval()
        rows.append(tuple(getattr(iv, f) for f in iv.__dataclass_fields__))
        if knobs_seed is not None:
            e.set_knobs(action_to_knobs(rng.uniform(-1.0, 1.0, NUM_KNOBS)))
            e.check_invariants()
    rows.append([(r.req_id, r.status, r.first_token_s, r.finish_s, r.num_preemptions,
                  r.reject_reason, r.num_output_tokens, r.num_computed_tokens)
                 for r in e.requests])
    return rows


@pytest.mark.parametrize("admission,blocks,rate,knobs_seed", [
    ("fcfs", 400, 8, None), ("fcfs", 60, 20, None), ("shed", 80, 30, None),
    ("late_to_back", 60, 25, None), ("fcfs", 120, 20, 1), ("shed", 200, 30, 2),
    ("late_to_back", 150, 25, 3)])
def test_the_decode_clocks_kept_state_gives_the_run_rebuilt_at_every_event(admission, blocks,
                                                                             rate, knobs_seed):
    """The closed-form loop keeps its decodes' state from event to event (lazy token counts,
    block residues, completion heap, context sum): it must give the run that rebuilds that
    state from the requests after every stretch and step, the same times, counters, block ids
    (fragmentation) and outcomes, compared with ==, past arrivals, deadlines, completions,
    block shortages, preemptions and knob changes."""
    profile = hand_profile(blocks_at_half=blocks, prefill_token_s=1e-5, decode_ctx_token_s=1e-6,
                           decode_seq_s=2e-5)
    arrivals, prompts, outputs = random_workload(11, 300, rate)
    classes = np.where(np.arange(300) % 4 == 0, "batch", "interactive")
    runs = []
    for kept in (True, False):
        e = make_engine(profile, chunk=256, admission=admission, admission_slack=0.5)
        e.add_requests(arrivals, prompts, outputs, classes)
        if not kept:
            _rebuilt_at_every_event(e)
        runs.append(_trajectory(e, 1e9, 0.37, knobs_seed))
        if kept:
            assert e.num_fast_stretches > e.num_iterations / 200  # the path was taken
            if blocks <= 80 or knobs_seed is not None:
                assert e.num_preemptions > 0
    assert runs[0] == runs[1]


def test_running_decodes_counts_lag_between_run_until_calls_and_requests_has_them_exact():
    """Closing an interval reads no running decode's counts (the environment closes one every
    0.25 s), so they stay on the decode clock from one ``run_until`` to the next; ``requests``
    brings them up to date: every interval, they are the counts of the run that takes every
    request off the clock after every stretch and step."""
    profile = hand_profile(blocks_at_half=400, prefill_token_s=1e-5, decode_ctx_token_s=1e-6,
                           decode_seq_s=2e-5)
    arrivals, prompts, outputs = random_workload(3, 60, 10)
    runs = []
    for kept in (True, False):
        e = make_engine(profile, chunk=256)
        e.add_requests(arrivals, prompts, outputs)
        if not kept:
            _rebuilt_at_every_event(e)
        rows, lagging = [], 0
        while e.has_work():
            e.run_until(e.now + 0.25)
            e.collect_interval()
            e.check_invariants()
            lagging += any(0 <= r.synced_at < e._clock for r in e.running)
            rows.append([(r.req_id, r.num_computed_tokens, r.num_output_tokens)
                         for r in e.requests])
        runs.append(rows)
        assert (lagging > 0) == kept
    assert runs[0] == runs[1]


def test_an_executor_that_must_see_its_batches_gets_every_step_and_the_same_run():
    """A wrapper of the simulated executor (a recording, a subclass that counts) is handed
    every step's batch, as the step-by-step path builds it, and the run is the plain
    executor's to the bit: only the closed-form executor's own steps are timed from
    aggregates."""
    profile = hand_profile(blocks_at_half=150, prefill_token_s=1e-5, decode_ctx_token_s=1e-6,
                           decode_seq_s=2e-5)
    arrivals, prompts, outputs = random_workload(5, 200, 20)
    runs = []
    for wrap in (False, True):
        ex = SimulatedExecutor(profile)
        rec = RecordingExecutor(ex) if wrap else ex
        e = Engine(rec, Knobs(5.0, 256, 0.5), EngineConfig())
        assert (e._iteration_cost is None) == wrap
        e.add_requests(arrivals, prompts, outputs)
        runs.append(_trajectory(e, 1e9, 0.37, knobs_seed=4))
        if wrap:  # every prefill token went through the executor
            assert isinstance(rec, RecordingExecutor)
            col = list(IntervalStats.__dataclass_fields__).index("prefill_tokens")
            assert sum(r.prefill_tokens for r in rec.records if not r.oom) == sum(
                row[col] for row in runs[-1][:-1]) > 0
            assert len(rec.records) < e.num_iterations  # decode stretches in closed form
    assert runs[0] == runs[1]

    class Counting(SimulatedExecutor):
        def execute(self, batch, kv_cache_ratio):
            return super().execute(batch, kv_cache_ratio)

    assert Counting(profile).closed_form() is None
    assert SimulatedExecutor(profile).closed_form() is profile.cost


def test_a_fork_copies_state_it_does_not_know_and_shares_what_never_changes():
    e = make_engine()
    arrivals, prompts, outputs = random_workload(3, 50, 10)
    e.add_requests(arrivals, prompts, outputs)
    e.run_until(2.0)
    e.extra_state = {"seen": [1]}  # a field added to the engine later
    f = e.fork(5.0)
    f.extra_state["seen"].append(2)
    f._interval.ttft_ratios.append(9.0)
    assert e.extra_state == {"seen": [1]} and 9.0 not in e._interval.ttft_ratios
    assert f.config is e.config and f.knobs is e.knobs and f.memory is e.memory
    assert {id(r) for r in f.running}.isdisjoint(id(r) for r in e.running)
    assert [r.req_id for r in f.running] == [r.req_id for r in e.running]
    assert f.state_key() == e.state_key()
    f.run_until(4.0)
    assert f.state_key() != e.state_key()
