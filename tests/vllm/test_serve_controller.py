"""The serving controller on the session's in-process vLLM engine, stepped by vLLM's own
``LLMEngine.step()``: it decides on vLLM's clock, busy and idle; a controller that raises, or an
interval that cannot be closed, holds the static knobs with the cause logged once; a fault in the
knobs' per-step work leaves vLLM to its own scheduling. The scheduler vLLM runs is made the
serving one for a test (its class swapped, the controller started on it), and put back after."""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager

import pytest

from runtime.decider.failsafe import CONTROLLER_FAULT, FailSafe
from runtime.knobs import Knobs

LIMIT_S = 600.0


@contextmanager
def serving(vllm_server, **settings):
    """The session's vLLM with its scheduler serving under ``settings``."""
    from runtime.vllm.scheduler import BatchpilotScheduler
    from runtime.vllm.serve.scheduler import ServingScheduler
    from runtime.vllm.serve.settings import ServeSettings

    vllm_server.abort_leftovers()
    sch = vllm_server.scheduler
    sch.__class__ = ServingScheduler
    try:
        sch._bp_serve(ServeSettings(**{"metrics_port": 0, "timeline_s": 0, "reload_poll_s": 0,
                                       "policy_file": "", **settings}))
        yield sch
    finally:
        controller = getattr(sch, "bp_controller", None)
        if controller is not None:
            controller.stop()
        sch.__class__ = BatchpilotScheduler
        vllm_server.abort_leftovers()


def serve(vllm_server, prompts, outputs) -> list:
    """Hand vLLM requests (as its API server does) and step it until they end; their outputs."""
    from vllm import SamplingParams

    eng = vllm_server.llm_engine
    for i, (p, o) in enumerate(zip(prompts, outputs)):
        eng.add_request(f"serve-{time.monotonic_ns()}-{i}",
                        {"prompt_token_ids": [5 + (i + j) % 1000 for j in range(p)]},
                        SamplingParams(max_tokens=o, ignore_eos=True, detokenize=False))
    ended = []
    deadline = time.time() + LIMIT_S
    while eng.has_unfinished_requests():
        ended += [out for out in eng.step() if out.finished]
        assert time.time() < deadline
    return ended


def ticked(controller, since: int, timeout_s: float = 10.0) -> None:
    """Wait until the controller has closed an interval after its ``since``-th (while vLLM is
    idle its own thread does, at the next grid point)."""
    deadline = time.time() + timeout_s
    while controller.num_ticks <= since:
        assert time.time() < deadline, "the controller closed no interval"
        time.sleep(0.02)


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def captured():
    """What the controller and the fail-safe log."""
    logs = [logging.getLogger("batchpilot.vllm"), logging.getLogger("runtime.decider.failsafe")]
    handler = _Capture()
    for log in logs:
        log.addHandler(handler)
    try:
        yield handler.lines
    finally:
        for log in logs:
            log.removeHandler(handler)


def test_it_decides_every_interval_busy_and_idle(vllm_server):
    with serving(vllm_server, controller="pid", interval_s=0.1) as sch:
        c = sch.bp_controller
        t0 = c.clock()
        ended = serve(vllm_server, [400] * 6, [24] * 6)
        assert len(ended) == 6 and all(o.outputs[0].finish_reason == "length" for o in ended)
        busy = c.num_ticks
        time.sleep(0.6)  # nothing to serve: the controller's thread decides
        assert c.idle_ticks >= 3 and c.num_ticks > busy
        elapsed = c.clock() - t0
        # once an interval (a step is never cut: a long one may hold two grid points back)
        assert c.num_ticks <= elapsed / 0.1 + 2
        assert c.by_source["pid"] == c.num_ticks and c.last.source == "pid"
        assert c.totals.arrivals == 6
        assert c.totals.finished == 6 and c.totals.decode_tokens > 0
        assert sch.bp_steps  # the knobs were applied at vLLM's steps


@pytest.mark.parametrize("hold", [True, False])
def test_the_window_setting_holds_or_releases_new_requests(vllm_server, hold):
    """``BATCHPILOT_VLLM_HOLD_WINDOW``: held, a new request waits the window (200 ms) before
    vLLM's queue; released, it enters at vLLM's next step, whatever the knob says."""
    with serving(vllm_server, controller="static", static_batch_window_ms=200.0,
                 hold_window=hold) as sch:
        t0 = sch._bp_now()
        assert len(serve(vllm_server, [32], [2])) == 1
        first = next(s for s in sch.bp_steps if s.admitted and s.t_s >= t0)
        waited = first.t_s - t0
        assert waited >= 0.2 if hold else waited < 0.2
        assert sch.bp_controller.state()["window_held"] is hold
        assert sch.knobs.batch_window_ms == 200.0


def test_the_policys_fallback_pid_is_bound_around_the_served_static_knobs(vllm_server):
    """With no policy to load the policy controller decides with the PID, and that PID holds
    the served static slack (0.5 here), as the ``pid`` controller does: it held the static
    default's 1."""
    with serving(vllm_server, controller="policy", interval_s=0.1,
                 static_admission_slack=0.5) as sch:
        c = sch.bp_controller
        ticked(c, c.num_ticks)
        assert c.last.source == "pid"
        assert c.last.knobs.admission_slack == 0.5


def test_a_controller_that_raises_holds_the_static_knobs(vllm_server, captured):
    class Raises:
        def decide(self, observation):
            raise RuntimeError("the controller broke")

    static = Knobs(5.0, 512, 0.8)
    with serving(vllm_server, controller="pid", static_prefill_chunk_tokens=512,
                 static_kv_cache_ratio=0.8) as sch:
        c = sch.bp_controller
        sch.set_knobs(Knobs(50.0, 4096, 0.5))  # somewhere else, as a controller left them
        c.decider = FailSafe(Raises(), static)
        ticks = c.num_ticks
        ended = serve(vllm_server, [300] * 4, [16] * 4)
        assert len(ended) == 4 and all(o.outputs[0].finish_reason == "length" for o in ended)
        # on a fast machine the requests end within an interval: the next tick is the idle one
        ticked(c, ticks)
        assert sch.knobs == static and c.last.source == "static"
        assert c.last.reason == CONTROLLER_FAULT and c.by_reason[CONTROLLER_FAULT] >= 1
        assert sum("the controller broke" in line for line in captured) == 1  # once
        # a fault in the loop itself (the interval cannot be closed): the same
        sch.set_knobs(Knobs(50.0, 4096, 0.5))
        sch.collect_interval = lambda: 1 / 0
        try:
            ticks = c.num_ticks
            ended = serve(vllm_server, [300] * 4, [16] * 4)
            ticked(c, ticks)
        finally:
            del sch.collect_interval
        assert len(ended) == 4
        assert sch.knobs == static and c.faults["ZeroDivisionError"] >= 1
        assert sum("ZeroDivisionError" in line for line in captured) == 1


def test_a_reload_asked_for_during_the_file_watch_loads_once(vllm_server, tmp_path):
    """The watch reads the file's signature, then compares it with the one the last reload left.
    A reload of another file asked for in between must not make the watch load that file a
    second time: the watch pauses after its read while the reload is asked for."""
    import shutil
    import threading

    from tests.conftest import FIXTURES

    for name in ("policy-test-1.onnx", "policy-test-2.onnx"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    with serving(vllm_server, policy_dir=tmp_path, policy_file="policy-test-1.onnx") as sch:
        c = sch.bp_controller
        read, go = threading.Event(), threading.Event()
        signature = c._file_signature

        def paused_signature():
            sig = signature()
            if threading.current_thread().name == "watch":
                read.set()
                go.wait(5.0)
            return sig

        c._file_signature = paused_signature
        ok = c.reloads["ok"]
        watch = threading.Thread(target=c.check_policy_file, name="watch")
        watch.start()
        assert read.wait(5.0)
        asked = threading.Thread(target=lambda: c.reload("policy-test-2.onnx"))
        asked.start()
        time.sleep(0.2)  # the asked-for reload runs now, unless the watch holds it off
        go.set()
        watch.join(10.0)
        asked.join(10.0)
        assert c.reloads["ok"] == ok + 1, dict(c.reloads)
        assert c.guarded.policy.policy_version == "test-2"


def test_a_fault_in_the_knobs_per_step_work_leaves_vllm_to_itself(vllm_server, captured):
    with serving(vllm_server, controller="static", static_kv_cache_ratio=0.5) as sch:
        assert sch.bp_withheld  # the cap withholds blocks
        sch._bp_arrange = lambda: 1 / 0
        try:
            ended = serve(vllm_server, [300] * 5, [12] * 5)
        finally:
            del sch._bp_arrange
        assert len(ended) == 5 and all(o.outputs[0].finish_reason == "length" for o in ended)
        assert sch.bp_passthrough and sch.bp_fault is not None
        assert not sch.bp_withheld and sch.max_num_scheduled_tokens == sch.bp_startup_budget
        assert sum("knob application failed" in line for line in captured) == 1
        assert sch.bp_controller.state()["passthrough"] is True
    assert type(vllm_server.scheduler).__name__ == "BatchpilotScheduler"
