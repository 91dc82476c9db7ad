"""The lending guard: memory goes back to serving while the serving pool is nearly full.

A policy trained with a co-tenant lowers the KV-cache ratio to lend memory, and it cannot see
the arrivals to come: near capacity it lends into the bursts that then miss (docs/results.md, "How
much of the oracle's gain is foresight"). The guard is a floor on the ratio that holds only under
pressure: when the observation's ``kv_utilization`` (the share of the serving pool in use at
the end of the interval) is above ``kv_utilization``, the decided ratio is raised to at least
``kv_cache_ratio``. Below that the policy lends as it chose. The floor is applied after the
slew limit, at once: it only ever gives memory back to serving, which a pool grows into
without moving a block.

A policy carries its guard in its ONNX metadata, ``batchpilot.lend_guard``, a JSON object
``{"kv_utilization": 0.9, "kv_cache_ratio": 0.95}`` (``batchpilot install-policy
--lend-guard 0.9:0.95`` stamps it), so the arena, the embedded runtime and the REST routes all
run the policy with the same guard. A policy without the key has none.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import NamedTuple

from runtime.knobs import DEFAULT_KNOBS, KNOB_NAMES, KNOB_SPECS, knobs_to_action
from runtime.observation import OBSERVATION_FIELDS, OBSERVATION_INDEX

LEND_GUARD_KEY = "batchpilot.lend_guard"
"""the ONNX metadata key that carries a policy's lending guard"""

UTILIZATION_INDEX = OBSERVATION_INDEX["kv_utilization"]
"""where the guard reads the pool's utilisation in the observation vector"""
_field = OBSERVATION_FIELDS[UTILIZATION_INDEX]
if _field.transform != "linear" or (_field.low, _field.high) != (0.0, 1.0):
    raise ImportError("the lending guard reads kv_utilization straight from the vector, which "
                      f"needs a linear 0..1 transform; the spec has {_field}")
RATIO_INDEX = KNOB_NAMES.index("kv_cache_ratio")
"""the KV ratio's place in an action"""
_RATIO_SPEC = KNOB_SPECS[RATIO_INDEX]


class LendGuard(NamedTuple):
    kv_utilization: float
    """above this share of the serving pool in use, the ratio is held at least at the floor"""
    kv_cache_ratio: float
    """the floor: the KV-cache ratio the pool gets back under pressure"""
    ratio_action: float
    """the floor in action coordinates"""

    @classmethod
    def of(cls, kv_utilization: float, kv_cache_ratio: float) -> LendGuard:
        """A guard; raises ValueError naming the field out of range."""
        if not (math.isfinite(kv_utilization) and 0.0 < kv_utilization < 1.0):
            raise ValueError(f"lend guard: kv_utilization must be in (0, 1), got "
                             f"{kv_utilization!r}")
        if not (math.isfinite(kv_cache_ratio)
                and _RATIO_SPEC.low <= kv_cache_ratio <= _RATIO_SPEC.high):
            raise ValueError(f"lend guard: kv_cache_ratio must be in [{_RATIO_SPEC.low}, "
                             f"{_RATIO_SPEC.high}] (the knob's range), got {kv_cache_ratio!r}")
        floor = dataclasses.replace(DEFAULT_KNOBS, kv_cache_ratio=kv_cache_ratio)
        return cls(float(kv_utilization), float(kv_cache_ratio),
                   knobs_to_action(floor)[RATIO_INDEX])

    @classmethod
    def parse_flag(cls, text: str) -> LendGuard:
        """``UTILIZATION:RATIO`` (``0.9:0.95``), as the install command takes it."""
        parts = text.split(":")
        try:
            if len(parts) != 2:
                raise ValueError
            utilization, ratio = float(parts[0]), float(parts[1])
        except ValueError:
            raise ValueError(f"--lend-guard takes UTILIZATION:RATIO (e.g. 0.9:0.95), got "
                             f"{text!r}") from None
        return cls.of(utilization, ratio)

    @classmethod
    def from_metadata(cls, text: str) -> LendGuard:
        """The guard in a policy's ``batchpilot.lend_guard`` metadata; ValueError if malformed."""
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{LEND_GUARD_KEY} is not JSON: {e}") from None
        if (not isinstance(value, dict)
                or set(value) != {"kv_utilization", "kv_cache_ratio"}
                or not all(isinstance(v, int | float) and not isinstance(v, bool)
                           for v in value.values())):
            raise ValueError(f"{LEND_GUARD_KEY} must be a JSON object of two numbers, "
                             '{"kv_utilization": ..., "kv_cache_ratio": ...}, '
                             f"got {text[:200]!r}")
        return cls.of(value["kv_utilization"], value["kv_cache_ratio"])

    def metadata(self) -> str:
        """The guard as its metadata value."""
        return json.dumps({"kv_utilization": self.kv_utilization,
                           "kv_cache_ratio": self.kv_cache_ratio})

    def floor(self, action: Sequence[float], utilization: float) -> tuple[float, ...] | None:
        """``action`` with its ratio raised to the floor when ``utilization`` is above the
        guard's and the ratio is under it; None when the guard leaves it alone."""
        if utilization > self.kv_utilization and action[RATIO_INDEX] < self.ratio_action:
            return (*action[:RATIO_INDEX], self.ratio_action, *action[RATIO_INDEX + 1:])
        return None
