"""A request trace: sorted arrays of arrival times, prompt and output lengths, and SLO classes."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np

from runtime.engine.engine import MAX_ARRIVAL_S


@dataclass(frozen=True)
class Trace:
    """Requests in arrival order. ``arrival_s`` starts at 0 for a trace read from a file (the
    first request), and is non-decreasing."""

    name: str
    arrival_s: np.ndarray
    """float64 seconds, sorted"""
    prompt_tokens: np.ndarray
    """int64, >= 1"""
    output_tokens: np.ndarray
    """int64, >= 1"""
    slo_class: np.ndarray
    """str (numpy unicode) class names, one per request"""
    source: str = ""
    """where it came from: a file path, or the generator and its parameters"""
    skipped: dict[str, int] = field(default_factory=dict)
    """rows skipped by rule when it was read, by reason (never dropped silently)"""
    num_reordered: int = 0
    """rows of the file that were out of arrival order and were re-sorted when it was read"""
    timestamp_step_s: float = 0.0
    """the step its timestamps come in when the file quantised them (Mooncake's conversation
    trace: 3 s); 0 when they are not quantised (or were spread, see ``transforms.jitter``)"""

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name in ("prompt_tokens", "output_tokens", "slo_class"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"trace {self.name!r}: {name} has {len(getattr(self, name))} "
                                 f"entries, arrival_s has {n}")
        if n and not (np.isfinite(self.arrival_s[-1]) and self.arrival_s[-1] <= MAX_ARRIVAL_S):
            bad = int(np.argmax(~(self.arrival_s <= MAX_ARRIVAL_S)))
            raise ValueError(f"trace {self.name!r}: request {bad} arrives at "
                             f"{self.arrival_s[bad]:g} s, past the engine's limit of "
                             f"{MAX_ARRIVAL_S:g} s")
        if n and np.any(np.diff(self.arrival_s) < 0):
            raise ValueError(f"trace {self.name!r}: arrival_s is not sorted")
        if n and (self.prompt_tokens.min() < 1 or self.output_tokens.min() < 1):
            raise ValueError(f"trace {self.name!r}: token counts must be >= 1")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    @property
    def mean_rate(self) -> float:
        d = self.duration_s
        return (len(self) - 1) / d if d > 0 else 0.0

    def select(self, mask_or_index: np.ndarray, name: str | None = None,
               source: str | None = None) -> Trace:
        """A trace of a subset of the requests (a boolean mask or sorted indices)."""
        return Trace(name=name or self.name, arrival_s=self.arrival_s[mask_or_index],
                     prompt_tokens=self.prompt_tokens[mask_or_index],
                     output_tokens=self.output_tokens[mask_or_index],
                     slo_class=self.slo_class[mask_or_index],
                     source=source or self.source, skipped=dict(self.skipped),
                     num_reordered=self.num_reordered,
                     timestamp_step_s=self.timestamp_step_s)

    def check_classes(self, known: Collection[str]) -> None:
        """Raise ValueError naming the first request whose SLO class is not in ``known`` (the
        engine's classes), before a replay starts rather than from inside it."""
        unknown = sorted(set(np.unique(self.slo_class).tolist()) - set(known))
        if unknown:
            first = int(np.flatnonzero(self.slo_class == unknown[0])[0])
            count = int(np.isin(self.slo_class, unknown).sum())
            raise ValueError(f"trace {self.name!r} ({self.source}): slo_class {unknown[0]!r} of "
                             f"request {first} (in arrival order; {count} request"
                             f"{'s' if count != 1 else ''} in all with classes {unknown}) is not "
                             f"one of the engine's classes {sorted(known)}")

    def peak_requests_in(self, window_s: float) -> int:
        """The most requests whose arrivals fall in any window ``[t, t + window_s)`` (seconds).

        The window slides: it may start anywhere, not only on whole seconds from the first
        request, so the figure does not depend on where bins happen to fall (on the Azure
        conversation trace, 1-s bins from the first request give a peak of 16 requests, bins
        offset by 0.7 s give 19, and the sliding window gives 19).
        """
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        if not len(self):
            return 0
        # A busiest window can always be moved to start at a request.
        ends = np.searchsorted(self.arrival_s, self.arrival_s + window_s, side="left")
        return int((ends - np.arange(len(self))).max())

    def skipped_report(self) -> str:
        """One line for a person: how many rows were skipped by rule when it was read, and why."""
        if not self.skipped:
            return f"{self.name}: no rows skipped"
        total = sum(self.skipped.values())
        reasons = ", ".join(f"{n} {reason}" for reason, n in self.skipped.items())
        return f"{self.name}: skipped {total} row{'s' if total != 1 else ''} by rule: {reasons}"

    def stats(self) -> dict[str, float]:
        """The figures ``../shared/traces/README.md`` tabulates, for checking generators.

        ``mean_rate`` is requests per second, ``(requests - 1) / duration_s``;
        ``interarrival_cv`` is the standard deviation of the gaps over their mean;
        ``peak_1s_over_mean`` is :meth:`peak_requests_in` one second (a sliding window, as the
        README's table counts it) over ``mean_rate``; token figures are per request.
        """
        if len(self) < 2:
            return {"requests": len(self)}
        gaps = np.diff(self.arrival_s)
        return {
            "requests": len(self),
            "duration_s": self.duration_s,
            "mean_rate": self.mean_rate,
            "interarrival_cv": float(gaps.std() / gaps.mean()) if gaps.mean() > 0 else 0.0,
            "peak_1s_over_mean": (self.peak_requests_in(1.0) / self.mean_rate
                                  if self.mean_rate else 0.0),
            "prompt_mean": float(self.prompt_tokens.mean()),
            "prompt_p99": float(np.percentile(self.prompt_tokens, 99)),
            "output_mean": float(self.output_tokens.mean()),
            "output_p99": float(np.percentile(self.output_tokens, 99)),
        }
