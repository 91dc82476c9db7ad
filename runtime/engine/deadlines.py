"""The engine's deadline heap and deadline-aware admission: SLO misses counted as soon as they are
certain, interactive requests late for their first token handled under the admission policy
(:mod:`runtime.engine.admission`), batch requests rejected once their deadline passes while
they wait."""

from __future__ import annotations

import dataclasses
import heapq

from runtime.engine.admission import AdmissionPolicy
from runtime.engine.config import EngineConfig
from runtime.engine.memory import MemoryMixin
from runtime.engine.outcomes import OutcomesMixin
from runtime.engine.request import RejectReason, Request, Status
from runtime.engine.state import FINISH, FIRST_TOKEN, LATE


class DeadlinesMixin(MemoryMixin, OutcomesMixin):
    """:class:`~runtime.engine.engine.Engine`'s deadline heap and admission policy."""

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
            if kind == FINISH:
                self._violation(r)
                if r.is_batch and r.status == Status.WAITING:
                    self.waiting_batch.remove(r)
                    self._batch_waiting_tokens -= r.num_tokens
                    self._interval.expired += 1
                    self._reject(r, RejectReason.EXPIRED)
            elif r.first_token_s is None:
                if kind == FIRST_TOKEN:
                    self._violation(r)
                if kind == LATE:
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
                                                     r.req_id, LATE, r))

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
            if self._lazy:
                self._prefill_list.remove(r)
            self.pool.free(r.block_ids)
            r.block_ids = []
        else:
            return
        self._interval.shed += 1
        self._reject(r, RejectReason.SHED)
