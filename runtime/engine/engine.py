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

Layout. This module holds the engine's loop: construction, knob changes, scheduling, stepping,
the closed-form decode path, driving and forking. Its other jobs are mixins in their own modules,
each inheriting the ones whose methods it calls; the attributes they share are declared in
:mod:`runtime.engine.state`: request intake, the waiting queues, admission and preemption
(:mod:`runtime.engine.queues`); the deadline heap and deadline-aware admission
(:mod:`runtime.engine.deadlines`); how a request's end is accounted
(:mod:`runtime.engine.outcomes`); the memory integrals (:mod:`runtime.engine.memory`); interval
stats, the run summary and the invariants (:mod:`runtime.engine.observing`). The configuration
is :mod:`runtime.engine.config` (imported from here as before).
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import heapq
import math
import operator
from collections import deque
from collections.abc import Callable, Sequence
from typing import cast

from runtime.engine.admission import AdmissionPolicy
from runtime.engine.block_pool import BlockPool
from runtime.engine.config import MAX_ARRIVAL_S, EngineConfig, check_batch_share
from runtime.engine.executor import Batch, Executor
from runtime.engine.metrics import IntervalStats, SummaryAccumulator
from runtime.engine.observing import ObservingMixin
from runtime.engine.queues import QueuesMixin
from runtime.engine.request import Request, Status
from runtime.engine.state import FINISH
from runtime.knobs import DEFAULT_KNOBS, KNOB_SPECS, Knobs

__all__ = ["MAX_ARRIVAL_S", "Engine", "EngineConfig"]

_request_id = operator.attrgetter("req_id")
_IMMUTABLE = frozenset((int, float, bool, str, type(None), AdmissionPolicy))
"""types of engine state a fork shares rather than copies"""
_arrival = operator.attrgetter("arrival_s")


class Engine(QueuesMixin, ObservingMixin):
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
        self._batch_blocks = 0  # KV blocks the running batch requests hold
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

    # ------------------------------------------------------------------ knobs
    def set_knobs(self, knobs: Knobs) -> float:
        """Apply new knobs now, all five (the one place knobs are applied); returns the seconds
        the change cost (a pool resize stalls the engine). Lowering the ratio below the blocks in
        use preempts the newest requests. A new ``batch_share`` applies from the next admission
        and step (running batch requests are not preempted for it); a new ``admission_slack``
        applies under the configured admission policy at once (see :meth:`_apply_admission`)."""
        old = self.knobs
        if knobs is old or knobs == old:  # every interval of a replay: mostly unchanged
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
                for r in self.running:  # only a request holding a block above the cut has moves
                    if r.block_ids and max(r.block_ids) >= new_blocks:
                        r.block_ids = [moves.get(b, b) for b in r.block_ids]
        cost = self.executor.resize_kv(new_blocks, moves)
        self.now += cost
        self._interval.resize_s += cost
        return cost

    def set_batch_share(self, share: float) -> None:
        """Set the ``batch_share`` knob alone (through :meth:`set_knobs`)."""
        check_batch_share(share)
        self.set_knobs(dataclasses.replace(self.knobs, batch_share=share))

    # ------------------------------------------------------------------ scheduling
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
                    if r.is_batch:
                        self._batch_blocks += 1
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
    def _decode_wake(self, until: float) -> float:
        """When a decode-only stretch starting now must stop: ``until``, the next arrival, the
        admission deadline of the waiting head (if ahead) or, when deadlines change the queues,
        the next one."""
        wake = until
        pending = self._pending
        if self._next_pending < len(pending):
            arrival = pending[self._next_pending].arrival_s
            if arrival < wake:
                wake = arrival
        if self.waiting:
            # A deadline already past means _admit() ran and the head did not fit: only a
            # completion or a preemption (both end the stretch) can change that.
            deadline = self.waiting[0].arrival_s + self.knobs.batch_window_ms * 1e-3
            if self.now < deadline < wake:
                wake = deadline
        if (not self._fcfs or self.waiting_batch) and self._deadlines:
            # a late request or an expiring batch one changes the queues at its deadline, as
            # the step-by-step path would see it
            head = self._deadlines[0][0]
            if head < wake:
                wake = head
        return wake

    def _fast_decode(self, until: float) -> bool:
        """Advance decode-only stretches in closed form, each up to the next event. Returns False
        (and changes nothing) when the state does not allow one.

        A stretch ends where the step-by-step loop has something to do. Where that is only a
        completion, an arrival, a deadline or a wait for admission (nothing admitted, no block
        short), the requests and queues are updated there as :meth:`run_until` would and the next
        stretch starts at once from the same closed form: the run is the one :meth:`run_until`
        makes calling this once a stretch, to the bit, without two passes over the running
        requests per stretch. The first stretch advances the requests one by one; from the
        second on, every stretch advances their token counts by the same number of tokens, so
        they are brought up to date once, at the end (a completing request at its completion),
        while their blocks are taken stretch by stretch, in the order the one-stretch path takes
        them (so every block id is the same), from a sorted list of the iteration at which each
        request next needs one."""
        cost = self._decode_cost
        running = self.running
        if cost is None or self._num_prefilling or not running:
            return False
        n = len(running)
        if n > self._max_batch_tokens:
            return False
        now = self.now
        wake = self._decode_wake(until)
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
        # iteration i of a stretch starts at now + A*i + Bq*i*(i-1); it takes a + c*(ctx + n*i)
        per_ctx = cost.per_ctx_token_s
        a0 = cost.const_s + cost.per_seq_s * n
        bq = per_ctx * n * 0.5
        pool = self.pool
        iv = self._interval
        dl = self._deadlines
        running_status = Status.RUNNING
        # From the second stretch: (iteration at which each request next needs a block, its
        # position in ``running``), (iteration at which it ends, position), and the iterations
        # run since (the token counts lag by as many).
        needs: list[tuple[int, int]] | None = None  # sorted
        nxt: list[int] = []  # by position: the iteration of its entry in ``needs``
        ends: list[tuple[int, int]] = []
        done = 0
        advanced = False
        while True:
            if needs is not None:
                k_fin = ends[0][0] - done
            a = a0 + per_ctx * ctx
            d = wake - now
            if bq > 0:
                lin = a - bq
                k_time = math.ceil((-lin + math.sqrt(lin * lin + 4.0 * bq * d)) / (2.0 * bq))
            else:
                k_time = math.ceil(d / a) if a > 0 else k_fin
            if k_time < 1:
                k_time = 1
            while k_time > 1 and now + a * (k_time - 1) + bq * (k_time - 1) * (k_time - 2) >= wake:
                k_time -= 1
            while now + a * k_time + bq * k_time * (k_time - 1) < wake:
                k_time += 1
            k = k_fin if k_fin < k_time else k_time

            # Blocks: request r needs one at iterations o_r, o_r + B, ... (o_r = held*B -
            # computed)
            free = pool.num_free
            if free < n * (-(-k // bs)):
                q, j = divmod(free, n)
                if needs is None:
                    offsets = sorted(len(r.block_ids) * bs - r.num_computed_tokens
                                     for r in running)
                    k_block = q * bs + offsets[j]
                else:
                    k_block = q * bs + needs[j][0] - done
                if k_block < k:
                    k = k_block
            if k <= 0:
                break
            end = now + a * k + bq * k * (k - 1)
            finished = False
            if needs is None:
                # the first stretch: every request advanced by k, with the blocks it crossed into
                for r in running:
                    c = r.num_computed_tokens + k
                    r.num_computed_tokens = c
                    r.num_output_tokens += k
                    extra = -(-c // bs) - len(r.block_ids)
                    if extra > 0:
                        more = pool.allocate(extra)
                        assert more is not None, "the stretch reserved these blocks"
                        r.block_ids.extend(more)
                        if r.is_batch:
                            self._batch_blocks += extra
                    if r.num_output_tokens == r.output_tokens:
                        finished = True
                self.now = end
                if finished:  # finish after all allocations, as the step-by-step path does
                    for r in running:
                        if r.num_output_tokens == r.output_tokens:
                            ctx -= r.num_computed_tokens + 1
                            self._finish(r)
            else:
                top = done + k
                if needs[0][0] < top:
                    cut = bisect.bisect_left(needs, (top, -1))
                    crossed = []
                    for p, i in needs[:cut]:
                        m = (top - 1 - p) // bs + 1
                        p += m * bs
                        nxt[i] = p
                        crossed.append((i, m))
                    del needs[:cut]
                    for i, _ in crossed:
                        bisect.insort(needs, (nxt[i], i))
                    crossed.sort()
                    # one allocation, cut as the request-by-request ones would be: each takes
                    # the top of the free stack left by those before it
                    got = pool.allocate(sum(m for _, m in crossed))
                    assert got is not None, "the stretch reserved these blocks"
                    hi = len(got)
                    for i, m in crossed:
                        r = running[i]
                        r.block_ids.extend(got[hi - m:hi])
                        hi -= m
                        if r.is_batch:
                            self._batch_blocks += m
                done = top
                self.now = end
                if k == k_fin:  # completions, in running order, after the allocations
                    finishing = []
                    while ends and ends[0][0] == top:
                        finishing.append(heapq.heappop(ends)[1])
                    finishing.sort()
                    for i in finishing:
                        r = running[i]
                        r.num_computed_tokens += top
                        r.num_output_tokens = r.output_tokens
                        ctx -= r.num_computed_tokens + 1
                        self._finish(r)
                        del needs[bisect.bisect_left(needs, (nxt[i], i))]
                    finished = True
            advanced = True
            self.num_iterations += k
            self.num_fast_stretches += 1
            iv.iterations += k
            iv.busy_s += end - now
            iv.decode_tokens += n * k
            ctx += n * k
            if finished:
                if needs is None:
                    running = self.running = [r for r in running if r.status == running_status]
                    n = len(running)
                else:
                    self.running = [r for r in running if r.status == running_status]
                    n = len(self.running)
                if not n:
                    break
                a0 = cost.const_s + cost.per_seq_s * n
                bq = per_ctx * n * 0.5
            if end >= until:
                break
            # what run_until does before its next stretch; a stretch follows when that admits
            # nothing
            if self._next_pending < len(self._pending) and \
                    self._pending[self._next_pending].arrival_s <= end:
                self._take_arrivals()
            if dl and dl[0][0] <= end:
                self._count_certain_violations()
            if not self._admission_idle():
                break
            now = end
            wake = self._decode_wake(until)
            if wake <= now:
                break
            if needs is None:
                nxt = [len(r.block_ids) * bs - r.num_computed_tokens for r in running]
                needs = sorted(zip(nxt, range(n)))
                ends = [(r.output_tokens - r.num_output_tokens, i) for i, r in enumerate(running)]
                heapq.heapify(ends)
        if not advanced:
            return False
        if needs is None:
            return True
        for r in running:
            if r.status == running_status:
                r.num_computed_tokens += done
                r.num_output_tokens += done
        return True

    # ------------------------------------------------------------------ driving
    def run_until(self, t: float) -> None:
        """Run iterations while ``now < t``. The last one may end after ``t`` (an iteration is not
        interrupted); when idle, time jumps to the next arrival or admission deadline."""
        dl = self._deadlines
        while self.now < t:
            pending = self._pending
            if self._next_pending < len(pending) and \
                    pending[self._next_pending].arrival_s <= self.now:
                self._take_arrivals()
            if dl and dl[0][0] <= self.now:
                self._count_certain_violations()
            if self.waiting or self.late or self.waiting_batch:
                self._admit()
            if not self._num_prefilling and self.running and self._fast_decode(t):
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
            arrival = self._next_arrival_s()
            if not self.waiting and not self.running and arrival < math.inf:
                # idle: jump straight to the next arrival (with every request arrived and only
                # shut-out batch work waiting, run_until(inf) would leave the clock at inf)
                t = max(t, arrival)
            self.run_until(min(t, max_time_s))

    def arrived_within(self, span_s: float) -> list[Request]:
        """The requests that arrived in the last ``span_s`` seconds (``now - span_s < arrival <=
        now``), in arrival order: what a controller that cannot see the future knows of the
        traffic. The engine's own objects: read them, do not change them."""
        requests = self.requests
        now = self.now
        hi = bisect.bisect_right(requests, now, key=_arrival)
        return requests[bisect.bisect_right(requests, now - span_s, hi=hi, key=_arrival):hi]

    def repeated_arrivals(self, span_s: float) -> list[Request]:
        """A persistence forecast of the next ``span_s`` seconds of traffic, for
        ``fork(arrivals=...)``: the requests that arrived in the last ``span_s``
        (:meth:`arrived_within`), again, each ``span_s`` later. Fresh requests (not yet arrived,
        ids no other request has) with the same lengths, SLO class and targets."""
        if not span_s > 0:
            raise ValueError(f"a forecast spans a positive number of seconds, got {span_s}")
        base = self._num_added
        return [Request(base + i, r.arrival_s + span_s, r.prompt_tokens, r.output_tokens,
                        r.slo_class, r.ttft_target_s, r.tpot_target_s,
                        r.deadline_s - r.arrival_s if r.is_batch else None)
                for i, r in enumerate(self.arrived_within(span_s))]

    def state_key(self, memory: bool = True) -> tuple:
        """What decides how this engine runs on from now, and what its open interval's score
        counters read: two engines with equal keys, holding copies of the same requests (forks
        of one engine, say), run on to the bit alike and close their intervals with the same
        ``met``, ``violations``, batch goodput and KV GiB-seconds. The lookahead oracle scores a
        candidate once per key (:func:`agents.oracle.search`). Left out: what has ended (finished
        requests, the run summary's inputs), counters that nothing reads back (iterations,
        preemptions, busy time, first-token ratios) and caches; with ``memory`` False, the memory
        integrals too (for a score that does not price memory). Requests are identified by id:
        the key means something only between engines with the same requests."""
        cfg = self.config
        iv = self._interval

        def state(r: Request) -> tuple:
            return (r.req_id, r.status, r.num_computed_tokens, r.num_output_tokens,
                    r.output_tokens, tuple(r.block_ids), r.first_token_s, r.admitted_s,
                    r.violation_counted, r.is_late, r.num_preemptions)

        return (
            self.now, self.knobs, self.batch_share, self._max_batch_tokens, self._chunk_cap,
            self._policy, self._slack, cfg.max_num_seqs, cfg.watermark, self.max_model_len,
            id(cfg.slo_classes), id(cfg.cotenant), self._mem_t if memory else None,
            self.pool.num_blocks, tuple(self.pool.free_ids()),
            getattr(self.executor, "_num_blocks", None),
            len(self._pending) - self._next_pending,
            tuple(map(state, self.running)), tuple(map(state, self.waiting)),
            tuple(map(state, self.late)), tuple(map(state, self.waiting_batch)),
            self._waiting_tokens, self._batch_waiting_tokens, self._num_running_batch,
            self._num_prefilling, self._batch_blocks,
            tuple(sorted((t, i, kind) for t, i, kind, _ in self._deadlines)),
            iv.start_s, iv.met, iv.batch_met, iv.violations, iv.batch_violations,
            iv.batch_goodput_tokens, iv.kv_gib_s if memory else None,
        )

    def fork(self, horizon_s: float = math.inf, arrivals: Sequence[Request] | None = None,
             output_tokens: Callable[[Request], int] | None = None) -> Engine:
        """An independent copy of the engine now, to try settings ahead (a lookahead oracle).

        The copy holds its own requests in flight (in any queue), its own copies of the
        requests arriving within ``horizon_s`` of ``now`` (later arrivals are left out, so a fork
        for a short look ahead does not copy the rest of the trace; with ``arrivals``, copies of
        those instead of the trace's future: a forecast, requests in arrival order after ``now``
        with ids no other request has, while requests that have already arrived but not yet been
        taken in are kept), its own block pool, deadline heap, interval counters and executor.
        With ``output_tokens``, every request of the copy gets the output length that function
        forecasts for it (at least one token more than it has, within the model's length)
        instead of its true one, and the TPOT deadlines that hang on it move with it: a fork
        that does not know how long requests will run. Its ``requests`` list holds only those
        copies: finished requests stay with the original, so the fork's :meth:`summary` covers
        what it ran, not the whole replay. The configuration, memory model, knobs and co-tenant
        demand are shared (they are never changed in place). Any other state is deep-copied, so
        a field added to the engine is copied too unless it is listed here as shared.

        Raises TypeError when the executor cannot fork (one that holds device memory).
        """
        fork_executor = getattr(self.executor, "fork", None)
        if fork_executor is None:
            raise TypeError(f"{type(self.executor).__name__} cannot be forked: only an executor "
                            "with a fork() method (the simulated one) can")
        end = self.now + horizon_s
        src = self._pending
        if arrivals is None:
            stop = bisect.bisect_right(src, end, lo=self._next_pending, key=_arrival)
            pending = [r.clone() for r in src[self._next_pending:stop]]
        else:
            if arrivals and not arrivals[0].arrival_s > self.now:
                raise ValueError(f"a fork's forecast arrivals must come after now ({self.now:g} "
                                 f"s), the first is at {arrivals[0].arrival_s:g} s")
            stop = bisect.bisect_right(src, self.now, lo=self._next_pending, key=_arrival)
            pending = [r.clone() for r in src[self._next_pending:stop]]
            pending.extend(r.clone() for r in arrivals if r.arrival_s <= end)
        memo: dict[int, object] = {id(x): x for x in (self.config, self.memory, self.knobs,
                                                      self._decode_cost, self._cotenant)}
        # Requests in flight, in whatever queue holds them, are cloned once each; the containers
        # the engine is known to hold are rebuilt around the clones, the rest of its state is
        # taken as it is when immutable and deep-copied otherwise (with the clones in the memo),
        # so that a field added to the engine is copied too. The deadline heap is rebuilt from
        # the clones (entries of finished requests dropped), not deep-copied tuple by tuple.
        clones: dict[int, Request] = {}

        def cloned(r: Request) -> Request:
            c = clones.get(id(r))
            if c is None:
                c = clones[id(r)] = r.clone()
            return c

        rebuilt: dict[str, object] = {
            "executor": fork_executor(), "pool": self.pool.copy(), "_pending": pending,
            "requests": [], "_deadlines": [],
            "running": [cloned(r) for r in self.running],
            "waiting": deque(map(cloned, self.waiting)), "late": deque(map(cloned, self.late)),
            "waiting_batch": deque(map(cloned, self.waiting_batch)),
            "_interval": self._interval.copy(), "_ended": self._ended.copy(),
        }
        memo.update(clones)
        state = {}
        for name, value in self.__dict__.items():
            if name in rebuilt:
                state[name] = rebuilt[name]
            elif type(value) in _IMMUTABLE or id(value) in memo:
                state[name] = memo.get(id(value), value)
            else:
                state[name] = copy.deepcopy(value, memo)
                clones.update((k, v) for k, v in memo.items() if type(v) is Request)
        clone = Engine.__new__(Engine)
        clone.__dict__ = state
        clone._deadlines = [(t, i, kind, cloned(r)) for t, i, kind, r in self._deadlines
                            if r.status < Status.FINISHED]
        copies = cast(list[Request], clone.requests)
        copies.extend(clones.values())
        copies.extend(pending)
        copies.sort(key=_request_id)
        if output_tokens is not None:
            for r in copies:
                room = self.max_model_len - r.prompt_tokens
                r.output_tokens = max(r.num_output_tokens + 1, min(int(output_tokens(r)), room))
            deadlines = []
            for t, i, kind, r in clone._deadlines:
                if kind == FINISH and not r.is_batch:  # the TPOT deadline, set at the first token
                    if r.output_tokens < 2 or r.first_token_s is None:
                        continue  # judged on its first token alone
                    t = r.first_token_s + r.tpot_target_s * (r.output_tokens - 1)
                deadlines.append((t, i, kind, r))
            clone._deadlines = deadlines
        heapq.heapify(clone._deadlines)
        clone._next_pending = 0
        return clone
