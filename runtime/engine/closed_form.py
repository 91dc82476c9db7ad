"""The engine's loop on an executor whose iteration times are a closed form: the simulator's.

Between events (an arrival, an admission deadline, a completion, a block shortage, the end of a
``run_until``), a decode-only stretch has a fixed batch whose iteration time grows linearly, so
the loop advances the whole stretch in one computation; an iteration with prefill work is one
step. Both run on the lazy decode clock (:mod:`runtime.engine.decode_clock`): neither walks the
running decodes, only the requests something happens to (a block needed, a completion, a
prefill chunk). With an executor whose iterations are its cost model alone
(``SimulatedExecutor.closed_form``) a step is computed here from the batch's aggregates, the
executor's formula term by term; with one that must see its batches (a recording wrapper, a
subclass), a step is the step-by-step path's (:mod:`runtime.engine.stepping`).

The run is the step-by-step loop's, event for event: the same iterations at the same times (a
stretch's times summed in closed form), the same admissions, block ids, completions and counts;
``tests/test_engine.py`` compares it with the loop rebuilding its state at every event, and with
the step-by-step path.
"""

from __future__ import annotations

import heapq
import math
from itertools import chain

from runtime.engine.deadlines import DeadlinesMixin
from runtime.engine.decode_clock import DecodeClockMixin, order_of
from runtime.engine.request import Request
from runtime.engine.stepping import SteppingMixin

_chain = chain.from_iterable


class ClosedFormMixin(SteppingMixin, DeadlinesMixin, DecodeClockMixin):
    """:class:`~runtime.engine.engine.Engine`'s closed-form loop."""

    _rebuild_every_event = False
    """tests: drop the decode clock's state after every stretch and step, so that each is
    computed from the requests' own counts (the reference the kept state must match)"""

    def _eager_step(self) -> bool:
        """One step-by-step iteration (the counts brought up to date first)."""
        self._clock_sync(drop=True)
        return self._step()

    def _run_closed_form(self, t: float) -> None:
        """:meth:`Engine.run_until` on the closed-form path: the step-by-step loop's order of
        work (arrivals, certain misses, admission, one iteration or one stretch), with the
        decode-only stretch written out here."""
        dl = self._deadlines
        waiting, late, waiting_batch = self.waiting, self.late, self.waiting_batch
        pool = self.pool
        bs = self.block_size
        cost = self._decode_cost
        assert cost is not None
        const_s, per_seq, per_ctx = cost.const_s, cost.per_seq_s, cost.per_ctx_token_s
        knobs = self.knobs
        window_s = knobs.batch_window_ms * 1e-3
        chunk = knobs.prefill_chunk_tokens
        lazy_steps = self._iteration_cost is not None
        rebuild = self._rebuild_every_event
        sqrt, ceil = math.sqrt, math.ceil
        heappop = heapq.heappop
        n_of = -1  # the batch size the stretch constants below are for
        a0 = bq = bq2 = bq4 = 0.0
        iv = self._interval  # (an interval closes between run_until calls, never inside one)
        # the next arrival: only _take_arrivals, below, moves it inside the loop
        next_arrival = self._next_arrival_s()
        while self.now < t:
            now = self.now
            if next_arrival <= now:
                self._take_arrivals()
                next_arrival = self._next_arrival_s()
            if dl and dl[0][0] <= now:
                self._count_certain_violations()
            if waiting:
                # _admit's own test: the window of the oldest on-time request has expired or the
                # waiting tokens fill a chunk (late requests are always due)
                if (now >= waiting[0].arrival_s + window_s or self._waiting_tokens >= chunk
                        or late):
                    self._admit()
            elif late or waiting_batch:
                self._admit()
            running = self.running
            if not running:
                # idle: nothing can run until an arrival, a window or a deadline
                wake = min(t, self.next_event_s())
                if wake <= now:  # waiting, but blocked (cannot happen with nothing running)
                    raise RuntimeError(
                        f"engine stalled at t={now}: {len(waiting)} waiting, "
                        f"{len(running)} running, {pool.num_free} free blocks")
                self.now = wake
                continue
            n = len(running)
            if self._num_prefilling or n > self._max_batch_tokens:
                if not (lazy_steps and self._lazy_step()):
                    self._eager_step()
                if rebuild:
                    self._clock_sync(drop=True)
                continue
            if not self._lazy:
                self._clock_build()
            # --- a decode-only stretch, from now to its first event. It ends at ``t``, the
            # next arrival, the admission deadline of the waiting head (if ahead: one past means
            # the head did not fit, and only a completion or a preemption, both events here,
            # can change that) or, when deadlines change the queues (a late request, an
            # expiring batch one), the next deadline; at the first completion; or where the
            # first decode would find no free block.
            wake = t
            if next_arrival < wake:
                wake = next_arrival
            if waiting:
                deadline = waiting[0].arrival_s + window_s
                if now < deadline < wake:
                    wake = deadline
            if dl and (waiting_batch or not self._fcfs):
                head = dl[0][0]
                if head < wake:
                    wake = head
            if wake <= now:  # an event due now that the top of the loop left: one plain step
                self._eager_step()
                continue
            clock = self._clock
            ends = self._ends
            top_end, order, r = ends[0]
            while r.order != order or r.synced_at < 0:
                heappop(ends)  # an entry of a request preempted (or finished) since
                top_end, order, r = ends[0]
            k_fin = top_end - clock
            # iteration i of a stretch starts at now + A*i + Bq*i*(i-1); it takes a + c*(ctx + n*i)
            if n != n_of:
                n_of = n
                a0 = const_s + per_seq * n
                bq = per_ctx * n * 0.5
                bq2, bq4 = 2.0 * bq, 4.0 * bq
            a = a0 + per_ctx * self._ctx
            # k: the first iteration that ends at or after ``wake``, or the completion if that
            # comes first (the stretch's end time grows with its length: the completion comes
            # first when the iteration before it ends before ``wake``)
            if k_fin > 1 and now + a * (k_fin - 1) + bq * (k_fin - 1) * (k_fin - 2) >= wake:
                d = wake - now
                if bq > 0:
                    lin = a - bq
                    k = ceil((-lin + sqrt(lin * lin + bq4 * d)) / bq2)
                else:
                    k = ceil(d / a) if a > 0 else k_fin
                if k < 1:
                    k = 1
                while k > 1 and now + a * (k - 1) + bq * (k - 1) * (k - 2) >= wake:
                    k -= 1
                while now + a * k + bq * k * (k - 1) < wake:
                    k += 1
                if k > k_fin:
                    k = k_fin
            else:
                k = k_fin
            # blocks: a decode needs one every block-size-th iteration; with too few free, the
            # stretch stops where the first decode would find none
            free = pool.num_free
            if free < n * (-(-k // bs)):
                q, j = divmod(free, n)
                k_block = q * bs + self._block_offset(j)
                if k_block < k:
                    k = k_block
                if k <= 0:  # short at once: the step-by-step path preempts
                    self._eager_step()
                    continue
            end = now + a * k + bq * k * (k - 1)
            # the blocks crossed into, in running order (each takes the top of the free stack
            # left by those before it, as one allocation a request would)
            if k < bs:
                s = clock % bs
                crossing = list(_chain(self._buckets2[s:s + k]))
                if crossing:
                    if len(crossing) > 1:
                        crossing.sort(key=order_of)
                    got = pool.allocate(len(crossing))
                    assert got is not None, "the stretch reserved these blocks"
                    for r, b in zip(crossing, reversed(got)):
                        r.block_ids.append(b)
                    if self._num_running_batch:
                        self._batch_blocks += sum(r.is_batch for r in crossing)
            elif self._deferred:
                self._take_crossings(self._crossings(k))
            else:
                self._take_stretch_blocks(k)
            if self._deferred:  # their skipped residue is behind them
                self._buckets[clock % bs].extend(self._deferred)
                self._deferred.clear()
            clock += k
            self._clock = clock
            self.now = end
            self.num_iterations += k
            self.num_fast_stretches += 1
            iv.iterations += k
            iv.busy_s += end - now
            iv.decode_tokens += n * k
            self._ctx += n * k
            if k == k_fin:  # completions, in running order, after the allocations
                self._complete_decodes(clock)
            if rebuild:
                self._clock_sync(drop=True)
        self._take_arrivals()
        self._count_certain_violations()
        # the decodes' counts are left lagging the clock: an interval's close reads none of
        # them (the environment closes one every 0.25 s); readers of counts bring them up to
        # date (``requests``, ``state_key``, ``fork``)

    def _take_crossings(self, crossing: list[tuple[Request, int]]) -> None:
        """Hand each ``(request, blocks)`` of ``crossing`` (in running order) its blocks: one
        allocation, cut as request-by-request ones would be."""
        got = self.pool.allocate(sum(m for _, m in crossing))
        assert got is not None, "the stretch reserved these blocks"
        hi = len(got)
        for r, m in crossing:
            r.block_ids.extend(got[hi - m:hi])
            hi -= m
            if r.is_batch:
                self._batch_blocks += m

    def _take_stretch_blocks(self, k: int) -> None:
        """The blocks of a decode-only stretch of ``k`` iterations, ``k`` of a block or more, none
        deferred: every running request is a registered decode then and crosses into at least
        one block, so ``running`` (kept in running order) is walked once, each request's count
        read from its clock residue; the allocation is cut as :meth:`_take_crossings` cuts it."""
        bs = self.block_size
        now = self._clock
        buckets = self._buckets
        # a request of residue (now + i) % bs crosses into a block at iterations i, i + bs, ...
        # of the k: q + 1 blocks for the first ``rem`` residues from now, q for the others
        q, rem = divmod(k, bs)
        per_residue = [q] * bs  # blocks a request of each residue takes
        total = q * len(self.running)
        for i in range(now, now + rem):
            b = i % bs
            per_residue[b] = q + 1
            total += len(buckets[b])
        got = self.pool.allocate(total)
        assert got is not None, "the stretch reserved these blocks"
        hi = len(got)
        if self._num_running_batch:
            for r in self.running:
                m = per_residue[(r.synced_at - r.num_computed_tokens) % bs]
                r.block_ids.extend(got[hi - m:hi])
                hi -= m
                if r.is_batch:
                    self._batch_blocks += m
        else:
            for r in self.running:
                m = per_residue[(r.synced_at - r.num_computed_tokens) % bs]
                r.block_ids.extend(got[hi - m:hi])
                hi -= m
        assert hi == 0, "a running request off the clock in a decode-only stretch"

    def _complete_decodes(self, top: int) -> None:
        """Finish the registered decodes whose last token came at clock ``top``, in running
        order."""
        ends = self._ends
        finishing = []
        while ends and ends[0][0] <= top:
            _, order, r = heapq.heappop(ends)
            if r.order == order and r.synced_at >= 0:
                finishing.append(r)
        if len(finishing) > 1:
            finishing.sort(key=order_of)
        running = self.running
        for r in finishing:
            self._unregister(r)
            self._finish(r)
            running.remove(r)

    def _lazy_step(self) -> bool:
        """One iteration with prefill work, from the batch's aggregates and the executor's cost
        model (``_iteration_cost``); False (nothing changed) where the step-by-step path must run
        it: a decode short of a block, an iteration out of activation memory, an empty batch."""
        if not self._lazy:
            self._clock_build()
        running = self.running
        prefilling = self._prefill_list
        n_dec = len(running) - len(prefilling)
        clock = self._clock
        bs = self.block_size
        pool = self.pool
        if bs > 1:
            crossing = self._buckets[clock % bs][:]
            if len(crossing) > pool.num_free:
                return False
        else:
            pairs_m = self._crossings(1)
            if len(pairs_m) > pool.num_free:
                return False
        knobs = self.knobs
        budget = knobs.prefill_chunk_tokens
        if self._chunk_cap is not None:
            budget = min(budget, self._chunk_cap)
        batch_budget = int(self.batch_share * budget)
        chunks = []
        tokens = pairs = 0
        for r in prefilling:
            if budget <= 0:
                break
            computed = r.num_computed_tokens
            todo = r.prompt_tokens + r.num_output_tokens - computed
            n = todo if todo < budget else budget
            if r.is_batch:  # batch requests come last: interactive prefill went first
                if n > batch_budget:
                    n = batch_budget
                    if n <= 0:
                        continue
                batch_budget -= n
            budget -= n
            chunks.append((r, n))
            tokens += n
            pairs += n * computed + n * (n + 1) // 2
        if not chunks and not n_dec:
            return False
        ratio = knobs.kv_cache_ratio
        if ratio != self._fit_ratio:
            self._fit_ratio = ratio
            self._fit_bytes = self.memory.workspace_bytes(ratio)
        m = self.memory
        if m.act_fixed_bytes + m.act_bytes_per_token * (tokens + n_dec) > self._fit_bytes:
            return False  # out of memory: the step-by-step path counts it and retries
        c = self._iteration_cost
        assert c is not None
        ctx = self._ctx
        duration = (c.const_s + c.prefill_token_s * tokens + c.prefill_attn_pair_s * pairs
                    + c.decode_seq_s * n_dec + c.decode_ctx_token_s * ctx)
        self.now += duration
        self.num_iterations += 1
        iv = self._interval
        iv.iterations += 1
        iv.busy_s += duration
        iv.prefill_tokens += tokens
        iv.decode_tokens += n_dec
        # the decodes' blocks, in running order
        if bs > 1:
            if crossing:
                if len(crossing) > 1:
                    crossing.sort(key=order_of)
                got = pool.allocate(len(crossing))
                assert got is not None  # checked above
                for r, b in zip(crossing, reversed(got)):
                    r.block_ids.append(b)
                if self._num_running_batch:
                    self._batch_blocks += sum(r.is_batch for r in crossing)
        elif pairs_m:
            self._take_crossings(pairs_m)
        deferred = self._deferred
        if deferred:
            self._buckets[clock % bs].extend(deferred)
            deferred.clear()
        clock += 1
        self._clock = clock
        self._ctx = ctx + n_dec
        ends = self._ends
        if ends and ends[0][0] <= clock:
            self._complete_decodes(clock)
        done = []
        for r, n in chunks:
            computed = r.num_computed_tokens + n
            r.num_computed_tokens = computed
            num_tokens = r.prompt_tokens + r.num_output_tokens
            if computed == num_tokens:
                r.num_output_tokens += 1
                self._num_prefilling -= 1
                prefilling.remove(r)
                if r.first_token_s is None:
                    self._first_token(r)
                if r.num_output_tokens == r.output_tokens:
                    self._finish(r)
                    done.append(r)
                else:
                    self._register(r)
            elif r.num_output_tokens and computed == num_tokens - 1:
                self._num_prefilling -= 1  # a recompute chunk one token short: now a decode
                prefilling.remove(r)
                self._register(r)
        for r in done:
            running.remove(r)
        return True
