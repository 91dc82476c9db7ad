"""The engine's request intake and queues: requests added ahead of their arrival, the arrivals
taken into the waiting queues (interactive on time, interactive late, batch), admission into
``running`` as the batch window, the chunk, sequence slots, KV blocks and ``batch_share``
allow, and preemption back to the front of a queue (see :mod:`runtime.engine.engine`)."""

from __future__ import annotations

import heapq
import math
from bisect import insort
from collections import deque
from collections.abc import Sequence

import numpy as np

from runtime.engine.config import MAX_ARRIVAL_S
from runtime.engine.decode_clock import BATCH_ORDER, DecodeClockMixin, order_of
from runtime.engine.outcomes import OutcomesMixin
from runtime.engine.request import RejectReason, Request, Status
from runtime.engine.state import FINISH, FIRST_TOKEN, LATE


def _as_list(values: Sequence, kinds: str) -> Sequence:
    """A numpy array of one of the dtype ``kinds`` as a list of Python numbers, else
    ``values``."""
    return values.tolist() if isinstance(values, np.ndarray) and values.dtype.kind in kinds \
        else values


class QueuesMixin(DecodeClockMixin, OutcomesMixin):
    """:class:`~runtime.engine.engine.Engine`'s intake, waiting queues, admission and
    preemption."""

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
        # numpy arrays as Python lists at once (float() and int() of each element as below would
        # give the same values, one numpy scalar at a time)
        arrival_s = _as_list(arrival_s, "fiu")
        prompt_tokens = _as_list(prompt_tokens, "iu")
        output_tokens = _as_list(output_tokens, "iu")
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
        self._requests.extend(new)
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
                heapq.heappush(self._deadlines, (r.deadline_s, r.req_id, FINISH, r))
            else:
                r.status = Status.WAITING
                self.waiting.append(r)
                self._waiting_tokens += r.prompt_tokens
                heapq.heappush(self._deadlines,
                               (r.arrival_s + r.ttft_target_s, r.req_id, FIRST_TOKEN, r))
                if self._slack_events:
                    heapq.heappush(self._deadlines, (r.arrival_s + self._slack * r.ttft_target_s,
                                                     r.req_id, LATE, r))
        if i > self._next_pending:
            self._next_pending = i
            if i > 4096 and i * 2 > len(pending):  # drop the arrived prefix now and then
                del pending[:i]
                self._next_pending = 0

    def _preempt(self, r: Request) -> None:
        """Drop ``r``'s KV and send it to the front of its queue (the caller removed it from
        ``running``)."""
        if r.synced_at >= 0:
            self._unregister(r)  # a decode on the lazy clock: its counts up to date first
        elif r.num_computed_tokens < r.num_tokens - (1 if r.num_output_tokens else 0):
            self._num_prefilling -= 1
            if self._lazy:
                self._prefill_list.remove(r)
        self.pool.free(r.block_ids)
        r.num_computed_tokens = 0
        r.num_preemptions += 1
        r.status = Status.WAITING
        if r.is_batch:
            self._batch_blocks -= len(r.block_ids)
            self._num_running_batch -= 1
            r.block_ids = []
            self.waiting_batch.appendleft(r)
            self._batch_waiting_tokens += r.num_tokens
        else:
            r.block_ids = []
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
            self._admit_from(self.waiting_batch, slots,
                             int(self.batch_share * self.pool.num_blocks) - self._batch_blocks)

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
            self._admissions += 1
            if batch:
                r.order = self._admissions + BATCH_ORDER
                running.append(r)
                self._num_running_batch += 1
                self._batch_blocks += need
            else:
                r.order = self._admissions
                if self._num_running_batch:
                    running.insert(len(running) - self._num_running_batch, r)
                else:
                    running.append(r)
            self._num_prefilling += 1
            if self._lazy:
                insort(self._prefill_list, r, key=order_of)
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
        freeable = self._batch_blocks
        if len(running) - n >= self.config.max_num_seqs or \
                self.pool.num_free + freeable - need < (watermark if len(running) > n else 0):
            return False
        while (len(running) >= self.config.max_num_seqs
               or self.pool.num_free - need < (watermark if running else 0)):
            self._preempt(running.pop())
        return True

    def abort_all(self, reason: RejectReason = RejectReason.ABORTED) -> int:
        """End every request in flight (waiting, running or not yet arrived) with ``reason``."""
        self._clock_sync(drop=True)
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
        self._batch_blocks = 0
        self._waiting_tokens = 0
        self._batch_waiting_tokens = 0
        self._num_prefilling = 0
        self._pending = []
        self._next_pending = 0
        return n
