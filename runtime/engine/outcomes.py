"""How a request's end is accounted: finished or rejected with a reason, its first token and its
SLO miss (counted once) in the interval's stats, and its entry in the run summary."""

from __future__ import annotations

import heapq

from runtime.engine.request import RejectReason, Request, Status
from runtime.engine.state import FINISH, EngineState


class OutcomesMixin(EngineState):
    """:class:`~runtime.engine.engine.Engine`'s accounting of first tokens, finishes, rejections
    and SLO misses."""

    def _ended_request(self, r: Request, met: bool | None = None) -> None:
        """Account for a request that just ended (``met``: whether it met its SLO, when the caller
        knows), and drop it unless every request is kept."""
        self._ended.add(r, met)
        if not self.config.keep_requests:
            self._num_dropped += 1
            if self._num_dropped > 1024 and self._num_dropped * 2 > len(self._requests):
                self._requests = [q for q in self._requests if q.status < Status.FINISHED]
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
        now = r.finish_s = self.now
        blocks = r.block_ids
        self.pool.free(blocks)
        r.block_ids = []
        iv = self._interval
        iv.finished += 1
        if r.is_batch:
            self._num_running_batch -= 1
            self._batch_blocks -= len(blocks)
            ok = now <= r.deadline_s  # Request.meets_slo, for a batch request
            self._ended_request(r, ok)
            if ok:
                iv.met += 1
                iv.batch_met += 1
                iv.batch_goodput_tokens += r.prompt_tokens + r.output_tokens
            else:
                self._violation(r)
            return
        # Request.meets_slo, with the TPOT taken once for the ratio too
        first = r.first_token_s
        assert first is not None  # it produced tokens
        ok = not first - r.arrival_s > r.ttft_target_s
        if r.output_tokens >= 2:
            tpot = (now - first) / (r.output_tokens - 1)
            iv.tpot_ratios.append(tpot / r.tpot_target_s)
            ok = ok and tpot <= r.tpot_target_s
        self._ended_request(r, ok)
        if ok:
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
