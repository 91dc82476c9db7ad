"""The oracle as an upper bound of the fixed settings: at every load, the better of the lookahead
search's run and the runs of the fixed settings it must bound.

A receding-horizon search is no proof of optimality: it scores ten seconds ahead, met requests
against certain misses, and a setting that pays later, or a capacity decided by a few requests
at the window's end, can leave it under a fixed setting (on code's held-out window the search
anchored on best static stayed 9% under a fixed setting it never tried). So the arena's
``oracle`` is not the search alone. It knows the whole window, so it can replay every candidate
in full before it commits: at each load it runs

- the search (:class:`agents.oracle.LookaheadOracle`), anchored on hindsight static's setting
  and with best static's among its candidates, and
- every fixed setting it must bound (:func:`portfolio`): best static's and hindsight static's
  settings for capacity at 99% and at 90%,

and keeps the run with the highest interactive attainment (ties to the search's run, which may
lend memory). Its attainment at every load is then at least each fixed setting's, and by the
dominance of the fixed-grid walk (:mod:`agents.bisection`) its capacity at 99% and at 90% is at
least theirs, exactly. Its row says which run it kept (``oracle_run``) and what the search alone
did there (``search``); its capacity entry gives the search's own capacity too
(``search_capacity_99``), so the room the search finds beyond the fixed settings stays visible.

It is not deployable: it reads the engine and the trace's future, and replays whole windows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agents.bisection import walk
from agents.controllers.best_static import BestStatic, BestStaticController
from agents.oracle import ORACLE_NAME
from agents.registry import HINDSIGHT, EvalSpec, best_static, hindsight_static, make_controller
from env.traces.resolve import trace_label

SEARCH = "search"
"""what a bound row's ``oracle_run`` says when the search's own run was kept"""
TARGETS = ((0.99, "99"), (0.90, "90"))


def portfolio(spec: EvalSpec) -> dict[str, BestStatic]:
    """The fixed settings the oracle bounds, by name (one name per distinct setting, the first
    that has it): best static's and hindsight static's, tuned for 99% and for 90%."""
    out: dict[str, BestStatic] = {}
    for target, tag in TARGETS:
        for name, setting in (("best-static", best_static(spec, target=target)),
                              (HINDSIGHT, hindsight_static(spec, target))):
            if setting not in out.values():
                out[name if tag == "99" else f"{name}@90"] = setting
    return out


def _arms(spec: EvalSpec) -> dict[str, Any]:
    return {name: BestStaticController(s.knobs, s.admission, name=name)
            for name, s in portfolio(spec).items()}


def bound_row(spec: EvalSpec, scale: float, record: bool, controller_row: Callable) -> dict:
    """The oracle's row at ``scale``: the kept run's figures (see the module docstring).
    ``controller_row``: the arena's row of one controller (:func:`agents.arena.controller_row`;
    passed in, as the arena calls this module)."""
    search = controller_row(spec, ORACLE_NAME, make_controller(ORACLE_NAME, spec), scale, record)
    runs = {SEARCH: search}
    for name, c in _arms(spec).items():
        runs[name] = controller_row(spec, name, c, scale, False)
    kept = max(runs, key=lambda n: (runs[n]["interactive_attainment"], n == SEARCH))
    row = dict(runs[kept])
    if kept != SEARCH and record:
        row["timeline"] = search.get("timeline", {})
    row.update(controller=ORACLE_NAME, upper_bound=True, oracle_run=kept,
               search={k: search[k] for k in ("interactive_attainment", "slo_attainment",
                                              "mean_kv_gib", "goodput_rps",
                                              "decision_sources")},
               arms={n: r["interactive_attainment"] for n, r in runs.items()})
    return row


def bound_capacity(spec: EvalSpec, known: dict[float, tuple], summary_at: Callable) -> dict:
    """The oracle's capacities at 99% and 90% (the walk over the kept run's attainment at each
    load), and the search's own. ``known``: the oracle rows' (interactive attainment, goodput,
    the search's own interactive attainment) by load; the first two are the kept runs'.
    ``summary_at``: a controller's run summary at a load (:func:`agents.arena.summary_at`)."""
    search = make_controller(ORACLE_NAME, spec)
    arms = _arms(spec)
    bound = {s: k[0] for s, k in known.items()}
    goodput = {s: k[1] for s, k in known.items()}
    alone: dict[float, float] = {s: k[2] for s, k in known.items() if len(k) > 2}
    kept: dict[float, str] = {}

    def search_at(scale: float) -> float:
        if scale not in alone:
            s = summary_at(spec, search, scale)
            alone[scale] = s["interactive_attainment"]
            goodput.setdefault(scale, s["goodput_rps"])
        return alone[scale]

    def bound_at(scale: float) -> float:
        runs = {SEARCH: (search_at(scale), goodput[scale])}
        for name, c in arms.items():
            s = summary_at(spec, c, scale)
            runs[name] = (s["interactive_attainment"], s["goodput_rps"])
        best = max(runs, key=lambda n: (runs[n][0], n == SEARCH))
        kept[scale] = best
        goodput[scale] = runs[best][1]
        return runs[best][0]

    out = {"controller": ORACLE_NAME, "upper_bound": True, "trace": trace_label(spec.trace)}
    for target, tag in TARGETS:
        out[f"capacity_{tag}"] = walk(bound_at, target, bound)
    for target, tag in TARGETS:
        out[f"search_capacity_{tag}"] = walk(search_at, target, alone)
    cap99 = out["capacity_99"]
    return {**out, "goodput_at_capacity_99_rps": goodput.get(cap99),
            "kept_run": {f"{s:.6g}": n for s, n in sorted(kept.items())},
            "evaluations": len(bound) + len(alone)}
