"""How a request's end is accounted: finished or rejected with a reason, its first token and its
SLO miss (counted once) in the interval's stats, and its entry in the run summary."""

from __future__ import annotations

import heapq

from runtime.engine.request import RejectReason, Request, Status
from runtime.engine.state import FINISH, EngineState


class OutcomesMixin(EngineState):
    """:class:`~runtime.engine.engine.Engine`'s accounting of first tokens, finishes, rejections
    and SLO misses."""

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
        held = len(r.block_ids)
        self.pool.free(r.block_ids)
        r.block_ids = []
        self._ended_request(r)
        iv = self._interval
        iv.finished += 1
        if r.is_batch:
            self._num_running_batch -= 1
            self._batch_blocks -= held
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
            heapq.heappush(self._deadlines, (deadline, r.req_id, FINISH, r))
