"""``ServingScheduler``: the knob scheduler with batchpilot's controller inside, for ``vllm
serve`` (``--scheduler-cls runtime.vllm.serve.scheduler.ServingScheduler``) and ``LLM(...,
scheduler_cls=...)``, in vLLM's engine-core process or in-process.

vLLM builds it in its engine core; it reads and checks the ``BATCHPILOT_VLLM_*`` settings there
(a bad one stops the start with a message naming it), configures the knob scheduler with them and
starts the controller (:mod:`runtime.vllm.serve.controller`) and its side port.

Threads. vLLM calls the scheduler from its engine-core thread; the controller's own thread ticks
while vLLM is idle and the side port reads the controller's counters. One lock (an ``RLock``)
covers every entry point vLLM calls (``add_request``, ``schedule``, ``update_from_output``,
``finish_requests``) and every tick, so the knobs change only between steps and never while
vLLM schedules. The model runs between ``schedule`` and ``update_from_output``, outside the
lock; the controller's thread ticks only when vLLM holds no request, so it never changes the
knobs of a step in flight.

Nothing batchpilot does can stop vLLM. The controller's faults are its own (static knobs held,
see the controller). A fault in the knobs' per-step application (the admission, the cap, the
accounting around vLLM's own scheduling) is caught too: it is logged once, every held request is
handed to vLLM's queue, every withheld block given back, vLLM's start-up token budget restored,
and from then on vLLM schedules on its own, as if started without batchpilot
(``batchpilot_vllm_passthrough`` is 1); vLLM's own exceptions are vLLM's and pass through.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

from runtime.engine.request import RejectReason
from runtime.vllm.scheduler import BatchpilotScheduler, StepPlan
from runtime.vllm.serve.controller import ServingController
from runtime.vllm.serve.settings import ServeSettings

log = logging.getLogger("batchpilot.vllm")


class ServingScheduler(BatchpilotScheduler):
    """vLLM's V1 scheduler under batchpilot's knobs, decided every interval inside vLLM."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._bp_serve(ServeSettings.from_environment())

    def _bp_serve(self, settings: ServeSettings) -> None:
        """Configure the knobs from ``settings`` and start the controller."""
        if getattr(self.scheduler_config, "async_scheduling", False):
            raise ValueError("batchpilot's scheduler steps vLLM synchronously: start vLLM with "
                             "--no-async-scheduling (batchpilot vllm-serve adds it)")
        self.bp_lock = threading.RLock()
        self.bp_passthrough = False
        self.bp_fault: str | None = None
        self.configure(settings.engine_config(), settings.static_knobs(),
                       hold_window=settings.hold_window)
        self.bp_controller = ServingController(self, settings)
        self.bp_controller.start(self.bp_lock)

    # ------------------------------------------------------------------ faults
    def _bp_failed(self, where: str, e: BaseException) -> None:
        """A fault in the knobs' per-step work: noted (logged once); the hand-back happens at
        the next step's start, between steps."""
        if self.bp_fault is None:
            self.bp_fault = f"{where}: {type(e).__name__}: {e}"[:300]
            log.error("batchpilot's knob application failed in %s (%s: %s); vLLM continues on "
                      "its own start-up scheduling", where, type(e).__name__, e)
            self.bp_controller.faults[f"{where}: {type(e).__name__}"] += 1
            self.bp_controller.last_fault = self.bp_fault

    def _bp_hand_back(self) -> None:
        """Leave vLLM to itself: held requests to its queue, withheld blocks to its pool, its
        start-up token budget."""
        self.bp_passthrough = True
        try:
            for queue in (self.bp_held, self.bp_late, self.bp_held_batch):
                while queue:
                    r = queue.popleft()
                    if r.request_id in self.requests and not r.is_finished():
                        self.waiting.add_request(r)
            self.bp_held_tokens = 0
            if self.bp_withheld:
                self.kv_cache_manager.block_pool.free_blocks(self.bp_withheld)
                self.bp_withheld = []
            self.max_num_scheduled_tokens = self.bp_startup_budget
        except Exception as e:  # noqa: BLE001
            log.error("handing vLLM back its requests and blocks failed (%s: %s)",
                      type(e).__name__, e)

    # ------------------------------------------------------------------ vLLM's entry points
    def add_request(self, request: Any) -> None:
        with self.bp_lock:
            if not self.bp_passthrough:
                try:
                    super().add_request(request)
                    return
                except Exception as e:  # noqa: BLE001
                    if request.request_id in self.requests:
                        raise  # vLLM's own add_request failed
                    self._bp_failed("add_request", e)
            Scheduler.add_request(self, request)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        with self.bp_lock:
            if self.bp_fault is not None and not self.bp_passthrough:
                self._bp_hand_back()
            plan: StepPlan | None = None
            if not self.bp_passthrough:
                controller = self.bp_controller
                if controller.due(self._bp_now()):
                    controller.tick()
                try:
                    plan = self._bp_plan()
                except Exception as e:  # noqa: BLE001
                    self._bp_failed("schedule", e)
                    self._bp_hand_back()
            if plan is None:
                return Scheduler.schedule(self, *args, **kwargs)
            try:
                out = Scheduler.schedule(self, *args, **kwargs)
            finally:
                self._bp_unhide(plan)
            try:
                self._bp_scheduled(out, plan)
            except Exception as e:  # noqa: BLE001
                self._bp_failed("schedule", e)
            return out

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        with self.bp_lock:
            if not self.bp_passthrough:
                self.bp_model_s = max(0.0, time.perf_counter() - self.bp_step_started_s)
            outputs = Scheduler.update_from_output(self, scheduler_output, model_runner_output)
            if not self.bp_passthrough and self.bp_fault is None:
                try:
                    return self._bp_outputs(outputs)
                except Exception as e:  # noqa: BLE001
                    self._bp_failed("update_from_output", e)
            try:
                return self._bp_emit_ends(outputs)
            except Exception as e:  # noqa: BLE001
                self._bp_failed("update_from_output", e)
                self.bp_emit = []
                return outputs

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        with self.bp_lock:
            done = Scheduler.finish_requests(self, request_ids, finished_status)
            if not self.bp_passthrough and self.bp_fault is None:
                try:
                    self._bp_finished(done)
                except Exception as e:  # noqa: BLE001
                    self._bp_failed("finish_requests", e)
            return done

    def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> None:
        Scheduler._preempt_request(self, request, *args, **kwargs)
        if not self.bp_passthrough and self.bp_fault is None:
            try:
                self._bp_preempted(request)
            except Exception as e:  # noqa: BLE001
                self._bp_failed("preemption", e)

    def _bp_end(self, request: Any, reason: RejectReason, held: bool = True) -> None:
        super()._bp_end(request, reason, held)
        if reason == RejectReason.SHED:
            self.bp_controller.note_shed(request.request_id)

    def shutdown(self) -> None:
        try:
            self.bp_controller.stop()
        finally:
            super().shutdown()

