"""The observation: one float32 vector built from engine stats over the last decision interval.

Training (the Gymnasium environment) and production (the decider, embedded or over REST) build it
with the same functions here, so a policy sees in production exactly what it saw in training.
Each field has a name and a unit (the REST API takes the named fields in these units), a range the
raw value is clipped to, and a transform into the vector:

- ``log``: ``log1p(x) / log1p(high)``, in [0, 1] (counts and rates that span decades)
- ``slog``: ``sign(x) log1p(|x|) / log1p(high)``, in [-1, 1] (signed changes)
- ``linear``: ``(x - low) / (high - low)``, in [0, 1]
- ``knob``: the knob's action coordinate (:func:`runtime.knobs.knobs_to_action`), in [-1, 1]

The table (rendered from :data:`OBSERVATION_FIELDS`; see :func:`observation_table`) is the
reference for every field; the spec version changes whenever the table or the knob spec does.

Spec 3 appended the SLO-class, admission and co-tenant fields after the 17 measured fields of
spec 2 (the knob fields stay last, now five). The new measured fields have neutral defaults
(:attr:`ObservationField.default`: no batch work, deadline margin 1, nothing shed, no co-tenant),
so a named observation may leave them out (a spec-2 client keeps working); knob fields left out
take the runtime's static knobs.

Older policies are still served (:data:`SPEC_ADAPTERS`). Spec 2 saw the 17 measured fields and
the first three knobs; spec 1 saw the same with the prompt-length fields topped at 65,536 tokens
instead of 131,072. An adapter picks those fields out of today's vector (an index map) and
rescales spec 1's prompt fields (a factor), which rebuilds exactly the vector that spec built; the
policy's three actions then stand for the first three knobs, and the runtime takes the other two
from its static knobs (never worse than the static default).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.knobs import (
    DEFAULT_KNOBS,
    KNOB_NAMES,
    KNOB_SPECS,
    NUM_KNOBS,
    Knobs,
    KnobSpec,
    action_to_knobs,
    current_action,
)


@dataclass(frozen=True, slots=True)
class ObservationField:
    name: str
    unit: str
    low: float
    high: float
    transform: str  # "log" | "slog" | "linear" | "knob"
    doc: str
    default: float | None = None
    """the value a named observation (REST) that leaves the field out gets; None: required
    (a knob field left out takes the static knob instead)"""

    @property
    def vector_bounds(self) -> tuple[float, float]:
        return (-1.0, 1.0) if self.transform in ("slog", "knob") else (0.0, 1.0)


PROMPT_TOKENS_HIGH = 131072.0
"""the top of the prompt-length fields: a 128k-token prompt (Llama-3.1's context)"""

_SPEC2_MEASURED: tuple[ObservationField, ...] = (
    ObservationField("arrival_rate_rps", "requests/s", 0.0, 5000.0, "log",
                     "requests that arrived in the interval, per second"),
    ObservationField("arrival_rate_change_rps", "requests/s", -5000.0, 5000.0, "slog",
                     "arrival rate minus the previous interval's"),
    ObservationField("prompt_tokens_mean", "tokens", 0.0, PROMPT_TOKENS_HIGH, "log",
                     "mean prompt length of the interval's arrivals"),
    ObservationField("prompt_tokens_std", "tokens", 0.0, PROMPT_TOKENS_HIGH, "log",
                     "standard deviation of the interval's prompt lengths"),
    ObservationField("waiting_requests", "requests", 0.0, 1e6, "log",
                     "requests waiting for admission at the end of the interval"),
    ObservationField("waiting_prompt_tokens", "tokens", 0.0, 1e8, "log",
                     "tokens the waiting requests must prefill"),
    ObservationField("running_requests", "requests", 0.0, 4096.0, "log",
                     "requests holding KV blocks at the end of the interval"),
    ObservationField("kv_utilization", "fraction", 0.0, 1.0, "linear",
                     "share of the KV blocks in use"),
    ObservationField("kv_fragmentation", "fraction", 0.0, 1.0, "linear",
                     "1 - sum(free gap^2) / free^2: 0 when the free blocks are contiguous"),
    ObservationField("preemptions", "count", 0.0, 1e5, "log",
                     "requests preempted in the interval"),
    ObservationField("ooms", "count", 0.0, 1e4, "log",
                     "iterations that ran out of activation memory in the interval"),
    ObservationField("ttft_p99_ratio", "ratio", 0.0, 1000.0, "log",
                     "p99 TTFT of the interval's first tokens over their targets, or the oldest "
                     "request still without a first token, if that is larger"),
    ObservationField("tpot_p99_ratio", "ratio", 0.0, 1000.0, "log",
                     "p99 TPOT of the interval's completions over their targets"),
    ObservationField("slo_attainment", "fraction", 0.0, 1.0, "linear",
                     "met / (met + certain violations) in the interval; 1 when none decided"),
    ObservationField("ttft_p99_ratio_prev", "ratio", 0.0, 1000.0, "log",
                     "ttft_p99_ratio of the previous interval"),
    ObservationField("tpot_p99_ratio_prev", "ratio", 0.0, 1000.0, "log",
                     "tpot_p99_ratio of the previous interval"),
    ObservationField("kv_utilization_prev", "fraction", 0.0, 1.0, "linear",
                     "kv_utilization at the end of the previous interval"),
)

_SPEC3_MEASURED: tuple[ObservationField, ...] = (
    ObservationField("batch_waiting_requests", "requests", 0.0, 1e6, "log",
                     "of waiting_requests: batch-class requests waiting at the end of the "
                     "interval", 0.0),
    ObservationField("batch_running_requests", "requests", 0.0, 4096.0, "log",
                     "of running_requests: batch-class requests holding KV at the end of the "
                     "interval", 0.0),
    ObservationField("batch_backlog_tokens", "tokens", 0.0, 1e9, "log",
                     "tokens the batch requests in the engine still have to compute (outputs "
                     "at their full length)", 0.0),
    ObservationField("batch_deadline_margin", "fraction", 0.0, 1.0, "linear",
                     "min over unfinished batch requests of (deadline - now) / deadline span; "
                     "1 if none", 1.0),
    ObservationField("batch_goodput_tokens_s", "tokens/s", 0.0, 1e6, "log",
                     "prompt + output tokens of batch requests finished by their deadline in "
                     "the interval, per second", 0.0),
    ObservationField("shed_requests", "count", 0.0, 1e5, "log",
                     "interactive requests shed (rejected late) in the interval", 0.0),
    ObservationField("cotenant_demand_fraction", "fraction", 0.0, 1.0, "linear",
                     "the co-tenant's memory demand now over the memory left after the "
                     "weights; 0 without one", 0.0),
)


def _knob_fields(knobs: tuple[KnobSpec, ...]) -> tuple[ObservationField, ...]:
    return tuple(ObservationField(k.name, k.unit, k.low, k.high, "knob", f"current knob: {k.doc}")
                 for k in knobs)


OBSERVATION_FIELDS: tuple[ObservationField, ...] = (
    *_SPEC2_MEASURED, *_SPEC3_MEASURED, *_knob_fields(KNOB_SPECS))
OBSERVATION_NAMES: tuple[str, ...] = tuple(f.name for f in OBSERVATION_FIELDS)
OBSERVATION_INDEX: dict[str, int] = {n: i for i, n in enumerate(OBSERVATION_NAMES)}
OBS_DIM = len(OBSERVATION_FIELDS)
OBS_LOW = np.array([f.vector_bounds[0] for f in OBSERVATION_FIELDS], dtype=np.float32)
OBS_HIGH = np.array([f.vector_bounds[1] for f in OBSERVATION_FIELDS], dtype=np.float32)
REQUIRED_NAMES: tuple[str, ...] = tuple(f.name for f in OBSERVATION_FIELDS
                                        if f.default is None and f.transform != "knob")
"""the fields a named observation must carry (the rest have defaults or are knobs)"""


def _spec_digest(fields: tuple[ObservationField, ...] = OBSERVATION_FIELDS,
                 knobs: tuple[KnobSpec, ...] = KNOB_SPECS) -> str:
    table = {
        "knobs": [[k.name, k.unit, k.low, k.high, k.scale, k.step] for k in knobs],
        "observation": [[f.name, f.unit, f.low, f.high, f.transform] for f in fields],
    }
    return hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest()[:12]


SPEC_VERSION = f"batchpilot-spec/3+{_spec_digest()}"
"""Written into every exported policy; the runtime refuses a policy whose spec it cannot
serve (this one, or one of :data:`SPEC_ADAPTERS`)."""


@dataclass(frozen=True, eq=False)
class SpecAdapter:
    """How to feed a policy of an older spec: its vector is ``clip(today[index] * factor)``,
    and its ``num_actions`` outputs are the first knobs of today's (the rest: static)."""

    version: str
    """the older spec's version string"""
    index: np.ndarray
    """for each of the older spec's fields, its position in today's vector (intp)"""
    factor: np.ndarray
    """float32 per older field: today's transformed value times this is the older one"""
    num_actions: int
    """the older spec's action width (its knobs are today's first ``num_actions``)"""

    def __post_init__(self) -> None:
        # computed once: adapt_vector is on every decision of an older spec's policy
        object.__setattr__(self, "low", OBS_LOW[self.index])
        object.__setattr__(self, "high", OBS_HIGH[self.index])
        object.__setattr__(self, "scaled", bool((self.factor != 1.0).any()))

    low: np.ndarray = dataclasses.field(init=False)
    """the older vector's lower bounds"""
    high: np.ndarray = dataclasses.field(init=False)
    """its upper bounds"""
    scaled: bool = dataclasses.field(init=False)
    """whether any factor differs from 1"""

    @property
    def obs_dim(self) -> int:
        return len(self.index)


def _old_spec_adapter(number: int, old_high: dict[str, float]) -> SpecAdapter:
    """Spec 2 (``old_high`` empty) or spec 1 (the prompt-length fields topped lower): the 17
    measured fields of spec 2 and the first three knobs."""
    knobs = KNOB_SPECS[:3]
    fields = tuple(dataclasses.replace(f, high=old_high.get(f.name, f.high))
                   for f in (*_SPEC2_MEASURED, *_knob_fields(knobs)))
    index = np.array([OBSERVATION_INDEX[f.name] for f in fields], dtype=np.intp)
    # Both prompt fields are log fields from 0: log1p(x) / log1p(old) = today's value *
    # log1p(new) / log1p(old), and a prompt past the old top reads 1, as spec 1 clipped it.
    factor = np.array([math.log1p(OBSERVATION_FIELDS[i].high) / math.log1p(f.high)
                       if f.name in old_high else 1.0 for i, f in zip(index, fields)],
                      dtype=np.float32)
    return SpecAdapter(f"batchpilot-spec/{number}+{_spec_digest(fields, knobs)}", index, factor,
                       len(knobs))


SPEC_ADAPTERS: dict[str, SpecAdapter] = {a.version: a for a in (
    _old_spec_adapter(2, {}),
    _old_spec_adapter(1, {"prompt_tokens_mean": 65536.0, "prompt_tokens_std": 65536.0}),
)}
"""older spec versions the runtime still serves, each with the adapter that turns today's
vector into that spec's (:func:`adapt_vector`)"""


def adapt_vector(vector: np.ndarray, adapter: SpecAdapter) -> np.ndarray:
    """Today's observation vector(s) (``[..., OBS_DIM]``) as an older spec built them: its
    fields picked, scaled field by field, then clipped to the vector's bounds (a new array;
    NaN passes through, as np.clip lets it)."""
    x = np.take(vector, adapter.index, axis=-1)
    if adapter.scaled:
        x = x * adapter.factor
    np.minimum(x, adapter.high, out=x)
    np.maximum(x, adapter.low, out=x)
    return x


_NUM_MEASURED = OBS_DIM - NUM_KNOBS  # the fields before the knobs
_TRANSFORMS = tuple(
    (f.transform, f.low, f.high,
     math.log1p(f.high) if f.transform in ("log", "slog") else f.high - f.low)
    for f in OBSERVATION_FIELDS[:_NUM_MEASURED])


def _compile_vector() -> Callable[[Sequence[float], Knobs], np.ndarray]:
    """The vector from the measured fields' raw values (in table order) and the knobs: the one
    implementation of the transforms, shared by the named (REST) and the engine paths.

    It is on every decision and every environment step, so it is written out from
    :data:`_TRANSFORMS` at import, one expression a field (clip, then the transform, with the
    table's constants inlined): 3.5-4 us against 5-8 for a loop over the table (the same
    operations in the same order, so the same float32 bits)."""
    names = [f"x{i}" for i in range(_NUM_MEASURED)]
    lines = [f"def _vector(values, knobs):\n    {', '.join(names)}, = values"]
    exprs = []
    for x, (kind, low, high, denom) in zip(names, _TRANSFORMS):
        clip = f"({low!r} if {x} < {low!r} else {high!r} if {x} > {high!r} else {x})"
        if kind == "log":
            exprs.append(f"_log1p{clip} / {denom!r}")
        elif kind == "slog":
            lines.append(f"    {x} = {clip}")
            exprs.append(f"_copysign(_log1p(abs({x})), {x}) / {denom!r}")
        else:
            exprs.append(f"({clip} - {low!r}) / {denom!r}")
    # packed into a fresh array by struct (a C cast to float32 a value, numpy's own rounding):
    # np.array of the tuple looks at every value's type first, twice the instructions
    lines.append("    out = _empty(_DIM, _float32)")
    lines.append(f"    _pack_into(out, 0, {', '.join(exprs)}, *_current_action(knobs))")
    lines.append("    return out")
    namespace: dict[str, Any] = {"_log1p": math.log1p, "_copysign": math.copysign,
                                 "_empty": np.empty, "_float32": np.float32, "_DIM": OBS_DIM,
                                 "_pack_into": struct.Struct(f"{OBS_DIM}f").pack_into,
                                 "_current_action": current_action}
    exec("\n".join(lines), namespace)
    return namespace["_vector"]


_vector = _compile_vector()


def field_defaults(static_knobs: Knobs = DEFAULT_KNOBS) -> dict[str, float]:
    """The value of every optional field of a named observation: the neutral defaults of the
    measured fields added in spec 3, and ``static_knobs`` for the knob fields."""
    out = {f.name: f.default for f in OBSERVATION_FIELDS if f.default is not None}
    out.update(static_knobs.as_dict())
    return out


def example_fields(knobs: Knobs | None = None) -> dict[str, float]:
    """A plausible named observation, in spec order: moderate load (40 requests/s, 60 running,
    KV 70% used, 8 of them batch requests with a backlog), SLOs met, and ``knobs`` (the static
    default when None). For examples, tests and load generators; not a default for anything."""
    return {
        "arrival_rate_rps": 40.0, "arrival_rate_change_rps": -3.0, "prompt_tokens_mean": 900.0,
        "prompt_tokens_std": 400.0, "waiting_requests": 5.0, "waiting_prompt_tokens": 4500.0,
        "running_requests": 60.0, "kv_utilization": 0.7, "kv_fragmentation": 0.1,
        "preemptions": 0.0, "ooms": 0.0, "ttft_p99_ratio": 0.6, "tpot_p99_ratio": 0.8,
        "slo_attainment": 0.97, "ttft_p99_ratio_prev": 0.5, "tpot_p99_ratio_prev": 0.7,
        "kv_utilization_prev": 0.65, "batch_waiting_requests": 2.0,
        "batch_running_requests": 8.0, "batch_backlog_tokens": 60000.0,
        "batch_deadline_margin": 0.9, "batch_goodput_tokens_s": 1500.0, "shed_requests": 0.0,
        "cotenant_demand_fraction": 0.0, **(knobs or DEFAULT_KNOBS).as_dict(),
    }


def vector_from_fields(fields: Mapping[str, Any],
                       static_knobs: Knobs = DEFAULT_KNOBS) -> np.ndarray:
    """The observation vector from named raw values: every field of :data:`REQUIRED_NAMES`;
    an optional measured field left out takes its neutral default, a knob left out the knob of
    ``static_knobs`` (see :func:`field_defaults`).

    Raises ValueError naming the field that is missing, unknown or not finite.
    """
    unknown = set(fields) - set(OBSERVATION_INDEX)
    if unknown:
        raise ValueError(f"unknown observation field(s): {sorted(unknown)}")
    values = []
    static = static_knobs.as_tuple()
    for i, f in enumerate(OBSERVATION_FIELDS):
        if f.name in fields:
            x = fields[f.name]
        elif f.default is not None:
            x = f.default
        elif f.transform == "knob":
            x = static[i - _NUM_MEASURED]
        else:
            raise ValueError(f"observation field {f.name!r} is missing")
        try:
            x = float(x)
        except (TypeError, ValueError):
            raise ValueError(f"observation field {f.name!r} is not a number: {x!r}") from None
        if not math.isfinite(x):
            raise ValueError(f"observation field {f.name!r} is not finite: {x!r}")
        values.append(x)
    return _vector(values[:_NUM_MEASURED], Knobs.clamped(*values[_NUM_MEASURED:]))


def fields_from_vector(vector: np.ndarray) -> dict[str, float]:
    """Named raw values back from a vector (inverse of the transforms, up to clipping)."""
    vector = np.asarray(vector, dtype=np.float64)
    if vector.shape != (OBS_DIM,):
        raise ValueError(f"an observation has shape ({OBS_DIM},), got {vector.shape}")
    out: dict[str, float] = {}
    for f, v in zip(OBSERVATION_FIELDS, vector):
        if f.transform == "log":
            out[f.name] = math.expm1(v * math.log1p(f.high))
        elif f.transform == "slog":
            out[f.name] = math.copysign(math.expm1(abs(v) * math.log1p(f.high)), v)
        elif f.transform == "linear":
            out[f.name] = f.low + v * (f.high - f.low)
    knobs = action_to_knobs(vector[-NUM_KNOBS:])
    out.update(knobs.as_dict())
    return out


def observation_table() -> str:
    """The observation table in markdown (for docs and the environment's docstring)."""
    rows = ["| index | field | unit | raw range | transform | vector range | if absent (REST) "
            "| meaning |",
            "|---|---|---|---|---|---|---|---|"]
    for i, f in enumerate(OBSERVATION_FIELDS):
        lo, hi = f.vector_bounds
        absent = ("static knob" if f.transform == "knob" else "required" if f.default is None
                  else f"{f.default:g}")
        rows.append(f"| {i} | `{f.name}` | {f.unit} | {f.low:g} .. {f.high:g} | {f.transform} "
                    f"| {lo:g} .. {hi:g} | {absent} | {f.doc} |")
    return "\n".join(rows)


class FeatureBuilder:
    """Turns the engine's interval stats into observations, remembering what the next interval's
    ``*_prev`` and ``*_change`` fields need. One per engine (or per environment)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._prev_rate = 0.0
        self._prev_ttft = 0.0
        self._prev_tpot = 0.0
        self._prev_kv = 0.0

    def _values(self, stats) -> list[float]:
        """Raw values of the measured fields, in table order; updates the remembered ones."""
        rate = stats.arrival_rate
        ttft = max(stats.ttft_p99_ratio, stats.oldest_wait_ratio)
        tpot = stats.tpot_p99_ratio
        d = stats.duration_s
        values = [rate, rate - self._prev_rate, stats.prompt_mean, stats.prompt_std,
                  stats.waiting, stats.waiting_tokens, stats.running, stats.kv_utilization,
                  stats.kv_fragmentation, stats.preemptions, stats.ooms, ttft, tpot,
                  stats.slo_attainment, self._prev_ttft, self._prev_tpot, self._prev_kv,
                  stats.batch_waiting, stats.batch_running, stats.batch_backlog_tokens,
                  stats.batch_deadline_margin,
                  stats.batch_goodput_tokens / d if d > 0 else 0.0,
                  stats.shed, stats.cotenant_demand_fraction]
        self._prev_rate, self._prev_ttft, self._prev_tpot = rate, ttft, tpot
        self._prev_kv = stats.kv_utilization
        return values

    def fields(self, stats, knobs: Knobs) -> dict[str, float]:
        """Named raw values from an :class:`runtime.engine.metrics.IntervalStats`."""
        return {**dict(zip(OBSERVATION_NAMES, self._values(stats))), **knobs.as_dict()}

    def observe(self, stats, knobs: Knobs) -> np.ndarray:
        """The observation vector of an interval (the same as
        ``vector_from_fields(self.fields(stats, knobs))``, without the dictionary)."""
        return _vector(self._values(stats), knobs)


# Column groups and constants for vectors_from_rows, from the same table as _vector.
_RAW_LOW = np.array([f.low for f in OBSERVATION_FIELDS], dtype=np.float64)
_RAW_HIGH = np.array([f.high for f in OBSERVATION_FIELDS], dtype=np.float64)
_COLUMNS = {t: np.array([i for i, f in enumerate(OBSERVATION_FIELDS) if f.transform == t],
                        dtype=np.intp)
            for t in ("log", "slog", "linear", "knob")}
_LOG_DEN = np.array([math.log1p(f.high) for f in OBSERVATION_FIELDS], dtype=np.float64)
assert [OBSERVATION_NAMES[i] for i in _COLUMNS["knob"]] == list(KNOB_NAMES)


def vectors_from_rows(rows: np.ndarray) -> np.ndarray:
    """Observation vectors ``[n, OBS_DIM]`` (float32) from raw values ``[n, OBS_DIM]`` whose
    columns are :data:`OBSERVATION_NAMES`: :func:`vector_from_fields` for many rows at once, with
    the same transforms and the same knob clamping and rounding, in numpy (the REST batch route
    maps thousands of observations per second). Agrees with it to 1 float32 ulp (numpy's and the
    math module's ``log1p`` may differ in the last bit of a float64).

    Raises ValueError naming the first field and row that are not finite.
    """
    x = np.array(rows, dtype=np.float64)  # a copy: clipped in place below
    if x.ndim != 2 or x.shape[1] != OBS_DIM:
        raise ValueError(f"rows of raw observations have shape [n, {OBS_DIM}], "
                         f"got {list(x.shape)}")
    bad = ~np.isfinite(x)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(f"observation field {OBSERVATION_NAMES[j]!r} is not finite in row {i}: "
                         f"{x[i, j]!r}")
    np.clip(x, _RAW_LOW, _RAW_HIGH, out=x)
    out = np.empty(x.shape, dtype=np.float32)
    c = _COLUMNS["log"]
    out[:, c] = np.log1p(x[:, c]) / _LOG_DEN[c]
    c = _COLUMNS["slog"]
    out[:, c] = np.copysign(np.log1p(np.abs(x[:, c])), x[:, c]) / _LOG_DEN[c]
    c = _COLUMNS["linear"]
    out[:, c] = (x[:, c] - _RAW_LOW[c]) / (_RAW_HIGH[c] - _RAW_LOW[c])
    for col, spec in zip(_COLUMNS["knob"], KNOB_SPECS):
        v = x[:, col]  # already clamped to the knob's range (the field's raw range is the same)
        if spec.step:  # as Knobs.clamped: round half to even to the step, clamp again
            v = np.clip(np.round(v * spec.per_step) / spec.per_step, spec.low, spec.high)
        if spec.scale == "log":
            u = (np.log(v) - math.log(spec.low)) / (math.log(spec.high) - math.log(spec.low))
        else:
            u = (v - spec.low) / (spec.high - spec.low)
        out[:, col] = 2.0 * u - 1.0
    return out
