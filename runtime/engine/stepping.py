"""The engine's step-by-step iteration: one batch built from the running requests, run on the
executor, and its tokens applied (see :mod:`runtime.engine.engine`). It is the reference path,
the one real executors take; the simulator's closed-form loop
(:mod:`runtime.engine.closed_form`) runs the same iterations without building batches."""

from __future__ import annotations

from runtime.engine.executor import Batch
from runtime.engine.queues import QueuesMixin
from runtime.engine.request import Status


class SteppingMixin(QueuesMixin):
    """:class:`~runtime.engine.engine.Engine`'s step-by-step iteration."""

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
