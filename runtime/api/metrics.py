"""Prometheus metrics of one app, in the app's own registry (so that several apps, e.g. in tests,
do not collide in the global one)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from runtime.decider.decision import SOURCES, Decision, Source
from runtime.decider.guard import GuardedDecider

LATENCY_BUCKETS_S = (10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
                     25e-3, 50e-3, 100e-3, 250e-3)
"""Decision latency buckets: from a single decision (tens of microseconds) to a 4096 batch."""
LOOP_LAG_PERIOD_S = 0.02
"""how often the event loop's lag is sampled"""
LOOP_LAG_BUCKETS_S = (250e-6, 500e-6, 1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 7.5e-3, 10e-3, 25e-3, 50e-3,
                      100e-3, 250e-3, 1.0)
"""Event-loop lag buckets: a fraction of a millisecond on an idle loop to a blocked one"""


async def watch_loop_lag(observe: Callable[[float], None],
                         period_s: float = LOOP_LAG_PERIOD_S) -> None:
    """Every ``period_s``, observe how much later than asked the loop woke this coroutine: how
    long a request that arrived at that moment waited before the loop could turn to it (the loop
    busy with other callbacks, or its thread off the CPU). Runs until cancelled."""
    while True:
        t0 = time.perf_counter()
        await asyncio.sleep(period_s)
        observe(max(0.0, time.perf_counter() - t0 - period_s))


class _DeciderState(Collector):
    """Gauges read from the decider when scraped: loaded policy, breaker state and trips."""

    def __init__(self, decider: GuardedDecider) -> None:
        self.decider = decider

    def collect(self) -> Iterator[GaugeMetricFamily]:
        d = self.decider
        policy = d.policy
        info = GaugeMetricFamily("batchpilot_policy_loaded",
                                 "1 when an ONNX policy is loaded (labelled with its version)",
                                 labels=["policy_version"])
        info.add_metric([policy.policy_version if policy is not None else ""],
                        1.0 if policy is not None else 0.0)
        yield info
        state = GaugeMetricFamily("batchpilot_breaker_state",
                                  "1 for the circuit breaker's current state", labels=["state"])
        for s in ("closed", "open", "half_open"):
            state.add_metric([s], 1.0 if d.breaker.state == s else 0.0)
        yield state
        yield GaugeMetricFamily("batchpilot_breaker_trips",
                                "times the breaker handed control to the PID since start",
                                value=d.breaker.num_trips)
        ood = policy.ood_guard if policy is not None and d.ood_guard else None
        yield GaugeMetricFamily("batchpilot_ood_tripped",
                                "1 while the PID has control because the observations left the "
                                "policy's training distribution (0 without a guard)",
                                value=1.0 if ood is not None and ood.tripped else 0.0)
        yield GaugeMetricFamily("batchpilot_ood_client_out",
                                "client observations outside the policy's training "
                                "distribution, decided by the PID, since the policy loaded",
                                value=ood.client_out if ood is not None else 0)
        latch = policy.lend_latch if policy is not None else None
        yield GaugeMetricFamily("batchpilot_lend_hold_trips",
                                "holds of the lending guard's floor after lending preempted, "
                                "since the policy loaded (0 without a hold)",
                                value=latch.trips if latch is not None else 0)
        yield GaugeMetricFamily("batchpilot_lend_holding",
                                "1 while a hold of the lending guard's floor runs",
                                value=1.0 if latch is not None and latch.left > 0 else 0.0)


class ServerMetrics:
    """:param decider: the app's decider (its state is read at scrape time)"""

    def __init__(self, decider: GuardedDecider) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.decisions = Counter("batchpilot_decisions", "Decisions by route and source",
                                 ["route", "source"], registry=r)
        self.fallbacks = Counter("batchpilot_fallbacks",
                                 "Decisions not made by the policy, by reason", ["reason"],
                                 registry=r)
        self.latency = Histogram("batchpilot_decision_seconds",
                                 "Time to decide one request, from the validated observations to "
                                 "the decisions (the batch route: the whole batch)",
                                 ["route"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.loop_lag = Histogram("batchpilot_event_loop_lag_seconds",
                                  "How much later than asked the event loop ran a timer, sampled "
                                  "every 20 ms: what a request arriving then waited for the loop",
                                  buckets=LOOP_LAG_BUCKETS_S, registry=r)
        self.reloads = Counter("batchpilot_reloads", "Policy reloads by outcome (ok, or why the "
                               "policy was refused)", ["outcome"], registry=r)
        r.register(_DeciderState(decider))
        # children bound once: labels() costs a dict lookup and a lock per call
        self._by_source = {route: {s: self.decisions.labels(route, s) for s in SOURCES}
                           for route in ("decide", "batch")}
        self._latency = {route: self.latency.labels(route) for route in ("decide", "batch")}

    def record(self, route: str, decision: Decision, seconds: float) -> None:
        self._by_source[route][decision.source].inc()
        if decision.reason is not None:
            self.fallbacks.labels(decision.reason).inc()
        self._latency[route].observe(seconds)

    def record_tally(self, tally: Mapping[tuple[Source, str | None], int],
                     seconds: float) -> None:
        """Count a batch's decisions by (source, reason), and its time."""
        by_source = self._by_source["batch"]
        for (source, reason), n in tally.items():
            by_source[source].inc(n)
            if reason is not None:
                self.fallbacks.labels(reason).inc(n)
        self._latency["batch"].observe(seconds)
