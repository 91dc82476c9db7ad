"""The slow-policy guard: a policy whose decisions take too long hands its decisions to the PID.

In the embedded runtime the decision runs between two of the engine's steps (inside vLLM's
``schedule()``, once an interval), so a policy that answers, but slowly, delays a step every
interval: a policy far larger than the shipped MLP, an onnxruntime built for another machine, a
CPU shared with something that starves it. The decision of a 64x64 MLP takes about 10 us; the
limit (:attr:`SlowPolicyGuard.limit_s`, 5 ms by default in ``vllm serve``) is hundreds of times
that and a small share of a step.

The rule, per decision the policy makes in the embedded runtime:

- A decision is *slow* when ``policy.act`` took longer than the limit. Its answer is kept (the
  time is spent; the knobs are as good as the policy's).
- :data:`SLOW_AFTER` slow decisions in a row (one alone can be the machine: a page fault, a
  descheduled thread) hand the decisions to the PID (reason ``policy slow``) for
  :data:`RETRY_AFTER` intervals, without running the policy. Then the policy decides once more:
  a fast decision gives it back its place, a slow one hands over again at once.
- A reload starts afresh (a new policy has not been slow).

A client's decision (REST) is timed by nobody: a client's load on the server's CPU must not
switch the policy off for the other clients (as with the breaker).
"""

from __future__ import annotations

import math

SLOW_AFTER = 3
"""slow decisions in a row that hand the decisions to the PID"""
RETRY_AFTER = 240
"""intervals the PID then decides before the policy is tried again (a minute at 0.25 s)"""


class SlowPolicyGuard:
    """Times the policy's decisions (see the module docstring).

    :param limit_s: a decision that takes longer is slow
    :param slow_after: slow decisions in a row that hand over to the PID
    :param retry_after: intervals the PID then decides before the policy is tried again
    """

    def __init__(self, limit_s: float, slow_after: int = SLOW_AFTER,
                 retry_after: int = RETRY_AFTER) -> None:
        if not (math.isfinite(limit_s) and limit_s > 0):
            raise ValueError(f"the decision limit must be a finite number of seconds > 0, got "
                             f"{limit_s}")
        if slow_after < 1 or retry_after < 1:
            raise ValueError(f"slow_after and retry_after must be >= 1, got {slow_after}, "
                             f"{retry_after}")
        self.limit_s = float(limit_s)
        self.slow_after = slow_after
        self.retry_after = retry_after
        self.slow_decisions = 0
        """policy decisions that took longer than the limit"""
        self.num_handovers = 0
        """times the decisions went to the PID"""
        self.slowest_s = 0.0
        """the slowest policy decision timed"""
        self._in_a_row = 0
        self._left = 0

    @property
    def handed_over(self) -> bool:
        """Whether the PID decides now in the policy's place."""
        return self._left > 0

    def skip(self) -> bool:
        """Whether this interval's decision goes to the PID without running the policy (counts
        the interval off the hand-over)."""
        if self._left > 0:
            self._left -= 1
            return True
        return False

    def timed(self, seconds: float) -> None:
        """The policy took ``seconds`` to decide."""
        if seconds > self.slowest_s:
            self.slowest_s = seconds
        if seconds <= self.limit_s:
            self._in_a_row = 0
            return
        self.slow_decisions += 1
        self._in_a_row += 1
        if self._in_a_row >= self.slow_after:
            self._left = self.retry_after
            self.num_handovers += 1
            self._in_a_row = self.slow_after - 1  # a slow retry hands over again at once

    def reset(self) -> None:
        """A new policy: nothing slow yet (the counts stay)."""
        self._in_a_row = 0
        self._left = 0

    def describe(self) -> dict:
        return {"limit_s": self.limit_s, "slow_after": self.slow_after,
                "retry_after": self.retry_after, "handed_over": self.handed_over,
                "intervals_left": self._left, "slow_decisions": self.slow_decisions,
                "num_handovers": self.num_handovers, "slowest_s": self.slowest_s}
