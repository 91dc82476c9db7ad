"""Request and response models. The observation model is built from the observation spec
(``runtime.observation.OBSERVATION_FIELDS``), so its fields are exactly ``OBSERVATION_NAMES`` with
their units, and the OpenAPI schema documents each one."""

from __future__ import annotations

from typing import Annotated, Literal, NotRequired

from pydantic import BaseModel, ConfigDict, Field, with_config
from typing_extensions import TypedDict

from runtime.api.bounds import MAX_BATCH, field_bounds
from runtime.decider.policy_set import POLICY_NAME_PATTERN
from runtime.observation import OBSERVATION_FIELDS, ObservationField


def _field(f: ObservationField) -> tuple[type, object]:
    """A strict finite float within :func:`field_bounds`."""
    bounds = field_bounds(f)
    desc = f"{f.doc} [{f.unit}]; clipped to {f.low:g}..{f.high:g} ({f.transform} transform)"
    if f.transform == "knob":
        desc += "; optional: absent, the runtime's static knob"
    elif f.default is not None:
        desc += f"; optional: absent, {f.default:g}"
    # mypy matches **bounds against Field's positional `default` overloads
    info = Field(description=desc, json_schema_extra={"unit": f.unit}, **bounds)  # type: ignore[call-overload]
    return (float, info)


# The observation, batch and decision shapes are TypedDicts rather than models: the batch route
# validates 256 observations in 2.2 ms as TypedDicts against 3.4 ms as model instances, and
# answers with plain dicts (measured on the 2-core project machine).
def _annotated(f: ObservationField) -> object:
    field = Annotated[float, _field(f)[1]]
    if f.default is None and f.transform != "knob":
        return field
    return NotRequired[field]  # type: ignore[valid-type]


Observation = TypedDict(  # type: ignore[misc]
    "Observation", {f.name: _annotated(f) for f in OBSERVATION_FIELDS})
Observation.__doc__ = ("One interval's engine signals, by name, in the units of the observation "
                       "spec (runtime/observation.py). The fields added in spec 3 are optional "
                       "(absent: their neutral defaults), and so are the knobs (absent: the "
                       "runtime's static knobs); every other field is required.")
Observation.__pydantic_config__ = ConfigDict(  # type: ignore[attr-defined]
    extra="forbid", strict=True, allow_inf_nan=False)


@with_config(ConfigDict(extra="forbid", use_attribute_docstrings=True))
class BatchRequest(TypedDict):
    observations: Annotated[list[Observation],  # type: ignore[valid-type]
                            Field(max_length=MAX_BATCH)]
    """observations to decide for, answered in the same order (at most 4096)"""


class KnobsOut(TypedDict):
    batch_window_ms: float
    prefill_chunk_tokens: int
    kv_cache_ratio: float
    batch_share: float
    admission_slack: float


@with_config(ConfigDict(use_attribute_docstrings=True))
class DecisionOut(TypedDict):
    knobs: KnobsOut
    source: Literal["policy", "pid", "static"]
    """who chose the knobs"""
    reason: str | None
    """why the policy did not (None when it did)"""
    spec_version: str
    policy_version: str | None


class BatchResponse(TypedDict):
    decisions: list[DecisionOut]


class ReloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: Annotated[str, Field(pattern=POLICY_NAME_PATTERN, examples=["policy.onnx"])]
    """a file name inside the configured policy folder (no path)"""


class PolicyFileOut(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    name: str | None
    policy_version: str
    spec_version: str
    sha256: str
    size_bytes: int
    loaded_at: float
    """Unix time of the load"""
    providers: list[str]
    metadata: dict[str, str]
    """every metadata_props entry of the model (training traces, date, evaluation summary) but
    its training distribution (``ood_guard`` shows that)"""


class BreakerOut(BaseModel):
    enabled: bool
    state: Literal["closed", "open", "half_open"]
    target: float
    trip_after: int
    cooldown_s: float
    close_after: int
    num_trips: int


class OodGuardOut(BaseModel):
    """The policy's out-of-distribution guard (runtime/decider/ood_guard.py)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    tripped: bool
    """whether the PID has control now because the embedded runtime's observations left the
    policy's training distribution"""
    recent_out: int
    """embedded intervals out among the last ``window``"""
    num_trips: int
    """times control went to the PID for this reason"""
    intervals_out: int
    """embedded intervals whose observation was out"""
    client_out: int
    """client observations decided by the PID because they were out"""
    last_field: str | None
    """the observation field that was out most recently"""
    last_value: float | None
    """its value, in vector coordinates"""
    patience: int
    """intervals out among the last ``window`` that hand control to the PID"""
    window: int
    """intervals remembered; that many in a row in give control back"""
    quantiles: list[float]
    """the training quantiles each field's range runs between"""
    margin: float
    """the widening of each range, as a share of the field's vector span"""
    samples: int
    """training observations the ranges come from"""
    fields: dict[str, list[float]]
    """each checked field's range, [low, high] in vector coordinates"""


class RecentOut(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    window_s: int
    """the span counted, in seconds (the last minute)"""
    decisions: int
    """decisions made in the window"""
    by_source: dict[str, int]
    """decisions in the window by source (policy, pid, static)"""
    fallback_share: float
    """share of the window's decisions not made by the policy (0 when there were none)"""
    source: Literal["policy", "pid", "static"] | None
    """the source that made most of the window's decisions (None when there were none)"""
    top_reason: str | None
    """the commonest fallback reason in the window"""


class LendLatchOut(BaseModel):
    """The lending guard's holds after lending preempted (runtime/decider/lend_guard.py)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    preemption_hold: int
    """intervals a hold starts with, doubling on each repeat"""
    trips: int
    """holds started since the policy was loaded"""
    holding_intervals: int
    """intervals the current hold has still to run (0: none runs)"""


class PolicyOut(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    loaded: bool
    policy: PolicyFileOut | None
    missing_reason: str | None
    """why no policy is loaded (None when one is)"""
    runtime_spec_version: str
    max_step: float
    static_knobs: KnobsOut
    breaker: BreakerOut
    recent: RecentOut
    """who actually decided over the last minute"""
    num_reloads: int
    num_failed_reloads: int
    lend_guard_hits: int
    """policy decisions whose KV ratio the policy's lending guard raised (its metadata
    ``batchpilot.lend_guard`` holds the guard)"""
    lend_latch: LendLatchOut | None = None
    """the lending guard's holds in the runtime this server drives (None: the policy's guard
    holds none)"""
    ood_guard: OodGuardOut | None = None
    """the policy's out-of-distribution guard (None: the policy carries no training
    distribution, ``batchpilot.obs_distribution``)"""
    last_error: str | None
    last_error_at: float | None


class HealthOut(BaseModel):
    status: Literal["ok"]


class ReadyOut(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    ready: bool
    source: Literal["policy", "pid", "static"]
    """who actually decides: the source of most decisions over the last minute, or, before any,
    who would decide an ordinary observation now (the policy, or the PID when none is loaded or
    the circuit is open)"""
    policy_version: str | None
    reason: str | None
    """why the policy does not decide (None when it does): the commonest fallback reason over
    the last minute, or why there is no policy"""
    fallback_share_1m: float
    """share of the last minute's decisions not made by the policy (0 when there were none)"""
    decisions_1m: int
    """decisions made over the last minute"""
