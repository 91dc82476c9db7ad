"""The arena: every controller on the same windows and loads, side by side, each controller's
capacity, its goodput past capacity, and the static frontier of memory against attainment.

Each controller replays the trace split (the whole split is one window) at each rate scale,
deciding every interval through the runtime's session loop, the one the environment trains in;
the replay runs until every request of the window has finished or been rejected (or
:data:`DRAIN_LIMIT_S` after the last arrival). A row holds SLO attainment (all classes, and the
interactive classes alone), goodput, batch goodput (tokens/s of batch requests finished by their
deadline) and backlog, TTFT and TPOT p99, preemptions, OOMs, the requests shed, expired and
moved back by admission, mean knobs, mean KV memory reserved, the co-tenant's demand served and
burst recovery time. The oracle's rows are flagged ``upper_bound`` (it knows the future).

- Capacity: the largest rate scale at which attainment stays >= 99% (and >= 90%), found by
  bisection to within 2%, with the goodput measured there.
- Goodput past capacity: every controller at multiples of best static's capacity at 99%
  (:data:`PAST_CAPACITY_MULTIPLES`), its goodput there as a share of its own goodput at its own
  capacity. Admission (first come first served, shed, late to back) is a deployment setting of
  the engine config, so one arena run measures one policy.
- The static frontier: for each KV ratio (:data:`FRONTIER_RATIOS`), best static's setting
  (:mod:`agents.controllers.best_static`: the knob grid, then the admission lever) with the
  ratio held fixed, replayed at each rate scale: (mean KV GiB, interactive attainment), the
  line a controller's point is judged against in the Pareto plot (:func:`agents.report.plot`).
- Neighbouring loads: every load past best static's capacity is replayed again at
  :data:`LOAD_NEIGHBOURS` of itself by every controller but the lookahead searches, for the
  never-worse figure.
- The scorecard (:mod:`agents.scorecard`): every controller beside best static and the
  oracle, judged against the project's targets, computed from the rows above and from rows at
  the scorecard loads (:data:`SCORECARD_LOADS`, multiples of best static's capacity at 99%),
  which run only where no row at that load exists; the frontier is replayed there too.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from agents.bisection import HIGHEST, LOWEST, TOLERANCE, walk
from agents.controllers.best_static import GRID, RATIO_KNOB, BestStatic, BestStaticController
from agents.oracle import ORACLE_NAME, SEARCH_NAMES, OracleConfig
from agents.parallel import JobRunner
from agents.registry import (
    HINDSIGHT,
    EvalSpec,
    best_static,
    capacity_search,
    hindsight_search,
    hindsight_static,
    make_controller,
)
from agents.scorecard import REFERENCE, TARGET, scorecard
from agents.windows import DRAIN_LIMIT_S, eval_window
from env.replay import replay
from env.traces.resolve import resolve_trace, trace_label
from env.traces.trace import Trace
from runtime.decider.controller import Controller
from runtime.engine.engine import EngineConfig
from runtime.engine.metrics import burst_onsets, recovery_times
from runtime.engine.profile import Profile
from runtime.engine.request import RejectReason
from runtime.knobs import DEFAULT_KNOBS, KNOB_NAMES, NUM_KNOBS
from runtime.session import DEFAULT_INTERVAL_S, IntervalRecord

TIMELINE_KEYS = ("t", *KNOB_NAMES, "waiting", "running", "slo_attainment", "arrival_rate",
                 "kv_utilization", "batch_backlog_tokens")
"""what an episode's timeline holds per interval (the knobs are those decided at its end)"""

FRONTIER_RATIOS: tuple[float, ...] = tuple(GRID[RATIO_KNOB])
"""the KV ratios of the static frontier by default: those of best static's grid (0.5 to 0.95),
whose picks its own search already holds, so the default frontier adds replays, not searches"""
PAST_CAPACITY_MULTIPLES: tuple[float, ...] = (2.0, 4.0)
"""loads past capacity, as multiples of best static's capacity at 99% attainment (the "no
collapse" loads: shedding late requests should keep goodput there near goodput at capacity)"""
LOAD_NEIGHBOURS: tuple[float, ...] = (0.98, 0.99, 1.01, 1.02)
"""multiples of each load past best static's capacity at which every controller but the
lookahead searches replays again (rows with ``"neighbour_of"``), so that the never-worse figure
there is judged on the mean of the load and its neighbours (:func:`agents.scorecard.worst_margin`):
past capacity one replay's attainment moves by up to a point when the load moves by half a
percent (conversation's held-out split at 4x capacity), more than most margins between
controllers, while capacity itself is measured only to 2%"""
SCORECARD_LOADS: tuple[float, ...] = (1.0, 0.5)
"""the scorecard's loads (co-tenant memory, batch goodput), as multiples of best static's
capacity at 99% attainment"""


def is_upper_bound(controller: str) -> bool:
    """Whether a controller's figures are an upper bound (it sees the future), not a baseline."""
    return controller == ORACLE_NAME


@dataclass
class EpisodeResult:
    summary: dict
    """the run's summary (:meth:`runtime.session.RunResult.as_dict`)"""
    decisions: int
    """intervals decided"""
    sources: dict[str, int]
    """decisions by who made them"""
    mean_knobs: tuple[float, ...] = ()
    """the decided knobs, averaged over the decisions (in the order of KNOB_NAMES; empty when
    not tallied)"""
    mean_batch_backlog_tokens: float = 0.0
    """tokens batch work still had to compute at an interval's end, averaged over the
    intervals"""
    timeline: dict[str, list[float]] = field(default_factory=dict)
    """per interval, when recorded (see :data:`TIMELINE_KEYS`)"""
    reasons: dict[str, int] = field(default_factory=dict)
    """decisions not made by the policy, by the guarded decider's reason (out of distribution,
    circuit open, ...); empty for a controller that never falls back"""

    @property
    def mean_kv_gib(self) -> float:
        """KV memory reserved, averaged over the run's time (the engine's integral)."""
        return self.summary["mean_kv_gib"]


class _Tally:
    """Folds interval records into the means (and the timeline) as they come."""

    def __init__(self, record: bool) -> None:
        self.knob_sum = np.zeros(NUM_KNOBS)
        self.backlog_sum = 0.0
        self.n = 0
        self.reasons: dict[str, int] = {}
        self.timeline: dict[str, list[float]] = {k: [] for k in TIMELINE_KEYS} if record else {}

    def __call__(self, rec: IntervalRecord) -> None:
        s, knobs = rec.stats, rec.knobs.as_tuple()
        self.knob_sum += knobs
        self.backlog_sum += s.batch_backlog_tokens
        self.n += 1
        if rec.reason is not None:
            self.reasons[rec.reason] = self.reasons.get(rec.reason, 0) + 1
        if self.timeline:
            for k, v in zip(TIMELINE_KEYS, (s.end_s, *knobs, s.waiting, s.running,
                                            s.slo_attainment, s.arrival_rate, s.kv_utilization,
                                            s.batch_backlog_tokens)):
                self.timeline[k].append(float(v))


def run_episode(window: Trace, controller: Controller, *, interval_s: float,
                profile: Profile, config: EngineConfig | None = None,
                record: bool = False, tally: bool = True) -> EpisodeResult:
    """Replay ``window`` with ``controller`` deciding every interval, until it has drained. A
    controller of a fixed setting (one with ``start``: best static's, hindsight static's) has
    the engine start with its knobs and admission policy, and without a tally runs straight
    through.

    :param record: keep the per-interval timeline
    :param tally: average the knobs and the batch backlog (False lets a static controller's
        replay run straight through; only the summary is then filled in)
    """
    controller.reset()
    end_s = float(window.arrival_s[-1]) if len(window) else 0.0
    t = _Tally(record) if tally or record else None
    knobs = DEFAULT_KNOBS
    decider: Controller | None = controller
    start = getattr(controller, "start", None)
    if start is not None:  # a fixed setting: the engine starts with it
        knobs, config = start(config if config is not None else EngineConfig())
        if t is None:
            decider = None  # nothing to record: straight through
    res = replay(window, knobs, decider=decider, profile=profile, config=config,
                 interval_s=interval_s, max_s=end_s + DRAIN_LIMIT_S, on_interval=t)
    if t is None:
        return EpisodeResult(res.as_dict(), res.decisions, res.sources)
    n = max(t.n, 1)
    return EpisodeResult(res.as_dict(), res.decisions, res.sources,
                         tuple(float(k) for k in t.knob_sum / n), t.backlog_sum / n, t.timeline,
                         t.reasons)


def summary_at(spec: EvalSpec, controller: Controller, scale: float) -> dict:
    """The run summary of ``controller`` on the spec's window at ``scale`` (no timeline)."""
    return run_episode(eval_window(spec, scale), controller, interval_s=spec.interval_s,
                       profile=Profile.load(spec.profile_path), config=spec.config,
                       tally=False).summary


def attainment_at(spec: EvalSpec, controller: Controller, scale: float) -> float:
    """SLO attainment of ``controller`` on the spec's window at ``scale`` (no timeline)."""
    return summary_at(spec, controller, scale)["slo_attainment"]


def _figures(s: dict, config: EngineConfig) -> dict:
    """The figures a row and a frontier point share, from a run summary."""
    return {"slo_attainment": s["slo_attainment"],
            "interactive_attainment": s["interactive_attainment"],
            "goodput_rps": s["goodput_rps"], "batch_goodput_tps": s["batch_goodput_tps"],
            "mean_kv_gib": s["mean_kv_gib"],
            "cotenant_served_share": (s["cotenant_served_share"] if config.cotenant is not None
                                      else None)}


def _row_job(args: tuple) -> dict:
    spec, name, scale, record = args
    if name == ORACLE_NAME:
        from agents.oracle_bound import bound_row

        return bound_row(spec, scale, record, controller_row)
    return controller_row(spec, name, make_controller(name, spec), scale, record)


def controller_row(spec: EvalSpec, name: str, controller: Controller, scale: float,
                   record: bool) -> dict:
    """The arena's row of ``controller`` (named ``name``) on the spec's window at ``scale``
    (with its timeline when ``record``)."""
    profile = Profile.load(spec.profile_path)
    t0 = time.perf_counter()
    window = eval_window(spec, scale)
    ep = run_episode(window, controller, interval_s=spec.interval_s,
                     profile=profile, config=spec.config, record=True)
    s = ep.summary
    row = {"controller": name, "upper_bound": is_upper_bound(name),
           "trace": trace_label(spec.trace), "rate_scale": scale, **_figures(s, spec.config),
           "ttft_p99_s": s["ttft_p99_s"], "tpot_p99_s": s["tpot_p99_s"],
           "preemptions": s["preemptions"], "ooms": s["ooms"], "requests": s["requests"],
           "rejected": s["rejected"], "batch_requests": s["batch_requests"],
           "batch_met": s["batch_met"], "batch_backlog_requests": s["batch_unfinished"],
           "batch_backlog_tokens_mean": ep.mean_batch_backlog_tokens,
           "shed": s["rejected_by_reason"].get(RejectReason.SHED.value, 0),
           "expired": s["rejected_by_reason"].get(RejectReason.EXPIRED.value, 0),
           "late": s["late"], "sim_s": s["sim_seconds"],
           "arrival_span_s": float(window.arrival_s[-1]) if len(window) else 0.0,
           **{f"mean_{k}": v for k, v in zip(KNOB_NAMES, ep.mean_knobs)},
           "decision_sources": ep.sources, "fallback_reasons": ep.reasons,
           "lend_guard_hits": getattr(controller, "lend_guard_hits", None),
           "wall_s": time.perf_counter() - t0}
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
                  known: dict[float, float], *, tolerance: float = TOLERANCE,
                  lowest: float = LOWEST, highest: float = HIGHEST, start: float = 1.0) -> float:
    """The largest rate scale with attainment >= ``target``: the fixed-grid walk of
    :mod:`agents.bisection` (``start`` doubled or halved until the target is bracketed, then
    geometric midpoints until the bracket is within ``tolerance``). Returns 0 when even
    ``lowest`` misses, ``highest`` when it never misses.

    ``known`` (scales already measured, which also gets the new ones) only saves a probe that
    lands on a scale it holds; it never moves the bracket. So the answer depends on the
    controller and the trace alone, not on the loads a run happened to measure first: attainment
    is not monotone in the load at this resolution, and a bracket taken from those loads found
    another crossing in another run."""
    return walk(attainment, target, known, tolerance=tolerance, lowest=lowest, highest=highest,
                start=start)


def _capacity_job(args: tuple) -> dict:
    """A controller's capacity at 99% (and 90%) interactive attainment. Interactive, as every
    figure judged at these loads reads attainment: on the mixed workload the batch requests all
    meet their hour, so an all-class capacity put best static under 99% interactive at its own
    capacity. On traces without batch work the two are the same."""
    spec, name, known = args  # known: {scale: (interactive attainment, goodput_rps)} measured
    if name == ORACLE_NAME:
        from agents.oracle_bound import bound_capacity

        return bound_capacity(spec, known, summary_at)
    attainment = {scale: k[0] for scale, k in known.items()}
    goodput = {scale: k[1] for scale, k in known.items()}
    out = {"controller": name, "upper_bound": is_upper_bound(name),
           "trace": trace_label(spec.trace)}
    if name in (REFERENCE, HINDSIGHT):
        # each figure with the setting tuned for it: best static on the train split, hindsight
        # static on this window (its search already walked it here: the same walk, the same
        # answer)
        for target, key in ((TARGET, "capacity_99"), (0.90, "capacity_90")):
            if name == HINDSIGHT:
                found = hindsight_search(spec, target)["best"]
                setting, out[key] = found["setting"], found["capacity"]
            else:
                setting = best_static(spec, target=target)
                c = BestStaticController(setting.knobs, setting.admission, name=name)
                own = attainment if target == TARGET else {}  # the rows hold the 99% setting
                out[key] = find_capacity(functools.partial(_interactive_at, spec, c), target,
                                         own)
            out[f"setting_{key[-2:]}"] = {"knobs": setting.knobs.as_dict(),
                                          "admission": setting.admission}
        cap99 = out["capacity_99"]
        if cap99 not in goodput and cap99 > 0:
            goodput[cap99] = summary_at(spec, make_controller(name, spec), cap99)["goodput_rps"]
        return {**out, "goodput_at_capacity_99_rps": goodput.get(cap99),
                "evaluations": len(attainment)}
    controller = make_controller(name, spec)

    def measure(scale: float) -> float:
        s = summary_at(spec, controller, scale)
        goodput[scale] = s["goodput_rps"]
        return s["interactive_attainment"]

    cap99 = find_capacity(measure, TARGET, attainment)
    cap90 = find_capacity(measure, 0.90, attainment)
    return {**out, "capacity_99": cap99, "capacity_90": cap90,
            "goodput_at_capacity_99_rps": goodput.get(cap99), "evaluations": len(attainment)}


def _frontier_job(args: tuple) -> dict:
    spec, ratio, best, scale = args
    s = summary_at(spec, BestStaticController(best.knobs, best.admission), scale)
    return {"trace": trace_label(spec.trace), "rate_scale": scale, RATIO_KNOB: ratio,
            "knobs": best.knobs.as_dict(), "admission": best.admission,
            **_figures(s, spec.config)}


def _loads_past(rows: Sequence[dict], trace: str, controller: str,
                capacity: float) -> list[float]:
    """The distinct rate scales above ``capacity`` that ``controller`` ran at on ``trace``
    (neighbouring loads excluded), in order."""
    return sorted({r["rate_scale"] for r in rows if r["trace"] == trace
                   and r["controller"] == controller and r["rate_scale"] > capacity
                   and "neighbour_of" not in r})


def _known(rows: Sequence[dict], trace: str, controller: str) -> dict[float, tuple]:
    """(interactive attainment, goodput) by rate scale of a controller's rows on a trace, and
    for the oracle's rows the search's own interactive attainment third."""
    return {r["rate_scale"]: (r["interactive_attainment"], r["goodput_rps"])
            + ((r["search"]["interactive_attainment"],) if "search" in r else ())
            for r in rows if r["trace"] == trace and r["controller"] == controller}


def past_capacity_table(rows: Sequence[dict], capacity: Sequence[dict]) -> list[dict]:
    """Per trace and controller: goodput at each multiple of best static's capacity (the rows
    flagged ``past_capacity_multiple``) as a share of the controller's goodput at its own
    capacity at 99%."""
    caps = {(c["trace"], c["controller"]): c for c in capacity}
    out = []
    for (trace, name), cap in caps.items():
        past = sorted((r for r in rows if r["trace"] == trace and r["controller"] == name
                       and "past_capacity_multiple" in r),
                      key=lambda r: r["past_capacity_multiple"])
        if not past:
            continue
        base = cap["goodput_at_capacity_99_rps"]
        out.append({
            "trace": trace, "controller": name, "upper_bound": is_upper_bound(name),
            "reference": REFERENCE, "reference_capacity_99": caps[trace, REFERENCE]["capacity_99"],
            "capacity_99": cap["capacity_99"], "goodput_at_capacity_99_rps": base,
            "points": [{"multiple": r["past_capacity_multiple"], "rate_scale": r["rate_scale"],
                        "goodput_rps": r["goodput_rps"],
                        "goodput_share": r["goodput_rps"] / base if base else None,
                        "slo_attainment": r["slo_attainment"],
                        "interactive_attainment": r["interactive_attainment"],
                        "batch_goodput_tps": r["batch_goodput_tps"],
                        "shed": r["shed"]} for r in past]})
    return out


def deployment(config: EngineConfig) -> dict:
    """The engine's deployment settings an arena run measures under (admission, co-tenant)."""
    return {"admission": config.admission, "admission_slack": config.admission_slack,
            "batch_share": config.batch_share,
            "cotenant": config.cotenant.source if config.cotenant is not None else None}


def static_default(config: EngineConfig) -> EngineConfig:
    """``config`` as the static default runs: first come first served, the default batch share
    and admission slack (classes ignored); the SLO classes, limits and co-tenant kept."""
    return dataclasses.replace(config, admission=EngineConfig.admission,
                               batch_share=EngineConfig.batch_share,
                               admission_slack=EngineConfig.admission_slack)


def _interactive_at(spec: EvalSpec, controller: Controller, scale: float) -> float:
    return summary_at(spec, controller, scale)["interactive_attainment"]


def fixed_settings(spec: EvalSpec, controllers: set[str], *, capacity: bool = True,
                   **options) -> dict:
    """Best static's searches on the train split and hindsight static's on the evaluated one
    (capacity at 99%, and at 90% when ``capacity`` is measured), run or read from their caches
    here, before the arena fans out, for the controllers that need them; what each found (best,
    top settings, how many were measured and how many proven below)."""
    from agents.controllers.capacity_search import TARGETS

    needs_best = bool({REFERENCE, HINDSIGHT, *SEARCH_NAMES} & controllers)
    needs_hindsight = bool({HINDSIGHT, ORACLE_NAME} & controllers)
    out: dict[str, dict] = {}
    targets = TARGETS if capacity or ORACLE_NAME in controllers else TARGETS[:1]
    for target in targets if needs_best else ():
        tag = f"{target * 100:.0f}"
        best = capacity_search(spec, "train", target, **options)
        out[f"best_static_{tag}"] = search_summary(best)
        if needs_hindsight:
            out[f"hindsight_{tag}"] = search_summary(
                best if spec.part == "train" else
                capacity_search(spec, spec.part, target, (best["best"]["setting"],), **options))
    return out


def search_summary(found: dict) -> dict:
    """A capacity search's result for the arena's JSON: its best and top settings, and how
    many candidates it measured and proved below them."""
    def entry(e: dict) -> dict:
        s = e["setting"]
        return {"knobs": s.knobs.as_dict(), "admission": s.admission,
                "capacity": e["capacity"], "below": e["below"],
                "attainment_at_capacity": e["attainment_at_capacity"]}

    table = found["table"]
    below = [e["below"] for e in table if e["capacity"] is None]
    return {"split": found["split"], "target": found["target"], "best": entry(found["best"]),
            "top": [entry(e) for e in found["top"]], "candidates": len(table),
            "measured": len(table) - len(below), "proven_below": len(below),
            "highest_bound_of_the_rest": max(below) if below else None,
            "probes": found["probes"], "tie_rule": found["tie_rule"]}


def hindsight_grid(spec: EvalSpec) -> list[BestStatic]:
    """The knob grid under hindsight static's levers (capacity at 99%): the settings whose
    points make the hindsight frontier."""
    from agents.controllers.capacity_search import knob_grid

    return knob_grid(hindsight_static(spec), spec.static_grid or GRID)


def _hindsight_point_job(args: tuple) -> dict:
    spec, setting, scale = args
    s = summary_at(spec, BestStaticController(setting.knobs, setting.admission), scale)
    return {"trace": trace_label(spec.trace), "rate_scale": scale,
            "knobs": setting.knobs.as_dict(), "admission": setting.admission,
            **_figures(s, spec.config)}


def evaluate(traces: Sequence[str], controllers: Sequence[str], scales: Sequence[float], *,
             part: str = "eval", interval_s: float = DEFAULT_INTERVAL_S,
             profile_path: str | None = None, config: EngineConfig | None = None,
             capacity: bool = True, workers: int = 2, ray: bool | None = None,
             progress: bool = True, match_static: float | None = None,
             tuning_scales: tuple[float, ...] | None = None,
             past_capacity: Sequence[float] = (),
             frontier_ratios: Sequence[float] = (), scorecard_loads: Sequence[float] = (),
             scorecard_rate_scales: Sequence[float] = (),
             oracle: OracleConfig | None = None,
             capacity_controllers: Sequence[str] | None = None,
             neighbours: Sequence[float] = (), static_grid: dict[str, tuple] | None = None,
             hindsight_frontier: bool = True) -> dict:
    """Run the arena; returns ``{"rows", "capacity", "static_match", "past_capacity",
    "frontier", "scorecard", "deployment", ...}``.

    Rows, capacity bisections and the frontier's replays run in parallel through
    :class:`agents.parallel.JobRunner`: ``workers`` local processes, or Ray with ``ray=True``
    (``None``: when ``RAY_ADDRESS`` is set).

    :param match_static: also find, per trace, the rate scale at which the static default (its
        knobs under first come first served, classes ignored: :func:`static_default`) attains
        this share of interactive requests (bisection to 2%), and run every controller there;
        those rows carry ``"matched_static": True``
    :param past_capacity: multiples of best static's capacity at 99% to run every controller at
        (rows with ``"past_capacity_multiple"``); needs ``capacity`` and best static among
        ``controllers``, and is skipped otherwise (the command's default:
        :data:`PAST_CAPACITY_MULTIPLES`; empty here, so training's final evaluation and the
        benchmarks run what they ran)
    :param frontier_ratios: the KV ratios of the static frontier, best static's setting at each
        (:func:`agents.registry.best_static`) measured at each of ``scales`` and of the
        scorecard loads (the command's default: :data:`FRONTIER_RATIOS`; empty here: none)
    :param scorecard_loads: the scorecard's loads (:mod:`agents.scorecard`), multiples of best
        static's capacity at 99% (needs it, as ``past_capacity`` does; the command's default:
        :data:`SCORECARD_LOADS`; empty here); every controller runs there unless a row at that
        rate scale exists already (rows with ``"scorecard_load_multiple"``)
    :param scorecard_rate_scales: the scorecard loads as rate scales instead (the same on every
        trace)
    :param oracle: how the oracle searches (None: :class:`agents.oracle.OracleConfig`'s
        defaults)
    :param capacity_controllers: the controllers whose capacity is searched (None: all of
        them); the others' capacity figures are not measured
    :param neighbours: multiples of each rate scale of the run above best static's capacity at
        99% (every load past it: the arena's, the match's, past capacity's) that every
        controller but the lookahead searches runs at too (rows with ``"neighbour_of"``: the
        load's rate scale); needs the capacity search and best static, as ``past_capacity``
        does (the command's default: :data:`LOAD_NEIGHBOURS`; empty here)
    :param static_grid: the knob grid of best static's and hindsight static's capacity searches
        (None: :data:`agents.controllers.best_static.GRID`)
    :param hindsight_frontier: with hindsight static among ``controllers``, replay that grid at
        the scorecard loads on the evaluated window (the hindsight frontier of memory against
        attainment, the memory target's reference)
    """
    config = config or EngineConfig()
    oracle = oracle or OracleConfig()
    specs = {t: EvalSpec(t, part, profile_path, interval_s, config, tuning_scales=tuning_scales,
                         oracle=oracle, static_grid=static_grid) for t in traces}
    # resolve names and fill the searches' caches before fanning out (a search has its pool)
    picks: dict[str, dict[float, BestStatic]] = {}
    fixed: dict[str, dict] = {}
    wanted = set(controllers)
    for t in traces:
        resolve_trace(t)
        fixed[trace_label(t)] = fixed_settings(specs[t], wanted, capacity=capacity,
                                               workers=workers, ray=ray, progress=progress)
        picks[t] = {r: best_static(specs[t], r) for r in frontier_ratios}
    jobs = [(specs[t], c, s, True) for t in traces for c in controllers for s in scales]
    t0 = time.perf_counter()
    rows: list[dict] = []
    matched: list[dict] = []
    cap: list[dict] = []
    frontier: list[dict] = []
    loads: list[dict] = []
    with JobRunner(workers, ray=ray, progress=progress) as pool:
        rows.extend(pool.map(_row_job, jobs, desc="runs"))
        if match_static is not None:
            default = static_default(config)
            for t in traces:
                mspec = dataclasses.replace(specs[t], config=default)
                own = deployment(default) == deployment(config)  # the static rows ran as it
                known = {r["rate_scale"]: r["interactive_attainment"] for r in rows
                         if own and r["trace"] == trace_label(t) and r["controller"] == "static"}
                static = make_controller("static", mspec)
                scale = find_capacity(functools.partial(_interactive_at, mspec, static),
                                      match_static, known)
                matched.append({"trace": trace_label(t), "target": match_static,
                                "attainment": "interactive", "static_deployment":
                                deployment(default), "rate_scale": scale,
                                "static_attainment": known.get(scale)})
            mjobs = [(specs[t], c, m["rate_scale"], False) for t, m in zip(traces, matched)
                     for c in controllers]
            for row in pool.map(_row_job, mjobs, desc="runs at the static match"):
                row["matched_static"] = True
                rows.append(row)
        if capacity:
            searched = controllers if capacity_controllers is None else [
                c for c in controllers if c in capacity_controllers]
            cjobs = [(specs[t], c, _known(rows, trace_label(t), c))
                     for t in traces for c in searched]
            # the capacity jobs take longest for the best controllers: start them first
            cjobs.sort(key=lambda j: -sum(k[0] for k in j[2].values()))
            cap.extend(pool.map(_capacity_job, cjobs, desc="capacities"))
        ref = {c["trace"]: c["capacity_99"] for c in cap if c["controller"] == REFERENCE}
        if past_capacity and ref:
            past = [(m, (specs[t], c, m * ref[trace_label(t)], False)) for t in traces
                    if ref.get(trace_label(t), 0) > 0 for m in past_capacity for c in controllers]
            done = pool.map(_row_job, [job for _, job in past], desc="runs past capacity")
            for (m, _), row in zip(past, done):
                row["past_capacity_multiple"] = m
                rows.append(row)
        if scorecard_rate_scales:
            loads = [{"trace": trace_label(t), "rate_scale": s, "multiple": None}
                     for t in traces for s in scorecard_rate_scales]
        elif scorecard_loads:
            loads = [{"trace": trace_label(t), "rate_scale": m * ref[trace_label(t)],
                      "multiple": m} for t in traces if ref.get(trace_label(t), 0) > 0
                     for m in scorecard_loads]
        have = {(r["trace"], r["controller"], r["rate_scale"]) for r in rows}
        fl = [(ld, (specs[t], c, ld["rate_scale"], False)) for t in traces for ld in loads
              if ld["trace"] == trace_label(t) for c in controllers
              if (ld["trace"], c, ld["rate_scale"]) not in have]
        for (ld, _), row in zip(fl, pool.map(_row_job, [job for _, job in fl],
                                             desc="runs at the scorecard loads")):
            row["scorecard_load_multiple"] = ld["multiple"]
            rows.append(row)
        if neighbours and ref:
            nb = [(s, (specs[t], c, s * k, False)) for t in traces
                  if ref.get(trace_label(t), 0) > 0 for c in controllers if c not in SEARCH_NAMES
                  for s in _loads_past(rows, trace_label(t), c, ref[trace_label(t)])
                  for k in neighbours]
            for (s, _), row in zip(nb, pool.map(_row_job, [job for _, job in nb],
                                                desc="runs at neighbouring loads")):
                row["neighbour_of"] = s
                rows.append(row)
        fjobs = [(specs[t], r, best, s) for t in traces for r, best in picks[t].items()
                 for s in dict.fromkeys([*scales, *(ld["rate_scale"] for ld in loads
                                                    if ld["trace"] == trace_label(t))])]
        frontier.extend(pool.map(_frontier_job, fjobs, desc="static frontier"))
        hindsight_points: list[dict] = []
        if hindsight_frontier and HINDSIGHT in wanted:
            hjobs = [(specs[t], s, ld["rate_scale"]) for t in traces
                     for s in hindsight_grid(specs[t]) for ld in loads
                     if ld["trace"] == trace_label(t)]
            hindsight_points = pool.map(_hindsight_point_job, hjobs,
                                        desc="hindsight frontier")
    card = scorecard(rows, cap, matched, frontier, loads, cotenant=config.cotenant is not None,
                     hindsight=hindsight_points)
    return {"rows": rows, "capacity": cap, "static_match": matched,
            "past_capacity": past_capacity_table(rows, cap), "frontier": frontier,
            "fixed_settings": fixed, "hindsight_frontier": hindsight_points,
            "scorecard": card, "deployment": deployment(config),
            "oracle": (dataclasses.asdict(oracle)
                       if set(SEARCH_NAMES) & set(controllers) else None),
            "split": part, "interval_s": interval_s,
            "profile": Profile.load(profile_path).name, "wall_s": time.perf_counter() - t0}
