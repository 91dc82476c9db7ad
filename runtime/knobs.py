"""The five run-time knobs and the one mapping between actions and knobs.

A policy acts in ``Box(-1, 1, shape=(NUM_KNOBS,), float32)``; :func:`action_to_knobs` is the
only place that turns such an action into knobs, and :func:`knobs_to_action` its inverse (used to
put the current knobs into the observation). A ``log`` knob moves on a log scale, a ``linear``
one linearly; a knob with a step is rounded to a multiple of it (the chunk to the KV block size).

===  ====================  ============  ============  ======  ====================================
idx  knob                  unit          range         scale   what it trades
===  ====================  ============  ============  ======  ====================================
0    batch_window_ms       ms            5 .. 200      log     TTFT against prefill batching,
                                                               stalls
1    prefill_chunk_tokens  tokens        64 .. 16384   log     TPOT (decode stalls) against TTFT
2    kv_cache_ratio        fraction      0.40 .. 0.95  linear  concurrency and preemptions against
                                                               activation room (OOM), memory for
                                                               others (a co-tenant)
3    batch_share           fraction      0 .. 1        linear  batch goodput against interactive
                                                               SLOs: the share of each step's
                                                               prefill budget, sequence slots and
                                                               KV blocks batch-class work may take
4    admission_slack       TTFT targets  0.25 .. 8     log     under admission ``shed`` or
                                                               ``late_to_back``: how long an
                                                               interactive request may wait
                                                               without a first token before it is
                                                               late (dropped or moved behind):
                                                               goodput past capacity against
                                                               requests given up early
===  ====================  ============  ============  ======  ====================================

The admission *policy* (``fcfs``, ``shed``, ``late_to_back``) is a deployment setting
(``EngineConfig.admission``), not a knob; under ``fcfs`` the slack has no effect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

BLOCK_SIZE_TOKENS = 16
"""KV block size in tokens; the chunk knob is a multiple of it."""


@dataclass(frozen=True, slots=True)
class KnobSpec:
    name: str
    unit: str
    low: float
    high: float
    scale: str  # "log" or "linear"
    step: float  # the resolution a value is rounded to (0: none)
    doc: str

    @property
    def per_step(self) -> float:
        """``1 / step``: a value is rounded as ``round(v * per_step) / per_step`` (exact for the
        power-of-two steps, and 0.29 rather than 0.29000000000000004 for a step of 0.01)."""
        return 1.0 / self.step if self.step else 0.0


KNOB_SPECS: tuple[KnobSpec, ...] = (
    KnobSpec("batch_window_ms", "ms", 5.0, 200.0, "log", 1.0,
             "how long newly arrived requests are held before admission to prefill"),
    KnobSpec("prefill_chunk_tokens", "tokens", 64.0, 16384.0, "log", float(BLOCK_SIZE_TOKENS),
             "the most prefill tokens one engine iteration may carry"),
    KnobSpec("kv_cache_ratio", "fraction", 0.40, 0.95, "linear", 0.0,
             "share of the memory left after the weights reserved for paged KV blocks"),
    KnobSpec("batch_share", "fraction", 0.0, 1.0, "linear", 0.01,
             "share of each step's prefill budget, sequence slots and KV blocks batch-class "
             "work may take"),
    KnobSpec("admission_slack", "TTFT targets", 0.25, 8.0, "log", 0.01,
             "an interactive request is late once it has waited this many TTFT targets without "
             "a first token (acts under admission shed / late_to_back)"),
)
KNOB_NAMES: tuple[str, ...] = tuple(k.name for k in KNOB_SPECS)
NUM_KNOBS = len(KNOB_SPECS)
KNOB_SPEC_BY_NAME: dict[str, KnobSpec] = {k.name: k for k in KNOB_SPECS}


def check_knob(name: str, value: float) -> float:
    """``value`` if it is a setting the knob ``name`` can take (within its range; the chunk a
    multiple of the KV block size); else ValueError naming the knob and its range. For
    settings that name one knob at a time (a server's static knobs)."""
    spec = KNOB_SPEC_BY_NAME[name]
    if not spec.low <= value <= spec.high:
        raise ValueError(f"{spec.name} must lie in [{spec.low:g}, {spec.high:g}] {spec.unit}, "
                         f"got {value:g}")
    if spec.name == "prefill_chunk_tokens" and value % BLOCK_SIZE_TOKENS:
        raise ValueError(f"{spec.name} must be a multiple of {BLOCK_SIZE_TOKENS}, got {value:g}")
    return value


@dataclass(frozen=True, slots=True)
class Knobs:
    """One setting of the five knobs, always within range (the constructor checks). The last two
    default to the static default's (batch work may take everything, slack of one TTFT target),
    so a setting of the first three alone means what it meant before they existed."""

    batch_window_ms: float
    prefill_chunk_tokens: int
    kv_cache_ratio: float
    batch_share: float = 1.0
    admission_slack: float = 1.0

    def __post_init__(self) -> None:
        for spec, value in zip(KNOB_SPECS, self.as_tuple()):
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{spec.name} must be a finite number, got {value!r}")
            if not spec.low - 1e-9 <= value <= spec.high + 1e-9:
                raise ValueError(f"{spec.name}={value} is outside its range "
                                 f"[{spec.low:g}, {spec.high:g}] {spec.unit}")
        if self.prefill_chunk_tokens % BLOCK_SIZE_TOKENS:
            raise ValueError(f"prefill_chunk_tokens={self.prefill_chunk_tokens} is not a multiple "
                             f"of the KV block size ({BLOCK_SIZE_TOKENS} tokens)")

    @classmethod
    def clamped(cls, batch_window_ms: float, prefill_chunk_tokens: float,
                kv_cache_ratio: float, batch_share: float = 1.0,
                admission_slack: float = 1.0) -> Knobs:
        """Knobs from any finite values: clamped to their ranges and rounded to their steps."""
        values = []
        for spec, v in zip(KNOB_SPECS, (batch_window_ms, prefill_chunk_tokens, kv_cache_ratio,
                                        batch_share, admission_slack)):
            if not math.isfinite(v):
                raise ValueError(f"{spec.name} must be finite, got {v!r}")
            v = min(max(float(v), spec.low), spec.high)
            if spec.step:
                v = min(max(round(v * spec.per_step) / spec.per_step, spec.low), spec.high)
            values.append(v)
        return cls(float(values[0]), int(values[1]), float(values[2]), float(values[3]),
                   float(values[4]))

    @classmethod
    def _trusted(cls, batch_window_ms: float, prefill_chunk_tokens: int,
                 kv_cache_ratio: float, batch_share: float, admission_slack: float) -> Knobs:
        """Knobs from values already clamped and rounded by this module (the decision hot path:
        the checks of ``__post_init__`` would cost more than the rest of a decision). The slots
        are written through their descriptors, 2-3x faster than ``object.__setattr__``."""
        k = _new(cls)
        _set_window(k, batch_window_ms)
        _set_chunk(k, prefill_chunk_tokens)
        _set_ratio(k, kv_cache_ratio)
        _set_share(k, batch_share)
        _set_slack(k, admission_slack)
        return k

    def as_tuple(self) -> tuple[float, int, float, float, float]:
        return (self.batch_window_ms, self.prefill_chunk_tokens, self.kv_cache_ratio,
                self.batch_share, self.admission_slack)

    def as_dict(self) -> dict[str, float]:
        return {n: v for n, v in zip(KNOB_NAMES, self.as_tuple())}


_new = object.__new__
# the slot descriptors' setters (a frozen dataclass's own __setattr__ refuses)
_set_window, _set_chunk, _set_ratio, _set_share, _set_slack = (
    getattr(Knobs, name).__set__ for name in KNOB_NAMES)

DEFAULT_KNOBS = Knobs(batch_window_ms=5.0, prefill_chunk_tokens=2048, kv_cache_ratio=0.9,
                      batch_share=1.0, admission_slack=1.0)
"""vLLM-like start-up values: a short window, a 2048-token budget, 90% of free memory for KV,
and, ignoring classes, batch work free to take whatever interactive work leaves (share 1) with a
request late once its miss is certain (slack 1)."""


def _to_unit(spec: KnobSpec, value: float) -> float:
    if spec.scale == "log":
        return (math.log(value) - math.log(spec.low)) / (math.log(spec.high) - math.log(spec.low))
    return (value - spec.low) / (spec.high - spec.low)


# action_to_knobs is on every decision's path, so it is unrolled over the five knobs; these
# constants come from KNOB_SPECS and the assert keeps the unrolled code honest if the table moves.
_W, _C, _R, _B, _S = KNOB_SPECS
assert (_W.scale, _C.scale, _R.scale, _B.scale, _S.scale) == (
    "log", "log", "linear", "linear", "log") and _R.step == 0 and _B.step and _S.step
_W_LOG_LOW, _W_LOG_SPAN = math.log(_W.low), math.log(_W.high) - math.log(_W.low)
_C_LOG_LOW, _C_LOG_SPAN = math.log(_C.low), math.log(_C.high) - math.log(_C.low)
_S_LOG_LOW, _S_LOG_SPAN = math.log(_S.low), math.log(_S.high) - math.log(_S.low)
_W_PER, _C_PER, _B_PER, _S_PER = _W.per_step, _C.per_step, _B.per_step, _S.per_step
_R_SPAN, _B_SPAN = _R.high - _R.low, _B.high - _B.low
_W_LOW, _W_HIGH, _C_LOW, _C_HIGH = _W.low, _W.high, _C.low, _C.high
_R_LOW, _R_HIGH, _B_LOW, _B_HIGH = _R.low, _R.high, _B.low, _B.high
_S_LOW, _S_HIGH = _S.low, _S.high
_isfinite = math.isfinite
_exp = math.exp


def action_to_knobs(action) -> Knobs:
    """Map an action in [-1, 1]^NUM_KNOBS to knobs. Values outside [-1, 1] are clipped; NaN is
    refused.

    The clamps are conditional expressions rather than ``min(max(.))`` (0.03 against 0.4 us
    each, 20 of them a decision); they are exact here because every value is finite."""
    values = action.tolist() if hasattr(action, "tolist") else list(action)
    if len(values) != NUM_KNOBS:
        raise ValueError(f"an action has {NUM_KNOBS} components, got {len(values)}")
    a0, a1, a2, a3, a4 = values
    s = a0 + a1 + a2 + a3 + a4
    if s - s != 0.0:  # NaN or an infinity somewhere (or a finite overflow: then none is named)
        for name, a in zip(KNOB_NAMES, values):
            if not _isfinite(a):
                raise ValueError(f"action component for {name} is not finite: {a!r}")
    u0 = 0.0 if a0 < -1.0 else 1.0 if a0 > 1.0 else (a0 + 1.0) * 0.5
    u1 = 0.0 if a1 < -1.0 else 1.0 if a1 > 1.0 else (a1 + 1.0) * 0.5
    u2 = 0.0 if a2 < -1.0 else 1.0 if a2 > 1.0 else (a2 + 1.0) * 0.5
    u3 = 0.0 if a3 < -1.0 else 1.0 if a3 > 1.0 else (a3 + 1.0) * 0.5
    u4 = 0.0 if a4 < -1.0 else 1.0 if a4 > 1.0 else (a4 + 1.0) * 0.5
    w = round(_exp(_W_LOG_LOW + u0 * _W_LOG_SPAN) * _W_PER) / _W_PER
    c = round(_exp(_C_LOG_LOW + u1 * _C_LOG_SPAN) * _C_PER) / _C_PER
    r = _R_LOW + u2 * _R_SPAN
    b = round((_B_LOW + u3 * _B_SPAN) * _B_PER) / _B_PER
    k = round(_exp(_S_LOG_LOW + u4 * _S_LOG_SPAN) * _S_PER) / _S_PER
    return Knobs._trusted(
        float(_W_LOW if w < _W_LOW else _W_HIGH if w > _W_HIGH else w),
        int(_C_LOW if c < _C_LOW else _C_HIGH if c > _C_HIGH else c),
        float(_R_LOW if r < _R_LOW else _R_HIGH if r > _R_HIGH else r),
        float(_B_LOW if b < _B_LOW else _B_HIGH if b > _B_HIGH else b),
        float(_S_LOW if k < _S_LOW else _S_HIGH if k > _S_HIGH else k))


def actions_to_columns(actions: np.ndarray) -> tuple[np.ndarray, ...]:
    """:func:`action_to_knobs` for ``[n, NUM_KNOBS]`` finite actions at once, as one float64
    array per knob (the chunk's as int64), in :data:`KNOB_NAMES` order (the REST batch route
    answers from these without building a :class:`Knobs` a row)."""
    a = np.clip(np.asarray(actions, dtype=np.float64), -1.0, 1.0)
    if a.ndim != 2 or a.shape[1] != NUM_KNOBS:
        raise ValueError(f"actions have shape [n, {NUM_KNOBS}], got {list(a.shape)}")
    if not np.isfinite(a).all():
        raise ValueError("actions must be finite")
    u = (a + 1.0) * 0.5
    window = np.clip(np.round(np.exp(_W_LOG_LOW + u[:, 0] * _W_LOG_SPAN) * _W_PER) / _W_PER,
                     _W.low, _W.high)
    chunk = np.clip(np.round(np.exp(_C_LOG_LOW + u[:, 1] * _C_LOG_SPAN) * _C_PER) / _C_PER,
                    _C.low, _C.high).astype(np.int64)
    ratio = np.clip(_R.low + u[:, 2] * _R_SPAN, _R.low, _R.high)
    share = np.clip(np.round((_B.low + u[:, 3] * _B_SPAN) * _B_PER) / _B_PER, _B.low, _B.high)
    slack = np.clip(np.round(np.exp(_S_LOG_LOW + u[:, 4] * _S_LOG_SPAN) * _S_PER) / _S_PER,
                    _S.low, _S.high)
    return window, chunk, ratio, share, slack


def actions_to_knobs(actions: np.ndarray) -> list[Knobs]:
    """:func:`action_to_knobs` for ``[n, NUM_KNOBS]`` finite actions at once."""
    trusted = Knobs._trusted
    return [trusted(*k) for k in zip(*(c.tolist() for c in actions_to_columns(actions)))]


def knobs_to_action(knobs: Knobs) -> tuple[float, ...]:
    """The action in [-1, 1]^NUM_KNOBS that maps to these knobs (up to rounding)."""
    return tuple(2.0 * _to_unit(s, v) - 1.0 for s, v in zip(KNOB_SPECS, knobs.as_tuple()))


_last_action: tuple[Knobs | None, tuple[float, ...]] = (None, ())
"""the knobs :func:`current_action` last saw and their action (read and replaced as one tuple,
so threads may share it; it holds a reference, so an identical id means the same object)"""


def current_action(knobs: Knobs) -> tuple[float, ...]:
    """:func:`knobs_to_action`, remembered for the last knobs object: the engine's knobs change
    far less often than an interval ends, and the observation and the environment's slew limit
    both need their action every interval."""
    global _last_action
    last = _last_action
    if knobs is last[0]:
        return last[1]
    action = knobs_to_action(knobs)
    _last_action = (knobs, action)
    return action
