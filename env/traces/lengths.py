"""Token lengths drawn from a log-normal given by its mean and 99th percentile."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z_99 = 2.3263478740408408
"""the standard normal's 99th percentile"""


def lognormal_params(mean: float, p99: float) -> tuple[float, float]:
    """``(mu, sigma)`` of the log-normal whose mean is ``mean`` and 99th percentile ``p99``.

    mean = exp(mu + sigma^2 / 2) and p99 = exp(mu + Z_99 sigma), so sigma solves
    sigma^2 / 2 - Z_99 sigma + ln(p99 / mean) = 0; the smaller root is taken (the larger one
    puts the mean far out in the tail). A solution needs mean < p99 <= mean exp(Z_99^2 / 2),
    about 14.97 times the mean.
    """
    if not (mean > 0 and p99 > mean):
        raise ValueError(f"log-normal lengths need 0 < mean < p99, got mean={mean}, p99={p99}")
    log_ratio = math.log(p99 / mean)
    discriminant = Z_99 * Z_99 - 2.0 * log_ratio
    if discriminant < 0:
        raise ValueError(f"no log-normal has mean {mean} and p99 {p99}: p99 may be at most "
                         f"{math.exp(Z_99 * Z_99 / 2):.2f} times the mean, got "
                         f"{p99 / mean:.2f}")
    sigma = Z_99 - math.sqrt(discriminant)
    return math.log(mean) - sigma * sigma / 2.0, sigma


@dataclass(frozen=True)
class LogNormalLengths:
    """Token counts from a log-normal with this mean and p99, rounded and clipped to
    ``[1, max_tokens]`` (clipping and rounding move the sample's mean a little: measured, well
    under 1% for the Azure figures)."""

    mean: float
    """tokens, before rounding and clipping"""
    p99: float
    """tokens, before rounding and clipping"""
    max_tokens: int
    """the largest count drawn"""

    def __post_init__(self) -> None:
        lognormal_params(self.mean, self.p99)  # refuses impossible figures now, not at sampling
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    def sample(self, rng: np.random.Generator, num: int) -> np.ndarray:
        """``num`` int64 token counts."""
        mu, sigma = lognormal_params(self.mean, self.p99)
        drawn = np.rint(rng.lognormal(mu, sigma, size=num))
        return np.clip(drawn, 1, self.max_tokens).astype(np.int64)

    def __str__(self) -> str:
        return f"lognormal(mean={self.mean:g}, p99={self.p99:g}, max={self.max_tokens})"
