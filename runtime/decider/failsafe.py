"""A decider that cannot stop the engine it drives: whatever the wrapped controller does (raise,
answer something that is not a :class:`runtime.decider.decision.Decision`, knobs out of range or
not finite), the decision is the static knobs, and the cause is logged once per kind of fault
rather than once per interval. The vLLM replays wrap every controller in it (a live engine must
keep serving); the simulator's loop calls controllers directly."""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np

from runtime.decider.controller import Decider
from runtime.decider.decision import Decision, decided_by
from runtime.knobs import DEFAULT_KNOBS, Knobs

log = logging.getLogger(__name__)

CONTROLLER_FAULT = "controller fault"
"""the reason of a decision the fail-safe made in the controller's place"""


class FailSafe:
    """:param inner: the controller
    :param static: the knobs to hold when it fails (default: the static default)
    """

    def __init__(self, inner: Decider, static: Knobs = DEFAULT_KNOBS) -> None:
        self.inner = inner
        self.static = static
        self.name = getattr(inner, "name", type(inner).__name__)
        self.faults: Counter[str] = Counter()
        """faults by kind (the exception's type, or what the answer was)"""
        self._fallback = Decision(static, "static", decided_by(static, "static").spec_version,
                                  None, CONTROLLER_FAULT)

    def reset(self) -> None:
        reset = getattr(self.inner, "reset", None)
        if reset is not None:
            try:
                reset()
            except Exception as e:  # noqa: BLE001 - a fault of the controller, kept
                self._fault(type(e).__name__, e)

    def bind(self, engine: object) -> None:
        """Bind the controller to the engine when it reads or sets it (best static sets its
        admission policy); a fault there is counted like any other."""
        bind = getattr(self.inner, "bind", None)
        if bind is not None:
            try:
                bind(engine)
            except Exception as e:  # noqa: BLE001 - a fault of the controller, kept
                self._fault(type(e).__name__, e)

    def _fault(self, kind: str, detail: object) -> Decision:
        if not self.faults[kind]:
            log.warning("controller %s failed (%s: %s); holding the static knobs", self.name,
                        kind, detail)
        self.faults[kind] += 1
        return self._fallback

    def decide(self, observation: np.ndarray) -> Decision:
        try:
            d = self.inner.decide(observation)
        except Exception as e:  # noqa: BLE001 - nothing the controller does may stop serving
            return self._fault(type(e).__name__, e)
        if not isinstance(d, Decision) or not isinstance(d.knobs, Knobs):
            return self._fault("not a Decision", repr(d)[:200])
        try:
            Knobs(*d.knobs.as_tuple())  # range and finiteness, as the constructor checks them
        except (ValueError, TypeError) as e:
            return self._fault("knobs out of range", e)
        return d
