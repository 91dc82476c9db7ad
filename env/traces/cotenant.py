"""A co-tenant's memory demand: a diurnal swing with spikes.

The co-tenant stands for what shares an accelerator with the serving engine (a second model's KV
cache, an embedding service, a fine-tuning or batch job) and wants memory over time. Its demand is
generated, not measured: a sinusoid around ``mean_gib`` with relative ``amplitude`` over
``period_s`` (busiest half-way through each period, like the conversation trace's load), plus
spikes of ``spike_gib`` lasting ``spike_s`` at Poisson times, ``spikes_per_hour`` on average. The
defaults, on the 40 GiB roofline profile (27.4 GiB after the weights; the engine lends 0.9 GiB at
ratio 0.95 and 16 GiB at 0.4): 6 GiB +-50% over the hour and spikes of 6 GiB for a minute, six an
hour, so no ratio serves all of it and every ratio serves some.
"""

from __future__ import annotations

import math

import numpy as np

from runtime.engine.cotenant import CoTenantDemand


def cotenant_demand(duration_s: float = 3600.0, *, mean_gib: float = 6.0,
                    amplitude: float = 0.5, period_s: float = 3600.0, spike_gib: float = 6.0,
                    spike_s: float = 60.0, spikes_per_hour: float = 6.0, step_s: float = 1.0,
                    seed: int = 0) -> CoTenantDemand:
    """A demand trace of ``duration_s`` seconds in ``step_s`` steps (repeated past its end)."""
    for name, value in (("duration_s", duration_s), ("period_s", period_s), ("step_s", step_s)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {value}")
    if not 0 <= amplitude <= 1:
        raise ValueError(f"amplitude must lie in [0, 1], got {amplitude}")
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, duration_s, step_s)
    gib = mean_gib * (1 - amplitude * np.cos(2 * math.pi * t / period_s))
    num_spikes = rng.poisson(spikes_per_hour * duration_s / 3600.0)
    for start in rng.uniform(0.0, duration_s, num_spikes):
        gib[(t >= start) & (t < start + spike_s)] += spike_gib
    params = (f"duration_s={duration_s:g}, mean_gib={mean_gib:g}, amplitude={amplitude:g}, "
              f"period_s={period_s:g}, spike_gib={spike_gib:g}, spike_s={spike_s:g}, "
              f"spikes_per_hour={spikes_per_hour:g}, step_s={step_s:g}, seed={seed}")
    return CoTenantDemand(gib=gib, step_s=step_s, source=f"cotenant_demand({params})")
