"""What the engine reports: the interval stats a controller reads, the run summary, and a check
of its own bookkeeping."""

from __future__ import annotations

from runtime.engine.deadlines import DeadlinesMixin
from runtime.engine.executor import GIB
from runtime.engine.metrics import IntervalStats, RunSummary
from runtime.engine.request import Request, Status


class ObservingMixin(DeadlinesMixin):
    """:class:`~runtime.engine.engine.Engine`'s interval stats, run summary and invariants."""

    def collect_interval(self, state: bool = True) -> IntervalStats:
        """Close the current interval: return its stats (with the engine state now) and start a
        new one. ``state`` False leaves the state fields (queues, KV use and fragmentation,
        batch backlog, percentiles) unset: the counters alone, for a look ahead that reads no
        more."""
        self._count_certain_violations()
        self._account_memory()
        iv = self._interval
        iv.end_s = self.now
        if not state:
            self._interval = IntervalStats(start_s=self.now)
            return iv
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
        iv.close_percentiles()
        self._interval = IntervalStats(start_s=self.now)
        return iv

    def _batch_backlog(self) -> tuple[int, float]:
        """(tokens the batch requests in the engine still have to compute, their least deadline
        margin: (deadline - now) / (deadline - arrival), floored at 0; 1 when there are none)."""
        n = self._num_running_batch
        if not n and not self.waiting_batch:
            return 0, 1.0
        now = self.now
        clock = self._clock
        todo = 0
        margin = 1.0
        for r in self.running[len(self.running) - n:]:
            todo += r.prompt_tokens + r.output_tokens - r.num_computed_tokens
            if r.synced_at >= 0:  # a decode on the clock: its count lags it
                todo -= clock - r.synced_at
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
        finished = Status.FINISHED  # an enum member read once, not once a request
        return self._ended.summary(
            (r for r in self._requests if r.status < finished), self.now,
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
        assert self._batch_blocks == sum(len(r.block_ids) for r in self.running if r.is_batch)
        assert [r.is_batch for r in self.running] == (
            [False] * (len(self.running) - n_batch) + [True] * n_batch), "class order"
        for q in (self.waiting, self.late, self.waiting_batch):
            assert all(r.status == Status.WAITING for r in q), "a queued request is not waiting"
        prefilling = sum(1 for r in self.running
                         if not (r.num_output_tokens and r.num_computed_tokens == r.num_tokens - 1))
        assert prefilling == self._num_prefilling, (prefilling, self._num_prefilling)
        clock = self._clock
        for r in self.running:  # a decode on the clock has computed its lag more than it says
            lag = clock - r.synced_at if r.synced_at >= 0 else 0
            assert len(r.block_ids) * self.block_size >= r.num_computed_tokens + lag
        assert [r.order for r in self.running] == sorted(r.order for r in self.running), "order"
        self._check_clock()

    def _check_clock(self) -> None:
        """The lazy decode clock's structures (runtime.engine.decode_clock) against the requests,
        each registered decode's counts taken up to date by its lag here without changing them
        (they lag between run_until calls too, and a check must not hide that)."""
        decodes = [r for r in self.running
                   if r.num_output_tokens and r.num_computed_tokens == r.num_tokens - 1]
        if not self._lazy:
            assert all(r.synced_at == -1 for r in self.running), "registered without a clock"
            return
        bs = self.block_size
        now = self._clock
        assert all(0 <= r.synced_at <= now for r in decodes), "a decode off the clock"
        lag = {id(r): now - r.synced_at for r in decodes}
        assert self._prefill_list == [r for r in self.running if r.synced_at < 0], "prefills"
        assert self._ctx == sum(r.num_computed_tokens + lag[id(r)] + 1 for r in decodes), "context"
        held = {id(r): i for i, bucket in enumerate(self._buckets) for r in bucket}
        held.update((id(r), -1) for r in self._deferred)
        assert len(held) == len(decodes) == sum(map(len, self._buckets)) + len(self._deferred)
        for r in decodes:
            off = len(r.block_ids) * bs - r.num_computed_tokens - lag[id(r)]
            assert held[id(r)] == ((now + off) % bs if off < bs else -1), "block residue"
        live = {id(r): t for t, order, r in self._ends if r.order == order and r.synced_at >= 0}
        assert live == {id(r): now + r.output_tokens - r.num_output_tokens - lag[id(r)]
                        for r in decodes}
