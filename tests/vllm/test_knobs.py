"""Each knob's effect, seen in vLLM's own behaviour: the steps it schedules (the scheduler's step
log records what vLLM took, not what we asked), the blocks its pool holds, the requests it admits,
aborts and preempts."""

from __future__ import annotations

import dataclasses

import pytest

from runtime.engine.config import EngineConfig
from runtime.engine.request import Status
from runtime.engine.slo import SloTarget
from runtime.knobs import Knobs

LIMIT_S = 600.0
"""wall seconds a test's run may take to drain (the shared 2-core machines run vLLM's steps up to
ten times slower when busy)"""


def drain(engine, step_s: float = 0.05, max_s: float = LIMIT_S, at=None) -> None:
    """Run ``engine`` until every request has ended, calling ``at(t)`` before each slice."""
    t = 0.0
    while engine.has_work():
        t += step_s
        assert t < max_s, "the run did not drain"
        if at is not None:
            at(t)
        engine.run_until(t)


def test_chunk_caps_the_prefill_tokens_of_every_step(vllm_server):
    eng = vllm_server.engine(knobs=Knobs(5.0, 128, 0.95))
    eng.add_requests([0.0] * 6, [1500] * 6, [4] * 6)
    switched = []

    def at(t):
        if t >= 0.5 and not switched:
            switched.append(len(eng.scheduler.bp_steps))
            eng.set_knobs(Knobs(5.0, 1024, 0.95))

    drain(eng, at=at)
    steps = list(eng.scheduler.bp_steps)
    before, after = steps[:switched[0]], steps[switched[0]:]
    assert before and after
    assert max(s.prefill_tokens for s in before) <= 128
    assert max(s.prefill_tokens for s in after) <= 1024
    assert max(s.prefill_tokens for s in after) > 128  # the new budget took effect at once
    # decodes do not count against the chunk: a step carries the chunk plus its decodes
    assert all(s.num_tokens <= s.chunk + s.decode_seqs for s in steps)
    assert eng.summary().finished == 6
    # a chunk above vLLM's start-up budget is capped (and counted)
    capped = eng.scheduler.bp_chunk_capped
    eng.set_knobs(Knobs(5.0, 16384, 0.95))
    assert eng.scheduler.bp_chunk == eng.scheduler.bp_startup_budget
    assert eng.scheduler.bp_chunk_capped == capped + 1


def test_kv_cap_bounds_the_blocks_held_and_preempts_when_it_falls(vllm_server):
    eng = vllm_server.engine(knobs=Knobs(5.0, 2048, 0.95))
    sch = eng.scheduler
    pool = sch.kv_cache_manager.block_pool
    assert sch.bp_cap == sch.bp_pool_blocks and not sch.bp_withheld
    eng.add_requests([0.0] * 8, [1500] * 8, [40] * 8)
    t = 0.0
    while sum(r.first_token_s is not None for r in eng.requests) < 8:
        t += 0.05
        eng.run_until(t)
        assert t < LIMIT_S
    held = sch.used_blocks()
    low = Knobs(5.0, 2048, 0.4)
    cap = sch.cap_blocks(0.4)
    assert held > cap  # the cap falls below what requests hold
    eng.set_knobs(low)
    assert sch.used_blocks() <= cap
    assert sch.ledger.num_preemptions > 0
    assert len(sch.bp_withheld) == sch.bp_pool_blocks - cap
    drain(eng)
    assert all(s.used_blocks <= s.cap_blocks for s in sch.bp_steps)
    assert max(s.used_blocks for s in sch.bp_steps if s.t_s > t) <= cap
    eng.set_knobs(Knobs(5.0, 2048, 0.95))  # the withheld blocks go back to vLLM
    assert not sch.bp_withheld and pool.get_num_free_blocks() == sch.bp_pool_blocks
    s = eng.summary()
    assert (s.finished, s.rejected, s.preemptions) == (8, 0, sch.ledger.num_preemptions)


def test_the_adapter_refuses_a_wait_shrink_by_name(vllm_server):
    """The simulator may lend KV memory only as it frees (``kv_shrink="wait"``); the adapter's
    cap preempts, and says so rather than run a deployment it does not implement."""
    with pytest.raises(ValueError, match="kv_shrink 'wait': the vLLM adapter's KV cap preempts"):
        vllm_server.engine(config=EngineConfig(kv_shrink="wait"))


def test_window_holds_admission_until_it_expires_or_the_chunk_fills(vllm_server):
    eng = vllm_server.engine(knobs=Knobs(200.0, 2048, 0.95))
    eng.add_requests([0.0, 0.05, 0.1], [64] * 3, [2] * 3)
    drain(eng, step_s=0.02)
    first = [s for s in eng.scheduler.bp_steps if s.admitted][0]
    assert first.t_s >= 0.2  # the oldest waited the whole window
    assert len(first.admitted) == 3  # and all three went in together
    # prompts that fill the chunk are admitted at once
    eng = vllm_server.engine(knobs=Knobs(200.0, 128, 0.95))
    eng.add_requests([0.0], [300], [2])
    drain(eng, step_s=0.02)
    first = [s for s in eng.scheduler.bp_steps if s.admitted][0]
    assert first.t_s < 0.1


def test_a_released_window_admits_each_request_as_it_arrives(vllm_server):
    """With the window released, the 200 ms the knob says hold no request: each enters vLLM's
    queue at the first step after it arrives, as in vLLM without batchpilot."""
    eng = vllm_server.engine(knobs=Knobs(200.0, 2048, 0.95), hold_window=False)
    eng.add_requests([0.0, 0.05, 0.1], [64] * 3, [2] * 3)
    drain(eng, step_s=0.02)
    admitted = [s for s in eng.scheduler.bp_steps if s.admitted]
    assert admitted[0].t_s < 0.1 and len(admitted[0].admitted) == 1
    assert sum(len(s.admitted) for s in admitted) == 3 and len(admitted) >= 2
    assert eng.knobs.batch_window_ms == 200.0  # decided and reported, not applied
    assert eng.summary().finished == 3
    # the next engine on this vLLM holds it again by default
    assert vllm_server.engine().scheduler.bp_hold_window


def test_a_late_request_is_aborted_by_vllm_with_reason_shed(vllm_server):
    config = EngineConfig(slo_classes={"interactive": SloTarget(0.1, 1.0)},
                          default_slo_class="interactive", admission="shed")
    eng = vllm_server.engine(config, Knobs(5.0, 64, 0.95, admission_slack=0.5))
    eng.add_requests([0.0, 0.01, 0.02, 0.03], [6000, 200, 200, 200], [4] * 4)
    drain(eng)
    s = eng.summary()
    assert s.rejected_by_reason.get("shed", 0) >= 2
    shed = [r for r in eng.requests if r.reject_reason is not None]
    first = eng.requests[0]
    assert first.reject_reason is not None, (first, first.first_token_s)  # shed while prefilling
    assert any(r.req_id > 0 for r in shed)  # and waiting ones
    for r in shed:  # vLLM ended them itself, as aborted, and says why
        assert eng.endings[str(r.req_id)] == ("abort", "batchpilot:shed")
    assert s.finished + s.rejected == s.requests == 4
    assert s.slo_attainment < 1.0  # a shed request is a miss


CLASSES = {"interactive": SloTarget(2.0, 0.5), "batch": SloTarget(3600.0, 1.0, 3600.0)}


def test_batch_work_never_goes_ahead_of_interactive_work(vllm_server):
    config = EngineConfig(slo_classes=dict(CLASSES), default_slo_class="interactive")
    eng = vllm_server.engine(config, Knobs(5.0, 256, 0.95, batch_share=0.0))
    sch = eng.scheduler
    eng.add_requests([0.0] * 4 + [0.2, 0.25, 0.3], [800] * 4 + [400] * 3, [8] * 7,
                     ["batch"] * 4 + ["interactive"] * 3)
    t = 0.0
    while not (len(eng.requests) == 7 and all(
            r.status == Status.FINISHED for r in eng.requests if not r.is_batch)):
        t += 0.05
        eng.run_until(t)
        assert t < LIMIT_S
    batch = [r for r in eng.requests if r.is_batch]
    assert all(r.admitted_s is None for r in batch)  # share 0: the batch tap is shut
    eng.set_knobs(dataclasses.replace(eng.knobs, batch_share=0.5))
    now = eng.now
    eng.add_requests([now + 0.1, now + 0.15], [600, 600], [8, 8])  # interactive, during batch work
    drain(eng)
    steps = list(sch.bp_steps)
    assert not any(s.batch_before_interactive for s in steps)
    assert all(s.batch_prefill_tokens <= int(0.5 * s.chunk) for s in steps)
    assert max(s.batch_prefill_tokens for s in steps) > 0
    s = eng.summary()
    assert (s.finished, s.batch_requests, s.batch_met) == (9, 4, 4)
    assert eng.check_conservation() == {"batch": {"requests": 4, "finished": 4, "in_flight": 0},
                                        "interactive": {"requests": 5, "finished": 5,
                                                        "in_flight": 0}}


def test_batch_requests_are_preempted_first(vllm_server):
    config = EngineConfig(slo_classes=dict(CLASSES), default_slo_class="interactive")
    eng = vllm_server.engine(config, Knobs(5.0, 4096, 0.95))
    eng.add_requests([0.0] * 8, [1500] * 8, [40] * 8, ["batch", "interactive"] * 4)
    t = 0.0
    while sum(r.first_token_s is not None for r in eng.requests) < 8:
        t += 0.05
        eng.run_until(t)
        assert t < LIMIT_S
    eng.set_knobs(Knobs(5.0, 4096, 0.5))
    preempted = {r.slo_class for r in eng.requests if r.num_preemptions}
    assert preempted == {"batch"}
    drain(eng)
    assert eng.summary().finished == 8
