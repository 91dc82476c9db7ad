"""A stable-baselines3 policy in training as a knob controller (the torch path, in-process)."""

from __future__ import annotations

import numpy as np

from runtime.decider.decision import Decision, decided_by
from runtime.knobs import action_to_knobs


class SB3PolicyController:
    """Decides with ``model.predict(normalised obs, deterministic=True)``, as the ONNX export
    will; used to evaluate a policy during training without exporting it."""

    def __init__(self, model, vecnormalize=None, name: str = "policy") -> None:
        self.model = model
        self.vecnormalize = vecnormalize
        self.name = name

    def reset(self) -> None:
        pass

    def decide(self, observation: np.ndarray) -> Decision:
        obs = np.asarray(observation, dtype=np.float32)[None, :]
        if self.vecnormalize is not None:
            obs = self.vecnormalize.normalize_obs(obs)
        action, _ = self.model.predict(obs, deterministic=True)
        return decided_by(action_to_knobs(np.asarray(action).reshape(-1)), self.name)
