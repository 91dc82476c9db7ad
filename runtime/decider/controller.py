"""The one contract every knob controller keeps: baselines, PID, the guarded ONNX decider and
the learned policy all answer an observation with a :class:`runtime.decider.decision.Decision`."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from runtime.decider.decision import Decision, decided_by
from runtime.knobs import DEFAULT_KNOBS, Knobs


class Decider(Protocol):
    """Anything the session loop (:mod:`runtime.session`) can ask for knobs."""

    def decide(self, observation: np.ndarray) -> Decision:
        """The decision for the next interval from the observation of the last one."""
        ...


@runtime_checkable
class Controller(Decider, Protocol):
    """A decider with a name and per-replay state (the arena's baselines and policies)."""

    name: str

    def reset(self) -> None:
        """Forget any state (a new episode or replay)."""
        ...


class StaticController:
    """Always the same knobs (the start-up configuration engines use today)."""

    def __init__(self, knobs: Knobs = DEFAULT_KNOBS, name: str = "static") -> None:
        self.knobs = knobs
        self.name = name
        self._decision = decided_by(knobs, name)

    def decide(self, observation: np.ndarray) -> Decision:
        return self._decision

    def reset(self) -> None:
        pass
