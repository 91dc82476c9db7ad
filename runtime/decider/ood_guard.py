"""The out-of-distribution guard: the policy decides only where its observations look like the
ones it was trained on.

A policy trained on some traffic can be the worst choice on traffic unlike it (a long-prompt
trace none of the training traces resembled: the policy lent memory into it and preempted
hundreds of requests where the static default preempted two). The exported policy therefore
carries the distribution of the observations it was trained on, and the decider hands control to
the fallback (the PID) while the live observation stays outside it.

The distribution (:class:`ObservationDistribution`) is per field of the observation vector, in
the vector's own coordinates (the transformed values the policy reads): the
``quantiles[0]``-th and ``quantiles[1]``-th quantiles of the training observations (0.1% and
99.9% by default), widened on each side by ``margin`` of the field's vector span (0.02 of
[0, 1] or of [-1, 1]: about a factor of 1.27 on a log field such as a prompt length). A field
that never moved in training (no co-tenant) is held to that value within the margin: a policy
that never saw a co-tenant has not learnt what to do with one.

Only the traffic's own fields are checked (:data:`CHECKED`: arrival rate and its change,
prompt length mean and spread, the co-tenant's demand), not the engine's state (queues, KV use,
latencies, preemptions, sheds) nor the knobs. The state is what the controller's own decisions
make of the traffic: a policy holding a long held-out window at a load past capacity builds
queues longer than its two-minute training episodes ever did, and a guard that read them handed
60% of such intervals to the PID, which serves that traffic far worse (azure-code at the trace's
rate: 78.77% interactive attainment with the guard on every field, 91.94% without). Traffic
unlike the training traffic is the question the guard can answer; whether the policy's state is
new is the policy's own doing.

An observation is *out* when any checked field lies outside its range; :meth:`outside` names the
first. An interval in which no request arrived says nothing of the prompts: its prompt fields
read 0 whatever the traffic is, so they are not judged then (:data:`PROMPT_FIELDS`). The
decider's rule (:class:`OodGuard`):

- The embedded runtime, which sees every interval, hands control to the fallback once at least
  ``patience`` of the last ``window`` intervals were out (4 of 8 by default: a second out of two
  at 0.25 s intervals). A burst that leaves the range for an interval or two does not switch
  the policy off. The prompt fields count over the last ``window`` intervals in which requests
  arrived, the others over the last ``window`` intervals: where long prompts come one every few
  seconds (Mooncake's long-context trace near capacity) the idle intervals between them read in
  on every field, and counted for the prompts too, they kept the guard from ever handing over:
  the shipped set's policy decided every interval at x0.1 and attained 81.44%; the guard now
  hands 99% of them to the PID, 82.37% (docs/results.md, "Traffic none of the policies saw").
  An idle interval still counts for the arrival rate, which it measures.
- It gives control back once the last ``window`` intervals were in on the fields other than
  the prompts' and the last ``window`` intervals with arrivals in on the prompts' (an idle
  interval is no evidence of the prompts either way), so it does not flap on traffic at the
  edge.
- Prompts out of range are the workload's make-up, not a passing state: where long prompts
  come and go (Mooncake's trace), the intervals whose arrivals happened to be short are samples
  of the same traffic. So after a trip on the prompt fields the run of intervals with arrivals
  in range that gives control back (:attr:`OodGuard.hold`) is ``window`` the first time and
  doubles with each such trip after, up to :data:`DEFAULT_MAX_HOLD` (the back-off of a breaker
  that keeps tripping); and control given back is on probation: until the policy has decided
  ``hold`` intervals with arrivals in range, one with prompts out hands control over again at
  once (as a breaker's half-open state does). On Mooncake's trace, under the patience rule
  alone, the policy got control back four times for 43-61 intervals each, raised the chunk to
  about 2,000 tokens and lent memory while the next long prompts arrived, and the set was a
  bisection step under its fallback; now it decides 53 of 25,323 intervals at x0.092 (the
  first 20, before any trip, and one run of 33) and is level with it (docs/results.md). Once
  the policy has decided :data:`DEFAULT_MAX_HOLD` intervals in a row, the back-off starts
  over. A trip on the arrival rate or the co-tenant's demand (a flash crowd, a co-tenant's
  surge) keeps the plain rule: a window in gives control back, with no back-off and no
  probation. Applied to them too, the back-off and the probation put the set under the static
  default on the flash-crowd family at 99% (x0.0884 against x0.0894) and cost it x1.48 to
  x1.46 at 90%.
- A client's observation (REST) is judged alone: the decision service keeps no client's history
  (any replica answers any request), so an observation outside the range is decided by the
  fallback, and one client's observations never change what another gets.

The distribution travels in the policy's ONNX metadata, ``batchpilot.obs_distribution`` (a JSON
object: ``version``, ``quantiles``, ``margin``, ``samples``, ``patience``, ``window``, and
``fields``: name -> ``[low, high]`` in vector coordinates, widened); training writes it into
``policy.onnx`` from the observations of its PPO rollouts (``agents/export.py``), and
``python -m agents.install_policy --stamp-distribution TRACES`` measures it for a policy exported
without one, from the policy's own replays of those traces. A policy without the key has no
guard.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from runtime.observation import OBS_DIM, OBSERVATION_FIELDS, OBSERVATION_INDEX

OOD_KEY = "batchpilot.obs_distribution"
"""the ONNX metadata key that carries a policy's training observation distribution"""
FORMAT_VERSION = 1
DEFAULT_QUANTILES = (0.001, 0.999)
"""the quantiles of the training observations that bound each field"""
DEFAULT_MARGIN = 0.02
"""each range is widened by this share of the field's vector span on either side"""
DEFAULT_PATIENCE = 4
"""intervals out among the last ``window`` that hand control to the fallback"""
DEFAULT_WINDOW = 8
"""intervals the embedded guard remembers; that many in a row in give control back"""
DEFAULT_BACKOFF = 2
"""each trip on the prompt fields multiplies the run of intervals with arrivals in range that
gives control back by this"""
DEFAULT_MAX_HOLD = 256
"""the longest such run; the policy deciding that many intervals in a row starts the back-off
over (64 s at 0.25 s intervals)"""
MIN_SAMPLES = 1000
"""the fewest training observations a distribution is measured from"""
CHECKED = ("arrival_rate_rps", "arrival_rate_change_rps", "prompt_tokens_mean",
           "prompt_tokens_std", "cotenant_demand_fraction")
"""the fields the guard checks: those that describe the traffic itself (what arrives and what
the co-tenant asks for), which no decision of the controller changes; see the module docstring
for why not the engine's state"""
PROMPT_FIELDS = ("prompt_tokens_mean", "prompt_tokens_std")
"""the checked fields measured on the interval's arrivals: not judged in an interval without one"""
_ARRIVALS = OBSERVATION_INDEX["arrival_rate_rps"]
"""where the observation holds the arrival rate (a log field: 0 exactly when none arrived)"""


def checked_fields(fields: Sequence[str]) -> tuple[str, ...]:
    """``fields`` in :data:`CHECKED`'s order; ValueError naming any the guard does not check,
    or none given."""
    wrong = [f for f in fields if f not in CHECKED]
    if wrong or not fields:
        raise ValueError(f"the guard checks some of {', '.join(CHECKED)}; got "
                         f"{', '.join(wrong) if wrong else 'none'}")
    return tuple(f for f in CHECKED if f in fields)


def _span(name: str) -> float:
    lo, hi = OBSERVATION_FIELDS[OBSERVATION_INDEX[name]].vector_bounds
    return hi - lo


@dataclass(frozen=True)
class ObservationDistribution:
    """Per-field ranges of the training observations, in vector coordinates (see the module
    docstring)."""

    fields: tuple[str, ...]
    """the checked fields, in vector order"""
    low: tuple[float, ...]
    """each field's lowest value in range (widened)"""
    high: tuple[float, ...]
    """each field's highest value in range (widened)"""
    samples: int
    """training observations the ranges were measured from"""
    quantiles: tuple[float, float] = DEFAULT_QUANTILES
    margin: float = DEFAULT_MARGIN
    patience: int = DEFAULT_PATIENCE
    window: int = DEFAULT_WINDOW

    def __post_init__(self) -> None:
        if not (len(self.fields) == len(self.low) == len(self.high)) or not self.fields:
            raise ValueError("an observation distribution needs one [low, high] per field")
        unknown = [f for f in self.fields if f not in OBSERVATION_INDEX]
        if unknown:
            raise ValueError(f"{OOD_KEY}: unknown observation field(s) {unknown}")
        for name, lo, hi in zip(self.fields, self.low, self.high):
            if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
                raise ValueError(f"{OOD_KEY}: field {name!r} has range [{lo}, {hi}]")
        if not 1 <= self.patience <= self.window:
            raise ValueError(f"{OOD_KEY}: need 1 <= patience <= window, got {self.patience}, "
                             f"{self.window}")
        object.__setattr__(self, "_index", np.array([OBSERVATION_INDEX[f] for f in self.fields],
                                                    dtype=np.intp))
        object.__setattr__(self, "_low", np.array(self.low, dtype=np.float64))
        object.__setattr__(self, "_high", np.array(self.high, dtype=np.float64))
        object.__setattr__(self, "_pairs", tuple(zip(self._index.tolist(), self.low, self.high)))
        judged_idle = [k for k, f in enumerate(self.fields) if f not in PROMPT_FIELDS]
        object.__setattr__(self, "_all_pairs",
                           tuple((k, *p) for k, p in enumerate(self._pairs)))
        object.__setattr__(self, "_idle_pairs",
                           tuple(self._all_pairs[k] for k in judged_idle))
        object.__setattr__(self, "_prompt_cols",
                           np.array([f in PROMPT_FIELDS for f in self.fields], dtype=bool))

    _index: np.ndarray = field(init=False, repr=False, compare=False)
    _low: np.ndarray = field(init=False, repr=False, compare=False)
    _high: np.ndarray = field(init=False, repr=False, compare=False)
    _pairs: tuple = field(init=False, repr=False, compare=False)
    _all_pairs: tuple = field(init=False, repr=False, compare=False)
    _idle_pairs: tuple = field(init=False, repr=False, compare=False)
    _prompt_cols: np.ndarray = field(init=False, repr=False, compare=False)

    @classmethod
    def measure(cls, observations: np.ndarray, *, quantiles: tuple[float, float] =
                DEFAULT_QUANTILES, margin: float = DEFAULT_MARGIN,
                patience: int = DEFAULT_PATIENCE,
                window: int = DEFAULT_WINDOW,
                fields: Sequence[str] = CHECKED) -> ObservationDistribution:
        """The distribution of ``observations`` (``[n, OBS_DIM]`` vectors as the policy read
        them) over ``fields`` (some of :data:`CHECKED`, in any order); ValueError with fewer
        than :data:`MIN_SAMPLES` observations, a non-finite one, or a field not checked."""
        x = np.asarray(observations, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != OBS_DIM:
            raise ValueError(f"observations must have shape [n, {OBS_DIM}], got {list(x.shape)}")
        if len(x) < MIN_SAMPLES:
            raise ValueError(f"an observation distribution needs at least {MIN_SAMPLES} "
                             f"observations, got {len(x)}")
        if not np.isfinite(x).all():
            raise ValueError("the training observations hold NaN or an infinity")
        names = checked_fields(fields)
        idx = [OBSERVATION_INDEX[f] for f in names]
        q = np.quantile(x[:, idx], quantiles, axis=0)
        spans = np.array([_span(f) for f in names])
        return cls(names, tuple((q[0] - margin * spans).tolist()),
                   tuple((q[1] + margin * spans).tolist()), len(x),
                   (float(quantiles[0]), float(quantiles[1])), margin, patience, window)

    def outside(self, v: Sequence[float]) -> int | None:
        """The position in :attr:`fields` of the first field of the vector ``v`` outside its
        range, or None when every one is in (the prompt fields not judged where nothing
        arrived)."""
        pairs = self._idle_pairs if v[_ARRIVALS] == 0.0 else self._all_pairs
        for k, i, lo, hi in pairs:
            x = v[i]
            if x < lo or x > hi:
                return k
        return None

    def outside_split(self, v: Sequence[float]) -> tuple[int | None, int | None]:
        """(the first field out of range that is not a prompt field, the first prompt field out)
        as positions in :attr:`fields`, each None when none is; the prompt fields are None
        where nothing arrived (not judged)."""
        other = prompt = None
        idle = v[_ARRIVALS] == 0.0
        for k, (i, lo, hi) in enumerate(self._pairs):
            is_prompt = self._prompt_cols[k]
            if (prompt if is_prompt else other) is not None or (is_prompt and idle):
                continue
            x = v[i]
            if x < lo or x > hi:
                if is_prompt:
                    prompt = k
                else:
                    other = k
        return other, prompt

    def outside_rows(self, x: np.ndarray) -> np.ndarray:
        """Per row of ``x`` (``[n, OBS_DIM]``): whether any checked field is out of range."""
        x = np.asarray(x, dtype=np.float64)
        cols = x[:, self._index]
        bad = (cols < self._low) | (cols > self._high)
        bad &= ~((x[:, _ARRIVALS] == 0.0)[:, None] & self._prompt_cols)  # nothing arrived
        # numpy's stubs type any(axis=...) as a scalar or an array
        out: np.ndarray = bad.any(axis=1)  # type: ignore[assignment]
        return out

    def metadata(self) -> str:
        """The distribution as its metadata value."""
        return json.dumps({"version": FORMAT_VERSION, "quantiles": list(self.quantiles),
                           "margin": self.margin, "samples": self.samples,
                           "patience": self.patience, "window": self.window,
                           "fields": {f: [lo, hi] for f, lo, hi in
                                      zip(self.fields, self.low, self.high)}})

    @classmethod
    def from_metadata(cls, text: str) -> ObservationDistribution:
        """The distribution in a policy's ``batchpilot.obs_distribution``; ValueError naming
        what is malformed."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{OOD_KEY} is not JSON: {e}") from None
        if not isinstance(d, dict) or d.get("version") != FORMAT_VERSION:
            raise ValueError(f"{OOD_KEY} must be a JSON object of version {FORMAT_VERSION}")
        try:
            fields = d["fields"]
            if not isinstance(fields, dict) or not all(
                    isinstance(b, list) and len(b) == 2 for b in fields.values()):
                raise TypeError("fields must map names to [low, high]")
            order = sorted(fields, key=lambda f: OBSERVATION_INDEX.get(f, -1))
            q = tuple(float(v) for v in d["quantiles"])
            return cls(tuple(order), tuple(float(fields[f][0]) for f in order),
                       tuple(float(fields[f][1]) for f in order), int(d["samples"]),
                       (q[0], q[1]), float(d["margin"]), int(d["patience"]), int(d["window"]))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise ValueError(f"{OOD_KEY} is malformed: {type(e).__name__}: {e}") from None

    def describe(self) -> dict:
        return {"quantiles": list(self.quantiles), "margin": self.margin,
                "samples": self.samples, "patience": self.patience, "window": self.window,
                "fields": {f: [lo, hi] for f, lo, hi in zip(self.fields, self.low, self.high)}}


def _push(recent: deque[bool], out: bool) -> int:
    """Append ``out`` to ``recent`` (a bounded window); the change in its count of outs."""
    change = -1 if len(recent) == recent.maxlen and recent[0] else 0
    recent.append(out)
    return change + out


class OodGuard:
    """Whether the policy may decide, interval by interval (see the module docstring).

    :param distribution: the policy's training observation distribution
    :param backoff: each trip on the prompt fields multiplies the run of intervals with
        arrivals in range that gives control back by this (1: always ``window``)
    :param max_hold: the longest such run, and the run of policy decisions that starts the
        back-off over
    """

    def __init__(self, distribution: ObservationDistribution, *, backoff: int = DEFAULT_BACKOFF,
                 max_hold: int = DEFAULT_MAX_HOLD) -> None:
        if backoff < 1:
            raise ValueError(f"the guard's backoff must be >= 1, got {backoff}")
        if max_hold < distribution.window:
            raise ValueError(f"the guard's max_hold must be >= its window "
                             f"({distribution.window}), got {max_hold}")
        self.distribution = distribution
        self.backoff = backoff
        self.max_hold = max_hold
        self._recent: deque[bool] = deque(maxlen=distribution.window)
        """whether each of the last intervals was out on a field other than the prompts'"""
        self._out_recent = 0
        self._recent_prompt: deque[bool] = deque(maxlen=distribution.window)
        """the same on the prompt fields, over the last intervals in which requests arrived"""
        self._prompt_out_recent = 0
        self.tripped = False
        """whether the fallback has control now (embedded runtime)"""
        self.hold = distribution.window
        """the run of intervals with arrivals in range that gives control back after a trip on
        the prompt fields (see the module docstring)"""
        self._run = 0
        """intervals in a row in on the fields other than the prompts'"""
        self._prompt_run = 0
        """intervals with arrivals in a row in on the prompt fields (idle ones not counted)"""
        self._policy_run = 0
        """intervals in a row the guard let the policy decide"""
        self._probation = 0
        """intervals with arrivals the policy must still decide in range before one out on the
        prompts is no longer enough to hand control back to the fallback"""
        self._by_prompts = False
        """whether the latest trip was the prompt fields'"""
        self.num_trips = 0
        """times control went to the fallback"""
        self.intervals_out = 0
        """embedded intervals whose observation was out"""
        self.client_out = 0
        """client observations decided by the fallback because they were out"""
        self.last_field: str | None = None
        """the field that was out in the latest observation found out"""
        self.last_value: float | None = None
        """its value (vector coordinates)"""

    def _note(self, v: Sequence[float], k: int) -> None:
        d = self.distribution
        self.last_field = d.fields[k]
        self.last_value = float(v[d._pairs[k][0]])

    def observe(self, v: Sequence[float]) -> bool:
        """One interval of the embedded runtime: whether the policy may decide it."""
        d = self.distribution
        other, prompt = d.outside_split(v)
        first = other if other is not None else prompt
        if first is not None:
            self.intervals_out += 1
            self._note(v, first)
        self._out_recent += _push(self._recent, other is not None)
        if v[_ARRIVALS] != 0.0:  # the prompt fields were measured
            self._prompt_out_recent += _push(self._recent_prompt, prompt is not None)
            self._prompt_run = self._prompt_run + 1 if prompt is None else 0
        self._run = self._run + 1 if other is None else 0
        if not self.tripped:
            by_prompts = (self._prompt_out_recent >= d.patience
                          or (self._probation > 0 and prompt is not None))
            if by_prompts or self._out_recent >= d.patience:
                self.tripped = True
                self.num_trips += 1
                self._by_prompts = by_prompts
            else:
                self._policy_run += 1
                if self._probation and v[_ARRIVALS] != 0.0:
                    self._probation -= 1
                if self._policy_run >= self.max_hold:  # the policy held the traffic: start over
                    self.hold = d.window
        elif self._run >= d.window and (
                self._prompt_run >= self.hold if self._by_prompts
                else self._prompt_out_recent == 0):
            self.tripped = False
            self._policy_run = 0
            if self._by_prompts:
                self._probation = self.hold
                self.hold = min(self.hold * self.backoff, self.max_hold)
        return not self.tripped

    def allows_client(self, v: Sequence[float]) -> bool:
        """A client's observation, judged alone: whether the policy may decide it."""
        k = self.distribution.outside(v)
        if k is None:
            return True
        self.client_out += 1
        self._note(v, k)
        return False

    def reset(self) -> None:
        self._recent.clear()
        self._out_recent = 0
        self._recent_prompt.clear()
        self._prompt_out_recent = 0
        self.tripped = False
        self.hold = self.distribution.window
        self._run = self._prompt_run = self._policy_run = self._probation = 0
        self._by_prompts = False

    def describe(self) -> dict:
        """What ``GET /v1/policy`` shows: the rule, the state and the last field out."""
        d = self.distribution
        return {"tripped": self.tripped,
                "recent_out": max(self._out_recent, self._prompt_out_recent),
                "num_trips": self.num_trips, "hold": self.hold, "intervals_out": self.intervals_out,
                "client_out": self.client_out, "last_field": self.last_field,
                "last_value": self.last_value, "patience": d.patience, "window": d.window,
                "quantiles": list(d.quantiles), "margin": d.margin, "samples": d.samples,
                "fields": {f: [lo, hi] for f, lo, hi in zip(d.fields, d.low, d.high)}}
