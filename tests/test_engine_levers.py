"""The engine's levers on tiny traces worked out by hand: SLO classes with a batch share,
deadline-aware admission, memory lent to a co-tenant; and conservation with all of them on.

The hand profile (tests/engine_factory.py): an iteration costs 10 ms + 1 ms per prefill token
(decodes are free beyond the constant); 100 KV blocks of 16 tokens at ratio 0.5.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest

from runtime.engine.cotenant import CoTenantDemand
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.executor import GIB
from runtime.engine.request import RejectReason, Status
from runtime.engine.sim_executor import SimulatedExecutor
from runtime.engine.slo import DEFAULT_SLO_CLASSES, SloTarget
from runtime.knobs import Knobs
from tests.engine_factory import hand_profile, make_engine, random_workload

INT, B = "interactive", "batch"


def test_interactive_prefill_goes_first_and_batch_takes_its_share_of_the_rest():
    # Both arrive at 0; the batch one is listed first. At 5 ms (the window) the interactive one
    # is admitted, then the batch one. Chunk 160, share 0.25: batch prefill gets at most 40
    # tokens a step. Step 1: 100 interactive + 40 batch (150 ms, to 0.155: interactive first
    # token); step 2: interactive decode + 40 batch (50 ms, to 0.205: interactive done);
    # step 3: the last 20 batch tokens (30 ms, 0.235: batch first token); step 4: decode (0.245).
    e = make_engine(chunk=160, batch_share=0.25)
    e.add_requests([0.0, 0.0], [100, 100], [2, 2], [B, INT])
    e.run_to_completion()
    e.check_invariants()
    b, i = e.requests
    assert i.first_token_s == pytest.approx(0.155) and i.finish_s == pytest.approx(0.205)
    assert b.first_token_s == pytest.approx(0.235) and b.finish_s == pytest.approx(0.245)
    s = e.summary()
    assert (s.interactive_requests, s.batch_requests, s.batch_met) == (1, 1, 1)
    # sim_seconds runs to the end of run_to_completion's last 60-s slice
    assert s.batch_goodput_tps == pytest.approx(102 / e.now)
    assert s.interactive_attainment == 1.0


def test_a_zero_batch_share_holds_batch_work_until_the_share_is_raised():
    e = make_engine(batch_share=0.0)
    e.add_requests([0.0], [100], [1], [B])
    e.run_until(1.0)
    (b,) = e.requests
    assert b.status == Status.WAITING and e.now == 1.0
    e.set_batch_share(0.5)  # 1024 of the 2048-token chunk: the 100 tokens take 110 ms
    e.run_to_completion()
    assert b.admitted_s == 1.0 and b.finish_s == pytest.approx(1.110)
    with pytest.raises(ValueError, match=r"^batch_share must lie in \[0, 1\], got 1.5$"):
        e.set_batch_share(1.5)


def test_the_batch_share_caps_running_batch_requests():
    e = make_engine(max_num_seqs=4, batch_share=0.5)  # 2 of the 4 slots
    e.add_requests([0.0, 0.0, 0.0], [10, 10, 10], [5, 5, 5], [B, B, B])
    e.run_until(0.001)
    assert len(e.running) == 2 and len(e.waiting_batch) == 1


def test_a_batch_request_is_preempted_before_a_newer_interactive_one():
    # 12 blocks; three requests of 32 + 60 tokens (6 blocks each at the end) cannot all fit.
    # Running order is interactive first, [A, C, B], so B goes although C was admitted with it.
    e = make_engine(hand_profile(blocks_at_half=12), watermark=0.0)
    e.add_requests([0.0, 0.001, 0.002], [32, 32, 32], [60, 60, 60], [INT, B, INT])
    e.run_to_completion()
    e.check_invariants()
    a, b, c = e.requests
    assert all(r.status == Status.FINISHED for r in e.requests)
    assert b.num_preemptions >= 1 and a.num_preemptions == 0 and c.num_preemptions == 0


def test_an_interactive_admission_that_does_not_fit_preempts_batch_work():
    # The batch request (100 + 50 tokens) runs alone: prefill to 0.110, then 10-ms decodes. The
    # interactive one (64 tokens, 4 blocks) arrives at 0.193; its window ends at 0.198 and the
    # next step starts at 0.200, when the batch request holds 7 of the 10 blocks: it is
    # preempted, and the interactive prefill runs alone (10 + 64 ms).
    e = make_engine(hand_profile(blocks_at_half=10), watermark=0.0)
    e.add_requests([0.0, 0.193], [100, 64], [50, 1], [B, INT])
    e.run_to_completion()
    e.check_invariants()
    b, i = e.requests
    assert b.num_preemptions == 1
    assert i.admitted_s == pytest.approx(0.200) and i.first_token_s == pytest.approx(0.274)
    assert b.status == Status.FINISHED


def test_a_batch_request_whose_deadline_passes_before_admission_expires():
    classes = {INT: DEFAULT_SLO_CLASSES[INT], B: SloTarget(1.0, 1.0, deadline_s=1.0)}
    e = make_engine(batch_share=0.0, slo_classes=classes)
    e.add_requests([0.5], [100], [1], [B])
    e.run_until(1.0)
    iv = e.collect_interval()
    e.run_to_completion()
    (b,) = e.requests
    assert b.reject_reason == RejectReason.EXPIRED and b.finish_s == 1.5
    assert (iv.violations, iv.batch_violations) == (0, 0)
    iv = e.collect_interval()
    assert (iv.violations, iv.batch_violations, iv.expired, iv.rejected) == (1, 1, 1, 1)
    assert e.summary().rejected_by_reason == {"expired": 1}


def test_an_engine_left_with_shut_out_batch_work_expires_it_and_keeps_a_finite_clock():
    # every request arrived, batch work alone waiting and shut out (share 0): the engine runs
    # its usual 60-s stretch, in which the request expires at its deadline, and stops; the
    # clock used to jump to inf there, and the co-tenant's integral overflowed
    classes = {INT: DEFAULT_SLO_CLASSES[INT], B: SloTarget(1.0, 1.0, deadline_s=1.0)}
    e = make_engine(batch_share=0.0, slo_classes=classes,
                    cotenant=CoTenantDemand(gib=np.array([0.001])))
    e.add_requests([0.5], [100], [1], [B])
    e.run_until(0.6)
    e.run_to_completion()
    (b,) = e.requests
    assert b.reject_reason == RejectReason.EXPIRED and b.finish_s == 1.5
    assert e.now == pytest.approx(60.6)
    s = e.summary()
    assert s.sim_seconds == pytest.approx(60.6)
    assert s.mean_kv_gib == pytest.approx(1_638_400 / GIB)
    assert s.cotenant_served_share == 1.0


def _late_workload(admission: str):
    # One sequence slot. A (900-token prompt, 50 outputs) prefills from 0.005 to 0.915 and
    # decodes to 1.405. B (arrives 0.001, 100 tokens) waits behind it and passes its 1-s TTFT
    # target at 1.001; C (0.5, 10 tokens) is on time until 1.5.
    e = make_engine(max_num_seqs=1, admission=admission)
    e.add_requests([0.0, 0.001, 0.5], [900, 100, 10], [50, 2, 2])
    e.run_to_completion()
    e.check_invariants()
    return e


def test_fcfs_serves_a_late_request_first_and_the_next_one_misses_too():
    e = _late_workload("fcfs")
    a, b, c = e.requests
    assert b.first_token_s == pytest.approx(1.515) and b.finish_s == pytest.approx(1.525)
    assert c.first_token_s == pytest.approx(1.545)  # TTFT 1.045 s: a miss
    assert e.summary().met == 1


def test_shed_drops_a_late_request_and_the_one_behind_it_meets_its_slo():
    e = _late_workload("shed")
    a, b, c = e.requests
    # B is found late at the first step boundary after 1.001 (A's decodes: 0.915 + 10 ms k)
    assert b.reject_reason == RejectReason.SHED and b.finish_s == pytest.approx(1.005)
    assert c.admitted_s == pytest.approx(1.405) and c.first_token_s == pytest.approx(1.425)
    s = e.summary()
    assert (s.met, s.rejected_by_reason) == (2, {"shed": 1})


def test_late_to_back_serves_on_time_requests_first_and_drops_nothing():
    e = _late_workload("late_to_back")
    a, b, c = e.requests
    assert c.first_token_s == pytest.approx(1.425) and c.finish_s == pytest.approx(1.435)
    assert b.first_token_s == pytest.approx(1.545) and b.finish_s == pytest.approx(1.555)
    s = e.summary()
    assert (s.met, s.finished, s.rejected) == (2, 3, 0)


def test_the_admission_policy_can_change_at_run_time_and_applies_to_requests_already_late():
    # as _late_workload, under fcfs until 1.2 s: B (late since 1.001) is waiting
    e = make_engine(max_num_seqs=1)
    e.add_requests([0.0, 0.001, 0.5], [900, 100, 10], [50, 2, 2])
    e.run_until(1.2)
    a, b, c = e.requests
    e.set_admission("late_to_back", 1.0)
    assert list(e.late) == [b] and list(e.waiting) == [c]
    e.set_admission("shed", 1.0)  # drops the late queue
    assert (e.admission, e.admission_slack) == ("shed", 1.0)
    assert b.reject_reason == RejectReason.SHED and b.finish_s == e.now
    e.run_to_completion()
    e.check_invariants()
    assert c.first_token_s == pytest.approx(1.425)
    with pytest.raises(ValueError, match="^admission must be one of"):
        e.set_admission("drop", 1.0)


@pytest.mark.parametrize("slack, shed_at", [(0.5, 0.505), (1.0, 1.005)])
@pytest.mark.parametrize("fast_path", [True, False])
def test_the_admission_slack_sets_when_a_waiting_request_is_late(slack, shed_at, fast_path):
    # A (400 tokens) prefills to 0.415 and decodes to 1.405, holding the only slot; B (arrives
    # 0.001) is late at 0.001 + slack s and shed at the next 10-ms step boundary.
    e = make_engine(max_num_seqs=1, admission="shed", admission_slack=slack,
                    fast_path=fast_path)
    e.add_requests([0.0, 0.001], [400, 10], [100, 2])
    e.run_to_completion()
    a, b = e.requests
    assert b.reject_reason == RejectReason.SHED and b.finish_s == pytest.approx(shed_at)
    assert a.finish_s == pytest.approx(1.405)


def test_a_prefill_past_its_ttft_target_is_shed_and_its_blocks_freed():
    # chunk 64: a 1500-token prompt (admitted at once: it fills a chunk) takes 24 steps of up to
    # 74 ms; at 1.0 its TTFT target passes mid-way, and the step boundary after it is 1.036
    e = make_engine(chunk=64, admission="shed")
    e.add_requests([0.0], [1500], [5])
    e.run_to_completion()
    e.check_invariants()
    (r,) = e.requests
    assert r.reject_reason == RejectReason.SHED and r.finish_s == pytest.approx(1.036)
    assert e.pool.num_used == 0 and not e.running


@pytest.mark.parametrize("bad, message", [
    ({"admission": "drop"}, "admission must be one of fcfs, shed, late_to_back, got 'drop'"),
    ({"admission_slack": 0.0}, r"admission_slack must lie in \[0.25, 8\] TTFT targets, got 0.0"),
    ({"batch_share": -0.1}, r"batch_share must lie in \[0, 1\], got -0.1"),
])
def test_engine_config_refuses_bad_lever_settings_naming_them(bad, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        make_engine(**bad)


def test_co_tenant_demand_is_integrated_by_hand():
    d = CoTenantDemand(gib=np.array([2.0, 6.0]), step_s=1.0)
    assert d.integrate(0.5, 1.5, 4.0) == (pytest.approx(3.0), pytest.approx(4.0))
    assert d.integrate(2.0, 3.0, 10.0) == (pytest.approx(2.0), pytest.approx(2.0))  # periodic
    with pytest.raises(ValueError, match="must be finite and >= 0 GiB"):
        CoTenantDemand(gib=np.array([1.0, -1.0]))


def test_the_engine_lends_what_kv_and_a_full_iterations_activations_leave():
    # Hand memory: 3,276,800 B after weights; KV at ratio 0.5 holds 1,638,400 B; a full
    # iteration (2048-token chunk + 256 decodes) needs 64 B x 2304 = 147,456 B. Lendable:
    # 1,490,944 B = 0.0013885 GiB. Demand 0.001 then 0.002 GiB: served 0.001 + 0.0013885.
    lendable = 1_490_944 / GIB
    e = make_engine(cotenant=CoTenantDemand(gib=np.array([0.001, 0.002])))
    e.run_until(2.0)
    iv = e.collect_interval()
    assert iv.kv_gib_s == pytest.approx(2 * 1_638_400 / GIB)
    assert iv.mean_kv_gib == pytest.approx(1_638_400 / GIB)
    assert iv.cotenant_demand_gib_s == pytest.approx(0.003)
    assert iv.cotenant_served_gib_s == pytest.approx(0.001 + lendable)
    assert e.summary().cotenant_served_share == pytest.approx((0.001 + lendable) / 0.003)
    e.set_knobs(Knobs(5.0, 2048, 0.4))  # a smaller pool lends more from now on
    e.run_until(3.0)
    iv = e.collect_interval()
    assert iv.cotenant_served_gib_s == pytest.approx(0.001)  # demand 0.001 < lendable


def _mixed_workload(seed: int, n: int = 240):
    arrivals, prompts, outputs = random_workload(seed, n, rate=25)
    classes = np.where(np.random.default_rng(seed).random(n) < 0.3, B, INT)
    return arrivals, prompts, outputs, classes


LEVERS = [
    {"admission": "fcfs", "batch_share": 1.0},
    {"admission": "shed", "batch_share": 0.3},
    {"admission": "shed", "admission_slack": 0.5, "batch_share": 0.0},
    {"admission": "late_to_back", "admission_slack": 2.0, "batch_share": 0.6},
]


@pytest.mark.parametrize("levers", LEVERS)
def test_every_request_ends_finished_or_rejected_and_class_counts_add_up(levers):
    classes_cfg = {INT: DEFAULT_SLO_CLASSES[INT], B: SloTarget(1.0, 1.0, deadline_s=8.0)}
    e = make_engine(hand_profile(blocks_at_half=120, prefill_token_s=2e-5,
                                 decode_ctx_token_s=1e-6), chunk=256, slo_classes=classes_cfg,
                    cotenant=CoTenantDemand(gib=np.array([0.001, 0.004])), **levers)
    arrivals, prompts, outputs, classes = _mixed_workload(3)
    e.add_requests(arrivals, prompts, outputs, classes)
    ivs, t = [], 0.0
    while e.has_work():
        t += 0.37
        if 3.0 < t < 3.5:
            e.set_knobs(replace(e.knobs, kv_cache_ratio=0.42))  # a shrink preempts, batch first
        e.run_until(t)
        e.check_invariants()
        ivs.append(e.collect_interval())
    s = e.summary()
    n = len(arrivals)
    assert all(r.status == Status.FINISHED or r.reject_reason is not None for r in e.requests)
    assert s.finished + s.rejected == n
    assert s.interactive_requests + s.batch_requests == n
    assert s.batch_requests == int((classes == B).sum())
    assert sum(iv.met for iv in ivs) == s.met
    assert sum(iv.batch_met for iv in ivs) == s.batch_met
    assert sum(iv.met + iv.violations for iv in ivs) == n  # each request decided once
    assert sum(iv.shed for iv in ivs) == s.rejected_by_reason.get("shed", 0)
    assert sum(iv.expired for iv in ivs) == s.rejected_by_reason.get("expired", 0)
    assert sum(iv.rejected for iv in ivs) == s.rejected
    if levers["batch_share"] == 0.0:  # no batch request ever runs
        assert s.batch_met == 0
        assert all(r.reject_reason in (RejectReason.EXPIRED, RejectReason.EXCEEDS_KV_CAPACITY)
                   for r in e.requests if r.is_batch)
    if levers["admission"] == "shed":
        assert s.rejected_by_reason["shed"] > 0


@pytest.mark.parametrize("levers", LEVERS[1:])
def test_closed_form_decode_agrees_with_step_by_step_with_the_levers_on(levers):
    results = []
    for fast in (True, False):
        e = make_engine(hand_profile(blocks_at_half=60, prefill_token_s=2e-5,
                                     decode_ctx_token_s=1e-6), chunk=256, fast_path=fast,
                        **levers)
        e.add_requests(*_mixed_workload(5))
        e.run_to_completion()
        results.append(e)
    fast, slow = results
    assert fast.num_fast_stretches > 0
    assert fast.num_iterations == slow.num_iterations
    for a, b in zip(fast.requests, slow.requests):
        assert (a.status, a.reject_reason, a.num_preemptions) == \
            (b.status, b.reject_reason, b.num_preemptions)
        assert a.finish_s == pytest.approx(b.finish_s, rel=1e-9, abs=1e-9)


def test_a_deep_copy_of_a_running_engine_continues_exactly_as_the_original():
    e = make_engine(admission="shed", batch_share=0.5,
                    cotenant=CoTenantDemand(gib=np.array([0.001, 0.004])))
    e.add_requests(*_mixed_workload(7))
    e.run_until(2.0)
    twin = copy.deepcopy(e)
    for engine in (e, twin):
        engine.run_to_completion()
    assert [r.finish_s for r in twin.requests] == [r.finish_s for r in e.requests]
    assert twin.summary() == e.summary()


def test_set_knobs_applies_the_batch_share_and_the_admission_slack():
    # as the zero-share test: a batch request held at share 0 runs once set_knobs opens the tap
    e = make_engine(batch_share=0.0)
    assert e.knobs.batch_share == 0.0  # the config's start value is the knob's
    e.add_requests([0.0], [100], [1], [B])
    e.run_until(1.0)
    assert e.set_knobs(replace(e.knobs, batch_share=0.5)) == 0.0
    assert e.batch_share == 0.5
    e.run_to_completion()
    assert e.requests[0].finish_s == pytest.approx(1.110)
    # as _late_workload under shed, with slack 2: B (TTFT target 1 s) is late only at 2.001 s,
    # so it is served at 1.515 s (as under fcfs) and not shed; a slack set at 1.2 s to 1 sheds it
    # at once (late since 1.001 s)
    for slack, shed in ((2.0, 0), (1.0, 1)):
        e = make_engine(max_num_seqs=1, admission="shed", admission_slack=2.0)
        e.add_requests([0.0, 0.001, 0.5], [900, 100, 10], [50, 2, 2])
        e.run_until(1.2)
        e.set_knobs(replace(e.knobs, admission_slack=slack))
        assert e.admission_slack == slack and e.knobs.admission_slack == slack
        e.run_to_completion()
        e.check_invariants()
        assert e.summary().rejected_by_reason.get("shed", 0) == shed


def test_engine_config_and_knobs_set_the_class_and_admission_knobs_in_one_place():
    assert make_engine(admission_slack=0.5).knobs.admission_slack == 0.5
    profile = hand_profile()
    e = Engine(SimulatedExecutor(profile), Knobs(5.0, 2048, 0.5, batch_share=0.3))
    assert (e.batch_share, e.knobs.batch_share) == (0.3, 0.3)
    with pytest.raises(ValueError, match="^batch_share is 0.5 in the engine config but 0.3 in "
                                         "the knobs: set it in one place$"):
        Engine(SimulatedExecutor(profile), Knobs(5.0, 2048, 0.5, batch_share=0.3),
               EngineConfig(batch_share=0.5))


def test_interval_stats_carry_the_batch_deadline_margin_and_the_co_tenant_demand():
    # a batch request with a 10-s deadline arrives at 0 and is held (share 0): at 4 s its margin
    # is (10 - 4) / 10; the co-tenant wants 0.001 GiB of the 3,276,800 B left after the weights
    classes = {INT: DEFAULT_SLO_CLASSES[INT], B: SloTarget(1.0, 1.0, deadline_s=10.0)}
    e = make_engine(batch_share=0.0, slo_classes=classes,
                    cotenant=CoTenantDemand(gib=np.array([0.001])))
    iv = e.collect_interval()
    assert (iv.batch_deadline_margin, iv.batch_backlog_tokens) == (1.0, 0)
    e.add_requests([0.0], [100], [20], [B])
    e.run_until(4.0)
    iv = e.collect_interval()
    assert iv.batch_deadline_margin == pytest.approx(0.6)
    assert iv.batch_backlog_tokens == 120
    assert iv.cotenant_demand_fraction == pytest.approx(0.001 * GIB / 3_276_800)
