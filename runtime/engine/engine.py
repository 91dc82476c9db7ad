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
from runtime.engine.closed_form import ClosedFormMixin
from runtime.engine.config import KV_SHRINK_WAIT, MAX_ARRIVAL_S, EngineConfig, check_batch_share
from runtime.engine.executor import Executor
from runtime.engine.metrics import IntervalStats, SummaryAccumulator
from runtime.engine.observing import ObservingMixin
from runtime.engine.request import Request, Status
from runtime.engine.state import FINISH
from runtime.knobs import DEFAULT_KNOBS, KNOB_SPECS, Knobs

__all__ = ["MAX_ARRIVAL_S", "Engine", "EngineConfig"]

_request_id = operator.attrgetter("req_id")
_IMMUTABLE = frozenset((int, float, bool, str, type(None), AdmissionPolicy))
"""types of engine state a fork shares rather than copies"""
KV_ROOM_PER_RUNNING = 2
"""blocks a ``wait`` shrink leaves free for each running request's next tokens (the pool is
shrunk again at the ratio's next application, every decision interval)"""
KV_ROOM_BLOCKS = 16
"""blocks a ``wait`` shrink leaves free besides, for admissions"""
_arrival = operator.attrgetter("arrival_s")


class Engine(ClosedFormMixin, ObservingMixin):
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
        closed_form = getattr(executor, "closed_form", None)
        self._iteration_cost = (closed_form() if closed_form is not None
                                and self._decode_cost is not None else None)
        self._fit_ratio = -1.0  # the ratio whose activation workspace _fit_bytes holds
        self._fit_bytes = 0
        if not self.memory.fits(self.block_size, KNOB_SPECS[2].high):
            raise ValueError(
                f"the activation workspace at kv_cache_ratio={KNOB_SPECS[2].high} "
                f"({self.memory.workspace_bytes(KNOB_SPECS[2].high)} bytes) cannot hold one block "
                f"of prefill ({self.memory.activation_bytes(self.block_size)} bytes)")

        self._requests: list[Request] = []  # what ``requests`` reads
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
        self._admissions = 0  # admissions so far: each one's number orders ``running``
        # the lazy decode clock (runtime.engine.decode_clock), built when first needed
        self._lazy = False
        self._clock = 0
        self._ctx = 0
        self._buckets: list[list[Request]] = []
        self._buckets2: list[list[Request]] = []
        self._deferred: list[Request] = []
        self._ends: list[tuple[int, int, Request]] = []
        self._prefill_list: list[Request] = []
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
        self._num_dropped = 0  # ended requests still in ``_requests`` (keep_requests=False)

    @property
    def requests(self) -> list[Request]:
        """Every request added (``config.keep_requests``), or those not yet ended, their token
        counts up to date: between ``run_until`` calls the running decodes' counts lag the
        decode clock (``runtime.engine.decode_clock``), and this list is what a reader outside
        the engine goes through (``running`` holds the same objects as the loop left them)."""
        self._clock_sync()
        return self._requests

    # ------------------------------------------------------------------ knobs
    def set_knobs(self, knobs: Knobs) -> float:
        """Apply new knobs now, all five (the one place knobs are applied); returns the seconds
        the change cost (a pool resize stalls the engine). Lowering the ratio below the blocks in
        use preempts the newest requests, or, with ``config.kv_shrink`` ``wait``, lowers it only
        as far as :meth:`_ratio_with_room` allows (the knobs then hold the ratio applied, and the
        next application of the lower one goes further). A new ``batch_share`` applies from the
        next admission and step (running batch requests are not preempted for it); a new
        ``admission_slack`` applies under the configured admission policy at once (see
        :meth:`_apply_admission`)."""
        old = self.knobs
        if knobs is old or knobs == old:  # every interval of a replay: mostly unchanged
            return 0.0
        if knobs.kv_cache_ratio < old.kv_cache_ratio and self.config.kv_shrink == KV_SHRINK_WAIT:
            knobs = self._ratio_with_room(knobs)
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
                for r in self.running:  # only a request holding a block above the cut has moves
                    if r.block_ids and max(r.block_ids) >= new_blocks:
                        r.block_ids = [moves.get(b, b) for b in r.block_ids]
        cost = self.executor.resize_kv(new_blocks, moves)
        self.now += cost
        self._interval.resize_s += cost
        return cost

    def _ratio_with_room(self, knobs: Knobs) -> Knobs:
        """``knobs`` with the KV ratio raised, where it must be, to the least (in steps of
        0.001, at most the ratio in force) whose pool holds what the running requests hold and
        :data:`KV_ROOM_PER_RUNNING` blocks more for each of them, plus :data:`KV_ROOM_BLOCKS`:
        the pool a ``wait`` shrink leaves (``EngineConfig.kv_shrink``)."""
        room = self.pool.num_used + KV_ROOM_PER_RUNNING * len(self.running) + KV_ROOM_BLOCKS
        memory = self.memory
        if memory.num_kv_blocks(knobs.kv_cache_ratio) >= room:
            return knobs
        ratio = math.ceil(room * memory.kv_block_bytes / memory.free_after_weights * 1000) / 1000
        while memory.num_kv_blocks(ratio) < room:
            ratio = round(ratio + 0.001, 3)
        return dataclasses.replace(knobs, kv_cache_ratio=min(ratio, self.knobs.kv_cache_ratio))

    def set_batch_share(self, share: float) -> None:
        """Set the ``batch_share`` knob alone (through :meth:`set_knobs`)."""
        check_batch_share(share)
        self.set_knobs(dataclasses.replace(self.knobs, batch_share=share))

    # ------------------------------------------------------------------ driving
    def run_until(self, t: float) -> None:
        """Run iterations while ``now < t``. The last one may end after ``t`` (an iteration is not
        interrupted); when idle, time jumps to the next arrival or admission deadline."""
        if self._decode_cost is not None:
            self._run_closed_form(t)
            return
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
        self._clock_sync()  # the key holds every running request's counts
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
        self._clock_sync()  # the clones' counts are exact: they start off the clock
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
            "_requests": [], "_deadlines": [],
            "running": [cloned(r) for r in self.running],
            "waiting": deque(map(cloned, self.waiting)), "late": deque(map(cloned, self.late)),
            "waiting_batch": deque(map(cloned, self.waiting_batch)),
            "_interval": self._interval.copy(), "_ended": self._ended.copy(),
            # the decode clock's structures hold the original's requests: the copy builds its
            # own when it first runs (the counts were brought up to date above)
            "_lazy": False, "_ctx": 0, "_buckets": [], "_buckets2": [], "_deferred": [],
            "_ends": [], "_prefill_list": [],
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
        for c in clones.values():
            c.synced_at = -1
        copies = cast(list[Request], clone._requests)
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
