"""The request accounting of a vLLM engine under the controller, with the simulator's own code.

vLLM does the scheduling; this ledger mirrors every vLLM request as a
:class:`runtime.engine.request.Request` and accounts for it with the engine's outcome code
(:class:`runtime.engine.outcomes.OutcomesMixin`: first tokens, finishes, rejections with a
reason, SLO misses counted once), the engine's interval stats
(:class:`runtime.engine.metrics.IntervalStats`) and run summary
(:class:`runtime.engine.metrics.SummaryAccumulator`), so that an interval of vLLM and one of the
simulator are the same record, observed by the same :class:`runtime.observation.FeatureBuilder`.

It imports nothing from vLLM: the scheduler subclass (:mod:`runtime.vllm.scheduler`) calls it
when vLLM admits, preempts, samples, finishes or aborts a request, and when the deadline heap says
a miss is certain or a request is late (deadline-aware admission, as
:mod:`runtime.engine.deadlines` has it: the same events, acted on by the scheduler).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from runtime.engine.admission import AdmissionPolicy
from runtime.engine.config import EngineConfig
from runtime.engine.executor import GIB
from runtime.engine.metrics import IntervalStats, RunSummary, SummaryAccumulator
from runtime.engine.outcomes import OutcomesMixin
from runtime.engine.request import RejectReason, Request, Status
from runtime.engine.state import FINISH, FIRST_TOKEN, LATE


class _NoBlocks:
    """The outcome code frees a finished request's blocks in the engine's pool; vLLM holds the
    blocks here and frees them itself."""

    def free(self, block_ids: Iterable[int]) -> None:
        pass


class Ledger(OutcomesMixin):
    """Every request's outcome, the interval counters and the run summary of one vLLM engine.

    :param config: the SLO classes, the admission policy and whether ended requests are kept
    :param admission_slack: the ``admission_slack`` knob to start with
    :param kv_block_bytes: bytes of one KV block (for the KV GiB-seconds)
    """

    def __init__(self, config: EngineConfig, admission_slack: float, kv_block_bytes: int) -> None:
        self.config = config
        self.now = 0.0
        self.requests: list[Request] = []
        self._ended = SummaryAccumulator()
        self._num_dropped = 0
        self._num_added = 0
        self._interval = IntervalStats(start_s=0.0)
        self.pool = _NoBlocks()  # type: ignore[assignment]
        self._num_running_batch = 0
        self._batch_blocks = 0  # the outcome code's count; vLLM holds the blocks, so always 0
        self._deadlines: list[tuple[float, int, int, Request]] = []
        self._late: list[Request] = []
        self._expired: list[Request] = []
        self.policy = AdmissionPolicy(config.admission)
        self.slack = admission_slack
        self.kv_block_bytes = kv_block_bytes
        self.kv_blocks = 0
        """the KV blocks vLLM may hold now (the cap), for the GiB-seconds"""
        self.kv_gib_s = 0.0
        self._mem_t = 0.0
        self.num_preemptions = 0
        self.num_iterations = 0

    # ------------------------------------------------------------------ intake
    def new_request(self, arrival_s: float, prompt_tokens: int, output_tokens: int,
                    slo_class: str | None = None) -> Request:
        """A request of ``slo_class`` (default: the config's default class), numbered in the
        order requests are made; it is not arrived yet (:meth:`arrive`)."""
        cls = self.config.default_slo_class if slo_class is None else slo_class
        target = self.config.slo_classes.get(cls)
        if target is None:
            raise ValueError(f"unknown SLO class {cls!r} "
                             f"(known: {sorted(self.config.slo_classes)})")
        r = Request(self._num_added, float(arrival_s), int(prompt_tokens), int(output_tokens), cls,
                    target.ttft_target_s(int(prompt_tokens)), target.tpot_s, target.deadline_s)
        self._num_added += 1
        return r

    def arrive(self, r: Request) -> None:
        """``r`` has arrived (it waits for admission): counted, and its deadlines set."""
        self.requests.append(r)
        iv = self._interval
        iv.arrivals += 1
        iv.arrival_prompt_sum += r.prompt_tokens
        iv.arrival_prompt_sumsq += r.prompt_tokens * r.prompt_tokens
        r.status = Status.WAITING
        if r.is_batch:
            heapq.heappush(self._deadlines, (r.deadline_s, r.req_id, FINISH, r))
            return
        heapq.heappush(self._deadlines, (r.arrival_s + r.ttft_target_s, r.req_id, FIRST_TOKEN, r))
        if self.policy != AdmissionPolicy.FCFS and self.slack != 1.0:
            heapq.heappush(self._deadlines,
                           (r.arrival_s + self.slack * r.ttft_target_s, r.req_id, LATE, r))

    def set_slack(self, slack: float, waiting: Iterable[Request]) -> None:
        """A new ``admission_slack``: the waiting requests get a lateness event at their new
        slack (events at the old one are stale and ignored)."""
        if slack == self.slack:
            return
        self.slack = slack
        if self.policy == AdmissionPolicy.FCFS:
            return
        for r in waiting:
            if r.first_token_s is None and not r.is_batch:
                heapq.heappush(self._deadlines,
                               (r.arrival_s + slack * r.ttft_target_s, r.req_id, LATE, r))

    # ------------------------------------------------------------------ life
    def admitted(self, r: Request) -> None:
        if r.status == Status.RUNNING:
            return
        r.status = Status.RUNNING
        if r.admitted_s is None:
            r.admitted_s = self.now
        if r.is_batch:
            self._num_running_batch += 1

    def preempted(self, r: Request) -> None:
        if r.status != Status.RUNNING:
            return
        r.status = Status.WAITING
        r.num_preemptions += 1
        r.num_computed_tokens = 0
        if r.is_batch:
            self._num_running_batch -= 1
        self.num_preemptions += 1
        self._interval.preemptions += 1

    def sampled(self, r: Request, num_tokens: int) -> None:
        """vLLM sampled ``num_tokens`` new tokens of ``r``."""
        if num_tokens <= 0:
            return
        if r.first_token_s is None:
            self._first_token(r)
        r.num_output_tokens += num_tokens

    def finished(self, r: Request) -> None:
        """vLLM finished ``r`` (its length reached, or a stop token: its output is then what it
        sampled)."""
        if r.status >= Status.FINISHED:
            return
        if r.status != Status.RUNNING:  # finished from the waiting queue: not counted running
            self.admitted(r)
        if r.first_token_s is None:  # nothing sampled (cannot happen for a generation)
            self._first_token(r)
        r.output_tokens = max(1, r.num_output_tokens)
        self._finish(r)

    def rejected(self, r: Request, reason: RejectReason) -> None:
        """``r`` ended without finishing, for ``reason``."""
        if r.status >= Status.FINISHED:
            return
        if r.status == Status.PENDING:  # refused at arrival: it arrived all the same
            self.arrive(r)
        if r.status == Status.RUNNING and r.is_batch:
            self._num_running_batch -= 1
        if reason == RejectReason.SHED:
            self._interval.shed += 1
        elif reason == RejectReason.EXPIRED:
            self._interval.expired += 1
        self._reject(r, reason)

    def moved_back(self, r: Request) -> None:
        """``r`` is late and waits behind on-time requests (admission ``late_to_back``)."""
        r.is_late = True
        self._interval.late += 1

    def due(self) -> tuple[list[Request], list[Request]]:
        """Pop the deadlines passed by ``now``: count the misses that became certain, and return
        (interactive requests late under the admission policy, batch requests whose deadline
        passed while they wait), with those found by :meth:`close_interval` since the last
        call. The caller sheds, moves back or expires them."""
        self._pop_due()
        late, expired = self._late, self._expired
        self._late, self._expired = [], []
        return late, expired

    def _pop_due(self) -> None:
        """Pop the deadlines passed by ``now`` into the late and expired lists (the misses
        counted now, in the open interval)."""
        dl = self._deadlines
        now = self.now
        late = self._late
        expired = self._expired
        acting = self.policy != AdmissionPolicy.FCFS
        while dl and dl[0][0] <= now:
            _, _, kind, r = heapq.heappop(dl)
            if r.status >= Status.FINISHED:
                continue
            if kind == FINISH:
                self._violation(r)
                if r.is_batch and r.status == Status.WAITING:
                    expired.append(r)
            elif r.first_token_s is None:
                if kind == FIRST_TOKEN:
                    self._violation(r)
                if not acting:
                    continue
                if kind == LATE:
                    if r.arrival_s + self.slack * r.ttft_target_s <= now:  # not a stale one
                        late.append(r)
                elif self.slack == 1.0 or (self.policy == AdmissionPolicy.SHED
                                           and r.status == Status.RUNNING):
                    late.append(r)  # late at its TTFT target, or a prefill past it

    def next_deadline_s(self) -> float:
        return self._deadlines[0][0] if self._deadlines else float("inf")

    # ------------------------------------------------------------------ memory, intervals
    def set_kv_blocks(self, blocks: int) -> None:
        """The KV cap changed (to ``blocks``) now."""
        self.account_memory()
        self.kv_blocks = blocks

    def account_memory(self) -> None:
        t0, now = self._mem_t, self.now
        if now <= t0:
            return
        self._mem_t = now
        gib_s = self.kv_blocks * self.kv_block_bytes / GIB * (now - t0)
        self._interval.kv_gib_s += gib_s
        self.kv_gib_s += gib_s

    @property
    def interval(self) -> IntervalStats:
        """The open interval's counters (the scheduler adds its step counts)."""
        return self._interval

    def close_interval(self) -> IntervalStats:
        """Close the open interval at ``now`` (the caller fills in the state at its end before
        :meth:`IntervalStats.close_percentiles`) and open the next. The requests that became
        late or expired wait for the scheduler's next :meth:`due`."""
        self._pop_due()
        self.account_memory()
        iv = self._interval
        iv.end_s = self.now
        iv.kv_blocks = self.kv_blocks
        self._interval = IntervalStats(start_s=self.now)
        return iv

    def batch_backlog(self, in_engine: Iterable[Request]) -> tuple[int, float]:
        """(tokens the batch requests in ``in_engine`` still have to compute, their least deadline
        margin, floored at 0; 1 when there are none), as the engine reports them."""
        todo, margin = 0, 1.0
        now = self.now
        for r in in_engine:
            if not r.is_batch:
                continue
            todo += r.prompt_tokens + r.output_tokens - r.num_computed_tokens
            m = (r.deadline_s - now) / (r.deadline_s - r.arrival_s)
            margin = min(margin, m)
        return todo, max(0.0, margin)

    def in_flight(self) -> list[Request]:
        return [r for r in self.requests if r.status < Status.FINISHED]

    def summary(self) -> RunSummary:
        self.account_memory()
        return self._ended.summary(self.in_flight(), self.now, self.num_preemptions, 0,
                                   self.num_iterations, self.kv_gib_s)
