"""The scorecard: every controller beside best static and the lookahead oracle (an upper bound),
judged against the project's targets, from an arena run's own rows.

A target is a figure an operator would act on, a bar it must clear, and why the bar stands where
it does (:data:`TARGETS`; docs/scorecard.md renders them). Nothing here replays anything: a target
whose inputs the run did not measure (no co-tenant, no capacity search, no oracle, no static
match, no batch work on the trace) is reported as not measured, never filled in. Per trace, at
the scorecard loads (multiples of best static's capacity at 99%, or explicit rate scales;
:func:`agents.arena.evaluate`'s ``scorecard_loads``):

- ``cotenant_memory``: each controller's (interactive attainment, mean KV GiB); it passes when
  its attainment is within :data:`MEMORY_ATTAINMENT_SLACK` of best static's and its mean KV is
  at most :data:`MEMORY_RATIO_BAR` of best static's. Whether its point lies above the static
  frontier is said too: the frontier's attainment at the controller's KV, the best of the
  frontier points holding at most that much (a running maximum), interpolated linearly
  (:func:`frontier_attainment`). Where that share of best static's KV is under what the KV
  ratio's floor holds, the group says that no controller can pass (:func:`unreachable_memory`).
- ``oracle_share_*``: for memory (at each load), capacity at 99% and batch goodput (at each
  load), where the oracle beats best static by at least :data:`ORACLE_GAIN_BAR`, the share of
  that gain a controller takes (bar :data:`ORACLE_SHARE_BAR`); under the bar there is no bar.
  The oracle's memory saving counts only where its attainment is within the same slack.
- ``batch_goodput``: on a trace with batch work, batch tokens finished by their deadline per
  second of the window's arrivals (the engine's own figure divides by the time the run took to
  drain, which moves with the batch work a controller leaves for the end), counted where the
  controller holds :data:`TARGET` interactive attainment; bar :data:`BATCH_GOODPUT_BAR` times
  best static's. Where every controller finishes every batch request the figure cannot separate
  them, and where best static finishes every one while holding the target no controller can
  reach the bar (nobody finishes more batch work than arrived); the group says so.
- ``capacity_99``: capacity at 99% attainment at least best static's on the same trace.
- ``regret_99``, ``regret_90``: capacity at 99% and at 90% against hindsight static's, the best
  fixed setting on the evaluated window itself (each searched for its own figure): regret
  ``1 - capacity / hindsight's``, and the gain over best static beside it; it passes when the
  regret is at most one bisection step (the capacity within :data:`agents.bisection.TOLERANCE`
  of hindsight static's).
- ``hindsight_memory``: at the scorecard loads, against the hindsight frontier (every setting
  of the knob grid replayed on the evaluated window there): the fixed setting holding the least
  KV among those within :data:`MEMORY_ATTAINMENT_SLACK` of the best attainment any setting
  reaches; a controller passes when its attainment is within the slack of that best and its
  mean KV at most :data:`MEMORY_RATIO_BAR` of that setting's.
- ``headline``: at the static default's match load (``--match-static``: the default knobs and
  deployment, classes ignored), interactive attainment at least :data:`HEADLINE_INTERACTIVE`
  and batch deadline attainment (batch requests met / batch requests) at least
  :data:`HEADLINE_BATCH`.
- ``never_worse``: the worst margin of SLO attainment, in points, against each of
  :data:`NEVER_WORSE_THAN` over every rate scale both ran at (the arena's loads, the match,
  past capacity, the scorecard loads); it passes at 0 or more. At a load past best static's
  capacity that the arena also ran at neighbouring loads, the margin is the mean over the load
  and its neighbours (:func:`worst_margin`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from agents.bisection import TOLERANCE
from agents.controllers.best_static import RATIO_KNOB
from agents.oracle import ORACLE_NAME
from runtime.knobs import KNOB_NAMES, KNOB_SPECS

REFERENCE = "best-static"
"""the controller every figure is judged against; its capacity sets the loads past capacity and
the scorecard loads"""
HINDSIGHT = "hindsight-static"
"""the best fixed setting in hindsight (searched on the evaluated window: not deployable), the
regret targets' reference"""
TARGET = 0.99
"""the attainment capacity is measured at, and the interactive attainment a batch goodput is
counted at"""
NEVER_WORSE_THAN = ("pid", "aimd", "heuristic")
"""the baselines a controller must never fall below at any load"""
ORACLE_GAIN_BAR = 0.10
"""the oracle's least gain over best static on a figure for the share of it to be judged"""
ORACLE_SHARE_BAR = 0.70
"""the least share of the oracle's gain a controller must take"""
MEMORY_ATTAINMENT_SLACK = 0.005
"""interactive attainment may be this much below best static's (0.5 point) for memory to count"""
MEMORY_RATIO_BAR = 0.70
"""mean KV memory at most this share of best static's"""
BATCH_GOODPUT_BAR = 1.3
"""batch goodput at least this multiple of best static's"""
HEADLINE_INTERACTIVE = 0.999
"""the headline's interactive attainment at the static default's match load"""
HEADLINE_BATCH = 0.99
"""the headline's share of batch requests finished by their deadline"""


@dataclass(frozen=True)
class Target:
    """One of the project's targets: what it reads, the bar, and why the bar stands there."""

    title: str
    """what the figure reads, as the scorecard's table names it"""
    bar: str
    """the bar a controller must clear, in words"""
    why: str
    """why the target is set where it is"""


_SHARE_BAR = f">= {ORACLE_SHARE_BAR:.0%} where the oracle gains >= {ORACLE_GAIN_BAR:.0%}"
_SHARE_WHY = (
    "The lookahead oracle bounds what run-time control can add to best static. Where it adds "
    f"under {ORACLE_GAIN_BAR:.0%}, a tuned fixed setting already holds nearly all there is, so "
    "no share is judged; where it adds more, a controller worth deploying takes most of it, "
    f"{ORACLE_SHARE_BAR:.0%} or more, without the oracle's knowledge of the arrivals to come.")

TARGETS: dict[str, Target] = {
    "cotenant_memory": Target(
        "co-tenant memory: mean KV GiB at interactive attainment",
        f"attainment >= best static's - {MEMORY_ATTAINMENT_SLACK * 100:g} pt and KV <= "
        f"{MEMORY_RATIO_BAR:g}x best static's",
        "Memory the KV cache does not hold serves a co-located model or job. Lending is worth "
        f"it when it frees a share a co-tenant can use: {1 - MEMORY_RATIO_BAR:.0%} of best "
        "static's pool is about 8 GiB on the default profile (26 GiB at ratio 0.95), more than "
        "the default co-tenant's mean demand of 6 GiB. Half a point of attainment is what a "
        "few requests decide near 99% (attainment there is not monotone in the load), so a "
        "controller within it has kept best static's service."),
    "oracle_share_memory": Target("share of the oracle's gain: memory", _SHARE_BAR, _SHARE_WHY),
    "oracle_share_capacity_99": Target("share of the oracle's gain: capacity @99%", _SHARE_BAR,
                                       _SHARE_WHY),
    "oracle_share_batch_goodput": Target("share of the oracle's gain: batch goodput",
                                         _SHARE_BAR, _SHARE_WHY),
    "batch_goodput": Target(
        "batch goodput at >= 99% interactive",
        f">= {BATCH_GOODPUT_BAR:g}x best static's",
        "Serving batch work beside interactive traffic pays when the controller fits markedly "
        f"more of it into the room interactive work leaves: {BATCH_GOODPUT_BAR:g}x a tuned "
        f"fixed batch share, counted only where interactive attainment still holds {TARGET:.0%}. "
        "Where best static already finishes every batch request, no controller can reach it "
        "(nobody finishes more work than arrived), and the scorecard says so."),
    "regret_99": Target(
        "capacity @99% against hindsight static",
        f"regret <= 0 (within one bisection step, {TOLERANCE:.0%}, of hindsight static's)",
        "Hindsight static is the best any fixed setting could have done on this very window: "
        "its capacity is searched on the window the figure is judged on, which no deployment "
        "can do. A run-time controller exists to close the gap between the setting an operator "
        "could tune (best static) and that one, from live observations and without hindsight; "
        "regret at most zero means it lost nothing to the best fixed choice."),
    "regret_90": Target(
        "capacity @90% against hindsight static",
        f"regret <= 0 (within one bisection step, {TOLERANCE:.0%}, of hindsight static's)",
        "The same at 90% attainment, where the engine is further past its knee and the best "
        "fixed setting is often another one (each figure has its own hindsight static)."),
    "hindsight_memory": Target(
        "co-tenant memory against the hindsight frontier",
        f"attainment >= the best fixed setting's - {MEMORY_ATTAINMENT_SLACK * 100:g} pt and KV "
        f"<= {MEMORY_RATIO_BAR:g}x the least any fixed setting holds within that",
        "The memory target judged against every fixed setting on the evaluated window rather "
        "than against one tuned on the train split: the least KV a fixed setting needs to stay "
        f"within {MEMORY_ATTAINMENT_SLACK * 100:g} point of the best fixed attainment there. "
        "Lending beats a fixed setting only if it frees memory that no fixed choice could have "
        "freed at that service."),
    "capacity_99": Target(
        "capacity @99%", ">= best static's",
        "Capacity at 99% attainment is the load an operator provisions for. A controller's worth "
        "is beating the fixed setting it could have been: best static, tuned on the same trace's "
        "train split."),
    "headline": Target(
        "headline at the static default's match",
        f"interactive >= {HEADLINE_INTERACTIVE:.1%}, batch on time >= {HEADLINE_BATCH:.0%}",
        "At the load where engines' start-up values (the static default, first come first "
        "served) attain 68% of interactive requests, a fixed configuration has visibly failed "
        f"while the accelerator is not yet past capacity. {HEADLINE_INTERACTIVE:.1%} is a "
        f"production SLO's three nines; {HEADLINE_BATCH:.0%} of batch requests by their deadline "
        "keeps the batch class's promise."),
    "never_worse": Target(
        "worst margin against PID, AIMD, heuristic", ">= 0 pt at every load",
        "An operator can always deploy a simple controller instead, and the decider falls back "
        "to the PID: a policy that loses to one of them anywhere is worse than its own fallback "
        "there. Past best static's capacity one replay's attainment moves by up to a point when "
        "the load moves by half a percent, so there the margin is the mean over the load and "
        "four neighbours."),
}
"""the project's targets, by the name the scorecard's JSON gives each (docs/scorecard.md)"""


def per_arrival_second(rate: float, sim_s: float, span_s: float) -> float:
    """A per-second figure of a run of ``sim_s`` seconds, per second of the window's arrivals
    (``span_s``: its last arrival), the same span for every controller at a load."""
    return rate * sim_s / span_s if span_s > 0 else 0.0


def batch_goodput(row: dict) -> float:
    """Batch tokens finished by their deadline per second of the window's arrivals."""
    return per_arrival_second(row["batch_goodput_tps"], row["sim_s"], row["arrival_span_s"])


def frontier_attainment(points: Sequence[tuple[float, float]], kv_gib: float) -> float | None:
    """The static frontier's interactive attainment at ``kv_gib``: the best attainment of the
    ``(mean KV GiB, attainment)`` points holding at most that much memory (a running maximum),
    interpolated linearly between them; None below the smallest pool."""
    best: dict[float, float] = {}
    for kv, att in points:
        best[kv] = max(att, best.get(kv, -math.inf))
    hull: list[tuple[float, float]] = []
    for kv in sorted(best):
        hull.append((kv, max(best[kv], hull[-1][1] if hull else -math.inf)))
    if not hull or kv_gib < hull[0][0]:
        return None
    for (x0, y0), (x1, y1) in zip(hull, hull[1:]):
        if kv_gib <= x1:
            return y0 + (y1 - y0) * (kv_gib - x0) / (x1 - x0)
    return hull[-1][1]


def _cell(value: float | None, text: str, ok: bool | None, why: str = "", **detail) -> dict:
    """A controller's entry in a figure: its value, how it reads, and the verdict (``pass`` or
    ``fail`` with the reason; otherwise ``why`` says what is missing: not measured, no bar)."""
    if ok is None:
        verdict = why
    else:
        verdict = ("pass" if ok else "fail") + (f": {why}" if why else "")
    return {"value": value, "text": text, "pass": ok, "verdict": verdict, **detail}


def _missing(why: str) -> dict:
    return _cell(None, "-", None, f"not measured: {why}")


def _gain(oracle: float, best: float, *, less: bool = False) -> float:
    return 1 - oracle / best if less else oracle / best - 1


class _Trace:
    """One trace's rows, capacities, match and frontier, looked up by controller and load."""

    def __init__(self, trace: str, rows: Sequence[dict], capacity: Sequence[dict],
                 static_match: Sequence[dict], frontier: Sequence[dict],
                 loads: Sequence[dict], hindsight: Sequence[dict] = ()) -> None:
        self.trace = trace
        self.rows = [r for r in rows if r["trace"] == trace]
        self.capacity = {c["controller"]: c for c in capacity if c["trace"] == trace}
        self.match = next((m for m in static_match if m["trace"] == trace), None)
        self.frontier = [f for f in frontier if f["trace"] == trace]
        self.loads = [ld for ld in loads if ld["trace"] == trace]
        self.controllers = list(dict.fromkeys(r["controller"] for r in self.rows))
        self.subjects = [c for c in self.controllers
                         if c not in (REFERENCE, ORACLE_NAME, HINDSIGHT)]
        self.hindsight = [h for h in hindsight if h["trace"] == trace]
        self.has_oracle = ORACLE_NAME in self.controllers
        self.has_batch = any(r["batch_requests"] > 0 for r in self.rows)

    def row(self, controller: str, scale: float) -> dict | None:
        """The controller's run at ``scale`` (any row: a load's flags do not change its run)."""
        return next((r for r in self.rows if r["controller"] == controller
                     and r["rate_scale"] == scale), None)

    def group(self, target: str, load: dict | None, best: dict | None, oracle: dict | None,
              cells: dict[str, dict], note: str | None = None,
              hindsight: dict | None = None) -> dict:
        return {"trace": self.trace, "target": target, "title": TARGETS[target].title,
                "bar": TARGETS[target].bar, "load": load_label(load) if load else None,
                "rate_scale": load["rate_scale"] if load else None,
                "best_static": best, "hindsight": hindsight,
                "oracle": oracle if self.has_oracle else _missing(f"no {ORACLE_NAME} run"),
                "controllers": cells, "note": note}


def load_label(load: dict) -> str:
    """``x0.585 (1x best-static cap.)``, or ``x0.585`` for an explicit rate scale."""
    text = f"x{load['rate_scale']:.3g}"
    if load.get("multiple") is not None:
        text += f" ({load['multiple']:g}x {REFERENCE} cap.)"
    return text


# ----------------------------------------------------------------------------- memory
def _memory_text(r: dict, best: dict | None) -> str:
    text = f"{r['mean_kv_gib']:.2f} GiB @ {r['interactive_attainment']:.2%}"
    if best is not None and best["mean_kv_gib"] > 0 and r is not best:
        text += f" ({r['mean_kv_gib'] / best['mean_kv_gib']:.2f}x)"
    return text


def _memory_cell(r: dict, best: dict, front: list[tuple[float, float]]) -> dict:
    kv, att = r["mean_kv_gib"], r["interactive_attainment"]
    if best["mean_kv_gib"] <= 0:
        return _missing(f"{REFERENCE} holds no KV memory")
    ratio = kv / best["mean_kv_gib"]
    gap = att - best["interactive_attainment"]
    at = frontier_attainment(front, kv)
    margin: float | None = None
    above: bool | None = None
    if at is not None:
        margin = (att - at) * 100
        above = margin > 0
    elif front and att >= min(front)[1]:
        # less memory than the frontier's smallest pool and at least its attainment
        margin, above = (att - min(front)[1]) * 100, True
    why = []
    if gap < -MEMORY_ATTAINMENT_SLACK:
        why.append(f"attainment {-gap * 100:.2f} pt below best static's")
    if ratio > MEMORY_RATIO_BAR:
        why.append(f"KV {ratio:.2f}x best static's")
    text = _memory_text(r, best)
    if above is not None:
        text += f", {'above' if above else 'not above'} the frontier ({margin:+.2f} pt)"
    elif front:
        text += ", below the frontier's smallest pool"
    return _cell(kv, text, not why, "; ".join(why), interactive_attainment=att,
                 mean_kv_gib=kv, kv_ratio=ratio, attainment_gap_pt=gap * 100,
                 frontier_attainment=at, frontier_margin_pt=margin, above_frontier=above)


def unreachable_memory(best: dict) -> str | None:
    """Why no controller can pass the memory bar against ``best`` (best static's row), if none
    can: its KV times :data:`MEMORY_RATIO_BAR` is below what the KV ratio's floor holds (the pool
    per unit of ratio read from its own row: mean KV over its mean ratio)."""
    ratio = best.get(f"mean_{RATIO_KNOB}")
    if not ratio:
        return None
    low = KNOB_SPECS[KNOB_NAMES.index(RATIO_KNOB)].low
    floor = low * best["mean_kv_gib"] / ratio
    bar = MEMORY_RATIO_BAR * best["mean_kv_gib"]
    if bar >= floor:
        return None
    return (f"{REFERENCE} holds KV ratio {ratio:.3g} ({best['mean_kv_gib']:.2f} GiB): "
            f"{MEMORY_RATIO_BAR:g}x its KV ({bar:.2f} GiB) is below the ratio's floor {low:g} "
            f"({floor:.2f} GiB), so no controller can pass")


def memory_figures(t: _Trace, cotenant: bool) -> list[dict]:
    if not cotenant:
        return []
    groups = []
    for load in t.loads:
        scale = load["rate_scale"]
        best, oracle = t.row(REFERENCE, scale), t.row(ORACLE_NAME, scale)
        front = [(f["mean_kv_gib"], f["interactive_attainment"]) for f in t.frontier
                 if f["rate_scale"] == scale]
        cells = {}
        for c in t.subjects:
            r = t.row(c, scale)
            cells[c] = (_missing("no run at this load") if r is None else
                        _missing(f"no {REFERENCE} run at this load") if best is None else
                        _memory_cell(r, best, front))
        notes = [] if front else ["no static frontier at this load (--frontier-ratios)"]
        floor = None if best is None else unreachable_memory(best)
        if floor:
            notes.append(floor)
        groups.append(t.group(
            "cotenant_memory", load,
            None if best is None else _cell(best["mean_kv_gib"], _memory_text(best, best), None,
                                            "reference"),
            None if oracle is None else _cell(oracle["mean_kv_gib"], _memory_text(oracle, best),
                                              None, "upper bound"),
            cells, "; ".join(notes) or None))
    return groups


# ----------------------------------------------------------------------------- oracle share
def _share_group(t: _Trace, target: str, load: dict | None, values: dict[str, float | None],
                 held: dict[str, str], *, less: bool = False, fmt: str = "{:.3g}") -> dict:
    """The share of the oracle's gain over best static each controller takes on one figure.

    :param values: the figure per controller (None: not measured)
    :param held: controllers whose value does not count, with the reason (e.g. a memory figure
        at an attainment more than the slack below best static's)
    :param less: less is better (memory)
    """
    best, oracle = values.get(REFERENCE), values.get(ORACLE_NAME)
    best_cell = (_missing(held.get(REFERENCE, f"no {REFERENCE} value")) if best is None else
                 _cell(best, fmt.format(best), None, held.get(REFERENCE, "reference")))
    if oracle is None or best is None or best == 0:
        why = (f"{REFERENCE}'s {held[REFERENCE]}" if REFERENCE in held else
               f"no {REFERENCE} value" if best is None or best == 0 else
               f"oracle: {held[ORACLE_NAME]}" if ORACLE_NAME in held else "no oracle value")
        cells = {c: _missing(why) for c in t.subjects}
        return t.group(target, load, best_cell, _missing(why), cells)
    og = _gain(oracle, best, less=less)
    oracle_cell = _cell(oracle, f"{fmt.format(oracle)} (gain {og:+.1%})", None,
                        held.get(ORACLE_NAME, "upper bound"), gain=og)
    judged = ORACLE_NAME not in held and og >= ORACLE_GAIN_BAR - 1e-12
    cells = {}
    for c in t.subjects:
        v = values.get(c)
        if v is None:
            cells[c] = _missing(held.get(c, "no value"))
            continue
        own = _gain(v, best, less=less)
        if ORACLE_NAME in held or not judged:
            # a share of a gain the oracle does not make means nothing: the own gain only
            why = (f"the oracle's figure does not count ({held[ORACLE_NAME]})"
                   if ORACLE_NAME in held else
                   f"the oracle gains {og:+.1%} < {ORACLE_GAIN_BAR:.0%}")
            cells[c] = _cell(None, f"{fmt.format(v)} (own {own:+.1%})", None, f"no bar: {why}",
                             gain=own)
            continue
        share = own / og
        text = f"{fmt.format(v)}: {share:.0%} of the gain (own {own:+.1%})"
        if c in held:
            cells[c] = _cell(share, text, False, held[c], gain=own)
        else:
            cells[c] = _cell(share, text, share >= ORACLE_SHARE_BAR - 1e-12, gain=own)
    return t.group(target, load, best_cell, oracle_cell, cells)


def share_figures(t: _Trace, cotenant: bool) -> list[dict]:
    groups = []
    if cotenant:
        for load in t.loads:
            scale = load["rate_scale"]
            best = t.row(REFERENCE, scale)
            values: dict[str, float | None] = {}
            held: dict[str, str] = {}
            for c in t.controllers:
                r = t.row(c, scale)
                values[c] = None if r is None else r["mean_kv_gib"]
                if r is not None and best is not None:
                    gap = r["interactive_attainment"] - best["interactive_attainment"]
                    if gap < -MEMORY_ATTAINMENT_SLACK:
                        held[c] = f"attainment {-gap * 100:.2f} pt below best static's"
            groups.append(_share_group(t, "oracle_share_memory", load, values, held, less=True,
                                       fmt="{:.2f} GiB"))
    if t.capacity:
        values = {c: (t.capacity[c]["capacity_99"] if c in t.capacity else None)
                  for c in t.controllers}
        unsearched = {c: "no capacity search (--capacity-controllers)" for c in t.controllers
                      if c not in t.capacity}
        groups.append(_share_group(t, "oracle_share_capacity_99", None, values, unsearched,
                                   fmt="x{:.3g}"))
    if t.has_batch:
        for load in t.loads:
            values, held = {}, {}
            for c in t.controllers:
                r = t.row(c, load["rate_scale"])
                values[c] = None if r is None else batch_goodput(r)
                if r is not None and r["interactive_attainment"] < TARGET:
                    held[c] = f"misses {TARGET:.0%} interactive ({r['interactive_attainment']:.2%})"
            if REFERENCE in held:
                values[REFERENCE] = None
            groups.append(_share_group(t, "oracle_share_batch_goodput", load, values, held,
                                       fmt="{:,.0f} tok/s"))
    return groups


# ----------------------------------------------------------------------------- batch goodput
def batch_figures(t: _Trace) -> list[dict]:
    if not t.has_batch:
        return []
    groups = []
    for load in t.loads:
        scale = load["rate_scale"]
        at = [r for r in t.rows if r["rate_scale"] == scale]
        best, oracle = t.row(REFERENCE, scale), t.row(ORACLE_NAME, scale)

        def cell(r: dict, role: str) -> dict:
            return _cell(batch_goodput(r), f"{batch_goodput(r):,.0f} tok/s @ "
                         f"{r['interactive_attainment']:.2%}", None, role)

        notes = []
        if at and all(r["batch_met"] == r["batch_requests"] for r in at):
            notes.append("every controller finishes every batch request by its deadline: the "
                         "figure cannot separate them")
        held = best is not None and best["interactive_attainment"] >= TARGET
        if held and best["batch_met"] == best["batch_requests"]:
            notes.append(f"{REFERENCE} finishes all {best['batch_requests']:,} batch requests "
                         "by their deadline: no controller's batch goodput can exceed its, so "
                         f"no controller can reach {BATCH_GOODPUT_BAR:g}x here")
        if best is not None and not held:
            notes.append(f"{REFERENCE} misses {TARGET:.0%} interactive here")
        cells = {}
        for c in t.subjects:
            r = t.row(c, scale)
            if r is None or best is None:
                cells[c] = _missing("no run at this load")
            elif not held:
                cells[c] = _missing(f"{REFERENCE} misses {TARGET:.0%} interactive here")
            elif r["interactive_attainment"] < TARGET:
                cells[c] = _cell(None, f"{r['interactive_attainment']:.2%} interactive", False,
                                 f"misses {TARGET:.0%} interactive")
            elif batch_goodput(best) <= 0:
                cells[c] = _missing(f"{REFERENCE} finishes no batch token by its deadline")
            else:
                ratio = batch_goodput(r) / batch_goodput(best)
                cells[c] = _cell(batch_goodput(r), f"{batch_goodput(r):,.0f} tok/s "
                                 f"({ratio:.2f}x)", ratio >= BATCH_GOODPUT_BAR - 1e-12,
                                 ratio=ratio, interactive_attainment=r["interactive_attainment"],
                                 batch_met=r["batch_met"], batch_requests=r["batch_requests"])
        groups.append(t.group("batch_goodput", load,
                              None if best is None else cell(best, "reference"),
                              None if oracle is None else cell(oracle, "upper bound"),
                              cells, "; ".join(notes) or None))
    return groups


# ----------------------------------------------------------------------------- capacity
def capacity_figures(t: _Trace) -> list[dict]:
    if not t.capacity:
        return []
    best = t.capacity.get(REFERENCE)
    oracle = t.capacity.get(ORACLE_NAME)

    def text(c: dict) -> str:
        own = f"x{c['capacity_99']:.3g}"
        if best and best["capacity_99"] > 0 and c is not best:
            own += f" ({c['capacity_99'] / best['capacity_99']:.2f}x)"
        return own

    cells = {}
    for name in t.subjects:
        c = t.capacity.get(name)
        cells[name] = (_missing("no capacity search (--capacity-controllers)") if c is None else
                       _missing(f"no {REFERENCE} capacity") if best is None else
                       _cell(c["capacity_99"], text(c),
                             c["capacity_99"] >= best["capacity_99"]))
    return [t.group("capacity_99", None,
                    None if best is None else _cell(best["capacity_99"], text(best), None,
                                                    "reference"),
                    _missing("no capacity search (--capacity-controllers)") if oracle is None else
                    _cell(oracle["capacity_99"], text(oracle), None, "upper bound"), cells)]


# ----------------------------------------------------------------------------- regret
def regret_figures(t: _Trace) -> list[dict]:
    """Capacity at 99% and 90% against hindsight static's (each figure's own), with the gain
    over best static's beside it."""
    hind = t.capacity.get(HINDSIGHT)
    if hind is None:
        return []
    best = t.capacity.get(REFERENCE)
    groups = []
    for key, target in (("capacity_99", "regret_99"), ("capacity_90", "regret_90")):
        h = hind[key]

        def text(c: dict, h: float = h, key: str = key) -> str:
            own = f"x{c[key]:.3g}"
            parts = []
            if h > 0 and c is not hind:
                parts.append(f"regret {1 - c[key] / h:+.1%}")
            if best is not None and best[key] > 0 and c is not best:
                parts.append(f"gain over best static {c[key] / best[key] - 1:+.1%}")
            return own + (f" ({', '.join(parts)})" if parts else "")

        cells = {}
        for name in t.subjects:
            c = t.capacity.get(name)
            if c is None:
                cells[name] = _missing("no capacity search (--capacity-controllers)")
                continue
            regret = 1 - c[key] / h if h > 0 else 0.0
            cells[name] = _cell(c[key], text(c), c[key] * (1 + TOLERANCE) >= h - 1e-12,
                                regret=regret,
                                gain_over_best_static=(c[key] / best[key] - 1
                                                       if best and best[key] > 0 else None))
        oracle = t.capacity.get(ORACLE_NAME)
        ocell = (_missing("no capacity search (--capacity-controllers)") if oracle is None else
                 _cell(oracle[key], text(oracle), None, "upper bound",
                       search_alone=oracle.get(f"search_{key}")))
        groups.append(t.group(
            target, None,
            None if best is None else _cell(best[key], text(best), None, "deployable reference",
                                            regret=1 - best[key] / h if h > 0 else 0.0),
            ocell, cells, None,
            hindsight=_cell(h, f"x{h:.3g}", None, "best fixed setting in hindsight",
                            setting=hind.get(f"setting_{key[-2:]}"))))
    return groups


# ----------------------------------------------------------------------------- hindsight memory
def hindsight_memory_point(points: Sequence[dict]) -> dict | None:
    """The hindsight frontier's reference at one load: among the settings within the slack of
    the best interactive attainment any of them reaches, the one holding the least KV."""
    if not points:
        return None
    top = max(p["interactive_attainment"] for p in points)
    within = [p for p in points if p["interactive_attainment"] >= top - MEMORY_ATTAINMENT_SLACK]
    return {**min(within, key=lambda p: (p["mean_kv_gib"], -p["interactive_attainment"])),
            "best_attainment": top}


def _hindsight_memory_cell(r: dict, top: float, kv_ref: float,
                           role: str | None = None) -> dict:
    """A row against the hindsight frontier's reference (``top``: the best fixed attainment at
    the load; ``kv_ref``: the least KV a fixed setting holds within the slack of it)."""
    kv, att = r["mean_kv_gib"], r["interactive_attainment"]
    ratio = kv / kv_ref if kv_ref > 0 else math.inf
    text = f"{kv:.2f} GiB @ {att:.2%} ({ratio:.2f}x)"
    why = []
    if att < top - MEMORY_ATTAINMENT_SLACK:
        why.append(f"attainment {(top - att) * 100:.2f} pt below the best fixed setting's")
    if ratio > MEMORY_RATIO_BAR:
        why.append(f"KV {ratio:.2f}x the hindsight frontier's")
    if role is not None:
        return _cell(kv, text, None, role, kv_ratio=ratio)
    return _cell(kv, text, not why, "; ".join(why), kv_ratio=ratio,
                 attainment_gap_pt=(att - top) * 100)


def hindsight_memory_figures(t: _Trace, cotenant: bool) -> list[dict]:
    if not cotenant or not t.hindsight:
        return []
    groups = []
    for load in t.loads:
        scale = load["rate_scale"]
        ref = hindsight_memory_point([p for p in t.hindsight if p["rate_scale"] == scale])
        if ref is None:
            continue
        top, kv_ref, att_ref = ref["best_attainment"], ref["mean_kv_gib"], ref[
            "interactive_attainment"]
        cells = {}
        for c in t.subjects:
            r = t.row(c, scale)
            cells[c] = (_missing("no run at this load") if r is None
                        else _hindsight_memory_cell(r, top, kv_ref))
        best, oracle = t.row(REFERENCE, scale), t.row(ORACLE_NAME, scale)
        k = ref["knobs"]
        note = (f"the best fixed attainment here is {top:.2%}; the least KV within "
                f"{MEMORY_ATTAINMENT_SLACK * 100:g} pt of it: {kv_ref:.2f} GiB at {att_ref:.2%} "
                f"({k['batch_window_ms']:g} ms, {k['prefill_chunk_tokens']:,}, ratio "
                f"{k['kv_cache_ratio']:g})")
        groups.append(t.group(
            "hindsight_memory", load,
            None if best is None else _hindsight_memory_cell(best, top, kv_ref,
                                                             "deployable reference"),
            None if oracle is None else _hindsight_memory_cell(oracle, top, kv_ref,
                                                               "upper bound"),
            cells, note,
            hindsight=_cell(kv_ref, f"{kv_ref:.2f} GiB @ {att_ref:.2%}", None,
                            "least KV a fixed setting holds within the slack", setting=k)))
    return groups


# ----------------------------------------------------------------------------- headline
def headline_figures(t: _Trace) -> list[dict]:
    if t.match is None:
        return []
    scale = t.match["rate_scale"]
    load = {"trace": t.trace, "rate_scale": scale}

    def cell(r: dict | None, role: str | None = None) -> dict:
        if r is None:
            return _missing("no run at the static match")
        inter = r["interactive_attainment"]
        on_time = r["batch_met"] / r["batch_requests"] if r["batch_requests"] else None
        text = f"{inter:.2%} interactive" + (
            "" if on_time is None else f", {on_time:.1%} batch on time")
        why = []
        if inter < HEADLINE_INTERACTIVE:
            why.append(f"interactive {inter:.2%}")
        if on_time is not None and on_time < HEADLINE_BATCH:
            why.append(f"batch on time {on_time:.1%}")
        if role is not None:
            return _cell(inter, text, None, role, batch_on_time=on_time)
        return _cell(inter, text, not why, "; ".join(why), batch_on_time=on_time)

    matched = [r for r in t.rows if r.get("matched_static")]

    def at(c: str) -> dict | None:
        return next((r for r in matched if r["controller"] == c), None)

    static_att = t.match.get("static_attainment")
    note = (f"the static default (first come first served, classes ignored) attains "
            f"{static_att:.1%} interactive here"
            if static_att is not None else None)
    return [t.group("headline", load, cell(at(REFERENCE), "reference"),
                    None if at(ORACLE_NAME) is None else cell(at(ORACLE_NAME), "upper bound"),
                    {c: cell(at(c)) for c in t.subjects}, note)]


# ----------------------------------------------------------------------------- never worse
def worst_margin(t: _Trace, controller: str) -> dict | None:
    """The least SLO attainment margin of ``controller`` over the baselines of
    :data:`NEVER_WORSE_THAN`, in points, over every rate scale both ran at. Where both also ran
    at the load's neighbours (rows with ``"neighbour_of"``: :data:`agents.arena.LOAD_NEIGHBOURS`)
    the margin there is the mean over the load and those neighbours, with its standard error
    (``se_pt``) and the span of the loads (``neighbourhood``: their lowest and highest multiple
    of the load)."""
    own = [r for r in t.rows if r["controller"] == controller]
    near: dict[float, list[dict]] = {}
    for r in own:
        if "neighbour_of" in r:
            near.setdefault(r["neighbour_of"], []).append(r)
    worst = None
    for r in own:
        if "neighbour_of" in r:
            continue
        scale = r["rate_scale"]
        for b in NEVER_WORSE_THAN:
            pairs = [(x, t.row(b, x["rate_scale"])) for x in (r, *near.get(scale, ()))]
            if pairs[0][1] is None:
                continue
            both = [(x, o) for x, o in pairs if o is not None]
            margins = [(x["slo_attainment"] - o["slo_attainment"]) * 100 for x, o in both]
            margin = math.fsum(margins) / len(margins)
            if worst is None or margin < worst["margin_pt"]:
                multiples = [x["rate_scale"] / scale for x, _ in both]
                worst = {"margin_pt": margin, "against": b, "rate_scale": scale,
                         "loads": len(margins),
                         "se_pt": (statistics.stdev(margins) / math.sqrt(len(margins))
                                   if len(margins) > 1 else None),
                         "neighbourhood": (min(multiples), max(multiples))}
    return worst


def never_worse_figures(t: _Trace) -> list[dict]:
    if not any(b in t.controllers for b in NEVER_WORSE_THAN):
        return []

    def cell(c: str, role: str | None = None) -> dict:
        w = worst_margin(t, c)
        if w is None:
            return _missing("no run at a baseline's load")
        text = f"{w['margin_pt']:+.2f} pt (vs {w['against']} at x{w['rate_scale']:.3g}"
        if w["loads"] > 1:
            lo, hi = w["neighbourhood"]
            text += (f"; mean of {w['loads']} loads x{lo:.3g}-{hi:.3g} of it, "
                     f"s.e. {w['se_pt']:.2f} pt")
        text += ")"
        if role is not None:
            return _cell(w["margin_pt"], text, None, role, **w)
        return _cell(w["margin_pt"], text, w["margin_pt"] >= 0, **w)

    subjects = {c: cell(c) for c in t.subjects if c not in NEVER_WORSE_THAN}
    if not subjects:
        return []
    return [t.group("never_worse", None,
                    cell(REFERENCE, "reference") if REFERENCE in t.controllers else None,
                    cell(ORACLE_NAME, "upper bound") if t.has_oracle else None, subjects)]


# ----------------------------------------------------------------------------- all
def scorecard(rows: Sequence[dict], capacity: Sequence[dict], static_match: Sequence[dict],
              frontier: Sequence[dict], loads: Sequence[dict], *, cotenant: bool,
              hindsight: Sequence[dict] = ()) -> dict:
    """The scorecard of an arena run (see the module docstring).

    :param loads: the scorecard loads, ``{"trace", "rate_scale", "multiple"}`` (``multiple`` of
        best static's capacity, None for an explicit rate scale)
    :param cotenant: whether the run lent memory to a co-tenant (the memory figures need one)
    :param hindsight: the hindsight frontier's points (every grid setting replayed at the
        scorecard loads on the evaluated window)
    :returns: ``{"table": [group, ...], "summary": {controller: counts}, "not_measured": [...],
        "targets": ...}``; a group is one target at one load: best static's and the oracle's
        entries and each controller's (``value``, ``text``, ``pass``, ``verdict``)
    """
    table: list[dict] = []
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    for trace in traces:
        t = _Trace(trace, rows, capacity, static_match, frontier, loads, hindsight)
        table += (memory_figures(t, cotenant) + hindsight_memory_figures(t, cotenant)
                  + share_figures(t, cotenant) + batch_figures(t) + capacity_figures(t)
                  + regret_figures(t) + headline_figures(t) + never_worse_figures(t))
    not_measured = []
    if not cotenant:
        not_measured.append("co-tenant memory and its share of the oracle's gain: the run lent "
                            "no memory to a co-tenant (--cotenant)")
    if not loads:
        not_measured.append("co-tenant memory and batch goodput: no scorecard loads (they "
                            f"need {REFERENCE}'s capacity, or --scorecard-rate-scales)")
    if not capacity:
        not_measured.append("capacity @99% and its share of the oracle's gain: no capacity "
                            "search (--no-capacity)")
    if not static_match:
        not_measured.append("the headline: no static match (--match-static 0.68)")
    if capacity and not any(c["controller"] == HINDSIGHT for c in capacity):
        not_measured.append(f"regret against the best fixed setting in hindsight: no {HINDSIGHT} "
                            "among --controllers")
    if ORACLE_NAME not in {r["controller"] for r in rows}:
        not_measured.append(f"every share of the oracle's gain: no {ORACLE_NAME} among "
                            "--controllers")
    if not any(r["batch_requests"] > 0 for r in rows):
        not_measured.append("batch goodput: no trace with batch requests (e.g. mixed)")
    summary: dict[str, dict[str, int]] = {}
    for g in table:
        for c, cell in g["controllers"].items():
            s = summary.setdefault(c, {"pass": 0, "fail": 0, "not judged": 0})
            s["pass" if cell["pass"] else "fail" if cell["pass"] is False else "not judged"] += 1
    return {"reference": REFERENCE, "upper_bound": ORACLE_NAME,
            "targets": {k: asdict(v) for k, v in TARGETS.items()}, "loads": list(loads),
            "table": table, "summary": summary, "not_measured": not_measured}

