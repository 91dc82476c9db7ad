"""The arena: every controller on the same windows and loads, side by side, and each
controller's capacity.

Each controller replays the trace split (the whole split is one window) at each rate scale,
deciding every interval through the runtime's session loop, the one the environment trains in;
the replay runs until every request of the window has finished or been rejected (or
:data:`DRAIN_LIMIT_S` after the last arrival). A row holds SLO attainment, goodput, TTFT and
TPOT p99, preemptions, OOMs, mean knobs, mean KV memory reserved and burst recovery time; a
controller's capacity is the largest rate scale at which attainment stays >= 99% (and >= 90%),
found by bisection to within 2%.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from agents.parallel import JobRunner
from agents.registry import EvalSpec, make_controller
from env.replay import replay
from env.traces import rate_scale, split
from env.traces.resolve import resolve_trace, trace_label
from env.traces.trace import Trace
from runtime.decider.controller import Controller
from runtime.engine.engine import EngineConfig
from runtime.engine.executor import GIB
from runtime.engine.metrics import burst_onsets, recovery_times
from runtime.engine.profile import Profile
from runtime.engine.request import RejectReason
from runtime.knobs import KNOB_NAMES, NUM_KNOBS
from runtime.session import DEFAULT_INTERVAL_S, IntervalRecord

DRAIN_LIMIT_S = 1800.0
"""a replay that has not drained this long after its last arrival is cut off (aborted)"""

TIMELINE_KEYS = ("t", *KNOB_NAMES, "waiting", "running", "slo_attainment", "arrival_rate",
                 "kv_utilization")
"""what an episode's timeline holds per interval (the knobs are those decided at its end)"""


@dataclass
class EpisodeResult:
    summary: dict
    """the run's summary (:meth:`runtime.session.RunResult.as_dict`)"""
    decisions: int
    """intervals decided"""
    sources: dict[str, int]
    """decisions by who made them"""
    mean_knobs: tuple[float, ...] = (0.0,) * NUM_KNOBS
    """the decided knobs, averaged over the decisions"""
    mean_kv_gib: float = 0.0
    """KV memory reserved, averaged over the intervals"""
    timeline: dict[str, list[float]] = field(default_factory=dict)
    """per interval, when recorded (see :data:`TIMELINE_KEYS`)"""


class _Tally:
    """Folds interval records into the means (and the timeline) as they come."""

    def __init__(self, block_gib: float, record: bool) -> None:
        self.block_gib = block_gib
        self.knob_sum = np.zeros(NUM_KNOBS)
        self.kv_gib_sum = 0.0
        self.n = 0
        self.timeline: dict[str, list[float]] = {k: [] for k in TIMELINE_KEYS} if record else {}

    def __call__(self, rec: IntervalRecord) -> None:
        s, knobs = rec.stats, rec.knobs.as_tuple()
        self.knob_sum += knobs
        self.kv_gib_sum += s.kv_blocks * self.block_gib
        self.n += 1
        if self.timeline:
            for k, v in zip(TIMELINE_KEYS, (s.end_s, *knobs, s.waiting, s.running,
                                            s.slo_attainment, s.arrival_rate, s.kv_utilization)):
                self.timeline[k].append(float(v))


def run_episode(window: Trace, controller: Controller, *, interval_s: float,
                profile: Profile, config: EngineConfig | None = None,
                record: bool = False, tally: bool = True) -> EpisodeResult:
    """Replay ``window`` with ``controller`` deciding every interval, until it has drained.

    :param record: keep the per-interval timeline
    :param tally: average the knobs and the KV memory (False lets a static controller's replay
        run straight through; only the summary is then filled in)
    """
    controller.reset()
    end_s = float(window.arrival_s[-1]) if len(window) else 0.0
    block_gib = profile.memory.kv_block_bytes / GIB
    t = _Tally(block_gib, record) if tally or record else None
    res = replay(window, decider=controller, profile=profile, config=config,
                 interval_s=interval_s, max_s=end_s + DRAIN_LIMIT_S, on_interval=t)
    if t is None:
        return EpisodeResult(res.as_dict(), res.decisions, res.sources)
    n = max(t.n, 1)
    return EpisodeResult(res.as_dict(), res.decisions, res.sources,
                         tuple(t.knob_sum / n), t.kv_gib_sum / n, t.timeline)


@functools.lru_cache(maxsize=8)
def _split_trace(trace_spec: str, part: str) -> Trace:
    return split(resolve_trace(trace_spec), part)


def _window(spec: EvalSpec, scale: float) -> Trace:
    trace = _split_trace(spec.trace, spec.part)
    return rate_scale(trace, scale) if scale != 1.0 else trace


def attainment_at(spec: EvalSpec, controller: Controller, scale: float) -> float:
    """SLO attainment of ``controller`` on the spec's window at ``scale`` (no timeline)."""
    return run_episode(_window(spec, scale), controller, interval_s=spec.interval_s,
                       profile=Profile.load(spec.profile_path), config=spec.config,
                       tally=False).summary["slo_attainment"]


def _row_job(args: tuple) -> dict:
    spec, name, scale, record = args
    profile = Profile.load(spec.profile_path)
    controller = make_controller(name, spec)
    t0 = time.perf_counter()
    ep = run_episode(_window(spec, scale), controller, interval_s=spec.interval_s,
                     profile=profile, config=spec.config, record=True)
    s = ep.summary
    row = {"controller": name, "trace": trace_label(spec.trace), "rate_scale": scale,
           "slo_attainment": s["slo_attainment"], "goodput_rps": s["goodput_rps"],
           "ttft_p99_s": s["ttft_p99_s"], "tpot_p99_s": s["tpot_p99_s"],
           "preemptions": s["preemptions"], "ooms": s["ooms"], "requests": s["requests"],
           "rejected": s["rejected"], "interactive_attainment": s["interactive_attainment"],
           "batch_requests": s["batch_requests"], "batch_met": s["batch_met"],
           "batch_goodput_tps": s["batch_goodput_tps"],
           "shed": s["rejected_by_reason"].get(RejectReason.SHED.value, 0),
           "expired": s["rejected_by_reason"].get(RejectReason.EXPIRED.value, 0),
           "late": s["late"], "cotenant_served_share": s["cotenant_served_share"],
           "mean_batch_window_ms": ep.mean_knobs[0], "mean_prefill_chunk_tokens": ep.mean_knobs[1],
           "mean_kv_cache_ratio": ep.mean_knobs[2], "mean_kv_gib": ep.mean_kv_gib,
           "decision_sources": ep.sources, "wall_s": time.perf_counter() - t0}
    onsets = burst_onsets(ep.timeline["arrival_rate"], spec.interval_s)
    if onsets:
        rec = recovery_times(ep.timeline["slo_attainment"], onsets, spec.interval_s)
        finite = [r for r in rec if math.isfinite(r)]
        row["bursts"] = len(onsets)
        row["recovery_s_mean"] = float(np.mean(finite)) if finite else math.inf
        row["unrecovered_bursts"] = len(rec) - len(finite)
    if record:
        row["timeline"] = ep.timeline
    return row


def find_capacity(attainment: Callable[[float], float], target: float,
                  known: dict[float, float], *, tolerance: float = 0.02,
                  lowest: float = 1 / 64, highest: float = 64.0) -> float:
    """The largest rate scale with attainment >= ``target``, by geometric bisection until the
    bracket is within ``tolerance``. ``known`` holds scales already measured (and gets the new
    ones). Returns 0 when even ``lowest`` misses, ``highest`` when it never misses."""

    def att(s: float) -> float:
        if s not in known:
            known[s] = attainment(s)
        return known[s]

    failing = sorted(s for s, a in known.items() if a < target)
    hi = failing[0] if failing else None
    if hi is None:
        hi = max(known) if known else 1.0
        while att(hi) >= target:
            if hi >= highest:
                return highest
            hi = min(highest, hi * 2)
    passing = sorted(s for s, a in known.items() if a >= target and s < hi)
    lo = passing[-1] if passing else hi / 2
    while att(lo) < target:
        hi = lo
        if lo <= lowest:
            return 0.0
        lo = max(lowest, lo / 2)
    while hi / lo > 1 + tolerance:
        mid = math.sqrt(lo * hi)
        if att(mid) >= target:
            lo = mid
        else:
            hi = mid
    return lo


def _capacity_job(args: tuple) -> dict:
    spec, name, known = args
    controller = make_controller(name, spec)
    known = dict(known)

    def attainment(scale: float) -> float:
        return attainment_at(spec, controller, scale)

    cap99 = find_capacity(attainment, 0.99, known)
    cap90 = find_capacity(attainment, 0.90, known)
    return {"controller": name, "trace": trace_label(spec.trace), "capacity_99": cap99,
            "capacity_90": cap90, "evaluations": len(known)}


def evaluate(traces: Sequence[str], controllers: Sequence[str], scales: Sequence[float], *,
             part: str = "eval", interval_s: float = DEFAULT_INTERVAL_S,
             profile_path: str | None = None, config: EngineConfig | None = None,
             capacity: bool = True, workers: int = 2, ray: bool | None = None,
             progress: bool = True, match_static: float | None = None,
             tuning_scales: tuple[float, ...] | None = None) -> dict:
    """Run the arena; returns ``{"rows": [...], "capacity": [...], "static_match": [...]}``.

    Rows and capacity bisections run in parallel through :class:`agents.parallel.JobRunner`:
    ``workers`` local processes, or Ray with ``ray=True`` (``None``: when ``RAY_ADDRESS`` is set).

    :param match_static: also find, per trace, the rate scale at which the static default
        attains this share (bisection to 2%), and run every controller there; those rows carry
        ``"matched_static": True``
    """
    config = config or EngineConfig()
    specs = {t: EvalSpec(t, part, profile_path, interval_s, config, tuning_scales=tuning_scales)
             for t in traces}
    for t in traces:  # resolve names and warm the best-static cache before fanning out
        resolve_trace(t)
        if "best-static" in controllers:
            make_controller("best-static", specs[t])
    jobs = [(specs[t], c, s, True) for t in traces for c in controllers for s in scales]
    t0 = time.perf_counter()
    rows: list[dict] = []
    with JobRunner(workers, ray=ray, progress=progress) as pool:
        rows.extend(pool.map(_row_job, jobs, desc="runs"))
        matched: list[dict] = []
        if match_static is not None:
            for t in traces:
                known = {r["rate_scale"]: r["slo_attainment"] for r in rows
                         if r["trace"] == trace_label(t) and r["controller"] == "static"}
                static = make_controller("static", specs[t])
                scale = find_capacity(functools.partial(attainment_at, specs[t], static),
                                      match_static, known)
                matched.append({"trace": trace_label(t), "target": match_static,
                                "rate_scale": scale, "static_attainment": known.get(scale)})
            mjobs = [(specs[t], c, m["rate_scale"], False) for t, m in zip(traces, matched)
                     for c in controllers]
            for row in pool.map(_row_job, mjobs, desc="runs at the static match"):
                row["matched_static"] = True
                rows.append(row)
        cap: list[dict] = []
        if capacity:
            cjobs = []
            for t in traces:
                for c in controllers:
                    known = {r["rate_scale"]: r["slo_attainment"] for r in rows
                             if r["trace"] == trace_label(t) and r["controller"] == c}
                    cjobs.append((specs[t], c, known))
            # the capacity jobs take longest for the best controllers: start them first
            cjobs.sort(key=lambda j: -sum(j[2].values()))
            cap.extend(pool.map(_capacity_job, cjobs, desc="capacities"))
    return {"rows": rows, "capacity": cap, "static_match": matched, "split": part,
            "interval_s": interval_s,
            "profile": Profile.load(profile_path).name, "wall_s": time.perf_counter() - t0}
