"""Headroom of run-time control, per lever: the lookahead oracle against best static and static.

An experiment, not a tool: it produced the per-lever headroom table quoted in docs/results.md
("Headroom of run-time control, per lever"), the finding that only the KV ratio with a co-tenant
passes the 10% bar, which is why the shipped recipes' imitation oracle searches that lever alone.

    PYTHONPATH=$PWD python scripts/experiments/oracle_headroom.py --out runs/headroom.json
    PYTHONPATH=$PWD python scripts/experiments/oracle_headroom.py --levers batch_share \\
        --out runs/h.json
    PYTHONPATH=$PWD python scripts/experiments/oracle_headroom.py --report runs/h.json

One lever at a time, on the held-out split of each trace it applies to, three arms replay the
whole split through the arena's data path (``agents.arena.run_episode``):

- ``static``: the lever at the engine's default (for ``knobs``, the static default knobs);
- ``best static``: best static's knobs (grid search on the training split) with the lever's best
  static value, tuned on the training split (``admission``, ``batch_share``) or, for the KV
  ratio, the static frontier: each ratio of :data:`KV_RATIOS` measured on the held-out split
  itself (a static choice that has seen the test, so the oracle's gain is not flattered);
- ``oracle (upper bound)``: the lookahead oracle (it knows the future arrivals) anchored on best
  static's setting, searching the lever's grid (:data:`LEVERS`).

The levers:

- ``knobs``: the three original knobs (chunk 256-16384 at window 5 ms, ratio 0.95);
- ``admission``: fcfs | shed | late_to_back with the admission slack;
- ``batch_share``: batch work's share, on ``mixed`` only (the Azure traces have no batch work);
- ``kv``: the KV ratio with the default co-tenant lent the memory the pool leaves.

Figures (``L*`` is best static's capacity at 99% interactive attainment with the default levers,
found once per trace by bisection):

- ``capacity``: each arm's capacity at 99% interactive attainment (rate scale, bisection to
  ``--tolerance``, on the fixed grid of loads of :func:`agents.arena.find_capacity`);
- ``batch``: batch goodput (tokens finished by their deadline per second of the window's
  arrivals) of each arm at ``L*``, counted only where the arm holds 99% interactive attainment;
- ``memory``: mean KV GiB at ``--kv-loads`` x ``L*``, for each arm that holds 99% interactive
  attainment there (best static: the frontier's smallest pool that does);
- ``past``: at ``--multiples`` x ``L*``, interactive goodput as a share of the arm's own
  interactive goodput at ``L*``.

Goodput is per second of the window's arrivals (its last arrival), the same span for every arm
at a load: the engine's own figure divides by the time the run took to drain, which moves with
the batch work an arm leaves for the end (at 2x on mixed that alone made a 13% "gain").
Capacities are printed with the oracle's gain and, in brackets, the least and the most it can
be given where each bisection stopped.

A lever is worth learning iff the oracle beats best static by at least
:data:`agents.scorecard.ORACLE_GAIN_BAR` (10%) on some
figure of some trace: capacity or batch goodput or goodput share 10% higher, or 10% less memory.
Each finished (lever, trace) cell is written to ``--out`` at once, and a rerun skips the cells
already there, so partial results survive and a long run can be resumed.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from agents.arena import find_capacity, run_episode
from agents.controllers.best_static import best_static_knobs
from agents.oracle import (
    DEFAULT_CANDIDATES,
    KV_CANDIDATES,
    KV_MEMORY_PRICE,
    KV_RATIOS,
    ORACLE_LABEL,
    LookaheadOracle,
    OracleConfig,
    Setting,
    parse_candidates,
)
from agents.registry import EvalSpec
from agents.scorecard import ORACLE_GAIN_BAR, TARGET, per_arrival_second
from agents.windows import eval_window
from env.traces.cotenant import cotenant_demand
from env.traces.resolve import trace_label
from runtime.decider.decision import Decision, decided_by
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.profile import Profile
from runtime.knobs import DEFAULT_KNOBS, KNOB_NAMES, Knobs

ARMS = ("static", "best-static", "oracle")
AZURE = ("azure-code", "azure-conv", "mixed")
LEVERS: dict[str, tuple[str, ...]] = {"knobs": AZURE, "admission": AZURE,
                                      "batch_share": ("mixed",), "kv": AZURE}
"""each lever and the traces it applies to"""
FIGURES: dict[str, tuple[str, ...]] = {"knobs": ("capacity", "past"),
                                       "admission": ("capacity", "past"),
                                       "batch_share": ("capacity", "batch", "past"),
                                       "kv": ("memory",)}
"""what each lever is judged on (see the module docstring)"""
ADMISSION_STATIC = (("fcfs", 1.0), ("shed", 0.5), ("shed", 1.0), ("late_to_back", 0.5),
                    ("late_to_back", 1.0))
"""(policy, slack) best static chooses among, on the training split"""
ADMISSION_GRID = "admission=fcfs,shed,late_to_back;admission_slack=0.5,1"
BATCH_SHARES = (0.0, 0.1, 0.25, 0.5, 1.0)
"""batch shares best static chooses among, on the training split"""
BATCH_GRID = "batch_share=0,0.25,0.5,1"


@dataclass
class HeadroomConfig:
    """Which levers and traces, and how the oracle searches."""

    levers: tuple[str, ...] = tuple(LEVERS)
    """levers to measure: knobs, admission, batch_share, kv"""
    traces: tuple[str, ...] = AZURE
    """traces (each lever runs on those of them it applies to)"""
    multiples: tuple[float, ...] = (2.0, 4.0)
    """past capacity: loads as multiples of best static's capacity L*"""
    kv_loads: tuple[float, ...] = (0.5, 1.0)
    """the kv lever's loads, multiples of L*"""
    tolerance: float = 0.01
    """capacity bisection stops when its bracket is within this ratio"""
    workers: int = 2
    """processes replaying in parallel"""
    out: Path | None = None
    """write every figure here (JSON) as each (lever, trace) cell ends; cells already in the
    file are not run again"""
    report: tuple[Path, ...] = ()
    """print the table of these JSON files (merged) and run nothing"""
    json: bool = False
    """print one JSON object (every cell) instead of the table"""
    split: str = "eval"
    """the held-out part replayed"""
    interval_s: float = 0.25
    """the decision interval"""
    period_s: float = OracleConfig.period_s
    """the oracle's search period (simulated s)"""
    horizon_s: float = OracleConfig.horizon_s
    """the oracle's look ahead (simulated s)"""


# ----------------------------------------------------------------------------- settings
def knob_spec(knobs: Knobs) -> str:
    """``knobs`` in the oracle's candidate grammar (``window=..;chunk=..;ratio=..``, then any
    further knob that differs from the static default)."""
    parts = [f"window={knobs.batch_window_ms:g}", f"chunk={knobs.prefill_chunk_tokens}",
             f"ratio={knobs.kv_cache_ratio:g}"]
    parts += [f"{n}={getattr(knobs, n):g}" for n in KNOB_NAMES[3:]
              if getattr(knobs, n) != getattr(DEFAULT_KNOBS, n)]
    return ";".join(parts)


def one_setting(spec: str) -> Setting:
    """The one setting a grid string with a single value per key names."""
    settings = parse_candidates(spec)
    if len(settings) != 1:
        raise ValueError(f"{spec!r} names {len(settings)} settings, not one")
    return settings[0]


def override(spec: str, key: str, value: str) -> str:
    """``spec`` with ``key`` set to ``value`` (replaced or appended)."""
    parts = [p for p in spec.split(";") if p and p.split("=")[0] != key]
    return ";".join([*parts, f"{key}={value}"])


class SettingController:
    """A static arm: one setting, knobs and levers, held from the start (levers are set on the
    engine when it is bound, the knobs are decided every interval)."""

    def __init__(self, setting: Setting, name: str) -> None:
        self.setting = setting
        self.name = name
        self._decision = decided_by(setting.knobs, name)

    def bind(self, engine: Engine) -> None:
        self.setting.apply(engine)

    def reset(self) -> None:
        pass

    def decide(self, observation: np.ndarray) -> Decision:
        return self._decision


@dataclass(frozen=True)
class Arm:
    """One controller of a cell: a static setting, or the oracle anchored on one."""

    name: str
    """static | best-static | oracle | a frontier point (``ratio=0.6``)"""
    spec: str
    """its setting (the oracle's anchor) in the candidate grammar"""
    grid: str = ""
    """the oracle's candidate grid; empty for a static arm"""
    memory_price: float = 0.0
    """the oracle's price of a GiB of KV held"""


def controller(arm: Arm, cfg: HeadroomConfig):
    setting = one_setting(arm.spec)
    if not arm.grid:
        return SettingController(setting, arm.name)
    oracle = OracleConfig(period_s=cfg.period_s, horizon_s=cfg.horizon_s, candidates=arm.grid,
                          memory_price=arm.memory_price)
    return LookaheadOracle(oracle, anchor=setting, interval_s=cfg.interval_s)


def engine_config(lever: str) -> EngineConfig | None:
    return EngineConfig(cotenant=cotenant_demand(seed=0)) if lever == "kv" else None


# ----------------------------------------------------------------------------- runs
def _run(job: tuple) -> dict:
    """One replay: ``(cfg, lever, trace, part, arm, scale)`` -> its figures."""
    cfg, lever, trace, part, arm, scale = job
    spec = EvalSpec(trace, part, None, cfg.interval_s)
    t0, c0 = time.perf_counter(), time.process_time()
    window = eval_window(spec, scale)
    ep = run_episode(window, controller(arm, cfg), interval_s=cfg.interval_s,
                     profile=Profile.load(), config=engine_config(lever))
    s = ep.summary
    sim = s["sim_seconds"]
    span = float(window.arrival_s[-1])
    return {"arm": arm.name, "scale": scale, "part": part,
            "interactive_attainment": s["interactive_attainment"],
            "interactive_goodput_rps": (s["met"] - s["batch_met"]) / span,
            "batch_goodput_tps": per_arrival_second(s["batch_goodput_tps"], sim, span),
            "batch_met": s["batch_met"],
            "batch_requests": s["batch_requests"], "mean_kv_gib": ep.mean_kv_gib,
            "cotenant_served_share": s["cotenant_served_share"],
            "shed": s["rejected_by_reason"].get("shed", 0), "sim_s": sim,
            "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def _capacity(job: tuple) -> dict:
    """Bisect ``arm``'s capacity at :data:`TARGET`: ``(cfg, lever, trace, arm, known)``."""
    cfg, lever, trace, arm, known = job
    known = dict(known)
    runs: list[dict] = []

    def att(scale: float) -> float:
        runs.append(_run((cfg, lever, trace, cfg.split, arm, scale)))
        return runs[-1]["interactive_attainment"]

    cap = find_capacity(att, TARGET, known, tolerance=cfg.tolerance)
    above = [s for s, a in known.items() if a < TARGET and s > cap]
    return {"arm": arm.name, "capacity": cap, "fails_at": min(above) if above else None,
            "runs": runs}


def tune_score(lever: str, row: dict) -> float:
    """What best static maximises on the training split for ``lever``, per run: interactive
    goodput (admission), or the oracle's own score (batch_share: interactive met - violations +
    1e-4 per batch token met, per simulated second)."""
    if lever == "batch_share":
        a = row["interactive_attainment"]
        met = row["interactive_goodput_rps"]
        violated = met * (1 - a) / a if a > 0 else 0.0
        return met - violated + OracleConfig.batch_token_value * row["batch_goodput_tps"]
    return row["interactive_goodput_rps"]


def pick_best(scores: dict[str, Sequence[float]]) -> str:
    """The key with the highest summed score (ties: the first)."""
    return max(scores, key=lambda k: sum(scores[k]))


def frontier_best(points: Sequence[dict], target: float = TARGET) -> dict:
    """The static frontier's choice: the smallest mean KV among points that hold ``target``
    interactive attainment, else the point of highest attainment."""
    holding = [p for p in points if p["interactive_attainment"] >= target]
    if holding:
        return min(holding, key=lambda p: (p["mean_kv_gib"], -p["interactive_attainment"]))
    return max(points, key=lambda p: (p["interactive_attainment"], -p["mean_kv_gib"]))


def gain(figure: str, oracle: float | None, best: float | None) -> float | None:
    """The oracle's gain over best static on ``figure``: ``oracle / best - 1`` (higher is
    better), for memory ``1 - oracle / best`` (less is better); None when either is missing."""
    if oracle is None or best is None or not best:
        return None
    return 1 - oracle / best if figure == "memory" else oracle / best - 1


def verdict(gains: Sequence[float | None], bar: float = ORACLE_GAIN_BAR) -> str:
    """``worth learning`` iff some gain is at least ``bar``."""
    known = [g for g in gains if g is not None]
    if not known:
        return "not measured"
    return "worth learning" if max(known) >= bar - 1e-12 else "not worth learning"


# ----------------------------------------------------------------------------- one cell
class Cell:
    """One (lever, trace): its arms, runs and figures."""

    def __init__(self, cfg: HeadroomConfig, lever: str, trace: str, anchor: Knobs,
                 l_star: float, pool: ProcessPoolExecutor, log: Callable[[str], None]) -> None:
        self.cfg, self.lever, self.trace, self.pool, self.log = cfg, lever, trace, pool, log
        self.base = knob_spec(anchor)
        self.l_star = l_star
        self.out: dict = {"lever": lever, "trace": trace_label(trace), "anchor": self.base,
                          "l_star": l_star, "figures": {}, "runs": [], "tuning": {}}

    def runs(self, jobs: list[tuple[Arm, float]], part: str | None = None) -> list[dict]:
        part = part or self.cfg.split
        rows = list(self.pool.map(_run, [(self.cfg, self.lever, self.trace, part, a, s)
                                         for a, s in jobs]))
        if part == self.cfg.split:
            self.out["runs"] += rows
        return rows

    def arms(self) -> dict[str, Arm]:
        base, lever = self.base, self.lever
        if lever == "knobs":
            return {"static": Arm("static", knob_spec(DEFAULT_KNOBS)),
                    "best-static": Arm("best-static", base),
                    "oracle": Arm("oracle", base, DEFAULT_CANDIDATES)}
        if lever == "admission":
            static = override(base, "admission", "fcfs")
            scales = [self.l_star * m for m in (1.0, *self.cfg.multiples)]
            choices = {f"{p}@{s:g}": override(override(base, "admission", p),
                                              "admission_slack", f"{s:g}")
                       for p, s in ADMISSION_STATIC}
            best = choices[self.tune(choices, scales)]
            return {"static": Arm("static", static), "best-static": Arm("best-static", best),
                    "oracle": Arm("oracle", best, f"{base};{ADMISSION_GRID}")}
        if lever == "batch_share":
            choices = {f"{s:g}": override(base, "batch_share", f"{s:g}") for s in BATCH_SHARES}
            best = choices[self.tune(choices, [self.l_star])]
            return {"static": Arm("static", override(base, "batch_share", "1")),
                    "best-static": Arm("best-static", best),
                    "oracle": Arm("oracle", best, f"{base};{BATCH_GRID}")}
        if lever == "kv":  # the grid's other knobs are the anchor's
            return {"static": Arm("static", base),
                    "oracle": Arm("oracle", base, KV_CANDIDATES, KV_MEMORY_PRICE)}
        raise ValueError(f"unknown lever {lever!r}; expected one of {', '.join(LEVERS)}")

    def tune(self, choices: dict[str, str], scales: Sequence[float]) -> str:
        """Best static's choice on the training split at ``scales`` (by :func:`tune_score`)."""
        keys = list(choices)
        rows = self.runs([(Arm(k, choices[k]), s) for k in keys for s in scales], part="train")
        scores = {k: [tune_score(self.lever, r) for r in rows if r["arm"] == k] for k in keys}
        chosen = pick_best(scores)
        self.out["tuning"] = {"scales": list(scales), "scores": scores, "chosen": chosen}
        self.log(f"  best static's {self.lever} on the training split: {chosen} "
                 f"(scores {', '.join(f'{k} {sum(v):.3f}' for k, v in scores.items())})")
        return chosen

    def run(self) -> dict:
        cfg, figs = self.cfg, FIGURES[self.lever]
        arms = self.arms()
        self.out["arms"] = {k: asdict(a) for k, a in arms.items()}
        L = self.l_star
        if self.lever == "kv":
            return self.run_kv(arms)
        loads = {L, L * 1.1} if "capacity" in figs else {L}
        if "past" in figs:
            loads |= {L * m for m in cfg.multiples}
        jobs = [(arms[a], s) for s in sorted(loads) for a in ARMS]
        jobs.sort(key=lambda j: not j[0].grid)  # the oracle's long runs first
        rows = self.runs(jobs)
        at = {(r["arm"], r["scale"]): r for r in rows}
        f = self.out["figures"]
        if "capacity" in figs:
            cjobs = [(cfg, self.lever, self.trace, arms[a],
                      {s: r["interactive_attainment"] for (n, s), r in at.items() if n == a})
                     for a in ARMS]
            caps = list(self.pool.map(_capacity, cjobs))
            for c in caps:
                self.out["runs"] += c["runs"]
            f["capacity"] = {c["arm"]: c["capacity"] for c in caps}
            f["capacity_fails_at"] = {c["arm"]: c["fails_at"] for c in caps}
        if "batch" in figs:
            f["batch"] = {a: (at[a, L]["batch_goodput_tps"]
                              if at[a, L]["interactive_attainment"] >= TARGET else None)
                          for a in ARMS}
            f["batch_attainment"] = {a: at[a, L]["interactive_attainment"] for a in ARMS}
        if "past" in figs:
            for m in cfg.multiples:
                f[f"past_{m:g}x"] = {
                    a: (at[a, L * m]["interactive_goodput_rps"]
                        / at[a, L]["interactive_goodput_rps"]
                        if at[a, L]["interactive_goodput_rps"] else None) for a in ARMS}
        return self.out

    def run_kv(self, arms: dict[str, Arm]) -> dict:
        cfg, L = self.cfg, self.l_star
        points = {f"ratio={r:g}": Arm(f"ratio={r:g}", override(self.base, "ratio", f"{r:g}"))
                  for r in KV_RATIOS}
        jobs = [(arms["oracle"], L * m) for m in cfg.kv_loads]
        jobs += [(a, L * m) for m in cfg.kv_loads for a in points.values()]
        rows = self.runs(jobs)
        static_ratio = f"ratio={one_setting(self.base).knobs.kv_cache_ratio:g}"
        for m in cfg.kv_loads:
            at = [r for r in rows if r["scale"] == L * m]
            front = [r for r in at if r["arm"] in points]
            best = frontier_best(front)
            pick = {"static": next(r for r in front if r["arm"] == static_ratio),
                    "best-static": best, "oracle": next(r for r in at if r["arm"] == "oracle")}
            self.out["figures"][f"memory_{m:g}x"] = {
                a: (r["mean_kv_gib"] if r["interactive_attainment"] >= TARGET else None)
                for a, r in pick.items()}
            self.out["figures"][f"memory_{m:g}x_detail"] = {
                a: {"arm": r["arm"], "attainment": r["interactive_attainment"],
                    "mean_kv_gib": r["mean_kv_gib"],
                    "cotenant_served_share": r["cotenant_served_share"]}
                for a, r in pick.items()}
        return self.out


# ----------------------------------------------------------------------------- report
def figure_rows(cells: Sequence[dict]) -> list[dict]:
    """One row per (lever, trace, figure): the three arms, the oracle's gain, and the lever's
    verdict over all its rows."""
    rows = []
    for c in cells:
        for name, vals in c["figures"].items():
            if name.endswith("_detail") or name in ("batch_attainment", "capacity_fails_at"):
                continue
            kind = name.split("_")[0]
            row = {"lever": c["lever"], "trace": c["trace"], "figure": name,
                   **{a: vals.get(a) for a in ARMS},
                   "gain": gain(kind, vals.get("oracle"), vals.get("best-static"))}
            above = c["figures"].get("capacity_fails_at", {})
            if kind == "capacity" and above.get("oracle") and above.get("best-static"):
                # the bisection brackets: the least and the most the gain can be
                row["gain_range"] = (vals["oracle"] / above["best-static"] - 1,
                                     above["oracle"] / vals["best-static"] - 1)
            rows.append(row)
    by_lever: dict[str, list] = {}
    for r in rows:
        by_lever.setdefault(r["lever"], []).append(r["gain"])
    for r in rows:
        r["verdict"] = verdict(by_lever[r["lever"]])
    return rows


def _fmt(figure: str, v: float | None) -> str:
    if v is None:
        return "misses 99%" if figure.startswith(("memory", "batch")) else "-"
    if figure.startswith("capacity"):
        return f"x{v:.3f}"
    if figure.startswith("batch"):
        return f"{v:,.0f} tok/s"
    if figure.startswith("memory"):
        return f"{v:.2f} GiB"
    return f"{v:.1%}"


FIGURE_NAMES = {"capacity": "capacity @99% interactive", "batch": "batch goodput @ L*",
                "memory": "mean KV GiB holding 99%", "past": "goodput share of goodput @ L*"}


def print_table(cells: Sequence[dict]) -> None:
    print(f"| lever | trace | figure | static | best static | {ORACLE_LABEL} | oracle vs best "
          "static | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for r in figure_rows(cells):
        kind, _, load = r["figure"].partition("_")
        name = FIGURE_NAMES[kind] + (f" at {load} L*" if load else "")
        g = "-" if r["gain"] is None else f"{r['gain']:+.1%}"
        if "gain_range" in r:
            g += " ({:+.1%} .. {:+.1%})".format(*r["gain_range"])
        print(f"| {r['lever']} | {r['trace']} | {name} | "
              + " | ".join(_fmt(r["figure"], r[a]) for a in ARMS) + f" | {g} | {r['verdict']} |")
    for c in cells:
        extra = []
        if c.get("tuning"):
            extra.append(f"best static's choice {c['tuning']['chosen']}")
        for name, d in c["figures"].items():
            if name.endswith("_detail"):
                extra.append(name.removesuffix("_detail") + ": " + "; ".join(
                    f"{a} {v['arm']} {v['attainment']:.2%} {v['mean_kv_gib']:.2f} GiB "
                    f"co-tenant {v['cotenant_served_share']:.1%}" for a, v in d.items()))
            if name == "batch_attainment":
                extra.append("interactive attainment @ L*: " + ", ".join(
                    f"{a} {v:.2%}" for a, v in d.items()))
        print(f"- {c['lever']} on {c['trace']} (L* x{c['l_star']:.3f}, anchor {c['anchor']}): "
              + "; ".join(extra))
    print(oracle_cost(cells))


def oracle_cost(cells: Sequence[dict]) -> str:
    """The oracle's simulated seconds per wall (and CPU) second over its runs, per lever."""
    parts = []
    for lever in dict.fromkeys(c["lever"] for c in cells):
        runs = [r for c in cells if c["lever"] == lever for r in c["runs"]
                if r["arm"] == "oracle"]
        if runs:
            sim = sum(r["sim_s"] for r in runs)
            parts.append(f"{lever} {sim / sum(r['wall_s'] for r in runs):.1f} "
                         f"({sim / sum(r['cpu_s'] for r in runs):.1f} per CPU s, {len(runs)} "
                         "runs)")
    return "oracle cost, simulated s per wall s: " + "; ".join(parts)


# ----------------------------------------------------------------------------- main
def load(paths: Sequence[Path]) -> list[dict]:
    cells: dict[tuple, dict] = {}
    for p in paths:
        if p.exists():
            for c in json.loads(p.read_text())["cells"]:
                cells[c["lever"], c["trace"]] = c
    return list(cells.values())


def best_static_capacity(cfg: HeadroomConfig, trace: str, anchor: Knobs) -> float:
    """``L*``: best static's capacity at 99% interactive attainment, the default levers."""
    arm = Arm("best-static", knob_spec(anchor))
    return _capacity((cfg, "knobs", trace, arm, {}))["capacity"]


def main(argv: list[str] | None = None) -> int:
    import tyro

    cfg = tyro.cli(HeadroomConfig, args=argv, description=__doc__.splitlines()[0])
    if cfg.report:
        cells = load(cfg.report)
    else:
        for lever in cfg.levers:
            if lever not in LEVERS:
                raise SystemExit(f"--levers: unknown lever {lever!r}; expected one of "
                                 f"{', '.join(LEVERS)}")
        cells = load([cfg.out]) if cfg.out else []
        done = {(c["lever"], c["trace"]) for c in cells}
        l_stars = {c["trace"]: c["l_star"] for c in cells}
        t0 = time.perf_counter()

        def log(msg: str) -> None:
            print(f"[{time.perf_counter() - t0:6.0f} s] {msg}", file=sys.stderr, flush=True)

        with ProcessPoolExecutor(max_workers=max(1, cfg.workers)) as pool:
            for lever in cfg.levers:
                for trace in (t for t in cfg.traces if t in LEVERS[lever]):
                    if (lever, trace_label(trace)) in done:
                        continue
                    anchor = best_static_knobs(trace, part="train")
                    label = trace_label(trace)
                    if label not in l_stars:
                        l_stars[label] = best_static_capacity(cfg, trace, anchor)
                        log(f"{label}: best static {knob_spec(anchor)}, L* "
                            f"x{l_stars[label]:.3f}")
                    log(f"{lever} on {label} ...")
                    cells.append(Cell(cfg, lever, trace, anchor, l_stars[label], pool, log).run())
                    log(f"{lever} on {label} done")
                    if cfg.out:
                        cfg.out.parent.mkdir(parents=True, exist_ok=True)
                        cfg.out.write_text(json.dumps({"config": json.loads(json.dumps(
                            asdict(cfg), default=str)), "cells": cells}, indent=1) + "\n")
    if cfg.json:
        print(json.dumps({"cells": cells, "table": figure_rows(cells)}))
    else:
        print_table(cells)
    return 0


if __name__ == "__main__":
    sys.exit(main())
