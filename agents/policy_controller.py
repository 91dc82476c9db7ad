"""An exported ONNX policy as a knob controller, run the way production runs it.

Decisions go through the runtime's :class:`runtime.decider.guard.GuardedDecider` (onnxruntime on
one CPU thread, non-finite and error fallbacks to PID, range and slew clamps), so an evaluation
measures the deployed path, not the training framework; each decision says who decided (policy,
PID or static) and why. The circuit breaker is off by default: under overload every
controller's attainment stays below target, and a breaker would hand a policy's decisions to the
PID exactly where the comparison matters; ``breaker=True`` turns it on with the evaluation's
simulated clock. The out-of-distribution guard of a policy that carries one runs as in
production (the arena's ``policy-unguarded:PATH`` runs the same policy without it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from runtime.decider.breaker import CircuitBreaker
from runtime.decider.decision import Decision
from runtime.decider.guard import GuardedDecider
from runtime.decider.pid import PidController
from runtime.knobs import DEFAULT_KNOBS, Knobs


class PolicyController:
    def __init__(self, path: str | Path, *, breaker: bool = False, clock=None,
                 ood_guard: bool = True, name: str | None = None,
                 static: Knobs = DEFAULT_KNOBS) -> None:
        """:param path: the ONNX policy file
        :param breaker: run the circuit breaker (with ``clock``, simulated seconds)
        :param ood_guard: run the policy's out-of-distribution guard, when it carries one
            (False: the policy decides wherever it answers, to measure what the guard buys)
        :param name: the controller's name (default ``policy:PATH``)
        :param static: the deployment's static knobs: the last resort, and what the PID it
            hands over to is bound around (the arena's ``static`` row)
        """
        if not Path(path).is_file():
            raise FileNotFoundError(f"policy file not found: {path}")
        cb = CircuitBreaker(clock=clock) if breaker else CircuitBreaker(trip_after=0)
        self.decider = GuardedDecider(path, breaker=cb, ood_guard=ood_guard,
                                      pid=PidController(static=static), static_knobs=static)
        if self.decider.policy is None:
            raise ValueError(f"policy {path} was refused: {self.decider.last_error}")
        self.name = name or f"policy:{path}"

    def reset(self) -> None:
        self.decider.breaker.reset()
        policy = self.decider.policy
        if policy is not None and policy.ood_guard is not None:
            policy.ood_guard.reset()
        if policy is not None and policy.lend_latch is not None:
            policy.lend_latch.reset()

    @property
    def lend_guard_hits(self) -> int:
        """the policy's decisions whose KV ratio its lending guard raised"""
        return self.decider.lend_guard_hits

    def decide(self, observation: np.ndarray) -> Decision:
        return self.decider.decide(observation)
