"""Serving metrics: per-interval counters the controller sees, and the summary of a run."""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from runtime.engine.request import RejectReason, Request, Status, slot_copier


def percentiles(values: Sequence[float], qs: tuple[float, ...]) -> list[float]:
    """The ``qs``-th percentiles (0..100), 0.0 each for no values: ``np.percentile``'s default
    (linear) method, its arithmetic step for step (the index ``(n - 1) q / 100``, the weight
    past its floor, the interpolation from the nearer end), on one sort. ``np.percentile``
    itself costs several times more a call (a run summary ends every environment episode),
    and its first call imports ``numpy.ma`` (through ``np.unique``): some 60 M instructions,
    more than a hundred environment steps. ``tests/test_metrics_percentiles.py`` holds the
    two equal."""
    if not len(values):
        return [0.0] * len(qs)
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    top = len(ordered) - 1
    out = []
    for q in qs:
        at = top * (q / 100)
        if at >= top:
            out.append(float(ordered[top]))
            continue
        below = int(at)  # the floor: at >= 0
        t = at - below
        a, b = float(ordered[below]), float(ordered[below + 1])
        d = b - a
        out.append(b - d * (1 - t) if t >= 0.5 else a + d * t)
    return out


def fast_p99(values: list[float]) -> float:
    """Nearest-rank 99th percentile of a short list, without numpy's per-call overhead."""
    n = len(values)
    if n == 0:
        return 0.0
    if n < _P99_IS_MAX_BELOW:
        return max(values)  # the rank below is n (an interval's lists: a few entries, no sort)
    return sorted(values)[min(n - 1, math.ceil(0.99 * n) - 1)]


_P99_IS_MAX_BELOW = 100
"""up to 99 values the nearest rank ``ceil(0.99 n)`` is ``n``: the 99th percentile is the
largest"""
assert all(math.ceil(0.99 * n) == n for n in range(1, _P99_IS_MAX_BELOW))


@dataclass(slots=True)
class IntervalStats:
    """What happened in the engine between two calls of ``Engine.collect_interval``, and its state
    at the end. Counts are events in the interval."""

    start_s: float = 0.0
    end_s: float = 0.0
    arrivals: int = 0
    arrival_prompt_sum: float = 0.0
    arrival_prompt_sumsq: float = 0.0
    finished: int = 0
    met: int = 0
    """finished within their SLO"""
    violations: int = 0
    """requests whose SLO miss became certain in the interval (each request counted once)"""
    rejected: int = 0
    preemptions: int = 0
    ooms: int = 0
    iterations: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    busy_s: float = 0.0
    resize_s: float = 0.0
    batch_met: int = 0
    """of ``met``: batch requests finished by their deadline"""
    batch_violations: int = 0
    """of ``violations``: batch requests whose deadline passed unfinished, or that were dropped"""
    batch_goodput_tokens: int = 0
    """prompt + output tokens of the batch requests finished by their deadline"""
    shed: int = 0
    """interactive requests rejected as ``shed`` by deadline-aware admission"""
    expired: int = 0
    """batch requests rejected as ``expired`` (deadline passed before admission)"""
    late: int = 0
    """interactive requests moved behind on-time ones (policy ``late_to_back``)"""
    kv_gib_s: float = 0.0
    """GiB-seconds of KV pool held over the interval"""
    cotenant_demand_gib_s: float = 0.0
    """GiB-seconds the co-tenant wanted over the interval (0 without one)"""
    cotenant_served_gib_s: float = 0.0
    """GiB-seconds of that demand that the memory left by the engine served"""
    ttft_ratios: list[float] = field(default_factory=list)
    """TTFT over its class target, for every first token of the interval"""
    tpot_ratios: list[float] = field(default_factory=list)
    """TPOT over its class target, for every completion of the interval"""
    # state at the end of the interval
    waiting: int = 0
    waiting_tokens: int = 0
    running: int = 0
    kv_utilization: float = 0.0
    kv_fragmentation: float = 0.0
    kv_blocks: int = 0
    oldest_wait_ratio: float = 0.0
    """age of the oldest interactive request still without a first token, over its TTFT
    target"""
    batch_waiting: int = 0
    """of ``waiting``: batch requests"""
    batch_running: int = 0
    """of ``running``: batch requests"""
    batch_backlog_tokens: int = 0
    """tokens the batch requests in the engine (waiting or running) still have to compute,
    outputs counted at their full length"""
    batch_deadline_margin: float = 1.0
    """min over the batch requests in the engine (waiting or running) of (deadline - now) /
    (deadline - arrival), floored at 0; 1 when there are none"""
    cotenant_demand_fraction: float = 0.0
    """the co-tenant's demand at the end of the interval over the memory left after the
    weights (0 without a co-tenant)"""
    _ttft_p99: float | None = field(default=None, init=False, repr=False, compare=False)
    """:attr:`ttft_p99_ratio`, once the interval is closed (:meth:`close_percentiles`)"""
    _tpot_p99: float | None = field(default=None, init=False, repr=False, compare=False)
    """:attr:`tpot_p99_ratio`, once the interval is closed"""

    def copy(self) -> IntervalStats:
        """An independent copy (its own ratio lists), for a forked engine: written out from the
        slots (:func:`runtime.engine.request.slot_copier`), so a field added later is copied
        too."""
        copied: IntervalStats = _copy_interval(self)
        return copied

    def close_percentiles(self) -> None:
        """Take the p99s of the closed interval once (the engine calls this when it closes the
        interval: its lists take no more entries); the observation and the environment's info
        both read them."""
        self._ttft_p99 = fast_p99(self.ttft_ratios)
        self._tpot_p99 = fast_p99(self.tpot_ratios)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def arrival_rate(self) -> float:
        d = self.duration_s
        return self.arrivals / d if d > 0 else 0.0

    @property
    def prompt_mean(self) -> float:
        return self.arrival_prompt_sum / self.arrivals if self.arrivals else 0.0

    @property
    def prompt_std(self) -> float:
        if self.arrivals < 2:
            return 0.0
        m = self.prompt_mean
        return math.sqrt(max(0.0, self.arrival_prompt_sumsq / self.arrivals - m * m))

    @property
    def slo_attainment(self) -> float:
        """Met over (met + certain violations) in the interval; 1.0 when nothing was decided."""
        decided = self.met + self.violations
        return self.met / decided if decided else 1.0

    @property
    def interactive_attainment(self) -> float:
        """:attr:`slo_attainment` over the interactive classes alone."""
        met = self.met - self.batch_met
        decided = met + self.violations - self.batch_violations
        return met / decided if decided else 1.0

    @property
    def mean_kv_gib(self) -> float:
        d = self.duration_s
        return self.kv_gib_s / d if d > 0 else 0.0

    @property
    def ttft_p99_ratio(self) -> float:
        """p99 of TTFT / its class target over the first tokens of the interval."""
        p = self._ttft_p99
        return fast_p99(self.ttft_ratios) if p is None else p

    @property
    def tpot_p99_ratio(self) -> float:
        """p99 of TPOT / its class target over the completions of the interval."""
        p = self._tpot_p99
        return fast_p99(self.tpot_ratios) if p is None else p


@dataclass(frozen=True)
class RunSummary:
    requests: int
    finished: int
    rejected: int
    rejected_by_reason: dict[str, int]
    met: int
    slo_attainment: float
    """met / (finished + rejected), aborted requests excluded"""
    goodput_rps: float
    throughput_rps: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    tpot_p99_s: float
    preemptions: int
    ooms: int
    iterations: int
    sim_seconds: float
    interactive_requests: int = 0
    interactive_attainment: float = 1.0
    """met / (finished + rejected) over the interactive classes, aborted excluded"""
    batch_requests: int = 0
    batch_met: int = 0
    """batch requests finished by their deadline"""
    batch_goodput_tps: float = 0.0
    """prompt + output tokens of batch requests finished by their deadline, per second"""
    batch_unfinished: int = 0
    """batch requests still in flight (waiting or running) at the end: the backlog"""
    late: int = 0
    """interactive requests moved behind on-time ones (admission ``late_to_back``)"""
    mean_kv_gib: float = 0.0
    """the KV pool's size, averaged over the run"""
    cotenant_served_share: float = 1.0
    """served / demanded GiB-seconds of the co-tenant (1 without one)"""

    def as_dict(self) -> dict:
        return dict(self.__dict__)


_copy_interval = slot_copier(IntervalStats.__slots__, own=("ttft_ratios", "tpot_ratios"))


_SUMMARY_QS = (50.0, 90.0, 99.0)
"""the TTFT and TPOT percentiles a run summary reports"""


class SummaryAccumulator:
    """What a run summary needs from the requests that ended, taken as each one ends, so that the
    engine can drop ended requests and still summarise the run exactly: the counts, and each
    finished interactive request's TTFT and TPOT (8 bytes each, in compact arrays, for exact
    percentiles)."""

    __slots__ = ("num", "finished", "rejected", "met", "reasons", "ttfts", "tpots", "num_batch",
                 "batch_met", "batch_decided", "batch_tokens", "late")

    def __init__(self) -> None:
        self.num = 0
        self.finished = 0
        self.rejected = 0
        """rejections that count against attainment (aborted ones do not)"""
        self.met = 0
        self.reasons: dict[str, int] = {}
        self.ttfts = array("d")
        self.tpots = array("d")
        self.num_batch = 0
        self.batch_met = 0
        self.batch_decided = 0
        self.batch_tokens = 0
        self.late = 0

    def copy(self) -> SummaryAccumulator:
        """An independent copy, for a forked engine."""
        c = SummaryAccumulator.__new__(SummaryAccumulator)
        for name in self.__slots__:
            setattr(c, name, getattr(self, name))
        c.reasons = dict(self.reasons)
        c.ttfts = array("d", self.ttfts)
        c.tpots = array("d", self.tpots)
        return c

    def add(self, r: Request, met: bool | None = None) -> None:
        """Account for ``r``, which has just finished or been rejected (``met``: whether it met
        its SLO, when the caller has just judged it; else :meth:`Request.meets_slo` judges)."""
        self.num += 1
        self.late += r.is_late
        batch = r.is_batch
        self.num_batch += batch
        if r.status == Status.FINISHED:
            assert r.first_token_s is not None and r.finish_s is not None
            self.finished += 1
            ok = r.meets_slo() if met is None else met
            self.met += ok
            if batch:
                self.batch_decided += 1
                if ok:
                    self.batch_met += 1
                    self.batch_tokens += r.prompt_tokens + r.output_tokens
                return
            self.ttfts.append(r.first_token_s - r.arrival_s)
            if r.output_tokens >= 2:
                self.tpots.append((r.finish_s - r.first_token_s) / (r.output_tokens - 1))
        elif r.status == Status.REJECTED:
            assert r.reject_reason is not None
            reason = r.reject_reason.value
            self.reasons[reason] = self.reasons.get(reason, 0) + 1
            if r.reject_reason != RejectReason.ABORTED:
                self.rejected += 1
                self.batch_decided += batch

    def summary(self, in_flight: Iterable[Request], sim_seconds: float, preemptions: int,
                ooms: int, iterations: int, kv_gib_s: float = 0.0,
                cotenant_gib_s: tuple[float, float] = (0.0, 0.0)) -> RunSummary:
        """The run's figures, with ``in_flight`` the requests that have not ended. TTFT and TPOT
        percentiles are over interactive requests (a batch request's are not judged);
        ``cotenant_gib_s`` is (served, demanded)."""
        n, n_batch, late, batch_open = self.num, self.num_batch, self.late, 0
        for r in in_flight:
            n += 1
            late += r.is_late
            n_batch += r.is_batch
            batch_open += r.is_batch
        met, finished, rejected = self.met, self.finished, self.rejected
        batch_met = self.batch_met
        decided = finished + rejected
        i_met, i_decided = met - batch_met, decided - self.batch_decided
        served, demanded = cotenant_gib_s
        ttft_p50, ttft_p90, ttft_p99 = percentiles(self.ttfts, _SUMMARY_QS)
        tpot_p50, tpot_p90, tpot_p99 = percentiles(self.tpots, _SUMMARY_QS)
        return RunSummary(
            requests=n, finished=finished, rejected=rejected,
            rejected_by_reason=dict(self.reasons), met=met,
            slo_attainment=met / decided if decided else 1.0,
            goodput_rps=met / sim_seconds if sim_seconds > 0 else 0.0,
            throughput_rps=finished / sim_seconds if sim_seconds > 0 else 0.0,
            ttft_p50_s=ttft_p50, ttft_p90_s=ttft_p90, ttft_p99_s=ttft_p99,
            tpot_p50_s=tpot_p50, tpot_p90_s=tpot_p90, tpot_p99_s=tpot_p99,
            preemptions=preemptions, ooms=ooms, iterations=iterations, sim_seconds=sim_seconds,
            interactive_requests=n - n_batch,
            interactive_attainment=i_met / i_decided if i_decided else 1.0,
            batch_requests=n_batch, batch_met=batch_met,
            batch_goodput_tps=self.batch_tokens / sim_seconds if sim_seconds > 0 else 0.0,
            batch_unfinished=batch_open, late=late,
            mean_kv_gib=kv_gib_s / sim_seconds if sim_seconds > 0 else 0.0,
            cotenant_served_share=served / demanded if demanded > 0 else 1.0,
        )


def summarize(requests: Iterable[Request], sim_seconds: float, preemptions: int, ooms: int,
              iterations: int, kv_gib_s: float = 0.0,
              cotenant_gib_s: tuple[float, float] = (0.0, 0.0)) -> RunSummary:
    """The run's figures from every request (see :meth:`SummaryAccumulator.summary`)."""
    acc = SummaryAccumulator()
    in_flight = []
    for r in requests:
        if r.status >= Status.FINISHED:
            acc.add(r)
        else:
            in_flight.append(r)
    return acc.summary(in_flight, sim_seconds, preemptions, ooms, iterations, kv_gib_s,
                       cotenant_gib_s)


def burst_onsets(arrival_rate: Sequence[float], interval_s: float, *, factor: float = 3.0,
                 bin_s: float = 1.0, baseline_s: float = 60.0, min_requests: int = 10) -> list[int]:
    """Indices of the intervals where a burst starts.

    Arrivals are counted in ``bin_s`` bins (per-interval counts are too noisy); a burst starts in
    a bin that holds at least ``min_requests`` and more than ``factor`` times the mean of the
    preceding ``baseline_s``, and it lasts while bins stay above that mean. Returns the index of
    the first interval of each starting bin.
    """
    rates = np.asarray(arrival_rate, dtype=np.float64)
    per_bin = max(1, int(round(bin_s / interval_s)))
    n_bins = len(rates) // per_bin
    if n_bins < 2:
        return []
    counts = (rates[:n_bins * per_bin] * interval_s).reshape(n_bins, per_bin).sum(axis=1)
    w = max(1, int(round(baseline_s / bin_s)))
    onsets: list[int] = []
    in_burst = False
    for i in range(1, n_bins):
        base = counts[max(0, i - w):i].mean()
        hot = counts[i] >= min_requests and counts[i] > factor * base
        if hot and not in_burst:
            onsets.append(i * per_bin)
        in_burst = hot or (in_burst and counts[i] > base)
    return onsets


def recovery_times(attainment: Sequence[float], onsets: Sequence[int], interval_s: float, *,
                   target: float = 0.99, hold: int = 3, dip_window_s: float = 30.0) -> list[float]:
    """Seconds from each burst onset until interval attainment is back at ``target`` for ``hold``
    intervals in a row after the burst's dip: 0 when attainment does not drop below ``target``
    within ``dip_window_s`` of the onset (misses become certain up to a TTFT target after the
    requests arrive, so the dip trails the onset); ``inf`` when it never recovers."""
    att = np.asarray(attainment, dtype=np.float64)
    window = max(1, int(round(dip_window_s / interval_s)))
    out = []
    for start in onsets:
        below = np.flatnonzero(att[start:start + window] < target)
        if below.size == 0:
            out.append(0.0)
            continue
        t = math.inf
        run = 0
        for j in range(start + int(below[0]), len(att)):
            run = run + 1 if att[j] >= target else 0
            if run >= hold:
                t = (j - hold + 1 - start) * interval_s
                break
        out.append(t)
    return out
