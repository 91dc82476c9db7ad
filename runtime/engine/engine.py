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

Nothing is lost: every request ends FINISHED or REJECTED with a reason.

Time. In simulation ``now`` moves by the executor's iteration times. Between events (an arrival,
an admission deadline, a completion, a block shortage, the end of a ``run_until``), a decode-only
stretch has a fixed batch whose iteration time grows linearly, so with an executor that promises
a linear decode cost the engine advances the whole stretch in closed form (``fast_path``); the
step-by-step path gives the same result and is kept for real executors and for tests.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from runtime.engine.block_pool import BlockPool
from runtime.engine.executor import Batch, Executor
from runtime.engine.metrics import IntervalStats, RunSummary, SummaryAccumulator
from runtime.engine.request import RejectReason, Request, Status
from runtime.engine.slo import DEFAULT_SLO_CLASS, DEFAULT_SLO_CLASSES, SloTarget
from runtime.knobs import DEFAULT_KNOBS, KNOB_SPECS, Knobs

_FIRST_TOKEN = 0  # violation-deadline kinds in the deadline heap
_FINISH = 1

MAX_ARRIVAL_S = 1e10
"""The latest arrival the engine accepts, in seconds (about 317 years). float64 still resolves
a microsecond there (an iteration's time must not vanish in rounding, or time would stop);
a Unix-epoch timestamp (1.7e9 s) fits, 1e300 does not."""


@dataclass
class EngineConfig:
    max_num_seqs: int = 256
    """the most requests running at once (vLLM's max_num_seqs)"""
    max_model_len: int = 16384
    """the most tokens (prompt + output) one request may have; longer ones are rejected"""
    watermark: float = 0.01
    """share of KV blocks kept free at admission while other requests run"""
    slo_classes: dict[str, SloTarget] = field(default_factory=lambda: dict(DEFAULT_SLO_CLASSES))
    """targets by class name; requests without a class get ``default_slo_class``"""
    default_slo_class: str = DEFAULT_SLO_CLASS
    fast_path: bool = True
    """advance decode-only stretches in closed form when the executor allows it"""
    keep_requests: bool = True
    """keep every request in ``Engine.requests`` after it ends (tests and per-request reports);
    False drops finished and rejected ones, so a long-running serving loop's memory stays
    bounded (the run summary is exact either way)"""

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if not 0 <= self.watermark < 0.5:
            raise ValueError(f"watermark must lie in [0, 0.5), got {self.watermark}")
        if self.default_slo_class not in self.slo_classes:
            raise ValueError(f"default_slo_class {self.default_slo_class!r} is not one of "
                             f"{sorted(self.slo_classes)}")


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
        self.block_size = self.memory.block_size
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
        self.waiting: deque[Request] = deque()
        self._waiting_tokens = 0
        self.running: list[Request] = []  # admission order: the newest is last
        self._num_prefilling = 0  # running requests that still have prompt (or recompute) work
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
                               target.ttft_s, target.tpot_s))
        self._num_added += n
        self.requests.extend(new)
        self._pending.extend(new)

    @property
    def num_unfinished(self) -> int:
        return (len(self._pending) - self._next_pending) + len(self.waiting) + len(self.running)

    def has_work(self) -> bool:
        return self.num_unfinished > 0

    def next_event_s(self) -> float:
        """When an idle engine next has something to do: the next arrival or the expiry of the
        oldest waiting request's window (inf when neither is ahead). A wall-clock pacer sleeps
        until then."""
        wake = self._next_arrival_s()
        return min(wake, self._admission_deadline()) if self.waiting else wake

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
        max_len = self.config.max_model_len
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
            else:
                r.status = Status.WAITING
                self.waiting.append(r)
                self._waiting_tokens += r.prompt_tokens
                heapq.heappush(self._deadlines,
                               (r.arrival_s + r.ttft_target_s, r.req_id, _FIRST_TOKEN, r))
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

    def _reject(self, r: Request, reason: RejectReason) -> None:
        r.status = Status.REJECTED
        r.reject_reason = reason
        r.finish_s = self.now
        self._ended_request(r)
        if reason != RejectReason.ABORTED:
            self._interval.rejected += 1
            if not r.violation_counted:
                r.violation_counted = True
                self._interval.violations += 1

    def _finish(self, r: Request) -> None:
        r.status = Status.FINISHED
        r.finish_s = self.now
        self.pool.free(r.block_ids)
        r.block_ids = []
        self._ended_request(r)
        iv = self._interval
        iv.finished += 1
        if r.output_tokens >= 2:
            assert r.first_token_s is not None  # it produced tokens
            tpot = (r.finish_s - r.first_token_s) / (r.output_tokens - 1)
            iv.tpot_ratios.append(tpot / r.tpot_target_s)
        if r.meets_slo():
            iv.met += 1
        elif not r.violation_counted:
            r.violation_counted = True
            iv.violations += 1

    def _first_token(self, r: Request) -> None:
        r.first_token_s = self.now
        ttft = self.now - r.arrival_s
        iv = self._interval
        iv.ttft_ratios.append(ttft / r.ttft_target_s)
        if ttft > r.ttft_target_s and not r.violation_counted:
            r.violation_counted = True
            iv.violations += 1
        elif r.output_tokens >= 2:
            deadline = r.first_token_s + r.tpot_target_s * (r.output_tokens - 1)
            heapq.heappush(self._deadlines, (deadline, r.req_id, _FINISH, r))

    def _count_certain_violations(self) -> None:
        """Count requests whose miss is certain by now: no first token past the TTFT target, or
        not finished past the time their TPOT target allows."""
        dl = self._deadlines
        now = self.now
        iv = self._interval
        while dl and dl[0][0] < now:
            _, _, kind, r = heapq.heappop(dl)
            if r.violation_counted or r.status >= Status.FINISHED:
                continue
            if (kind == _FIRST_TOKEN and r.first_token_s is None) or kind == _FINISH:
                r.violation_counted = True
                iv.violations += 1

    # ------------------------------------------------------------------ knobs
    def _activation_limit(self, knobs: Knobs) -> int:
        """The most tokens an iteration's activations fit in the workspace these knobs leave."""
        m = self.memory
        workspace = m.workspace_bytes(knobs.kv_cache_ratio)
        return (workspace - m.act_fixed_bytes) // m.act_bytes_per_token

    def set_knobs(self, knobs: Knobs) -> float:
        """Apply new knobs now; returns the seconds the change cost (a pool resize stalls the
        engine). Lowering the ratio below the blocks in use preempts the newest requests."""
        if knobs == self.knobs:
            return 0.0
        old = self.knobs
        self.knobs = knobs
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
    def _preempt(self, r: Request) -> None:
        """Drop ``r``'s KV and send it to the front of the queue (the caller removed it from
        ``running``)."""
        if r.num_computed_tokens < r.num_tokens - (1 if r.num_output_tokens else 0):
            self._num_prefilling -= 1
        self.pool.free(r.block_ids)
        r.block_ids = []
        r.num_computed_tokens = 0
        r.num_preemptions += 1
        r.status = Status.WAITING
        self.waiting.appendleft(r)
        self._waiting_tokens += r.num_tokens
        self.num_preemptions += 1
        self._interval.preemptions += 1

    def _admission_deadline(self) -> float:
        """When the window of the oldest waiting request expires."""
        return self.waiting[0].arrival_s + self.knobs.batch_window_ms * 1e-3

    def _admit(self) -> None:
        """Admit waiting requests if the window expired or their tokens fill a chunk."""
        waiting = self.waiting
        if not waiting:
            return
        if not (self.now >= self._admission_deadline()
                or self._waiting_tokens >= self.knobs.prefill_chunk_tokens):
            return
        pool = self.pool
        bs = self.block_size
        max_seqs = self.config.max_num_seqs
        running = self.running
        watermark = int(self.config.watermark * pool.num_blocks)
        while waiting and len(running) < max_seqs:
            r = waiting[0]
            if -(-(r.prompt_tokens + r.output_tokens) // bs) > pool.num_blocks:
                waiting.popleft()
                self._waiting_tokens -= r.num_tokens
                self._reject(r, RejectReason.EXCEEDS_KV_CAPACITY)
                continue
            need = -(-r.num_tokens // bs)
            if pool.num_free - need < (watermark if running else 0):
                break
            waiting.popleft()
            self._waiting_tokens -= r.num_tokens
            blocks = pool.allocate(need)
            assert blocks is not None  # num_free was checked above
            r.block_ids = blocks
            r.status = Status.RUNNING
            if r.admitted_s is None:
                r.admitted_s = self.now
            running.append(r)
            self._num_prefilling += 1

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
            batch = self._schedule(budget)
            if batch.is_empty():
                return bool(self.running)
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
        while self.now < t:
            self._take_arrivals()
            self._admit()
            if self._fast_decode(t):
                continue
            if self._step():
                continue
            # idle: nothing can run until an arrival or a window expires
            wake = min(t, self._next_arrival_s())
            if self.waiting:
                wake = min(wake, self._admission_deadline())
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

    def abort_all(self, reason: RejectReason = RejectReason.ABORTED) -> int:
        """End every request in flight (waiting, running or not yet arrived) with ``reason``."""
        n = 0
        for r in self.running:
            self.pool.free(r.block_ids)
            r.block_ids = []
            self._reject(r, reason)
            n += 1
        for r in self.waiting:
            self._reject(r, reason)
            n += 1
        for r in self._pending[self._next_pending:]:
            self._reject(r, reason)
            n += 1
        self.running = []
        self.waiting.clear()
        self._waiting_tokens = 0
        self._num_prefilling = 0
        self._pending = []
        self._next_pending = 0
        return n

    # ------------------------------------------------------------------ observing
    def collect_interval(self) -> IntervalStats:
        """Close the current interval: return its stats (with the engine state now) and start a
        new one."""
        self._count_certain_violations()
        iv = self._interval
        iv.end_s = self.now
        iv.waiting = len(self.waiting)
        iv.waiting_tokens = self._waiting_tokens
        iv.running = len(self.running)
        iv.kv_utilization = self.pool.utilization()
        iv.kv_fragmentation = self.pool.fragmentation()
        iv.kv_blocks = self.pool.num_blocks
        iv.oldest_wait_ratio = self._oldest_wait_ratio()
        self._interval = IntervalStats(start_s=self.now)
        return iv

    def _oldest_wait_ratio(self) -> float:
        oldest: Request | None = None
        for r in self.waiting:  # preempted requests (with a first token) sit at the front
            if r.first_token_s is None:
                oldest = r
                break
        if self._num_prefilling:
            for r in self.running:
                if r.first_token_s is None and (oldest is None or r.arrival_s < oldest.arrival_s):
                    oldest = r
                    break  # running is in admission order, so the first one is the oldest
        if oldest is None:
            return 0.0
        return (self.now - oldest.arrival_s) / oldest.ttft_target_s

    def summary(self) -> RunSummary:
        return self._ended.summary(self._num_added, self.now, self.num_preemptions,
                                   self.num_ooms, self.num_iterations)

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (for tests and debugging)."""
        used = [b for r in self.running for b in r.block_ids]
        assert len(used) == len(set(used)), "a block is owned twice"
        free = self.pool.free_ids()
        assert not set(used) & set(free), "a block is both free and owned"
        assert len(used) + len(free) == self.pool.num_blocks, (
            f"{self.pool.num_blocks - len(used) - len(free)} blocks leaked")
        assert all(0 <= b < self.pool.num_blocks for b in used + free), "block id out of range"
        assert self._waiting_tokens == sum(r.num_tokens for r in self.waiting)
        prefilling = sum(1 for r in self.running
                         if not (r.num_output_tokens and r.num_computed_tokens == r.num_tokens - 1))
        assert prefilling == self._num_prefilling, (prefilling, self._num_prefilling)
        for r in self.running:
            assert len(r.block_ids) * self.block_size >= r.num_computed_tokens
