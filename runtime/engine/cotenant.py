"""Memory lent to a co-tenant: what the KV cache does not hold serves a co-located job.

A co-tenant (a second model's KV, an embedding service, a batch job) shares the accelerator and
wants memory over time, given as a demand trace: GiB wanted in each ``step_s`` of time, repeated
past its end. The engine lends it what neither the KV pool nor the activation workspace of a
full iteration (a prefill chunk plus one decode token for every sequence slot) holds:

    lendable = (memory - weights) - KV pool bytes - activation bytes(chunk + max_num_seqs)

and the co-tenant is served ``min(demand, lendable)`` at every instant. The KV ratio therefore
trades the engine's SLO attainment against the co-tenant's served demand. The engine integrates
both (GiB-seconds) per interval and per run; the served share is served / demanded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class CoTenantDemand:
    """A co-tenant's memory demand: ``gib[i]`` GiB wanted during ``[i, i + 1) * step_s``,
    periodic with period ``len(gib) * step_s``."""

    gib: np.ndarray
    """float64 GiB wanted in each step, >= 0"""
    step_s: float = 1.0
    """the length of one step, seconds"""
    source: str = ""
    """how it was made (a generator and its parameters, or a file)"""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.step_s) and self.step_s > 0):
            raise ValueError(f"co-tenant step_s must be a finite number > 0, got {self.step_s}")
        g = np.asarray(self.gib, dtype=np.float64)
        if g.ndim != 1 or not len(g):
            raise ValueError(f"co-tenant demand must be a non-empty 1-d array, got shape "
                             f"{g.shape}")
        if not np.all(np.isfinite(g)) or g.min() < 0:
            raise ValueError("co-tenant demand must be finite and >= 0 GiB in every step")
        object.__setattr__(self, "gib", g)

    def shifted(self, offset_s: float) -> CoTenantDemand:
        """The same demand read from ``offset_s`` on: its value at time ``t`` is this one's at
        ``t + offset_s`` (to the step; the period is kept)."""
        if not math.isfinite(offset_s):
            raise ValueError(f"a co-tenant offset must be finite, got {offset_s}")
        steps = math.floor(offset_s / self.step_s) % len(self.gib)
        if steps == 0:
            return self
        return CoTenantDemand(gib=np.roll(self.gib, -steps), step_s=self.step_s,
                              source=f"{self.source} from {steps * self.step_s:g} s")

    def demand_gib(self, t: float) -> float:
        """GiB wanted at time ``t``."""
        return float(self.gib[math.floor(t / self.step_s) % len(self.gib)])

    def integrate(self, t0: float, t1: float, lendable_gib: float) -> tuple[float, float]:
        """``(served, demanded)`` GiB-seconds over ``[t0, t1)`` with ``lendable_gib`` on offer."""
        if t1 <= t0:
            return 0.0, 0.0
        step = self.step_s
        i0 = math.floor(t0 / step)
        i1 = math.ceil(t1 / step)
        idx = np.arange(i0, i1) % len(self.gib)
        width = np.full(i1 - i0, step)
        width[0] -= t0 - i0 * step
        width[-1] -= i1 * step - t1
        demand = self.gib[idx]
        served = np.minimum(demand, max(0.0, lendable_gib))
        return float(served @ width), float(demand @ width)
