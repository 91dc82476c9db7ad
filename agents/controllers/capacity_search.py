"""The fixed setting with the highest capacity on a window: best static tuned for the capacity
figure (on the train split) and the best fixed setting in hindsight (on the evaluated window).

Capacity at a target (99% or 90% interactive attainment) is the arena's figure: the fixed-grid
walk of :mod:`agents.bisection`, on the arena's own data path (the setting's
:class:`~agents.controllers.best_static.BestStaticController` deciding every interval through the
session loop, drained as the arena drains). Every candidate is walked, side by side, so that a
setting is measured at the loads its own walk probes and nowhere else; the answer for each is
what the arena would print for it.

What keeps it affordable, without changing any answer:

- A probe stops early once the window's interactive violations are more than ``1 - target`` of
  its interactive requests: from then on its attainment is certainly under the target (every
  request ends finished or rejected, and a violation is counted once it is certain). Only a pass
  needs the whole window.
- Pruning. While walks run, each one's answer is known to lie in ``[lower, upper)``
  (:meth:`agents.bisection.FixedGridBisection.can_reach`). A setting whose answer cannot reach
  the ``TOP``-th largest lower bound is below ``TOP`` other settings: its walk stops, and the
  table says what it was proven to stay under. So the top ``TOP`` settings are exact, and every
  other setting is proven below them.

Candidates. The knob grid (:data:`~agents.controllers.best_static.GRID`, 90 settings), then the
class and admission levers (admission and slack, and on a trace with batch work the batch share:
:func:`~agents.controllers.best_static.lever_settings`) around the best knobs, then the knob grid
again under the levers found, until the best setting stops changing (coordinate search, at most
:data:`MAX_ROUNDS` knob passes; a full product of the knob and lever grids would be 1,080
settings on mixed). The deployment's own levers start the first pass. ``extra`` settings join
the first pass (the hindsight search is given best static's setting, so that the best fixed
setting in hindsight is never below it).

Ties. Capacities lie on the walk's grid of loads, so settings often share one. Among those with
the highest capacity: the highest attainment at that load (the most margin to a shift in load or
traffic), then the lowest KV ratio (memory a co-tenant can use), the shortest window, the
smallest chunk, then the candidate that came first (the deployment's levers before others).

Results are cached in ``checkpoints/best_static/`` beside the grid searches
(``<trace>-<key>-capacity-<sub>.json``) under a key of everything they depend on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agents.bisection import TOLERANCE, FixedGridBisection
from agents.controllers.best_static import (
    GRID,
    BestStatic,
    BestStaticController,
    cache_key,
    lever_settings,
)
from agents.windows import DRAIN_LIMIT_S, eval_window
from env.traces import split
from env.traces.resolve import resolve_trace, trace_label
from runtime.engine.profile import Profile
from runtime.knobs import Knobs

PROBE_STRIDE_S = 5.0
"""simulated seconds between a probe's looks at its misses (the engine's dynamics do not depend
on where its run is cut: a test compares the session loop's quarter-second intervals with one
straight run)"""
TOP = 5
"""settings whose capacity is measured exactly; the others are proven below them"""
MAX_ROUNDS = 3
"""knob-grid passes of the coordinate search at most"""
TARGETS = (0.99, 0.90)
"""the attainments a capacity is measured at: the arena's capacity at 99% and at 90%"""
TIE_RULE = ("highest capacity; then the highest interactive attainment at that load (the most "
            "margin to a shift in load or traffic), the lowest KV ratio (memory a co-tenant can "
            "use), the shortest window, the smallest chunk, and the candidate met first (the "
            "deployment's own levers first)")
_VERSION = 1
"""bumped when the search's procedure changes (the cached answers then stand for another one)"""


def setting_dict(s: BestStatic) -> dict:
    return {"knobs": list(s.knobs.as_tuple()), "admission": s.admission}


def setting_of(d: dict) -> BestStatic:
    return BestStatic(Knobs(*d["knobs"]), d["admission"])


def setting_label(s: BestStatic) -> str:
    k = s.knobs
    return (f"{k.batch_window_ms:g} ms, {k.prefill_chunk_tokens:,}, {k.kv_cache_ratio:g}, "
            f"share {k.batch_share:g}, {s.admission}@{k.admission_slack:g}")


class _OverBudget(Exception):
    """A probe's attainment is certainly under its target."""


def probe(spec: Any, setting: BestStatic, scale: float, target: float | None = None
          ) -> float | None:
    """Interactive attainment of ``setting`` on the spec's window at ``scale``, as the arena
    measures a fixed setting (:func:`agents.arena.summary_at` gives the same number: the engine
    starts with the setting and runs straight through, as
    :meth:`runtime.engine.engine.Engine.run_to_completion` does, looking at its misses every
    :data:`PROBE_STRIDE_S`), or None when it stopped early because the attainment is certainly
    under ``target``."""
    from runtime.engine.engine import Engine
    from runtime.engine.sim_executor import SimulatedExecutor

    window = eval_window(spec, scale)
    knobs, config = BestStaticController(setting.knobs, setting.admission).start(spec.config)
    window.check_classes(config.slo_classes)
    budget = math.inf
    if target is not None:
        interactive = sum(1 for c in window.slo_class.tolist()
                          if not config.slo_classes[c].is_batch)
        budget = (1.0 - target) * interactive
    end = (float(window.arrival_s[-1]) if len(window) else 0.0) + DRAIN_LIMIT_S
    # (no gc_paused: simulated time does not see the collector, and its full collection on the
    # way out cost more than a short probe)
    engine = Engine(SimulatedExecutor(Profile.load(spec.profile_path)), knobs, config)
    engine.add_requests(window.arrival_s, window.prompt_tokens, window.output_tokens,
                        window.slo_class)
    stride = 60.0 if target is None else PROBE_STRIDE_S
    missed = 0
    while engine.has_work() and engine.now < end:  # run_to_completion's loop, watched
        t = engine.now + stride
        arrival = engine.next_arrival_s()
        if not engine.waiting and not engine.running and arrival < math.inf:
            t = max(t, arrival)
        engine.run_until(min(t, end))
        if target is not None:
            iv = engine.collect_interval()
            missed += iv.violations - iv.batch_violations
            if missed > budget:
                return None
    if engine.has_work():
        engine.abort_all()
    return engine.summary().interactive_attainment


def _probe_job(args: tuple) -> float | None:
    spec, setting, scale, target = args
    return probe(spec, setting, scale, target)


Known = dict[tuple[BestStatic, float], tuple[float | None, float]]
"""(setting, load) -> (attainment, or None when the probe stopped early; the target it stopped
at, or 0 when it ran through)"""


def _answer(known: Known, key: tuple[BestStatic, float], target: float) -> float | None:
    """What a stored probe says at ``target``: its attainment, -inf for a certain miss, None
    when it cannot say (it stopped at a higher target's budget)."""
    hit = known.get(key)
    if hit is None:
        return None
    att, stopped_at = hit
    if att is not None:
        return att
    return -math.inf if target >= stopped_at else None


def _rank_key(entry: dict, index: int) -> tuple:
    k = entry["setting"].knobs
    return (-entry["capacity"], -entry["attainment_at_capacity"], k.kv_cache_ratio,
            k.batch_window_ms, k.prefill_chunk_tokens, index)


def walk_all(spec: Any, candidates: Sequence[BestStatic], target: float, *, known: Known,
             top: int = TOP, runner: Any = None, desc: str = "capacity search") -> list[dict]:
    """Walk every candidate's capacity side by side (see the module docstring); one entry per
    candidate, in order: ``setting``, ``capacity`` (None when pruned), ``below`` (a pruned one's
    capacity is under this), ``attainment_at_capacity``, ``probes`` (run for it here)."""
    walks = {c: FixedGridBisection(target) for c in candidates}
    pruned: dict[BestStatic, float] = {}
    probes = {c: 0 for c in candidates}
    while True:
        for c, w in walks.items():  # answer what earlier probes can
            while w.load is not None and c not in pruned:
                a = _answer(known, (c, w.load), target)
                if a is None:
                    break
                w.record(a)
        lowers = sorted((w.lower for w in walks.values()), reverse=True)
        bar = lowers[min(top, len(lowers)) - 1]
        for c, w in walks.items():
            if w.load is not None and c not in pruned and bar > 0 and not w.can_reach(bar):
                pruned[c] = bar
        active = [c for c, w in walks.items() if w.load is not None and c not in pruned]
        if not active:
            break
        jobs = [(spec, c, walks[c].load, target) for c in active]
        for c, (_, _, load, _), att in zip(active, jobs,
                                           runner.map(_probe_job, jobs, desc=desc)):
            known[(c, load)] = (att, 0.0 if att is not None else target)
            probes[c] += 1
    out = []
    for c in candidates:
        w = walks[c]
        cap = w.result
        att = _answer(known, (c, cap), target) if cap else None
        out.append({"setting": c, "capacity": cap, "below": pruned.get(c),
                    "attainment_at_capacity": att if att is not None and att > -1 else 0.0,
                    "probes": probes[c]})
    return out


def rank(entries: Sequence[dict]) -> list[dict]:
    """The measured entries, best first by the tie rule (:data:`TIE_RULE`)."""
    measured = [(i, e) for i, e in enumerate(entries) if e["capacity"] is not None]
    return [e for i, e in sorted(measured, key=lambda ie: _rank_key(ie[1], ie[0]))]


def knob_grid(levers: BestStatic, grid: dict[str, tuple]) -> list[BestStatic]:
    """The knob grid under the levers (batch share, slack, admission) of ``levers``."""
    k = levers.knobs
    return [BestStatic(Knobs(w, c, r, k.batch_share, k.admission_slack), levers.admission)
            for w in grid["batch_window_ms"] for c in grid["prefill_chunk_tokens"]
            for r in grid["kv_cache_ratio"]]


def coordinate_search(spec: Any, target: float, *, start: BestStatic, batch_work: bool,
                      grid: dict[str, tuple], extra: Sequence[BestStatic] = (),
                      runner: Any, known: Known, label: str = "") -> dict:
    """The knob grid and the levers in turn (see the module docstring); the whole table."""
    table: dict[BestStatic, dict] = {}

    def merge(entries: list[dict]) -> None:
        for e in entries:
            had = table.get(e["setting"])
            if had is not None:
                e = {**(e if e["capacity"] is not None else had),
                     "probes": had["probes"] + e["probes"]}
            table[e["setting"]] = e

    levers = start
    rounds = 0
    for rounds in range(1, MAX_ROUNDS + 1):
        cands = list(dict.fromkeys([*knob_grid(levers, grid), *(extra if rounds == 1 else ())]))
        merge(walk_all(spec, cands, target, known=known, runner=runner,
                       desc=f"{label} knob grid, pass {rounds}"))
        knobs_best = rank(list(table.values()))[0]["setting"]
        merge(walk_all(spec, lever_settings(knobs_best, batch_work), target, known=known,
                       runner=runner, desc=f"{label} levers, pass {rounds}"))
        new = rank(list(table.values()))[0]["setting"]
        if _levers(new) == _levers(levers):  # another knob pass would search the same grid
            break
        levers = new
    entries = list(table.values())
    # a walk pruned in one pass is below that pass's top settings, which stay in the table: so
    # the table's first TOP are exact, and every pruned setting is below them
    ranked = rank(entries)
    return {"best": ranked[0], "ranked": ranked, "entries": entries, "rounds": rounds}


def _levers(s: BestStatic) -> tuple[float, float, str]:
    return (s.knobs.batch_share, s.knobs.admission_slack, s.admission)


def _key(spec: Any, part: str, target: float, grid: dict[str, tuple],
         extra: Sequence[BestStatic]) -> tuple[str, str]:
    """(the grid search's key, this search's sub-key)"""
    trace = split(resolve_trace(spec.trace), part)
    classes = sorted(set(trace.slo_class.tolist()))
    key = cache_key(spec.trace, part, [], Profile.load(spec.profile_path), spec.config, grid,
                    classes)
    desc = {"target": target, "tolerance": TOLERANCE, "top": TOP, "rounds": MAX_ROUNDS,
            "interval_s": spec.interval_s, "extra": [setting_dict(s) for s in extra],
            "version": _VERSION}
    return key, hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:8]


def capacity_static(spec: Any, part: str, target: float, *, extra: Sequence[BestStatic] = (),
                    grid: dict[str, tuple] | None = None, cache_dir: Path | None = None,
                    workers: int = 2, ray: bool | None = None,
                    progress: bool = True) -> dict:
    """The fixed setting with the highest capacity at ``target`` on the ``part`` split of the
    spec's trace (``spec``: an :class:`agents.registry.EvalSpec`, whose own split is not read),
    from the cache or searched and cached. Returns ``best`` (setting, capacity, attainment
    there), ``top`` (the first :data:`TOP`), ``table`` (every candidate: its capacity, or what
    it was proven to stay under), ``tie_rule``."""
    from agents.parallel import JobRunner
    from runtime.locations import best_static_dir

    grid = grid or GRID
    key, sub = _key(spec, part, target, grid, extra)
    label = trace_label(spec.trace)
    folder = Path(cache_dir or best_static_dir())
    path = folder / f"{label}-{key}-capacity-{sub}.json"
    if path.exists():
        return _decode(json.loads(path.read_text()))
    pspec = dataclasses.replace(spec, part=part)
    config = spec.config
    trace = split(resolve_trace(spec.trace), part)
    batch_work = any(config.slo_classes[c].is_batch for c in set(trace.slo_class.tolist()))
    start = BestStatic(config.start_knobs(Knobs(*[v[0] for v in grid.values()])),
                       config.admission)
    t0 = time.perf_counter()
    # the probes of the other searches of this split and deployment (another target, other
    # extra candidates) answer this one's where they can: a probe is a setting at a load
    known = shared_probes(folder, f"{label}-{key}-capacity-")
    before = len(known)
    with JobRunner(workers, ray=ray, progress=progress) as runner:
        found = coordinate_search(pspec, target, start=start, batch_work=batch_work, grid=grid,
                                  extra=extra, runner=runner, known=known,
                                  label=f"{label} {part} @{target:.0%}")
    result = {"trace": label, "split": part, "target": target, "key": f"{key}-{sub}",
              "tie_rule": TIE_RULE, "rounds": found["rounds"],
              "grid": {k: list(v) for k, v in grid.items()},
              "extra": [setting_dict(s) for s in extra],
              "best": _entry(found["best"]), "top": [_entry(e) for e in found["ranked"][:TOP]],
              "table": [_entry(e) for e in found["entries"]],
              "probes": len(known) - before, "seconds": time.perf_counter() - t0,
              "probe_table": [[*setting_dict(c)["knobs"], c.admission, load, att, stopped]
                              for (c, load), (att, stopped) in known.items()]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return _decode(result)


def shared_probes(folder: Path, prefix: str) -> Known:
    """Every probe the cached searches named ``prefix*`` ran (their ``probe_table``)."""
    known: Known = {}
    for f in sorted(folder.glob(f"{prefix}*.json")):
        for *knobs, admission, load, att, stopped in json.loads(f.read_text()).get(
                "probe_table", ()):
            known[(BestStatic(Knobs(*knobs), admission), load)] = (att, stopped)
    return known


def _entry(e: dict) -> dict:
    return {**e, "setting": setting_dict(e["setting"])}


def _decode(result: dict) -> dict:
    """A cached result with its settings as :class:`BestStatic` again."""
    out = dict(result)
    for k in ("best",):
        out[k] = {**result[k], "setting": setting_of(result[k]["setting"])}
    out["top"] = [{**e, "setting": setting_of(e["setting"])} for e in result["top"]]
    out["table"] = [{**e, "setting": setting_of(e["setting"])} for e in result["table"]]
    return out
