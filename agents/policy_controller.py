"""An exported ONNX policy as a knob controller, run the way production runs it.

Decisions go through the runtime's :class:`runtime.decider.guard.GuardedDecider` (onnxruntime on
one CPU thread, non-finite and error fallbacks to PID, range and slew clamps), so an evaluation
measures the deployed path, not the training framework; each decision says who decided (policy,
PID or static) and why. The circuit breaker is off by default: under overload every
controller's attainment stays below target, and a breaker would hand a policy's decisions to the
PID exactly where the comparison matters; ``breaker=True`` turns it on with the evaluation's
simulated clock.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from runtime.decider.breaker import CircuitBreaker
from runtime.decider.decision import Decision
from runtime.decider.guard import GuardedDecider


class PolicyController:
    def __init__(self, path: str | Path, *, breaker: bool = False, clock=None) -> None:
        """:param path: the ONNX policy file
        :param breaker: run the circuit breaker (with ``clock``, simulated seconds)
        """
        if not Path(path).is_file():
            raise FileNotFoundError(f"policy file not found: {path}")
        cb = CircuitBreaker(clock=clock) if breaker else CircuitBreaker(trip_after=0)
        self.decider = GuardedDecider(path, breaker=cb)
        if self.decider.policy is None:
            raise ValueError(f"policy {path} was refused: {self.decider.last_error}")
        self.name = f"policy:{path}"

    def reset(self) -> None:
        self.decider.breaker.reset()

    def decide(self, observation: np.ndarray) -> Decision:
        return self.decider.decide(observation)
