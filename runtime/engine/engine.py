"""The serving engine: continuous batching with chunked prefill over a paged KV cache.

One scheduling step builds one batch, as vLLM's v1 scheduler does: there is no prefill phase and
no decode phase, every running request's computed tokens catch up to its known tokens. Running
decodes get one token each; prefill chunks go to admitted requests first come first served until
``prefill_chunk_tokens`` is spent (decodes do not count against it).

Admission. Arrivals wait. The waiting requests are admitted, first come first served, when the
oldest has waited ``batch_window_ms`` or when their tokens fill a chunk, as far as sequence slots
and KV blocks allow (a request reserves blocks for all the tokens it must compute when it is
admitted; a small watermark of blocks is kept free while others run, as vLLM's v0 block manager
does, so that admissions do not cause immediate preemptions).

KV memory. ``num_blocks = kv_cache_ratio * (memory - weights) / block bytes``. A decode that
needs a block when none is free preempts the newest running request (recompute: it drops its
blocks, goes back to the front of the queue and recomputes all its tokens when readmitted), as
vLLM does. Lowering the ratio below the blocks in use preempts the newest requests until the rest
fit, and any change of the pool size costs the time the executor reports for it.

Activations. An iteration whose activations do not fit in the workspace left after weights and
KV is an out-of-memory error: it costs the executor's OOM time, is counted, and is retried with
half the prefill; the engine then caps the chunk at the size that fitted until the knobs change.

SLO classes. Interactive requests (TTFT and TPOT targets) and batch requests (a completion
deadline, :mod:`runtime.engine.slo`) share the engine. Interactive work is admitted first, and
batch requests are admitted only when no interactive one is left waiting; running requests are
kept interactive first, so interactive prefill takes the chunk first and the newest batch request
is the first preempted (for a block, for an interactive admission that does not fit, or when the
ratio shrinks). ``batch_share`` caps batch work: at most ``floor(batch_share * chunk)`` prefill
tokens a step and ``floor(batch_share * max_num_seqs)`` running batch requests (0 stops the batch
tap, 1 lets batch work fill whatever interactive work leaves); KV blocks are capped the same way.

Deadline-aware admission (:mod:`runtime.engine.admission`): with ``admission`` = ``shed`` or
``late_to_back``, an interactive request late for its first token is dropped or moved behind
on-time ones; a batch request whose deadline passes before admission is rejected as expired.

Memory lent to a co-tenant (:mod:`runtime.engine.cotenant`): the engine integrates its KV pool's
GiB-seconds and, with a co-tenant demand trace, the demand the memory it leaves serves.

Nothing is lost: every request ends FINISHED or REJECTED with a reason.

Time. In simulation ``now`` moves by the executor's iteration times. Between events (an arrival,
an admission deadline, a completion, a block shortage, the end of a ``run_until``), a decode-only
stretch has a fixed batch whose iteration time grows linearly, so with an executor that promises
a linear decode cost the engine advances the whole stretch in closed form (``fast_path``); the
step-by-step path gives the same result and is kept for real executors and for tests.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import heapq
import math
import operator
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from runtime.engine.admission import ADMISSION_SLACK_RANGE, AdmissionPolicy
from runtime.engine.block_pool import BlockPool
from runtime.engine.cotenant import CoTenantDemand
from runtime.engine.executor import GIB, Batch, Executor
from runtime.engine.metrics import IntervalStats, RunSummary, SummaryAccumulator
from runtime.engine.request import RejectReason, Request, Status
from runtime.engine.slo import DEFAULT_SLO_CLASS, DEFAULT_SLO_CLASSES, SloTarget
from runtime.knobs import DEFAULT_KNOBS, KNOB_SPECS, Knobs

_FIRST_TOKEN = 0  # deadline kinds in the deadline heap: TTFT target passed
_FINISH = 1  # TPOT-allowed finish (interactive) or completion deadline (batch) passed
_LATE = 2  # admission slack passed (deadline-aware admission)
_request_id = operator.attrgetter("req_id")
_arrival = operator.attrgetter("arrival_s")

MAX_ARRIVAL_S = 1e10
"""The latest arrival the engine accepts, in seconds (about 317 years). float64 still resolves
a microsecond there (an iteration's time must not vanish in rounding, or time would stop);
a Unix-epoch timestamp (1.7e9 s) fits, 1e300 does not."""


@dataclass
class EngineConfig:
    max_num_seqs: int = 256
    """the most requests running at once (vLLM's max_num_seqs)"""
    max_model_len: int | None = None
    """the most tokens (prompt + output) one request may have; longer ones are rejected.
    None: the executor's (the profile's model context)"""
    watermark: float = 0.01
    """share of KV blocks kept free at admission while other requests run"""
    slo_classes: dict[str, SloTarget] = field(default_factory=lambda: dict(DEFAULT_SLO_CLASSES))
    """targets by class name; requests without a class get ``default_slo_class``"""
    default_slo_class: str = DEFAULT_SLO_CLASS
    """the class of requests added without one"""
    fast_path: bool = True
    """advance decode-only stretches in closed form when the executor allows it"""
    keep_requests: bool = True
    """keep every request in ``Engine.requests`` after it ends (tests and per-request reports);
    False drops finished and rejected ones, so a long-running serving loop's memory stays
    bounded (the run summary is exact either way)"""
    batch_share: float = DEFAULT_KNOBS.batch_share
    """the ``batch_share`` knob to start with: share of each step's prefill chunk, of the
    sequence slots and of the KV blocks that batch-class requests may take, in [0, 1] (a knob:
    ``Engine.set_knobs`` changes it at run time)"""
    admission: str = AdmissionPolicy.FCFS.value
    """what happens to an interactive request late for its first token: fcfs, shed or
    late_to_back (see runtime.engine.admission)"""
    admission_slack: float = DEFAULT_KNOBS.admission_slack
    """the ``admission_slack`` knob to start with: a request is late once it has waited this
    many TTFT targets without a first token (a knob: ``Engine.set_knobs`` changes it)"""
    cotenant: CoTenantDemand | None = None
    """the memory demand of a co-located tenant, served from the memory the engine leaves"""

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if not 0 <= self.watermark < 0.5:
            raise ValueError(f"watermark must lie in [0, 0.5), got {self.watermark}")
        if self.default_slo_class not in self.slo_classes:
            raise ValueError(f"default_slo_class {self.default_slo_class!r} is not one of "
                             f"{sorted(self.slo_classes)}")
        _check_batch_share(self.batch_share)
        if self.admission not in tuple(AdmissionPolicy):
            raise ValueError(f"admission must be one of {', '.join(AdmissionPolicy)}, got "
                             f"{self.admission!r}")
        lo, hi = ADMISSION_SLACK_RANGE
        if not lo <= self.admission_slack <= hi:
            raise ValueError(f"admission_slack must lie in [{lo:g}, {hi:g}] TTFT targets, got "
                             f"{self.admission_slack}")

    def start_knobs(self, knobs: Knobs) -> Knobs:
        """The knobs an engine built with this config and ``knobs`` starts with: ``knobs``, with
        the config's ``batch_share`` and ``admission_slack`` where the config sets them (a value
        other than the static default's). Raises ValueError when both set one differently."""
        changes = {}
        for name in _CONFIG_KNOBS:
            mine, theirs = getattr(self, name), getattr(knobs, name)
            default = getattr(DEFAULT_KNOBS, name)
            if mine != default and theirs != mine:
                if theirs != default:
                    raise ValueError(f"{name} is {mine} in the engine config but {theirs} in the "
                                     "knobs: set it in one place")
                changes[name] = mine
        return dataclasses.replace(knobs, **changes) if changes else knobs


_CONFIG_KNOBS = ("batch_share", "admission_slack")
"""the knobs an EngineConfig may also set (their start values)"""


def _check_batch_share(share: float) -> None:
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"batch_share must lie in [0, 1], got {share}")


class Engine:
    """:param executor: runs the batches (simulated or torch)
    :param knobs: the knobs to start with
    :param config: limits and SLO classes
    """

    def __init__(self, executor: Executor, knobs: Knobs = DEFAULT_KNOBS,
                 config: EngineConfig | None = None) -> None:
        self.executor = executor
        self.config = config if config is not None else EngineConfig()
        self.memory = executor.memory
        self.max_model_len = (self.config.max_model_len if self.config.max_model_len is not None
                              else executor.max_model_len)
        """the limit on prompt + output tokens in force"""
        self.block_size = self.memory.block_size
        knobs = self.config.start_knobs(knobs)
        self.knobs = knobs
        self._max_batch_tokens = self._activation_limit(knobs)
        self.now = 0.0
        self.pool = BlockPool(self.memory.num_kv_blocks(knobs.kv_cache_ratio))
        self.executor.resize_kv(self.pool.num_blocks, {})
        self._decode_cost = executor.decode_cost() if self.config.fast_path else None
        if not self.memory.fits(self.block_size, KNOB_SPECS[2].high):
            raise ValueError(
                f"the activation workspace at kv_cache_ratio={KNOB_SPECS[2].high} "
                f"({self.memory.workspace_bytes(KNOB_SPECS[2].high)} bytes) cannot hold one block "
                f"of prefill ({self.memory.activation_bytes(self.block_size)} bytes)")

        self.requests: list[Request] = []
        """every request added (``config.keep_requests``), or those not yet ended"""
        self._num_added = 0
        self._ended = SummaryAccumulator()  # the run summary's inputs, one entry per ended request
        self._pending: list[Request] = []  # not yet arrived, sorted by arrival
        self._next_pending = 0
        self.waiting: deque[Request] = deque()  # interactive, on time
        self.late: deque[Request] = deque()  # interactive, late (policy late_to_back)
        self.waiting_batch: deque[Request] = deque()
        self._waiting_tokens = 0  # of waiting + late
        self._batch_waiting_tokens = 0
        # interactive requests in admission order, then batch ones in admission order: the
        # newest batch request is last, so it is the first preempted
        self.running: list[Request] = []
        self._num_running_batch = 0
        self._num_prefilling = 0  # running requests that still have prompt (or recompute) work
        self._set_policy(self.config.admission, knobs.admission_slack)
        self.batch_share = knobs.batch_share
        """the ``batch_share`` knob in force (read on every step)"""
        self._cotenant = self.config.cotenant
        self._mem_t = 0.0  # memory integrals are accounted up to here
        self.kv_gib_s = 0.0
        self.cotenant_served_gib_s = 0.0
        self.cotenant_demand_gib_s = 0.0
        self._chunk_cap: int | None = None  # set by an OOM until the knobs change
        self._deadlines: list[tuple[float, int, int, Request]] = []  # violation certainty heap

        self.num_preemptions = 0
        self.num_ooms = 0
        self.num_iterations = 0
        self.num_fast_stretches = 0
        self._interval = IntervalStats(start_s=0.0)
        self._num_dropped = 0  # ended requests still in ``requests`` (keep_requests=False)

    # ------------------------------------------------------------------ workload
    def add_requests(self, arrival_s: Sequence[float], prompt_tokens: Sequence[int],
                     output_tokens: Sequence[int], slo_class: Sequence[str] | None = None) -> None:
        """Queue requests arriving at the given times (sorted, not before ``now``)."""
        n = len(arrival_s)
        if not (len(prompt_tokens) == n and len(output_tokens) == n
                and (slo_class is None or len(slo_class) == n)):
            raise ValueError("arrival_s, prompt_tokens, output_tokens and slo_class must have "
                             "the same length")
        classes = self.config.slo_classes
        default = self.config.default_slo_class
        last = self._pending[-1].arrival_s if len(self._pending) > self._next_pending else self.now
        base_id = self._num_added
        new = []
        for i in range(n):
            t = float(arrival_s[i])
            if not t >= last:
                raise ValueError(f"request {i}: arrival {t} is before {last} (arrivals must be "
                                 "sorted and not in the engine's past)")
            if not t <= MAX_ARRIVAL_S:
                raise ValueError(f"request {i}: arrival {t:g} s is past the engine's limit of "
                                 f"{MAX_ARRIVAL_S:g} s (MAX_ARRIVAL_S)")
            last = t
            cls = default if slo_class is None else str(slo_class[i])
            target = classes.get(cls)
            if target is None:
                raise ValueError(f"request {i}: unknown SLO class {cls!r} "
                                 f"(known: {sorted(classes)})")
            new.append(Request(base_id + i, t, int(prompt_tokens[i]), int(output_tokens[i]), cls,
                               target.ttft_target_s(int(prompt_tokens[i])), target.tpot_s,
                               target.deadline_s))
        self._num_added += n
        self.requests.extend(new)
        self._pending.extend(new)

    @property
    def num_unfinished(self) -> int:
        return ((len(self._pending) - self._next_pending) + len(self.waiting) + len(self.late)
                + len(self.waiting_batch) + len(self.running))

    def has_work(self) -> bool:
        return self.num_unfinished > 0

    def next_event_s(self) -> float:
        """When an idle engine next has something to do: the next arrival, the expiry of the
        oldest waiting request's window (now, for a late one), or, with deadline-aware admission
        or batch work waiting, the next deadline that changes the queues (inf when none is
        ahead). A wall-clock pacer sleeps until then."""
        wake = self._next_arrival_s()
        if self.waiting or self.late:
            wake = min(wake, self._admission_deadline())
        if (not self._fcfs or self.waiting_batch) and self._deadlines:
            wake = min(wake, self._deadlines[0][0])  # a batch request expires, a late one goes
        return wake

    def is_idle(self) -> bool:
        """Nothing waiting or running: the engine can only wait for its next arrival."""
        return not self.waiting and not self.running

    def next_arrival_s(self) -> float:
        """When the next request not yet arrived arrives (inf when there is none)."""
        return self._next_arrival_s()

    def _next_arrival_s(self) -> float:
        if self._next_pending < len(self._pending):
            return self._pending[self._next_pending].arrival_s
        return math.inf

    def _take_arrivals(self) -> None:
        pending = self._pending
        i = self._next_pending
        now = self.now
        iv = self._interval
        max_len = self.max_model_len
        while i < len(pending) and pending[i].arrival_s <= now:
            r = pending[i]
            i += 1
            iv.arrivals += 1
            iv.arrival_prompt_sum += r.prompt_tokens
            iv.arrival_prompt_sumsq += r.prompt_tokens * r.prompt_tokens
            if r.prompt_tokens < 1 or r.output_tokens < 1:
                self._reject(r, RejectReason.INVALID)
            elif r.prompt_tokens + r.output_tokens > max_len:
                self._reject(r, RejectReason.EXCEEDS_MAX_MODEL_LEN)
            elif r.is_batch:
                r.status = Status.WAITING
                self.waiting_batch.append(r)
                self._batch_waiting_tokens += r.prompt_tokens
                heapq.heappush(self._deadlines, (r.deadline_s, r.req_id, _FINISH, r))
            else:
                r.status = Status.WAITING
                self.waiting.append(r)
                self._waiting_tokens += r.prompt_tokens
                heapq.heappush(self._deadlines,
                               (r.arrival_s + r.ttft_target_s, r.req_id, _FIRST_TOKEN, r))
                if self._slack_events:
                    heapq.heappush(self._deadlines, (r.arrival_s + self._slack * r.ttft_target_s,
                                                     r.req_id, _LATE, r))
        if i > self._next_pending:
            self._next_pending = i
            if i > 4096 and i * 2 > len(pending):  # drop the arrived prefix now and then
                del pending[:i]
                self._next_pending = 0

    # ------------------------------------------------------------------ outcomes
    def _ended_request(self, r: Request) -> None:
        """Account for a request that just ended, and drop it unless every request is kept."""
        self._ended.add(r)
        if not self.config.keep_requests:
            self._num_dropped += 1
            if self._num_dropped > 1024 and self._num_dropped * 2 > len(self.requests):
                self.requests = [q for q in self.requests if q.status < Status.FINISHED]
                self._num_dropped = 0

    def _violation(self, r: Request) -> None:
        """Count ``r``'s SLO miss, once."""
        if not r.violation_counted:
            r.violation_counted = True
            self._interval.violations += 1
            if r.is_batch:
                self._interval.batch_violations += 1

    def _reject(self, r: Request, reason: RejectReason) -> None:
        r.status = Status.REJECTED
        r.reject_reason = reason
        r.finish_s = self.now
        self._ended_request(r)
        if reason != RejectReason.ABORTED:
            self._interval.rejected += 1
            self._violation(r)

    def _finish(self, r: Request) -> None:
        r.status = Status.FINISHED
        r.finish_s = self.now
        self.pool.free(r.block_ids)
        r.block_ids = []
        self._ended_request(r)
        iv = self._interval
        iv.finished += 1
        if r.is_batch:
            self._num_running_batch -= 1
            if r.meets_slo():
                iv.met += 1
                iv.batch_met += 1
                iv.batch_goodput_tokens += r.prompt_tokens + r.output_tokens
            else:
                self._violation(r)
            return
        if r.output_tokens >= 2:
            assert r.first_token_s is not None  # it produced tokens
            tpot = (r.finish_s - r.first_token_s) / (r.output_tokens - 1)
            iv.tpot_ratios.append(tpot / r.tpot_target_s)
        if r.meets_slo():
            iv.met += 1
        else:
            self._violation(r)

    def _first_token(self, r: Request) -> None:
        r.first_token_s = self.now
        if r.is_batch:
            return
        ttft = self.now - r.arrival_s
        iv = self._interval
        iv.ttft_ratios.append(ttft / r.ttft_target_s)
        if ttft > r.ttft_target_s:
            self._violation(r)
        elif r.output_tokens >= 2:
            deadline = r.first_token_s + r.tpot_target_s * (r.output_tokens - 1)
            heapq.heappush(self._deadlines, (deadline, r.req_id, _FINISH, r))

    def _count_certain_violations(self) -> None:
        """Count requests whose miss is certain by now (no first token past the TTFT target, not
        finished past the time their TPOT target or deadline allows) and apply the admission
        policy to those that are late."""
        dl = self._deadlines
        now = self.now
        while dl and dl[0][0] <= now:  # a first token or finish at ``now`` is applied already
            _, _, kind, r = heapq.heappop(dl)
            if r.status >= Status.FINISHED:
                continue
            if kind == _FINISH:
                self._violation(r)
                if r.is_batch and r.status == Status.WAITING:
                    self.waiting_batch.remove(r)
                    self._batch_waiting_tokens -= r.num_tokens
                    self._interval.expired += 1
                    self._reject(r, RejectReason.EXPIRED)
            elif r.first_token_s is None:
                if kind == _FIRST_TOKEN:
                    self._violation(r)
                if kind == _LATE:
                    if r.arrival_s + self._slack * r.ttft_target_s <= now:  # not a stale one
                        self._on_late(r)
                elif self._slack == 1.0:
                    self._on_late(r)
                elif self._policy == AdmissionPolicy.SHED and r.status == Status.RUNNING:
                    self._on_late(r)  # a prefill past its TTFT target: its miss is certain

    def _set_policy(self, admission: str, slack: float) -> None:
        self._policy = AdmissionPolicy(admission)
        self._slack = slack
        # whether deadlines can change the queues (then time stops at them), and whether a
        # request gets a separate event when its slack passes
        self._fcfs = self._policy == AdmissionPolicy.FCFS
        self._slack_events = not self._fcfs and slack != 1.0

    @property
    def admission(self) -> str:
        """The admission policy in force (``fcfs``, ``shed`` or ``late_to_back``)."""
        return self._policy.value

    @property
    def admission_slack(self) -> float:
        """The admission slack in force, in TTFT targets."""
        return self._slack

    def set_admission(self, admission: str, slack: float | None = None) -> None:
        """Change the admission policy (a deployment setting; the oracle tries it too) and, when
        given, the ``admission_slack`` knob now (see :meth:`_apply_admission`)."""
        slack = self._slack if slack is None else slack
        EngineConfig(admission=admission, admission_slack=slack)  # checks both
        if slack != self._slack:
            self._account_memory()
            self.knobs = dataclasses.replace(self.knobs, admission_slack=slack)
        self._apply_admission(admission, slack)

    def _apply_admission(self, admission: str, slack: float) -> None:
        """Put an admission policy and slack in force (see :mod:`runtime.engine.admission`):
        waiting requests already late get the new policy at once (``shed`` also drops those in
        the late queue), the others when their new slack passes."""
        self._set_policy(admission, slack)
        if self._fcfs:
            return  # late requests keep their place: nothing to move (a slack knob per interval
            # costs nothing under fcfs)
        now = self.now
        for r in list(self.waiting):
            if r.first_token_s is None and r.arrival_s + slack * r.ttft_target_s <= now:
                self._on_late(r)
        if self._policy == AdmissionPolicy.SHED:
            while self.late:
                r = self.late.popleft()
                self._waiting_tokens -= r.num_tokens
                self._interval.shed += 1
                self._reject(r, RejectReason.SHED)
        if self._slack_events:
            for r in self.waiting:
                if r.first_token_s is None and not r.is_batch:
                    heapq.heappush(self._deadlines, (r.arrival_s + slack * r.ttft_target_s,
                                                     r.req_id, _LATE, r))

    def _on_late(self, r: Request) -> None:
        """Apply the admission policy to ``r``, late for its first token."""
        if self._fcfs:
            return
        policy = self._policy
        if r.status == Status.WAITING:
            if r.is_late:
                return  # already behind the on-time requests
            self.waiting.remove(r)
            if policy == AdmissionPolicy.LATE_TO_BACK:
                r.is_late = True
                self.late.append(r)
                self._interval.late += 1
                return
            self._waiting_tokens -= r.num_tokens
        elif policy == AdmissionPolicy.SHED and self.now - r.arrival_s > r.ttft_target_s:
            self.running.remove(r)  # running, still prefilling
            self._num_prefilling -= 1
            self.pool.free(r.block_ids)
            r.block_ids = []
        else:
            return
        self._interval.shed += 1
        self._reject(r, RejectReason.SHED)

    # ------------------------------------------------------------------ knobs
    def _activation_limit(self, knobs: Knobs) -> int:
        """The most tokens an iteration's activations fit in the workspace these knobs leave."""
        m = self.memory
        workspace = m.workspace_bytes(knobs.kv_cache_ratio)
        return (workspace - m.act_fixed_bytes) // m.act_bytes_per_token

    def set_knobs(self, knobs: Knobs) -> float:
        """Apply new knobs now, all five (the one place knobs are applied); returns the seconds
        the change cost (a pool resize stalls the engine). Lowering the ratio below the blocks in
        use preempts the newest requests. A new ``batch_share`` applies from the next admission
        and step (running batch requests are not preempted for it); a new ``admission_slack``
        applies under the configured admission policy at once (see :meth:`_apply_admission`)."""
        old = self.knobs
        if knobs == old:
            return 0.0
        self._account_memory()
        self.knobs = knobs
        if knobs.batch_share != old.batch_share:
            self.batch_share = knobs.batch_share
        if knobs.admission_slack != old.admission_slack:
            self._apply_admission(self._policy.value, knobs.admission_slack)
        if (knobs.batch_window_ms == old.batch_window_ms
                and knobs.prefill_chunk_tokens == old.prefill_chunk_tokens
                and knobs.kv_cache_ratio == old.kv_cache_ratio):
            return 0.0  # the class and admission knobs leave the OOM chunk cap in force
        self._max_batch_tokens = self._activation_limit(knobs)
        self._chunk_cap = None
        if knobs.kv_cache_ratio == old.kv_cache_ratio:
            return 0.0
        new_blocks = self.memory.num_kv_blocks(knobs.kv_cache_ratio)
        if new_blocks == self.pool.num_blocks:
            return 0.0
        moves: dict[int, int] = {}
        if new_blocks > self.pool.num_blocks:
            self.pool.grow(new_blocks)
        else:
            while self.pool.num_used > new_blocks:
                self._preempt(self.running.pop())
            moves = self.pool.shrink(new_blocks)
            if moves:
                for r in self.running:
                    r.block_ids = [moves.get(b, b) for b in r.block_ids]
        cost = self.executor.resize_kv(new_blocks, moves)
        self.now += cost
        self._interval.resize_s += cost
        return cost

    # ------------------------------------------------------------------ scheduling
    def set_batch_share(self, share: float) -> None:
        """Set the ``batch_share`` knob alone (through :meth:`set_knobs`)."""
        _check_batch_share(share)
        self.set_knobs(dataclasses.replace(self.knobs, batch_share=share))

    def _account_memory(self) -> None:
        """Integrate the KV pool's GiB-seconds and the co-tenant's demand up to now."""
        t0, now = self._mem_t, self.now
        if now <= t0:
            return
        self._mem_t = now
        kv_gib = self.pool.num_blocks * self.memory.kv_block_bytes / GIB
        iv = self._interval
        iv.kv_gib_s += kv_gib * (now - t0)
        self.kv_gib_s += kv_gib * (now - t0)
        if self._cotenant is not None:
            m = self.memory
            lendable = (m.free_after_weights - self.pool.num_blocks * m.kv_block_bytes
                        - m.activation_bytes(self.knobs.prefill_chunk_tokens
                                             + self.config.max_num_seqs))
            served, demanded = self._cotenant.integrate(t0, now, lendable / GIB)
            iv.cotenant_served_gib_s += served
            iv.cotenant_demand_gib_s += demanded
            self.cotenant_served_gib_s += served
            self.cotenant_demand_gib_s += demanded

    def _preempt(self, r: Request) -> None:
        """Drop ``r``'s KV and send it to the front of its queue (the caller removed it from
        ``running``)."""
        if r.num_computed_tokens < r.num_tokens - (1 if r.num_output_tokens else 0):
            self._num_prefilling -= 1
        self.pool.free(r.block_ids)
        r.block_ids = []
        r.num_computed_tokens = 0
        r.num_preemptions += 1
        r.status = Status.WAITING
        if r.is_batch:
            self._num_running_batch -= 1
            self.waiting_batch.appendleft(r)
            self._batch_waiting_tokens += r.num_tokens
        else:
            self.waiting.appendleft(r)
            self._waiting_tokens += r.num_tokens
        self.num_preemptions += 1
        self._interval.preemptions += 1

    def _admission_deadline(self) -> float:
        """When the window of the oldest on-time waiting request expires (late requests are
        always due)."""
        if not self.waiting:
            return self.now
        return self.waiting[0].arrival_s + self.knobs.batch_window_ms * 1e-3

    def _admit(self) -> None:
        """Admit interactive requests if the window expired or their tokens fill a chunk (on-time
        ones first, then late ones), then batch requests if no interactive one is left waiting
        and ``batch_share`` leaves them slots."""
        if self.waiting or self.late:
            if not (self.now >= self._admission_deadline()
                    or self._waiting_tokens >= self.knobs.prefill_chunk_tokens):
                return
            for queue in (self.waiting, self.late):
                if queue and not self._admit_from(queue):
                    return
        if self.waiting_batch:
            n = self._num_running_batch
            slots = min(self.config.max_num_seqs,
                        len(self.running) - n + int(self.batch_share * self.config.max_num_seqs))
            held = sum(len(r.block_ids) for r in self.running[len(self.running) - n:])
            self._admit_from(self.waiting_batch, slots,
                             int(self.batch_share * self.pool.num_blocks) - held)

    def _admit_from(self, queue: deque[Request], max_seqs: int | None = None,
                    max_blocks: int | None = None) -> bool:
        """Admit requests from the front of ``queue`` while ``running`` has fewer than
        ``max_seqs`` (default: ``max_num_seqs``), the admitted ones take at most ``max_blocks``
        blocks (default: no cap) and KV blocks allow; an interactive request that does not fit
        preempts running batch requests when that makes it fit. Returns whether the queue was
        emptied."""
        pool = self.pool
        bs = self.block_size
        if max_seqs is None:
            max_seqs = self.config.max_num_seqs
        running = self.running
        watermark = int(self.config.watermark * pool.num_blocks)
        while queue:
            r = queue[0]
            batch = r.is_batch
            if -(-(r.prompt_tokens + r.output_tokens) // bs) > pool.num_blocks:
                queue.popleft()
                self._drop_waiting_tokens(r)
                self._reject(r, RejectReason.EXCEEDS_KV_CAPACITY)
                continue
            need = -(-r.num_tokens // bs)
            if max_blocks is not None:
                if need > max_blocks and self._num_running_batch:
                    return False  # (a request larger than the cap runs when it runs alone)
                max_blocks -= need
            if len(running) >= max_seqs or pool.num_free - need < (watermark if running else 0):
                if batch or not self._make_room_from_batch(need, watermark):
                    return False
            queue.popleft()
            self._drop_waiting_tokens(r)
            blocks = pool.allocate(need)
            assert blocks is not None  # num_free was checked above
            r.block_ids = blocks
            r.status = Status.RUNNING
            if r.admitted_s is None:
                r.admitted_s = self.now
            if batch:
                running.append(r)
                self._num_running_batch += 1
            elif self._num_running_batch:
                running.insert(len(running) - self._num_running_batch, r)
            else:
                running.append(r)
            self._num_prefilling += 1
        return True

    def _drop_waiting_tokens(self, r: Request) -> None:
        if r.is_batch:
            self._batch_waiting_tokens -= r.num_tokens
        else:
            self._waiting_tokens -= r.num_tokens

    def _make_room_from_batch(self, need: int, watermark: int) -> bool:
        """Preempt the newest running batch requests until a slot and ``need`` blocks (with the
        watermark) are free; preempts nothing and returns False when all of them would not do."""
        n = self._num_running_batch
        if not n:
            return False
        running = self.running
        freeable = sum(len(r.block_ids) for r in running[len(running) - n:])
        if len(running) - n >= self.config.max_num_seqs or \
                self.pool.num_free + freeable - need < (watermark if len(running) > n else 0):
            return False
        while (len(running) >= self.config.max_num_seqs
               or self.pool.num_free - need < (watermark if running else 0)):
            self._preempt(running.pop())
        return True

    def _schedule(self, budget: int) -> Batch:
        """One batch: a token for every decode, prefill chunks FCFS up to ``budget`` tokens.
        A decode that needs a block when none is free preempts the newest running request."""
        batch = Batch()
        decodes = batch.decodes
        prefills = batch.prefills
        running = self.running
        pool = self.pool
        bs = self.block_size
        ctx = pf_tokens = pairs = 0
        batch_budget = int(self.batch_share * budget)
        i = 0
        while i < len(running):
            r = running[i]
            computed = r.num_computed_tokens
            out = r.num_output_tokens
            todo = r.prompt_tokens + out - computed
            if out and todo == 1:
                # decode: one token; it may need a fresh block
                if computed >= len(r.block_ids) * bs:
                    block = pool.allocate_one()
                    while block is None:
                        victim = running.pop()
                        self._preempt(victim)
                        if victim is r:
                            break
                        block = pool.allocate_one()
                    if block is None:
                        continue  # r itself was preempted (it was the newest)
                    r.block_ids.append(block)
                decodes.append(r)
                ctx += computed + 1
            elif budget > 0:
                n = todo if todo < budget else budget
                if r.is_batch:  # batch requests come last: interactive prefill went first
                    if n > batch_budget:
                        n = batch_budget
                        if n <= 0:
                            i += 1
                            continue
                    batch_budget -= n
                budget -= n
                prefills.append((r, n))
                pf_tokens += n
                pairs += n * computed + n * (n + 1) // 2
            i += 1
        batch.decode_ctx_tokens = ctx
        batch.prefill_tokens = pf_tokens
        batch.prefill_attn_pairs = pairs
        return batch

    def _apply(self, batch: Batch) -> None:
        """Advance the requests of an executed batch: computed tokens, sampling, completions."""
        any_done = False
        for r in batch.decodes:
            r.num_computed_tokens += 1
            r.num_output_tokens += 1
            if r.num_output_tokens == r.output_tokens:
                self._finish(r)
                any_done = True
        for r, n in batch.prefills:
            r.num_computed_tokens += n
            num_tokens = r.prompt_tokens + r.num_output_tokens
            if r.num_computed_tokens == num_tokens:
                r.num_output_tokens += 1
                self._num_prefilling -= 1
                if r.first_token_s is None:
                    self._first_token(r)
                if r.num_output_tokens == r.output_tokens:
                    self._finish(r)
                    any_done = True
            elif r.num_output_tokens and r.num_computed_tokens == num_tokens - 1:
                self._num_prefilling -= 1  # a recompute chunk one token short: now a decode
        if any_done:
            self.running = [r for r in self.running if r.status == Status.RUNNING]

    def _step(self) -> bool:
        """One iteration, step by step. Returns False when there was nothing to run."""
        if not self.running:
            return False
        budget = self.knobs.prefill_chunk_tokens
        if self._chunk_cap is not None:
            budget = min(budget, self._chunk_cap)
        ratio = self.knobs.kv_cache_ratio
        iv = self._interval
        while True:
            preempted = self.num_preemptions
            batch = self._schedule(budget)
            if batch.is_empty():
                # With every running request preempted for blocks the queue changed: admission
                # runs again (and rejects a request that alone outgrew a shrunk pool).
                return bool(self.running) or self.num_preemptions > preempted
            result = self.executor.execute(batch, ratio)
            if not result.oom:
                break
            self.num_ooms += 1
            iv.ooms += 1
            self.now += result.duration_s
            iv.busy_s += result.duration_s
            if batch.prefill_tokens > self.block_size:
                budget = max(self.block_size,
                             (batch.prefill_tokens // 2) // self.block_size * self.block_size)
                self._chunk_cap = budget
            else:  # the smallest chunk does not fit beside the decodes: shed the newest request
                self._preempt(self.running.pop())
                if not self.running:
                    return False
        self.now += result.duration_s
        self.num_iterations += 1
        iv.iterations += 1
        iv.busy_s += result.duration_s
        iv.prefill_tokens += batch.prefill_tokens
        iv.decode_tokens += len(batch.decodes)
        self._apply(batch)
        return True

    # ------------------------------------------------------------------ closed-form decode
    def _fast_decode(self, until: float) -> bool:
        """Advance a decode-only stretch in closed form up to the next event. Returns False (and
        changes nothing) when the state does not allow it."""
        cost = self._decode_cost
        running = self.running
        if cost is None or self._num_prefilling or not running:
            return False
        n = len(running)
        if n > self._max_batch_tokens:
            return False
        now = self.now
        wake = min(until, self._next_arrival_s())
        if self.waiting:
            # A deadline already past means _admit() ran and the head did not fit: only a
            # completion or a preemption (both end the stretch) can change that.
            deadline = self._admission_deadline()
            if deadline > now:
                wake = min(wake, deadline)
        if (not self._fcfs or self.waiting_batch) and self._deadlines:
            # a late request or an expiring batch one changes the queues at its deadline, as
            # the step-by-step path would see it
            wake = min(wake, self._deadlines[0][0])
        if wake <= now:
            return False
        bs = self.block_size
        ctx = 0
        k_fin = 1 << 62
        for r in running:
            ctx += r.num_computed_tokens + 1
            left = r.output_tokens - r.num_output_tokens
            if left < k_fin:
                k_fin = left
        # iteration i starts at now + A*i + Bq*i*(i-1); it takes a + c*(ctx + n*i)
        a = cost.const_s + cost.per_seq_s * n + cost.per_ctx_token_s * ctx
        bq = cost.per_ctx_token_s * n * 0.5

        def start(i: int) -> float:
            return now + a * i + bq * i * (i - 1)

        d = wake - now
        if bq > 0:
            lin = a - bq
            k_time = math.ceil((-lin + math.sqrt(lin * lin + 4.0 * bq * d)) / (2.0 * bq))
        else:
            k_time = math.ceil(d / a) if a > 0 else k_fin
        k_time = max(1, k_time)
        while k_time > 1 and start(k_time - 1) >= wake:
            k_time -= 1
        while start(k_time) < wake:
            k_time += 1
        k = min(k_fin, k_time)

        # Blocks: request r needs one at iterations o_r, o_r + B, ... where o_r = held*B - computed.
        free = self.pool.num_free
        if free < n * (-(-k // bs)):
            offsets = sorted(len(r.block_ids) * bs - r.num_computed_tokens for r in running)
            q, j = divmod(free, n)
            k_block = q * bs + offsets[j]
            if k_block < k:
                k = k_block
        if k <= 0:
            return False

        # advance every request by k tokens, allocating the blocks they crossed into
        pool = self.pool
        end = start(k)
        self.now = end
        any_done = False
        for r in running:
            c = r.num_computed_tokens + k
            r.num_computed_tokens = c
            r.num_output_tokens += k
            extra = -(-c // bs) - len(r.block_ids)
            if extra > 0:
                more = pool.allocate(extra)
                assert more is not None, "the step reserved these blocks"
                r.block_ids.extend(more)
            if r.num_output_tokens == r.output_tokens:
                any_done = True
        if any_done:  # finish after all allocations, as the step-by-step path does
            for r in running:
                if r.num_output_tokens == r.output_tokens:
                    self._finish(r)
            self.running = [r for r in running if r.status == Status.RUNNING]
        self.num_iterations += k
        self.num_fast_stretches += 1
        iv = self._interval
        iv.iterations += k
        iv.busy_s += end - now
        iv.decode_tokens += n * k
        return True

    # ------------------------------------------------------------------ driving
    def run_until(self, t: float) -> None:
        """Run iterations while ``now < t``. The last one may end after ``t`` (an iteration is not
        interrupted); when idle, time jumps to the next arrival or admission deadline."""
        dl = self._deadlines
        while self.now < t:
            self._take_arrivals()
            if dl and dl[0][0] <= self.now:
                self._count_certain_violations()
            self._admit()
            if self._fast_decode(t):
                continue
            if self._step():
                continue
            # idle: nothing can run until an arrival, a window or a deadline
            wake = min(t, self.next_event_s())
            if wake <= self.now:  # waiting, but blocked (cannot happen with nothing running)
                raise RuntimeError(f"engine stalled at t={self.now}: {len(self.waiting)} waiting, "
                                   f"{len(self.running)} running, {self.pool.num_free} free blocks")
            self.now = wake
        self._take_arrivals()
        self._count_certain_violations()

    def run_to_completion(self, max_time_s: float = math.inf) -> None:
        """Run until every request has finished or been rejected (or ``max_time_s``)."""
        while self.has_work() and self.now < max_time_s:
            t = self.now + 60.0
            if not self.waiting and not self.running:
                t = max(t, self._next_arrival_s())  # idle: jump straight to the next arrival
            self.run_until(min(t, max_time_s))

    def fork(self, horizon_s: float = math.inf) -> Engine:
        """An independent copy of the engine now, to try settings ahead (a lookahead oracle).

        The copy holds its own requests in flight (in any queue), its own copies of the
        requests arriving within ``horizon_s`` of ``now`` (later arrivals are left out, so a fork
        for a short look ahead does not copy the rest of the trace), its own block pool, deadline
        heap, interval counters and executor. Its ``requests`` list holds only those copies:
        finished requests stay with the original, so the fork's :meth:`summary` covers what it
        ran, not the whole replay. The configuration, memory model, knobs and co-tenant demand
        are shared (they are never changed in place). Any other state is deep-copied, so a
        field added to the engine is copied too unless it is listed here as shared.

        Raises TypeError when the executor cannot fork (one that holds device memory).
        """
        fork_executor = getattr(self.executor, "fork", None)
        if fork_executor is None:
            raise TypeError(f"{type(self.executor).__name__} cannot be forked: only an executor "
                            "with a fork() method (the simulated one) can")
        end = self.now + horizon_s
        src = self._pending
        stop = bisect.bisect_right(src, end, lo=self._next_pending, key=_arrival)
        pending = [r.clone() for r in src[self._next_pending:stop]]
        memo: dict[int, object] = {id(x): x for x in (self.config, self.memory, self.knobs,
                                                      self._decode_cost, self._cotenant)}
        memo[id(self.executor)] = fork_executor()
        memo[id(self.pool)] = self.pool.copy()
        memo[id(self._pending)] = pending
        copies: list[Request] = []
        memo[id(self.requests)] = copies
        # Requests in flight, in whatever queue holds them, are cloned once each as the deep copy
        # meets them (Request.__deepcopy__). The deadline heap is rebuilt from those clones rather
        # than deep-copied tuple by tuple (with a batch drop waiting, most of a fork's time went
        # there); entries of finished requests are dropped.
        state = dict(self.__dict__)
        state["_deadlines"] = []
        clone = Engine.__new__(Engine)
        clone.__dict__ = copy.deepcopy(state, memo)
        seen = cast(dict[int, Request], memo)
        clone._deadlines = [(t, i, kind, seen[id(r)] if id(r) in seen else r.__deepcopy__(memo))
                            for t, i, kind, r in self._deadlines if r.status < Status.FINISHED]
        heapq.heapify(clone._deadlines)
        copies.extend(v for v in memo.values() if type(v) is Request)
        copies.extend(pending)
        copies.sort(key=_request_id)
        clone._next_pending = 0
        return clone

    def abort_all(self, reason: RejectReason = RejectReason.ABORTED) -> int:
        """End every request in flight (waiting, running or not yet arrived) with ``reason``."""
        n = 0
        for r in self.running:
            self.pool.free(r.block_ids)
            r.block_ids = []
            self._reject(r, reason)
            n += 1
        for queue in (self.waiting, self.late, self.waiting_batch):
            for r in queue:
                self._reject(r, reason)
                n += 1
            queue.clear()
        for r in self._pending[self._next_pending:]:
            self._reject(r, reason)
            n += 1
        self.running = []
        self._num_running_batch = 0
        self._waiting_tokens = 0
        self._batch_waiting_tokens = 0
        self._num_prefilling = 0
        self._pending = []
        self._next_pending = 0
        return n

    # ------------------------------------------------------------------ observing
    def collect_interval(self) -> IntervalStats:
        """Close the current interval: return its stats (with the engine state now) and start a
        new one."""
        self._count_certain_violations()
        self._account_memory()
        iv = self._interval
        iv.end_s = self.now
        iv.batch_waiting = len(self.waiting_batch)
        iv.waiting = len(self.waiting) + len(self.late) + iv.batch_waiting
        iv.waiting_tokens = self._waiting_tokens + self._batch_waiting_tokens
        iv.running = len(self.running)
        iv.batch_running = self._num_running_batch
        iv.batch_backlog_tokens, iv.batch_deadline_margin = self._batch_backlog()
        if self._cotenant is not None:
            iv.cotenant_demand_fraction = (self._cotenant.demand_gib(self.now) * GIB
                                           / self.memory.free_after_weights)
        iv.kv_utilization = self.pool.utilization()
        iv.kv_fragmentation = self.pool.fragmentation()
        iv.kv_blocks = self.pool.num_blocks
        iv.oldest_wait_ratio = self._oldest_wait_ratio()
        self._interval = IntervalStats(start_s=self.now)
        return iv

    def _batch_backlog(self) -> tuple[int, float]:
        """(tokens the batch requests in the engine still have to compute, their least deadline
        margin: (deadline - now) / (deadline - arrival), floored at 0; 1 when there are none)."""
        n = self._num_running_batch
        if not n and not self.waiting_batch:
            return 0, 1.0
        now = self.now
        todo = 0
        margin = 1.0
        for r in self.running[len(self.running) - n:]:
            todo += r.prompt_tokens + r.output_tokens - r.num_computed_tokens
            m = (r.deadline_s - now) / (r.deadline_s - r.arrival_s)
            if m < margin:
                margin = m
        for r in self.waiting_batch:
            todo += r.prompt_tokens + r.output_tokens
            m = (r.deadline_s - now) / (r.deadline_s - r.arrival_s)
            if m < margin:
                margin = m
        return todo, max(0.0, margin)

    def _oldest_wait_ratio(self) -> float:
        oldest: Request | None = self.late[0] if self.late else None  # late ones waited longest
        for r in self.waiting:  # preempted requests (with a first token) sit at the front
            if r.first_token_s is None:
                if oldest is None or r.arrival_s < oldest.arrival_s:
                    oldest = r
                break
        if self._num_prefilling:
            for r in self.running:
                if r.is_batch:
                    break  # batch requests come last and have no TTFT target
                if r.first_token_s is None and (oldest is None or r.arrival_s < oldest.arrival_s):
                    oldest = r
                    break  # running is in admission order, so the first one is the oldest
        if oldest is None:
            return 0.0
        return (self.now - oldest.arrival_s) / oldest.ttft_target_s

    def summary(self) -> RunSummary:
        self._account_memory()
        return self._ended.summary(
            (r for r in self.requests if r.status < Status.FINISHED), self.now,
            self.num_preemptions, self.num_ooms, self.num_iterations, self.kv_gib_s,
            (self.cotenant_served_gib_s, self.cotenant_demand_gib_s))

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (for tests and debugging)."""
        used = [b for r in self.running for b in r.block_ids]
        assert len(used) == len(set(used)), "a block is owned twice"
        free = self.pool.free_ids()
        assert not set(used) & set(free), "a block is both free and owned"
        assert len(used) + len(free) == self.pool.num_blocks, (
            f"{self.pool.num_blocks - len(used) - len(free)} blocks leaked")
        assert all(0 <= b < self.pool.num_blocks for b in used + free), "block id out of range"
        assert self._waiting_tokens == sum(r.num_tokens for r in (*self.waiting, *self.late))
        assert self._batch_waiting_tokens == sum(r.num_tokens for r in self.waiting_batch)
        n_batch = self._num_running_batch
        assert [r.is_batch for r in self.running] == (
            [False] * (len(self.running) - n_batch) + [True] * n_batch), "class order"
        for q in (self.waiting, self.late, self.waiting_batch):
            assert all(r.status == Status.WAITING for r in q), "a queued request is not waiting"
        prefilling = sum(1 for r in self.running
                         if not (r.num_output_tokens and r.num_computed_tokens == r.num_tokens - 1))
        assert prefilling == self._num_prefilling, (prefilling, self._num_prefilling)
        for r in self.running:
            assert len(r.block_ids) * self.block_size >= r.num_computed_tokens
