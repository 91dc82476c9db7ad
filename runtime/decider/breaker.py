"""The circuit breaker: a canary that takes control from the policy when SLO attainment under it
stays below target, gives it to the PID for a cool-down, and hands it back on probation.

States (as in the classic breaker; "closed" means the policy is in the circuit):

- ``closed``: the policy decides. Each reading of interval SLO attainment that follows a policy
  decision counts: ``trip_after`` readings in a row below ``target`` open the circuit.
- ``open``: the PID decides. After ``cooldown_s`` (by the injected clock) the next decision moves
  to ``half_open``.
- ``half_open``: the policy decides on probation. A reading below target that follows a policy
  decision reopens the circuit at once (and restarts the cool-down); ``close_after`` readings in
  a row at or above target close it.

Attribution. The observation handed to decision k describes the interval that followed decision
k-1, so a reading is charged to the source of the previous decision: readings that follow a PID
or static decision (the open state, or a guard fallback) neither trip nor close the circuit.

Who feeds it. Only the serving runtime that applies this decider's knobs: its readings are of
the intervals that followed the decider's own decisions, which is what the attribution above
needs. Decisions for clients (REST) read the state but never feed it (see
:mod:`runtime.decider.guard`). A process-wide breaker fed by client rows let any client switch
the policy off for everyone (one batch with ``slo_attainment: 0`` in four rows opened it for 30 s),
and a breaker per client would not do better: the server cannot tell whether a client applied
the knobs it was given, which earlier decision a reading follows (replicas behind a load balancer
answer a client's consecutive intervals), or who a client is without authenticating it, and one
breaker per claimed identity is unbounded state a client can inflate. A client that wants a
canary acts on ``source``, or embeds the runtime. Each replica trips on its own, which errs
toward the PID.

The clock is injected so that tests (and the embedded serving loop, which runs in simulated
time) control it; it defaults to ``time.monotonic``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal

BreakerState = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    """:param target: interval SLO attainment (0..1) the policy must hold
    :param trip_after: consecutive readings below target under the policy that open the circuit;
        0 disables the breaker
    :param cooldown_s: how long the circuit stays open, in seconds of ``clock``
    :param close_after: consecutive readings at or above target in half-open that close it
    :param clock: seconds, monotonic
    """

    def __init__(self, target: float = 0.9, trip_after: int = 3, cooldown_s: float = 30.0,
                 close_after: int = 3, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0.0 <= target <= 1.0:
            raise ValueError(f"breaker target must lie in [0, 1], got {target}")
        if trip_after < 0:
            raise ValueError(f"breaker trip_after must be >= 0 (0 disables it), got {trip_after}")
        if not cooldown_s >= 0.0:
            raise ValueError(f"breaker cooldown_s must be >= 0, got {cooldown_s}")
        if close_after < 1:
            raise ValueError(f"breaker close_after must be >= 1, got {close_after}")
        self.target = target
        self.trip_after = trip_after
        self.cooldown_s = cooldown_s
        self.close_after = close_after
        self.clock = clock
        self._lock = threading.Lock()
        self.state: BreakerState = "closed"
        self.num_trips = 0
        """how many times the circuit opened"""
        self.opened_at: float | None = None
        self._below = 0  # consecutive readings below target under the policy (closed)
        self._good = 0  # consecutive readings at or above target under the policy (half-open)
        self._last_by_policy = False

    @property
    def enabled(self) -> bool:
        return self.trip_after > 0

    def allow_policy(self, attainment: float) -> bool:
        """Take the reading that arrives with this decision and say whether the policy may make
        it. Call :meth:`decided` once the decision is made."""
        if self.trip_after == 0:
            return True
        with self._lock:
            state = self.state
            if self._last_by_policy:  # the reading describes the policy's last interval
                if attainment < self.target:
                    if state == "half_open":
                        self._open()
                        return False
                    self._below += 1
                    if self._below >= self.trip_after:
                        self._open()
                        return False
                else:
                    self._below = 0
                    if state == "half_open":
                        self._good += 1
                        if self._good >= self.close_after:
                            self.state = "closed"
                            self._good = 0
            if state == "open":
                assert self.opened_at is not None  # set whenever the state is open
                if self.clock() - self.opened_at < self.cooldown_s:
                    return False
                self.state = "half_open"
                self._good = 0
                self._below = 0
            return True

    def is_closed(self) -> bool:
        """Whether the policy may decide, read without a reading: not open, or open past its
        cool-down (the state changes only when the runtime's next reading arrives)."""
        if self.trip_after == 0 or self.state != "open" or self.opened_at is None:
            return True
        return self.clock() - self.opened_at >= self.cooldown_s

    def decided(self, by_policy: bool) -> None:
        """Record who made the decision just taken (the next reading is charged to it)."""
        self._last_by_policy = by_policy

    def _open(self) -> None:
        self.state = "open"
        self.opened_at = self.clock()
        self.num_trips += 1
        self._below = 0
        self._good = 0
        self._last_by_policy = False

    def reset(self) -> None:
        """Close the circuit and forget every count (a new policy starts with a clean slate)."""
        with self._lock:
            self.state = "closed"
            self.opened_at = None
            self._below = 0
            self._good = 0
            self._last_by_policy = False

    def describe(self) -> dict:
        return {"enabled": self.enabled, "state": self.state, "target": self.target,
                "trip_after": self.trip_after, "cooldown_s": self.cooldown_s,
                "close_after": self.close_after, "num_trips": self.num_trips}
