"""Transforms of a trace: a time window, a rate scale, jitter for quantised timestamps, and the
project's train/eval split. Each returns a new :class:`Trace` whose ``source`` records it."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from env.traces.trace import Trace
from runtime.engine.engine import MAX_ARRIVAL_S

TRAIN_SPLIT_S = 2400.0
"""The project's one held-out convention, in seconds of trace time: requests arriving in the
first 40 minutes of a trace (``arrival_s < 2400``) are for training and tuning (policies,
baselines' grids, thresholds); the rest, re-based to start at 0, are for evaluation only. One
hour of the Azure 2023 traces splits 40 min / 18 min; nothing tuned may look past this line."""


def time_window(trace: Trace, start_s: float, end_s: float) -> Trace:
    """The requests with ``start_s <= arrival_s < end_s`` (seconds of trace time), re-based so
    that the window starts at 0 (a request at ``start_s`` arrives at 0). ``end_s`` may be inf.
    """
    if not (math.isfinite(start_s) and start_s < end_s):
        raise ValueError(f"time window needs a finite start_s < end_s, got start_s={start_s}, "
                         f"end_s={end_s}")
    lo, hi = np.searchsorted(trace.arrival_s, [start_s, end_s], side="left")
    window = trace.select(np.arange(lo, hi), source=f"{trace.source} [window {start_s:g} s to "
                          f"{end_s:g} s]")
    return _with_arrivals(window, window.arrival_s - start_s)


def rate_scale(trace: Trace, factor: float) -> Trace:
    """The trace with time compressed by ``factor``: every arrival time divided by it, so the
    request rate is ``factor`` times as high (2 = twice the load). Lengths are unchanged."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"rate scale factor must be a finite number > 0, got {factor}")
    last = float(trace.arrival_s[-1]) if len(trace) else 0.0
    if not last / factor <= MAX_ARRIVAL_S:
        raise ValueError(f"rate scale factor {factor:g} stretches the trace's last arrival, "
                         f"{last:g} s, to {last / factor:g} s, past the engine's limit of "
                         f"{MAX_ARRIVAL_S:g} s")
    return _with_arrivals(trace, trace.arrival_s / factor,
                          source=f"{trace.source} [rate x{factor:g}]",
                          timestamp_step_s=trace.timestamp_step_s / factor)


def jitter(trace: Trace, step_s: float, rng: np.random.Generator) -> Trace:
    """Spread quantised timestamps: each request moves to a uniform time in
    ``[arrival_s, arrival_s + step_s)``, then the trace is re-sorted (stably).

    Meant for traces whose timestamps come in steps of ``step_s`` seconds (Mooncake's are about
    3 s): requests that share a timestamp arrived somewhere in the step that follows it, and
    replaying them all at once would be a burst the real traffic never had. Deterministic given
    the state of ``rng``, which draws one number per request.
    """
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"jitter step_s must be a finite number of seconds > 0, got {step_s}")
    arrival_s = trace.arrival_s + rng.uniform(0.0, step_s, size=len(trace))
    order = np.argsort(arrival_s, kind="stable")
    # (not trace.select: the old arrivals in the new order are not sorted)
    return Trace(name=trace.name, arrival_s=arrival_s[order],
                 prompt_tokens=trace.prompt_tokens[order],
                 output_tokens=trace.output_tokens[order], slo_class=trace.slo_class[order],
                 source=f"{trace.source} [jitter {step_s:g} s]", skipped=dict(trace.skipped))


def quantisation_step(arrival_s: np.ndarray) -> float:
    """The step of quantised timestamps, or 0 when they are not quantised.

    Timestamps count as quantised when at least half of the requests share theirs with another
    request; the step is then the median gap between distinct timestamps (3 s in Mooncake's
    conversation trace, where up to 18 requests share one instant).
    """
    if len(arrival_s) < 4:
        return 0.0
    distinct = np.unique(arrival_s)
    if len(distinct) < 2 or len(distinct) * 2 > len(arrival_s):
        return 0.0
    return float(np.median(np.diff(distinct)))


def spread_quantised(trace: Trace, seed: int = 0) -> Trace:
    """The trace with quantised arrivals spread within their step (:func:`jitter` with the
    trace's ``timestamp_step_s``, seeded), or the trace itself when it is not quantised."""
    if trace.timestamp_step_s <= 0:
        return trace
    return jitter(trace, trace.timestamp_step_s, np.random.default_rng(seed))


def split(trace: Trace, part: Literal["train", "eval", "all"]) -> Trace:
    """The training part (arrivals before :data:`TRAIN_SPLIT_S`), the evaluation part (the rest,
    re-based to start at 0) or all of it. A part with no request is refused."""
    if part == "all":
        return trace
    if part == "train":
        chosen = trace.select(trace.arrival_s < TRAIN_SPLIT_S,
                              source=f"{trace.source} [train: before {TRAIN_SPLIT_S:g} s]")
    elif part == "eval":
        chosen = time_window(trace, TRAIN_SPLIT_S, math.inf)
        chosen = _with_arrivals(chosen, chosen.arrival_s,
                                source=f"{trace.source} [eval: from {TRAIN_SPLIT_S:g} s, re-based]")
    else:
        raise ValueError(f"unknown split part {part!r}; expected train, eval or all")
    if not len(chosen):
        raise ValueError(f"trace {trace.name!r} has no request in its {part} part: it spans "
                         f"{trace.arrival_s[0] if len(trace) else 0:g} s to "
                         f"{trace.arrival_s[-1] if len(trace) else 0:g} s and the split is at "
                         f"{TRAIN_SPLIT_S:g} s")
    return chosen


def _with_arrivals(trace: Trace, arrival_s: np.ndarray, source: str | None = None,
                   timestamp_step_s: float | None = None) -> Trace:
    return Trace(name=trace.name, arrival_s=arrival_s, prompt_tokens=trace.prompt_tokens,
                 output_tokens=trace.output_tokens, slo_class=trace.slo_class,
                 source=source or trace.source, skipped=dict(trace.skipped),
                 num_reordered=trace.num_reordered,
                 timestamp_step_s=(trace.timestamp_step_s if timestamp_step_s is None
                                   else timestamp_step_s))
