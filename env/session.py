"""The Gymnasium environment's episode: a trace window run through the runtime's interval loop
(:class:`runtime.session.Session`), with the reward.

The environment, the arena and the serving runtime all run the same loop, so a controller is
judged on exactly the data path a policy is trained on: engine -> interval stats -> features ->
knobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from env.traces.trace import Trace
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.executor import Executor
from runtime.engine.metrics import IntervalStats
from runtime.engine.profile import Profile
from runtime.engine.sim_executor import SimulatedExecutor
from runtime.knobs import DEFAULT_KNOBS, Knobs
from runtime.session import DEFAULT_INTERVAL_S, Pacer, ServingEngine, Session


@dataclass(frozen=True)
class RewardWeights:
    """The reward of one interval is

        (met_interactive + batch_weight * met_batch - violation_weight * violations)
            / expected_requests_per_interval
        - memory_price * kv_cache_ratio + cotenant_value * cotenant_served_share
        - oom_penalty * ooms

    ``met_*`` count requests that finished within their SLO in the interval (a batch request:
    by its deadline); ``violations`` counts requests whose miss became certain in it (a waiting
    request past its TTFT target counts then, not at its completion; rejected requests, shed or
    expired ones included, count when rejected). Dividing by the episode's mean arrivals per
    interval makes a perfect interval worth about 1 at any load. ``cotenant_served_share`` is the
    share of the co-tenant's demand in the interval that the memory the engine left served (1
    without a co-tenant, so the term is then a constant); with a co-tenant it prices memory by
    what it serves, and ``memory_price`` can be 0.
    """

    violation_weight: float = 1.0
    """cost of one SLO violation relative to the value of one SLO-meeting completion"""
    memory_price: float = 0.05
    """price per interval of holding the whole free memory as KV cache (0 for a dedicated
    accelerator; positive when co-located models, adapters or a prefix cache could use it)"""
    oom_penalty: float = 0.5
    """penalty per out-of-memory iteration, on top of the time it cost"""
    batch_weight: float = 1.0
    """value of a batch request finished by its deadline relative to an interactive one met"""
    cotenant_value: float = 0.0
    """value per interval of serving the whole of the co-tenant's demand (0: not rewarded)"""

    def __post_init__(self) -> None:
        for name in ("violation_weight", "memory_price", "oom_penalty", "batch_weight",
                     "cotenant_value"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"reward weight {name} must be a finite number >= 0, got {v}")


class StepResult(NamedTuple):
    """One interval of an episode (a named tuple: built every step, it must be cheap)."""

    observation: np.ndarray
    """the observation at the interval's end"""
    reward: float
    """the interval's reward (the sum of ``reward_terms``)"""
    stats: IntervalStats
    """the engine's interval stats"""
    knobs: Knobs
    """the knobs the interval ran under"""
    reward_terms: dict[str, float]
    """the reward's terms by name"""


def trace_engine(trace: Trace, *, executor: Executor | None = None,
                 profile: Profile | None = None, config: EngineConfig | None = None,
                 knobs: Knobs = DEFAULT_KNOBS, pacer: Pacer | None = None) -> Engine:
    """An engine with every request of ``trace`` queued, on ``executor`` (default: a simulated
    one from ``profile``), wrapped by ``pacer`` when it paces in wall-clock time."""
    ex = executor if executor is not None else SimulatedExecutor(profile)
    engine = Engine(pacer.executor(ex) if pacer is not None else ex, knobs, config)
    engine.add_requests(trace.arrival_s, trace.prompt_tokens, trace.output_tokens,
                        trace.slo_class)
    return engine


class ServingSession:
    """:param trace: the requests of the window, arrivals from 0
    :param interval_s: the decision interval (simulated seconds)
    :param profile: executor profile for the simulated executor (default: the shipped roofline)
    :param config: engine limits and SLO classes
    :param knobs: the knobs the engine starts with
    :param weights: reward weights
    :param executor: a ready executor (the torch one); default a simulated one from ``profile``
    :param engine: a ready engine holding the trace's requests, with its pacer (a live vLLM
        engine, ``runtime.vllm.engine``); replaces ``executor`` and ``profile``
    """

    def __init__(self, trace: Trace, *, interval_s: float = DEFAULT_INTERVAL_S,
                 profile: Profile | None = None, config: EngineConfig | None = None,
                 knobs: Knobs = DEFAULT_KNOBS, weights: RewardWeights | None = None,
                 executor: Executor | None = None,
                 engine: tuple[ServingEngine, Pacer] | None = None) -> None:
        self.trace = trace
        self.weights = weights if weights is not None else RewardWeights()
        if engine is not None:
            self.loop = Session(engine[0], interval_s=interval_s, pacer=engine[1])
        else:
            self.loop = Session(trace_engine(trace, executor=executor, profile=profile,
                                             config=config, knobs=knobs), interval_s=interval_s)
        self.engine = self.loop.engine
        self.interval_s = self.loop.interval_s
        self.end_s = float(trace.arrival_s[-1]) if len(trace) else 0.0
        rate = len(trace) / max(self.end_s, interval_s)
        self.requests_per_interval = max(1.0, rate * interval_s)
        self.num_steps = 0

    @property
    def now(self) -> float:
        return self.engine.now

    @property
    def window_over(self) -> bool:
        """Every request of the window has arrived and the interval that saw the last is done."""
        return self.engine.now >= self.end_s

    def step(self, knobs: Knobs) -> StepResult:
        """Apply ``knobs``, run to the next point of the interval grid, and observe it."""
        loop = self.loop
        loop.apply(knobs)
        stats, obs = loop.advance()
        knobs = self.engine.knobs  # as applied
        w = self.weights
        met = stats.met + (w.batch_weight - 1.0) * stats.batch_met
        served = (met - w.violation_weight * stats.violations) / self.requests_per_interval
        memory = w.memory_price * knobs.kv_cache_ratio
        demand = stats.cotenant_demand_gib_s
        cotenant = w.cotenant_value * (stats.cotenant_served_gib_s / demand if demand > 0 else 1.0)
        oom = w.oom_penalty * stats.ooms
        self.num_steps += 1
        return StepResult(obs, served - memory + cotenant - oom, stats, knobs,
                          {"served": served, "memory": -memory, "cotenant": cotenant,
                           "oom": -oom})

    @property
    def has_work(self) -> bool:
        return self.engine.has_work()

    def abort(self) -> int:
        """End the replay here: requests still in flight are aborted (with that reason, never
        counted as SLO outcomes). Returns how many."""
        return self.engine.abort_all()
