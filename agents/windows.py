"""The evaluated window of a trace, as the arena and the capacity searches replay it.

Both the arena's rows and best static's capacity probes replay the same window (a trace's split,
rate-scaled) for the same time after its last arrival; they share these two definitions so that
a probe's attainment is the arena's for the same setting.
"""

from __future__ import annotations

import functools
from typing import Any

from env.traces import rate_scale, split
from env.traces.resolve import resolve_trace
from env.traces.trace import Trace

DRAIN_LIMIT_S = 1800.0
"""a replay that has not drained this long after its last arrival is cut off (aborted)"""


@functools.lru_cache(maxsize=8)
def split_trace(trace_spec: str, part: str) -> Trace:
    """The ``part`` split (train, eval, ...) of the trace ``trace_spec`` names (the last few
    are kept: every controller and load of an arena replays the same one)."""
    return split(resolve_trace(trace_spec), part)


def eval_window(spec: Any, scale: float) -> Trace:
    """The window an :class:`agents.registry.EvalSpec` evaluates: its trace's split, at ``scale``
    times its rate."""
    trace = split_trace(spec.trace, spec.part)
    return rate_scale(trace, scale) if scale != 1.0 else trace
