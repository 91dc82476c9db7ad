"""The one interface every knob controller implements: baselines, PID, the learned policy."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from runtime.knobs import DEFAULT_KNOBS, Knobs


@runtime_checkable
class Controller(Protocol):
    name: str

    def decide(self, observation: np.ndarray) -> Knobs:
        """Knobs for the next interval from the observation of the last one."""
        ...

    def reset(self) -> None:
        """Forget any state (a new episode or replay)."""
        ...


class StaticController:
    """Always the same knobs (the start-up configuration engines use today)."""

    def __init__(self, knobs: Knobs = DEFAULT_KNOBS, name: str = "static") -> None:
        self.knobs = knobs
        self.name = name

    def decide(self, observation: np.ndarray) -> Knobs:
        return self.knobs

    def reset(self) -> None:
        pass
