"""Replay a trace through the engine with fixed knobs: the simplest use of the whole stack."""

from __future__ import annotations

import time
from dataclasses import dataclass

from env.traces.trace import Trace
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.metrics import RunSummary
from runtime.engine.profile import Profile
from runtime.engine.sim_executor import SimulatedExecutor
from runtime.knobs import Knobs


@dataclass(frozen=True)
class ReplayResult:
    summary: RunSummary
    wall_seconds: float
    engine: Engine

    @property
    def speedup(self) -> float:
        """Simulated seconds per wall second."""
        return self.summary.sim_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def as_dict(self) -> dict:
        s = self.summary
        return {
            "requests": s.requests, "finished": s.finished, "rejected": s.rejected,
            "rejected_by_reason": s.rejected_by_reason,
            "slo_attainment": s.slo_attainment, "goodput_rps": s.goodput_rps,
            "ttft_p50_s": s.ttft_p50_s, "ttft_p90_s": s.ttft_p90_s, "ttft_p99_s": s.ttft_p99_s,
            "tpot_p50_s": s.tpot_p50_s, "tpot_p90_s": s.tpot_p90_s, "tpot_p99_s": s.tpot_p99_s,
            "preemptions": s.preemptions, "ooms": s.ooms, "iterations": s.iterations,
            "sim_seconds": s.sim_seconds, "wall_seconds": self.wall_seconds,
            "speedup": self.speedup,
        }


def replay(trace: Trace, knobs: Knobs, *, profile: Profile | None = None,
           config: EngineConfig | None = None) -> ReplayResult:
    """Run every request of ``trace`` to its end with ``knobs`` held fixed.

    The wall time counts the engine only (building the requests included), not reading the trace.
    """
    config = config if config is not None else EngineConfig()
    trace.check_classes(config.slo_classes)
    executor = SimulatedExecutor(profile)
    t0 = time.perf_counter()
    engine = Engine(executor, knobs, config)
    engine.add_requests(trace.arrival_s, trace.prompt_tokens, trace.output_tokens,
                        trace.slo_class)
    engine.run_to_completion()
    wall = time.perf_counter() - t0
    return ReplayResult(engine.summary(), wall, engine)
