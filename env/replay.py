"""Replay a trace through the runtime's interval loop: fixed knobs (the simplest use of the whole
stack) or any controller deciding every interval."""

from __future__ import annotations

import math
from collections.abc import Callable

from env.traces.trace import Trace
from runtime.decider.controller import Decider
from runtime.engine.engine import EngineConfig
from runtime.engine.executor import Executor
from runtime.engine.profile import Profile
from runtime.engine.sim_executor import SimulatedExecutor
from runtime.knobs import DEFAULT_KNOBS, Knobs
from runtime.session import (
    DEFAULT_INTERVAL_S,
    IntervalRecord,
    Pacer,
    RunResult,
)
from runtime.session import replay as run_requests


def replay(trace: Trace, knobs: Knobs = DEFAULT_KNOBS, *, decider: Decider | None = None,
           profile: Profile | None = None, config: EngineConfig | None = None,
           executor: Executor | None = None, interval_s: float = DEFAULT_INTERVAL_S,
           pacer: Pacer | None = None, max_s: float = math.inf,
           on_interval: Callable[[IntervalRecord], None] | None = None,
           history: int = 0) -> RunResult:
    """Run every request of ``trace`` to its end (see :func:`runtime.session.replay`), on
    ``executor`` or a simulated one from ``profile``. The wall time counts the engine only
    (building the requests included), not reading the trace. A request of an SLO class the
    engine does not know is refused before anything runs."""
    config = config if config is not None else EngineConfig()
    trace.check_classes(config.slo_classes)
    return run_requests(executor if executor is not None else SimulatedExecutor(profile),
                        trace.arrival_s, trace.prompt_tokens, trace.output_tokens,
                        trace.slo_class, decider=decider, knobs=knobs, interval_s=interval_s,
                        pacer=pacer, config=config, max_s=max_s, on_interval=on_interval,
                        history=history)
