"""The lending guard: memory goes back to serving while the serving pool is nearly full.

A policy trained with a co-tenant lowers the KV-cache ratio to lend memory, and it cannot see
the arrivals to come: near capacity it lends into the bursts that then miss (docs/results.md, "How
much of the oracle's gain is foresight"). The guard is a floor on the ratio that holds only under
pressure: when the observation's ``kv_utilization`` (the share of the serving pool in use at
the end of the interval) is above ``kv_utilization``, the decided ratio is raised to at least
``kv_cache_ratio``. Below that the policy lends as it chose. The floor is applied after the
slew limit, at once: it only ever gives memory back to serving, which a pool grows into
without moving a block.

Pressure shows late: a pool that fills within an interval preempts before its utilisation at
the interval's end says so, and a policy whose lending preempts goes back to lending as soon as
the floor lets go. So a guard may also hold the floor after lending preempted
(``preemption_hold``): when an interval the policy decided with the ratio under the floor
preempted a request, the floor holds for ``preemption_hold`` intervals, and each time that
happens again the hold doubles (up to :data:`MAX_HOLD_DOUBLINGS` doublings), so a policy that
lends into every burst of a traffic it cannot serve that way ends up lending only where it does
not preempt. That memory of past intervals is the embedded runtime's (:class:`LendLatch`, one
per decider and policy, reset with the policy); a client's observation over REST is judged
alone: one that shows preemptions under the floor gets the floor.

A policy carries its guard in its ONNX metadata, ``batchpilot.lend_guard``, a JSON object
``{"kv_utilization": 0.9, "kv_cache_ratio": 0.95}``, with ``"preemption_hold": 30`` for a
hold (``batchpilot install-policy --lend-guard 0.9:0.95:30`` stamps it), so the arena, the
embedded runtime and the REST routes all run the policy with the same guard. A policy without
the key has none.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import NamedTuple

from runtime.knobs import DEFAULT_KNOBS, KNOB_NAMES, KNOB_SPECS, knobs_to_action
from runtime.observation import OBS_DIM, OBSERVATION_FIELDS, OBSERVATION_INDEX

LEND_GUARD_KEY = "batchpilot.lend_guard"
"""the ONNX metadata key that carries a policy's lending guard"""

UTILIZATION_INDEX = OBSERVATION_INDEX["kv_utilization"]
"""where the guard reads the pool's utilisation in the observation vector"""
_field = OBSERVATION_FIELDS[UTILIZATION_INDEX]
if _field.transform != "linear" or (_field.low, _field.high) != (0.0, 1.0):
    raise ImportError("the lending guard reads kv_utilization straight from the vector, which "
                      f"needs a linear 0..1 transform; the spec has {_field}")
PREEMPTIONS_INDEX = OBSERVATION_INDEX["preemptions"]
"""where the guard reads the interval's preemptions in the observation vector"""
_field = OBSERVATION_FIELDS[PREEMPTIONS_INDEX]
if _field.transform != "log" or _field.low != 0.0:
    raise ImportError("the lending guard reads preemptions through a log1p transform from 0; "
                      f"the spec has {_field}")
PREEMPTED = math.log1p(0.5) / math.log1p(_field.high)
"""a vector's preemptions field above this is at least one preempted request"""
MAX_HOLD_DOUBLINGS = 8
"""a hold doubles at most this many times (480 intervals, 2 minutes at 0.25 s, grow to 8.5 hours)"""
RATIO_INDEX = KNOB_NAMES.index("kv_cache_ratio")
"""the KV ratio's place in an action"""
CURRENT_RATIO_INDEX = OBS_DIM - len(KNOB_NAMES) + RATIO_INDEX
"""where the observation vector carries the KV ratio the interval ran with"""
_RATIO_SPEC = KNOB_SPECS[RATIO_INDEX]


class LendGuard(NamedTuple):
    kv_utilization: float
    """above this share of the serving pool in use, the ratio is held at least at the floor"""
    kv_cache_ratio: float
    """the floor: the KV-cache ratio the pool gets back under pressure"""
    ratio_action: float
    """the floor in action coordinates"""
    preemption_hold: int = 0
    """intervals the floor holds after one the policy decided under it preempted, doubling on
    each repeat (0: the floor holds only while the pool is fuller than ``kv_utilization``)"""

    @classmethod
    def of(cls, kv_utilization: float, kv_cache_ratio: float,
           preemption_hold: int = 0) -> LendGuard:
        """A guard; raises ValueError naming the field out of range."""
        if not (math.isfinite(kv_utilization) and 0.0 < kv_utilization < 1.0):
            raise ValueError(f"lend guard: kv_utilization must be in (0, 1), got "
                             f"{kv_utilization!r}")
        if not (math.isfinite(kv_cache_ratio)
                and _RATIO_SPEC.low <= kv_cache_ratio <= _RATIO_SPEC.high):
            raise ValueError(f"lend guard: kv_cache_ratio must be in [{_RATIO_SPEC.low}, "
                             f"{_RATIO_SPEC.high}] (the knob's range), got {kv_cache_ratio!r}")
        if (isinstance(preemption_hold, bool) or not isinstance(preemption_hold, int)
                or not 0 <= preemption_hold <= 100_000):
            raise ValueError(f"lend guard: preemption_hold must be a whole number of intervals "
                             f"in [0, 100000], got {preemption_hold!r}")
        floor = dataclasses.replace(DEFAULT_KNOBS, kv_cache_ratio=kv_cache_ratio)
        return cls(float(kv_utilization), float(kv_cache_ratio),
                   knobs_to_action(floor)[RATIO_INDEX], preemption_hold)

    @classmethod
    def parse_flag(cls, text: str) -> LendGuard:
        """``UTILIZATION:RATIO[:HOLD]`` (``0.9:0.95``, ``0.9:0.95:30``), as the install command
        takes it."""
        parts = text.split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            utilization, ratio = float(parts[0]), float(parts[1])
            hold = int(parts[2]) if len(parts) == 3 else 0
        except ValueError:
            raise ValueError(f"--lend-guard takes UTILIZATION:RATIO[:HOLD] (e.g. 0.9:0.95 or "
                             f"0.9:0.95:30), got {text!r}") from None
        return cls.of(utilization, ratio, hold)

    @classmethod
    def from_metadata(cls, text: str) -> LendGuard:
        """The guard in a policy's ``batchpilot.lend_guard`` metadata; ValueError if malformed."""
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{LEND_GUARD_KEY} is not JSON: {e}") from None
        if (not isinstance(value, dict)
                or not {"kv_utilization", "kv_cache_ratio"} <= set(value)
                <= {"kv_utilization", "kv_cache_ratio", "preemption_hold"}
                or not all(isinstance(v, int | float) and not isinstance(v, bool)
                           for v in value.values())):
            raise ValueError(f"{LEND_GUARD_KEY} must be a JSON object of numbers, "
                             '{"kv_utilization": ..., "kv_cache_ratio": ...} and optionally '
                             f'"preemption_hold": ..., got {text[:200]!r}')
        hold = value.get("preemption_hold", 0)
        if not (isinstance(hold, int) or hold.is_integer()):  # a float: NaN and inf are not
            raise ValueError(f"{LEND_GUARD_KEY}: preemption_hold must be a whole number of "
                             f"intervals, got {hold!r}")
        return cls.of(value["kv_utilization"], value["kv_cache_ratio"], int(hold))

    def metadata(self) -> str:
        """The guard as its metadata value."""
        return json.dumps({"kv_utilization": self.kv_utilization,
                           "kv_cache_ratio": self.kv_cache_ratio,
                           **({"preemption_hold": self.preemption_hold}
                              if self.preemption_hold else {})})

    def flag(self) -> str:
        """The guard as ``--lend-guard`` takes it."""
        hold = f":{self.preemption_hold}" if self.preemption_hold else ""
        return f"{self.kv_utilization:g}:{self.kv_cache_ratio:g}{hold}"

    def lent_and_preempted(self, v: Sequence[float]) -> bool:
        """Whether the interval the observation vector ``v`` describes ran under the floor and
        preempted a request (what a hold starts from)."""
        return (self.preemption_hold > 0 and v[PREEMPTIONS_INDEX] > PREEMPTED
                and v[CURRENT_RATIO_INDEX] < self.ratio_action)

    def floor(self, action: Sequence[float], utilization: float,
              holding: bool = False) -> tuple[float, ...] | None:
        """``action`` with its ratio raised to the floor when ``utilization`` is above the
        guard's, or a hold is ``holding``, and the ratio is under it; None when the guard leaves
        it alone."""
        if ((holding or utilization > self.kv_utilization)
                and action[RATIO_INDEX] < self.ratio_action):
            return (*action[:RATIO_INDEX], self.ratio_action, *action[RATIO_INDEX + 1:])
        return None


class LendLatch:
    """The embedded runtime's memory of a guard's holds: fed every interval the policy decides
    (its observation describes the interval after the previous decision), it says whether the
    floor holds for the next one."""

    def __init__(self, guard: LendGuard) -> None:
        self.guard = guard
        self.trips = 0
        """holds started since the last reset"""
        self.left = 0
        """intervals the current hold has still to run"""

    def reset(self) -> None:
        self.trips = self.left = 0

    def observe(self, v: Sequence[float]) -> bool:
        """Take an interval's observation; True while the floor holds."""
        if self.left == 0 and self.guard.lent_and_preempted(v):
            self.trips += 1
            self.left = self.guard.preemption_hold << min(self.trips - 1, MAX_HOLD_DOUBLINGS)
        if self.left > 0:
            self.left -= 1
            return True
        return False

    def describe(self) -> dict:
        """What ``GET /v1/policy`` shows of it."""
        return {"preemption_hold": self.guard.preemption_hold, "trips": self.trips,
                "holding_intervals": self.left}
