"""What the decider answers: knobs, who chose them, and why it fell back when it did."""

from __future__ import annotations

from typing import Literal, NamedTuple, cast

from runtime.knobs import Knobs
from runtime.observation import SPEC_VERSION

Source = Literal["policy", "pid", "static"]
"""Who chose the knobs in the guarded decider: the ONNX policy, the PID fallback, or the static
last resort (when even the PID cannot read the observation). A baseline controller of the arena
answers with its own name (``aimd``, ``heuristic``, ``best-static``)."""

SOURCES: tuple[Source, ...] = ("policy", "pid", "static")

# Why a decision did not come from the policy. Short and fixed, so that they can label metrics;
# the details (exception text, file names) go to the decider's ``last_error`` and the log.
MODEL_MISSING = "model missing"
"""no policy file is configured, or the file does not exist"""
MODEL_CORRUPT = "model corrupt"
"""the file could not be read or onnxruntime could not build a session from it"""
SPEC_MISMATCH = "spec mismatch"
"""the model's ``batchpilot.spec_version`` is absent or differs from the runtime's"""
BAD_SIGNATURE = "bad model signature"
"""the model's inputs, outputs, shapes or warm-up output break the contract"""
BAD_INPUT_SHAPE = "bad input shape"
"""the observation is not a vector of ``OBS_DIM`` numbers"""
NON_FINITE_INPUT = "non-finite input"
"""the observation holds NaN or an infinity"""
NON_FINITE_OUTPUT = "non-finite output"
"""the policy answered NaN or an infinity"""
POLICY_ERROR = "policy error"
"""the policy raised an exception"""
CIRCUIT_OPEN = "circuit open"
"""SLO attainment under the policy stayed below target: the PID has control for a cool-down"""
OUT_OF_DISTRIBUTION = "out of distribution"
"""the live observation left the distribution the policy was trained on
(:mod:`runtime.decider.ood_guard`): the PID has control until it is back"""
POLICY_SLOW = "policy slow"
"""the policy's decisions took longer than the embedded runtime's limit, several in a row
(:mod:`runtime.decider.slow_guard`): the PID decides for a while, then the policy is tried again"""
PID_FAILED = "; pid failed"
"""appended when the PID could not decide either and the static knobs were used"""

FALLBACK_REASONS: tuple[str, ...] = (
    MODEL_MISSING, MODEL_CORRUPT, SPEC_MISMATCH, BAD_SIGNATURE, BAD_INPUT_SHAPE, NON_FINITE_INPUT,
    NON_FINITE_OUTPUT, POLICY_ERROR, CIRCUIT_OPEN, OUT_OF_DISTRIBUTION, POLICY_SLOW,
)


class Decision(NamedTuple):
    """One decision. A named tuple rather than a frozen dataclass because it is built on the
    embedded hot path, where a frozen dataclass's ``__init__`` cost three times as much."""

    knobs: Knobs
    source: Source
    """who chose the knobs: one of :data:`SOURCES` from the guarded decider (what the REST API
    and its metrics see), or a baseline controller's name in the arena"""
    spec_version: str
    """the runtime's observation and knob spec (``runtime.observation.SPEC_VERSION``)"""
    policy_version: str | None
    """the loaded policy's version, None when no policy is loaded"""
    reason: str | None
    """why the decision did not come from the policy (one of the reasons above, possibly
    followed by :data:`PID_FAILED`); None when it did"""

    def as_dict(self) -> dict:
        return {"knobs": self.knobs.as_dict(), "source": self.source,
                "spec_version": self.spec_version, "policy_version": self.policy_version,
                "reason": self.reason}


def decided_by(knobs: Knobs, source: str) -> Decision:
    """The decision of a plain controller (static, PID, a baseline): no policy, no fallback.
    A baseline's name stands outside :data:`Source`; only the arena reads it."""
    return Decision(knobs, cast(Source, source), SPEC_VERSION, None, None)
