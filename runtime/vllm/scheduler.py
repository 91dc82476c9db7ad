"""``BatchpilotScheduler``: vLLM's V1 scheduler with batchpilot's five knobs applied at every step.

vLLM fixes its batching at start-up; this subclass of ``vllm.v1.core.sched.scheduler.Scheduler``
holds the knob state and applies it around vLLM's own ``schedule()``, so every token vLLM
schedules, every block it allocates and every preemption it makes are vLLM's, under our limits.
It needs nothing but vLLM's engine core around it: ``LLM(..., scheduler_cls=SCHEDULER_CLS,
scheduling_policy="priority")`` in-process, or ``--scheduler-cls`` with ``vllm serve``, where it
runs in the engine-core process. How each knob is applied (docs/vllm.md has the same table):

==================== ==========================================================================
knob                 mechanism
==================== ==========================================================================
prefill_chunk_tokens the token budget ``max_num_scheduled_tokens``, set before every step to the
                     chunk plus one token per running decode (so that, as in the simulator,
                     decodes do not count against the chunk), capped at the start-up
                     ``max_num_batched_tokens`` (a larger chunk is capped, and counted in
                     ``chunk_capped``)
kv_cache_ratio       a cap on the KV blocks vLLM may hold: ``pool * ratio / POOL_RATIO`` (the pool
                     vLLM allocated at start-up is the cap at the top of the knob's range), the
                     rest withheld from vLLM's block pool (``get_new_blocks``) and given back
                     (``free_blocks``) when the cap rises; when it falls below what requests
                     hold, the newest requests (batch first) are preempted, as the simulator
                     does. This caps use; it does not give memory back to the device.
batch_window_ms      a new request is held out of vLLM's waiting queue until the oldest held one
                     has waited the window or the held prompts fill the chunk; with the window
                     released (``configure(..., hold_window=False)``) it enters vLLM's queue at
                     once, as in vLLM on its own, and the knob is decided but not applied
batch_share          interactive requests go first (vLLM's priority scheduling: class rank as
                     the priority, so batch work is also the first preempted); batch requests
                     enter vLLM's queue only when no interactive one waits, while the running
                     batch requests stay under ``batch_share * max_num_seqs`` and their blocks
                     under ``batch_share`` of the cap; batch prefill gets at most
                     ``batch_share * chunk`` tokens a step, and none while interactive requests
                     wait for admission (running batch prefills are left out of that step)
admission_slack      under admission ``shed``, an interactive request late for its first token
                     (waited ``slack`` TTFT targets, or prefilling past its target) is finished
                     by vLLM as aborted, its reason ``shed`` (``stop_reason`` says
                     ``batchpilot:shed``); ``late_to_back`` holds it behind on-time requests; a
                     batch request whose deadline passes while it waits ends ``expired``
==================== ==========================================================================

The accounting (:class:`runtime.vllm.accounting.Ledger`: the engine's outcome and SLO code) is
kept here, from vLLM's own state, so that an interval can be closed and observed wherever this
class runs: :meth:`BatchpilotScheduler.collect_interval` returns the same
:class:`runtime.engine.metrics.IntervalStats` as the simulator's engine.

vLLM internals it touches (not public: :mod:`runtime.vllm.versions` pins the versions):
``max_num_scheduled_tokens``, ``running``, ``waiting`` (a ``PriorityRequestQueue``),
``requests``, ``kv_cache_manager.block_pool`` (``get_new_blocks``, ``free_blocks``,
``get_num_free_blocks``, ``num_gpu_blocks``), ``_enqueue_waiting_request``, ``_preempt_request``,
``finish_requests``, ``get_request_counts``, ``has_requests``, ``update_from_output`` and
``EngineCoreOutput``/``EngineCoreOutputs``, ``Request.priority``, ``num_computed_tokens``,
``num_tokens_with_spec``, ``num_output_placeholders``, ``num_output_tokens``,
``sampling_params.extra_args``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.request import Request as VllmRequest
from vllm.v1.request import RequestStatus

from runtime.engine.admission import AdmissionPolicy
from runtime.engine.config import KV_SHRINK_PREEMPT, EngineConfig
from runtime.engine.metrics import IntervalStats, RunSummary
from runtime.engine.request import RejectReason, Request, Status
from runtime.knobs import DEFAULT_KNOBS, KNOB_SPEC_BY_NAME, Knobs
from runtime.vllm.accounting import Ledger
from runtime.vllm.versions import check_vllm_version

POOL_RATIO = KNOB_SPEC_BY_NAME["kv_cache_ratio"].high
"""the ``kv_cache_ratio`` that vLLM's whole start-up pool stands for (the top of the knob's
range): ratio ``r`` caps the blocks vLLM may hold at ``pool * r / POOL_RATIO``"""

BATCH_PRIORITY = 1
"""vLLM priority of batch-class requests (interactive ones get 0: lower runs first)"""

STEP_LOG = 4096
"""step records the scheduler keeps (the most recent)"""

STOP_REASON_PREFIX = "batchpilot:"
"""``stop_reason`` of a request the scheduler ended itself, before its reason (``shed``,
``expired``, ``exceeds_kv_capacity``)"""


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One vLLM step as the scheduler planned it: what the knobs allowed and what vLLM took."""

    t_s: float
    """when it was scheduled, on the scheduler's clock"""
    budget: int
    """the token budget the step had (``max_num_scheduled_tokens``)"""
    chunk: int
    """the prefill chunk in force (after the start-up cap)"""
    prefill_tokens: int
    """prefill tokens scheduled (recompute after preemption included)"""
    batch_prefill_tokens: int
    """of those, batch-class ones"""
    decode_seqs: int
    decode_ctx_tokens: int
    prefill_attn_pairs: int
    num_tokens: int
    """every token scheduled"""
    used_blocks: int
    """KV blocks requests held when the step was scheduled"""
    cap_blocks: int
    """the KV cap in force"""
    admitted: tuple[int, ...]
    """requests (our ids) that entered ``running`` in this step"""
    batch_before_interactive: bool
    """whether a batch request got prefill tokens while an interactive one waited in vLLM's
    queue, or while interactive prefill got less than it could take (never, by the rules
    above)"""
    preemptions: int
    """preemptions counted so far (all of the scheduler's life)"""

    def features(self) -> tuple[float, float, float, float, float]:
        """The cost model's feature row (see :mod:`runtime.engine.profiling`)."""
        return (1.0, float(self.prefill_tokens), float(self.prefill_attn_pairs),
                float(self.decode_seqs), float(self.decode_ctx_tokens))


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What the knobs set up for one step before vLLM schedules it."""

    now: float
    hidden: list[VllmRequest]
    """batch prefills left out of this step (put back once vLLM has scheduled it)"""
    budget: int
    i_waiting: bool
    used: int


class _Clock:
    """Seconds since the scheduler started (monotonic)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self) -> float:
        return time.monotonic() - self.t0


class KnobSchedulerMixin:
    """The knob state and its application; mixed into vLLM's ``Scheduler`` (and
    ``AsyncScheduler``) below. Every attribute of its own starts with ``bp_``."""

    # the vLLM attributes it uses (set by vLLM's Scheduler.__init__)
    running: list[VllmRequest]
    waiting: Any
    requests: dict[str, VllmRequest]
    max_num_scheduled_tokens: int
    scheduler_config: Any
    kv_cache_manager: Any
    block_size: int
    policy: SchedulingPolicy
    _holds_kv_blocks: Callable[[VllmRequest], bool]
    _is_blocked_waiting_status: Callable[[RequestStatus], bool]

    def _bp_init(self) -> None:
        check_vllm_version()
        if self.policy != SchedulingPolicy.PRIORITY:
            raise ValueError("batchpilot's scheduler needs vLLM's priority scheduling (it ranks "
                             "interactive work before batch work): start vLLM with "
                             "scheduling_policy='priority' (--scheduling-policy priority)")
        self.bp_startup_budget = int(self.scheduler_config.max_num_batched_tokens)
        self.bp_max_num_seqs = int(self.scheduler_config.max_num_seqs)
        pool = self.kv_cache_manager.block_pool
        self.bp_pool_blocks = int(pool.num_gpu_blocks) - 1  # vLLM keeps one as its null block
        self.bp_withheld: list[Any] = []
        self.bp_held: deque[VllmRequest] = deque()  # interactive, on time, not yet released
        self.bp_late: deque[VllmRequest] = deque()  # interactive, late (late_to_back)
        self.bp_held_batch: deque[VllmRequest] = deque()
        self.bp_held_tokens = 0
        self.bp_meta: dict[str, Request] = {}
        self.bp_ids: dict[int, str] = {}
        self.bp_expected: dict[str, Request] = {}
        self.bp_reasons: dict[str, RejectReason] = {}
        self.bp_emit: list[VllmRequest] = []
        self.bp_holding = False
        self.bp_steps: deque[StepRecord] = deque(maxlen=STEP_LOG)
        self.bp_chunk_capped = 0
        self.bp_last_step: StepRecord | None = None
        self.bp_step_started_s = 0.0
        self.bp_model_s = 0.0
        self.bp_overhead_s = 0.0
        """wall seconds spent in this class's own work inside vLLM's steps (knobs, accounting),
        summed: what plain vLLM would not spend"""
        self.configure(EngineConfig(), DEFAULT_KNOBS)

    # ------------------------------------------------------------------ settings
    def configure(self, config: EngineConfig, knobs: Knobs, *,
                  clock: Callable[[], float] | None = None,
                  kv_block_bytes: int | None = None, hold_window: bool = True) -> None:
        """Start afresh with these SLO classes, admission policy and knobs (no request may be in
        flight): the accounting is reset. ``clock``: seconds on the caller's clock (default:
        monotonic seconds since now); ``kv_block_bytes``: for the KV GiB-seconds (default: from
        vLLM's KV cache config); ``hold_window`` False releases the window: a new request enters
        vLLM's queue at once, as it does without batchpilot, whatever ``batch_window_ms`` says
        (the knob's floor of 5 ms is a hold vLLM itself never makes)."""
        if getattr(self, "bp_meta", None) and any(
                r.status < Status.FINISHED for r in self.bp_meta.values()):
            raise RuntimeError("configure() with requests in flight")
        if config.kv_shrink != KV_SHRINK_PREEMPT:
            raise ValueError(f"EngineConfig.kv_shrink {config.kv_shrink!r}: the vLLM adapter's "
                             f"KV cap preempts when it falls below what requests hold "
                             f"({KV_SHRINK_PREEMPT!r}); {config.kv_shrink!r} is the simulator's")
        knobs = config.start_knobs(knobs)
        self.bp_config = config
        self.bp_hold_window = hold_window
        self.bp_clock = clock if clock is not None else _Clock()
        if kv_block_bytes is None:
            kv_block_bytes = _kv_block_bytes(getattr(self, "kv_cache_config", None))
        self.bp_kv_block_bytes = kv_block_bytes
        self.ledger = Ledger(config, knobs.admission_slack, kv_block_bytes)
        self.ledger.now = self.bp_clock()
        self.ledger._mem_t = self.ledger.now
        self.ledger._interval = IntervalStats(start_s=self.ledger.now)
        self.bp_meta = {}
        self.bp_ids = {}
        self.bp_knobs = DEFAULT_KNOBS
        self.bp_cap = self.bp_pool_blocks
        self.bp_steps.clear()
        self.set_knobs(knobs, force=True)

    def set_knobs(self, knobs: Knobs, *, force: bool = False) -> float:
        """Apply the knobs now (between steps); returns the wall seconds it took (a KV cap
        below what requests hold preempts at once)."""
        t0 = time.perf_counter()
        old = self.bp_knobs
        if knobs == old and not force:
            return 0.0
        self.bp_knobs = knobs
        self.bp_chunk = min(knobs.prefill_chunk_tokens, self.bp_startup_budget)
        if knobs.prefill_chunk_tokens > self.bp_startup_budget:
            self.bp_chunk_capped += 1
        self.ledger.now = self.bp_clock()
        if knobs.admission_slack != old.admission_slack or force:
            self.ledger.set_slack(knobs.admission_slack, self._bp_waiting_meta())
        cap = self.cap_blocks(knobs.kv_cache_ratio)
        if cap != self.bp_cap or force:
            self.bp_cap = cap
            self.ledger.set_kv_blocks(cap)
            self._bp_enforce_cap()
        return time.perf_counter() - t0

    def set_admission(self, admission: str, slack: float | None = None) -> None:
        """Change the admission policy now (and, when given, the slack knob)."""
        import dataclasses

        slack = self.bp_knobs.admission_slack if slack is None else slack
        self.bp_config = dataclasses.replace(self.bp_config, admission=admission,
                                             admission_slack=slack)  # checks both
        self.ledger.policy = AdmissionPolicy(admission)
        self.ledger.slack = math.nan  # every waiting request gets its lateness event anew
        self.set_knobs(dataclasses.replace(self.bp_knobs, admission_slack=slack), force=True)

    @property
    def knobs(self) -> Knobs:
        return self.bp_knobs

    def cap_blocks(self, kv_cache_ratio: float) -> int:
        """The KV blocks vLLM may hold at this ratio (at least one)."""
        return max(1, min(self.bp_pool_blocks,
                          math.floor(self.bp_pool_blocks * kv_cache_ratio / POOL_RATIO + 1e-9)))

    def expect(self, r: Request) -> None:
        """Register the request that vLLM will be given the id ``str(r.req_id)`` (a replay knows
        its class and arrival time); unregistered requests are classed by their sampling
        params' ``extra_args["slo_class"]`` and arrive when vLLM hands them over."""
        self.bp_expected[str(r.req_id)] = r

    # ------------------------------------------------------------------ vLLM's entry points
    def add_request(self, request: VllmRequest) -> None:
        new = request.request_id not in self.requests
        if new:
            now = self._bp_now()
            meta = self.bp_expected.pop(_given_id(request.request_id), None)
            if meta is None:
                meta = self._bp_classify(request, now)
            request.priority = BATCH_PRIORITY if meta.is_batch else 0
            self.bp_meta[request.request_id] = meta
            self.bp_ids[meta.req_id] = request.request_id
            if meta.status == Status.PENDING:
                self.ledger.arrive(meta)
            self.bp_holding = True
        try:
            super().add_request(request)  # type: ignore[misc]
        finally:
            self.bp_holding = False

    def _enqueue_waiting_request(self, request: VllmRequest) -> None:
        if self.bp_holding and not self._holds_kv_blocks(request) \
                and not self._is_blocked_waiting_status(request.status):
            if request.priority == BATCH_PRIORITY:
                self.bp_held_batch.append(request)
            else:
                self.bp_held.append(request)
                self.bp_held_tokens += request.num_prompt_tokens
            return
        super()._enqueue_waiting_request(request)  # type: ignore[misc]

    def get_request_counts(self) -> tuple[int, int]:
        running, waiting = super().get_request_counts()  # type: ignore[misc]
        return running, waiting + self._bp_num_held()

    def has_requests(self) -> bool:
        return bool(self.bp_emit) or super().has_requests()  # type: ignore[misc]

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        plan = self._bp_plan()
        try:
            out = super().schedule(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._bp_unhide(plan)
        self._bp_scheduled(out, plan)
        return out

    def _bp_plan(self) -> StepPlan:
        """The knobs before vLLM's own scheduling: admission, the KV cap, the window, the
        classes' order and the token budget."""
        t0 = time.perf_counter()
        now = self._bp_now()
        self.prepare()
        hidden, budget, i_waiting = self._bp_arrange()
        used = self.bp_pool_blocks - self._bp_free() - len(self.bp_withheld)
        self.bp_step_started_s = time.perf_counter()
        self.bp_overhead_s += self.bp_step_started_s - t0
        return StepPlan(now, hidden, budget, i_waiting, used)

    def _bp_unhide(self, plan: StepPlan) -> None:
        """Put back the batch prefills left out of the step (vLLM has scheduled it)."""
        if plan.hidden:
            self.running.extend(plan.hidden)

    def _bp_scheduled(self, out: Any, plan: StepPlan) -> None:
        """What vLLM scheduled, into the accounting and the step log."""
        t2 = time.perf_counter()
        self._bp_after_schedule(out, plan.now, plan.budget, plan.used, plan.i_waiting)
        self.bp_overhead_s += time.perf_counter() - t2

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        self.bp_model_s = time.perf_counter() - self.bp_step_started_s
        outputs = super().update_from_output(scheduler_output,  # type: ignore[misc]
                                             model_runner_output)
        return self._bp_outputs(outputs)

    def _bp_outputs(self, outputs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self._bp_account_outputs(outputs)
        finally:
            self.bp_overhead_s += time.perf_counter() - t0

    def _bp_account_outputs(self, outputs: Any) -> Any:
        """The ledger's view of a step's outputs, and the ends the scheduler decided."""
        self.ledger.now = self._bp_now()
        self.ledger.interval.busy_s += self.bp_model_s
        for eco in outputs.values():
            for out in eco.outputs:
                meta = self.bp_meta.get(out.request_id)
                if meta is None:
                    continue
                if out.new_token_ids:
                    self.ledger.sampled(meta, len(out.new_token_ids))
                if out.finish_reason is not None:
                    self.bp_meta.pop(out.request_id, None)
                    self.bp_ids.pop(meta.req_id, None)
                    if out.finish_reason in (FinishReason.LENGTH, FinishReason.STOP):
                        self.ledger.finished(meta)
                    else:
                        self.ledger.rejected(meta, RejectReason.ABORTED)
        return self._bp_emit_ends(outputs)

    def _bp_emit_ends(self, outputs: Any) -> Any:
        """Add to a step's outputs the end of every request the scheduler ended itself: vLLM's
        abort, with our reason as its ``stop_reason``, so that its client learns why."""
        if self.bp_emit:
            for request in self.bp_emit:
                reason = self.bp_reasons.pop(request.request_id, RejectReason.ABORTED)
                eco = outputs.get(request.client_index)
                if eco is None:
                    eco = outputs[request.client_index] = EngineCoreOutputs()
                eco.outputs = [*eco.outputs, EngineCoreOutput(
                    request_id=request.request_id, new_token_ids=[],
                    finish_reason=FinishReason.ABORT,
                    stop_reason=f"{STOP_REASON_PREFIX}{reason.value}")]
            self.bp_emit = []
        return outputs

    def _preempt_request(self, request: VllmRequest, *args: Any, **kwargs: Any) -> None:
        super()._preempt_request(request, *args, **kwargs)  # type: ignore[misc]
        self._bp_preempted(request)

    def _bp_preempted(self, request: VllmRequest) -> None:
        meta = self.bp_meta.get(request.request_id)
        if meta is not None:
            self.ledger.preempted(meta)

    def finish_requests(self, request_ids: Any, finished_status: RequestStatus) -> Any:
        done = super().finish_requests(request_ids, finished_status)  # type: ignore[misc]
        self._bp_finished(done)
        return done

    def _bp_finished(self, done: Iterable[VllmRequest]) -> None:
        """Requests vLLM finished on a signal from outside (an abort, or the scheduler's own
        end of a request): out of the held queues, into the accounting with their reason."""
        for request in done:
            self._bp_unhold(request)
            meta = self.bp_meta.pop(request.request_id, None)
            reason = self.bp_reasons.get(request.request_id, RejectReason.ABORTED)
            if meta is not None:
                self.bp_ids.pop(meta.req_id, None)
                self.ledger.now = self._bp_now()
                self.ledger.rejected(meta, reason)

    # ------------------------------------------------------------------ the knobs at a step
    def prepare(self) -> None:
        """Apply the admission policy, the KV cap and the admission window now: what
        ``schedule()`` does before vLLM's own scheduling (a replay calls it to learn whether a
        step has anything to do)."""
        self.ledger.now = self._bp_now()
        late, expired = self.ledger.due()
        policy = self.ledger.policy
        for meta in late:
            request = self._bp_vllm(meta)
            if request is None:
                continue
            if request.status == RequestStatus.RUNNING:
                if policy == AdmissionPolicy.SHED and \
                        self.ledger.now - meta.arrival_s >= meta.ttft_target_s:
                    self._bp_end(request, RejectReason.SHED)
            elif policy == AdmissionPolicy.SHED:
                self._bp_end(request, RejectReason.SHED)
            elif not meta.is_late:  # late_to_back: behind the on-time requests
                if not self._bp_unhold(request):
                    self.waiting.remove_requests([request])
                self.bp_late.append(request)
                self.ledger.moved_back(meta)
        for meta in expired:
            request = self._bp_vllm(meta)
            if request is not None and request.status != RequestStatus.RUNNING:
                self._bp_end(request, RejectReason.EXPIRED)
        self._bp_enforce_cap()
        self._bp_release()

    def runnable(self) -> bool:
        """Whether a step now would do anything: a request running or admitted to vLLM's queue,
        or an end to report."""
        return bool(self.running or self.waiting or self.bp_emit)

    def next_event_s(self) -> float:
        """When the held requests next change without a step: the window of the oldest held
        interactive request expires, or a deadline passes that the admission policy acts on
        (inf when none is ahead)."""
        wake = math.inf
        if self.bp_held:
            meta = self.bp_meta.get(self.bp_held[0].request_id)
            if meta is not None:
                wake = meta.arrival_s + self._bp_window_s()
        if self.bp_late:
            wake = self.ledger.now
        if self.ledger.policy != AdmissionPolicy.FCFS or self.bp_held_batch:
            wake = min(wake, self.ledger.next_deadline_s())
        return wake

    def _bp_window_s(self) -> float:
        """How long a new interactive request is held: the window knob, or 0 released."""
        return self.bp_knobs.batch_window_ms * 1e-3 if self.bp_hold_window else 0.0

    def _bp_arrange(self) -> tuple[list[VllmRequest], int, bool]:
        """Order ``running`` for vLLM's budget loop (decodes, then interactive prefill, then
        batch prefill), set the budget, and leave out the batch prefills that must not run this
        step. Returns (those left out, the budget, whether interactive requests wait in vLLM's
        queue)."""
        decodes: list[VllmRequest] = []
        i_prefill: list[VllmRequest] = []
        b_prefill: list[VllmRequest] = []
        i_demand = 0
        for r in self.running:
            todo = r.num_tokens_with_spec + r.num_output_placeholders - r.num_computed_tokens
            if r.num_output_tokens > 0 and todo <= 1:
                decodes.append(r)
            elif r.priority == BATCH_PRIORITY:
                b_prefill.append(r)
            else:
                i_prefill.append(r)
                i_demand += todo
        chunk = self.bp_chunk
        i_waiting = any(r.priority != BATCH_PRIORITY for r in self.waiting)
        hidden: list[VllmRequest] = []
        if i_waiting:
            hidden, b_prefill = b_prefill, []
            prefill_budget = chunk
        else:
            prefill_budget = min(chunk, i_demand + int(self.bp_knobs.batch_share * chunk))
        self.running[:] = decodes + i_prefill + b_prefill
        budget = max(1, min(self.bp_startup_budget, len(decodes) + prefill_budget))
        self.max_num_scheduled_tokens = budget
        self.bp_i_demand = min(i_demand, chunk)
        return hidden, budget, i_waiting

    def _bp_after_schedule(self, out: Any, now: float, budget: int, used: int,
                           i_waiting: bool) -> None:
        admitted = []
        for r in self.running:
            meta = self.bp_meta.get(r.request_id)
            if meta is not None and meta.status != Status.RUNNING:
                self.ledger.admitted(meta)
                admitted.append(meta.req_id)
        prefill = batch_prefill = decodes = ctx = pairs = 0
        for req_id, n in out.num_scheduled_tokens.items():
            r = self.requests.get(req_id)
            if r is None:
                continue
            start = r.num_computed_tokens - n  # vLLM advanced it already
            if n == 1 and r.num_output_tokens > 0 and start == r.num_tokens - 1:
                decodes += 1
                ctx += start + 1
            else:
                prefill += n
                pairs += n * start + n * (n + 1) // 2
                if r.priority == BATCH_PRIORITY:
                    batch_prefill += n
        total = int(out.total_num_scheduled_tokens)
        if total:
            self.ledger.num_iterations += 1
            iv = self.ledger.interval
            iv.iterations += 1
            iv.prefill_tokens += prefill
            iv.decode_tokens += decodes
        # batch prefill ahead of interactive work: while an interactive request waited in vLLM's
        # queue, or while interactive prefill got less than it could take
        ahead = bool(batch_prefill) and (
            i_waiting or prefill - batch_prefill < getattr(self, "bp_i_demand", 0))
        rec = StepRecord(now, budget, self.bp_chunk, prefill, batch_prefill, decodes, ctx, pairs,
                         total, used, self.bp_cap, tuple(admitted), ahead,
                         self.ledger.num_preemptions)
        self.bp_last_step = rec
        if total:
            self.bp_steps.append(rec)

    # ------------------------------------------------------------------ the KV cap
    def _bp_free(self) -> int:
        return int(self.kv_cache_manager.block_pool.get_num_free_blocks())

    def _bp_enforce_cap(self) -> None:
        """Withhold blocks from vLLM's pool so that requests hold at most the cap, preempting
        the newest (batch first) when they hold more; give blocks back when the cap rises."""
        pool = self.kv_cache_manager.block_pool
        target = self.bp_pool_blocks - self.bp_cap
        held = len(self.bp_withheld)
        if held > target:
            give = self.bp_withheld[target:]
            del self.bp_withheld[target:]
            pool.free_blocks(give)
            return
        need = target - held
        while need > self._bp_free() and self.running:
            victim = max(self.running, key=lambda r: (r.priority, r.arrival_time))
            self.running.remove(victim)
            self._preempt_request(victim, time.monotonic())
        take = min(need, self._bp_free())
        if take > 0:
            self.bp_withheld.extend(pool.get_new_blocks(take))

    def _bp_blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ------------------------------------------------------------------ admission
    def _bp_release(self) -> None:
        """Hand held requests to vLLM's waiting queue under the window and the class rules."""
        now = self.ledger.now
        knobs = self.bp_knobs
        if self.bp_held:
            first = self.bp_meta.get(self.bp_held[0].request_id)
            due = first is None or now >= first.arrival_s + self._bp_window_s()
            if due or self.bp_held_tokens >= self.bp_chunk:
                self._bp_hand_over(self.bp_held)
                self.bp_held_tokens = 0
        if self.bp_late and not self.bp_held and not any(
                r.priority != BATCH_PRIORITY and not self._bp_is_late(r) for r in self.waiting):
            self._bp_hand_over(self.bp_late)
        if self.bp_held_batch and not self.bp_held and not self.bp_late and not any(
                r.priority != BATCH_PRIORITY for r in self.waiting):
            share = knobs.batch_share
            slots = int(share * self.bp_max_num_seqs)
            blocks = int(share * self.bp_cap)
            in_batch = [r for r in self.running if r.priority == BATCH_PRIORITY]
            in_batch += [r for r in self.waiting if r.priority == BATCH_PRIORITY]
            n = len(in_batch)
            held_blocks = sum(self._bp_blocks(r.num_computed_tokens) for r in in_batch)
            while self.bp_held_batch and n < slots:
                r = self.bp_held_batch[0]
                need = self._bp_blocks(r.num_prompt_tokens)
                if held_blocks and held_blocks + need > blocks:
                    break  # (a request larger than the cap runs when it runs alone)
                self._bp_hand_over([self.bp_held_batch.popleft()])
                n += 1
                held_blocks += need

    def _bp_hand_over(self, queue: Iterable[VllmRequest]) -> None:
        for r in list(queue):
            if self._bp_blocks(r.num_prompt_tokens + r.max_tokens) > self.bp_cap:
                self._bp_end(r, RejectReason.EXCEEDS_KV_CAPACITY, held=False)
            else:
                self.waiting.add_request(r)
        if isinstance(queue, deque):
            queue.clear()

    def _bp_end(self, request: VllmRequest, reason: RejectReason, held: bool = True) -> None:
        """End ``request`` for ``reason``: vLLM finishes it as aborted, and its output says
        why."""
        if held:
            self._bp_unhold(request)
        self.bp_reasons[request.request_id] = reason
        self.finish_requests([request.request_id], RequestStatus.FINISHED_ABORTED)
        self.bp_emit.append(request)

    def _bp_unhold(self, request: VllmRequest) -> bool:
        for q in (self.bp_held, self.bp_late, self.bp_held_batch):
            if q and request in q:
                q.remove(request)
                if q is self.bp_held:
                    self.bp_held_tokens -= request.num_prompt_tokens
                return True
        return False

    def _bp_num_held(self) -> int:
        return len(self.bp_held) + len(self.bp_late) + len(self.bp_held_batch)

    def _bp_is_late(self, r: VllmRequest) -> bool:
        meta = self.bp_meta.get(r.request_id)
        return meta is not None and meta.is_late

    # ------------------------------------------------------------------ requests
    def _bp_now(self) -> float:
        return float(self.bp_clock())

    def _bp_classify(self, request: VllmRequest, now: float) -> Request:
        """Our record of a request nobody registered: its class from ``extra_args``, its arrival
        when vLLM received it (on our clock)."""
        params = request.sampling_params
        extra = (getattr(params, "extra_args", None) or {}) if params is not None else {}
        cls = extra.get("slo_class")
        if cls is not None and cls not in self.bp_config.slo_classes:
            cls = None  # an unknown class is served as the default one
        waited = max(0.0, time.time() - request.arrival_time)
        return self.ledger.new_request(now - waited, request.num_prompt_tokens,
                                       request.max_tokens, cls)

    def _bp_vllm(self, meta: Request) -> VllmRequest | None:
        req_id = self.bp_ids.get(meta.req_id)
        return None if req_id is None else self.requests.get(req_id)

    def _bp_waiting_meta(self) -> list[Request]:
        ids = [r.request_id for q in (self.bp_held, self.bp_late, self.bp_held_batch) for r in q]
        ids += [r.request_id for r in self.waiting]
        return [self.bp_meta[i] for i in ids if i in self.bp_meta]

    # ------------------------------------------------------------------ observing
    def collect_interval(self) -> IntervalStats:
        """Close the interval now: the same stats the simulator's engine returns."""
        self.ledger.now = self._bp_now()
        for r in self.running:
            meta = self.bp_meta.get(r.request_id)
            if meta is not None:
                meta.num_computed_tokens = r.num_computed_tokens
        iv = self.ledger.close_interval()
        waiting = self._bp_waiting_meta()
        running = [self.bp_meta[r.request_id] for r in self.running
                   if r.request_id in self.bp_meta]
        iv.batch_waiting = sum(1 for m in waiting if m.is_batch)
        iv.waiting = len(waiting)
        iv.waiting_tokens = sum(m.num_tokens for m in waiting)
        iv.running = len(self.running)
        iv.batch_running = sum(1 for m in running if m.is_batch)
        iv.batch_backlog_tokens, iv.batch_deadline_margin = self.ledger.batch_backlog(
            waiting + running)
        used = self.bp_pool_blocks - self._bp_free() - len(self.bp_withheld)
        iv.kv_utilization = used / self.bp_cap if self.bp_cap else 0.0
        now = self.ledger.now
        oldest = 0.0
        for m in waiting + running:
            if m.first_token_s is None and not m.is_batch:
                oldest = max(oldest, (now - m.arrival_s) / m.ttft_target_s)
        iv.oldest_wait_ratio = oldest
        iv.close_percentiles()
        return iv

    def summary(self) -> RunSummary:
        self.ledger.now = self._bp_now()
        return self.ledger.summary()

    def used_blocks(self) -> int:
        """KV blocks requests hold now."""
        return self.bp_pool_blocks - self._bp_free() - len(self.bp_withheld)


def _given_id(request_id: str) -> str:
    """The id a request was given to vLLM: vLLM appends ``-`` and 8 random characters."""
    head, sep, tail = request_id.rpartition("-")
    return head if sep and len(tail) == 8 else request_id


def _kv_block_bytes(kv_cache_config: Any) -> int:
    """Bytes of one KV block from vLLM's KV cache config (its tensors' size over its blocks)."""
    tensors = getattr(kv_cache_config, "kv_cache_tensors", None)
    blocks = getattr(kv_cache_config, "num_blocks", 0)
    if tensors and blocks:
        return max(1, sum(int(t.size) for t in tensors) // int(blocks))
    return 1


class BatchpilotScheduler(KnobSchedulerMixin, Scheduler):
    """vLLM's V1 scheduler under batchpilot's knobs (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._bp_init()


class BatchpilotAsyncScheduler(KnobSchedulerMixin, AsyncScheduler):
    """The same over vLLM's asynchronous scheduler (``async_scheduling=True``); not tested here:
    the replays run vLLM synchronously, step by step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._bp_init()
