"""The arena's command line: every controller on the same windows and loads, side by side.

    batchpilot evaluate --trace azure-conv,azure-code --split eval \\
        --controllers static,best-static,pid,aimd,heuristic,oracle --rate-scales 1,2,4,8 \\
        [--admission shed --admission-slack 0.5] [--cotenant] [--match-static 0.68] \\
        [--oracle.candidates ratio=0.5,0.6,0.7,0.8,0.9,0.95 --oracle.memory-price 0.01]

Prints a markdown table (per-class figures, shed and late counts, memory and the co-tenant's
share served), each controller's capacity, its goodput past capacity and the static frontier
(:mod:`agents.arena`), then the scorecard, every controller beside best static and the oracle
with pass or fail against the project's targets (:mod:`agents.scorecard`, docs/scorecard.md; run
at ``--scorecard-loads``), and writes the results as JSON (the scorecard under ``"scorecard"``)
and the plots, the Pareto plot of attainment against KV memory among them, to ``--out``
(:mod:`agents.report`). Controllers are named as the registry names them
(:mod:`agents.registry`); the oracle is an upper bound and is labelled so everywhere; how it
searches is ``--oracle.*`` (:class:`agents.oracle.OracleConfig`: the bracketed example searches
the KV ratio at a memory price, as the co-tenant memory target needs).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import tyro

from agents.arena import (
    FRONTIER_RATIOS,
    LOAD_NEIGHBOURS,
    PAST_CAPACITY_MULTIPLES,
    RATIO_KNOB,
    SCORECARD_LOADS,
    evaluate,
)
from agents.controllers.best_static import parse_grid
from agents.oracle import CAUSAL_NAME, FORECAST_NAME, SEARCH_NAMES, OracleConfig
from agents.registry import BASELINES, HINDSIGHT, EvalSpec, make_controller
from agents.report import fixed_settings_table, markdown_table, plot, scorecard_table, write_json
from agents.scorecard import REFERENCE
from agents.vllm_arena import VllmArena, main_vllm
from agents.windows import split_trace
from env.engine_choice import EngineChoice
from runtime.engine.roofline import ProfileChoice
from runtime.knobs import KNOB_NAMES, KNOB_SPECS
from runtime.session import DEFAULT_INTERVAL_S


@dataclass
class Config(ProfileChoice, EngineChoice):
    trace: str = "synthetic"
    """traces, comma-separated: synthetic | azure-conv | azure-code | mixed | mixed:SPEC | PATH"""
    split: Literal["train", "eval", "all"] = "eval"
    """the part of each trace that is replayed (one window)"""
    controllers: str = ",".join(BASELINES)
    """controllers, comma-separated: static, best-static (the highest capacity on the train
    split), hindsight-static (the highest capacity on the evaluated window itself: not
    deployable), pid, aimd, heuristic, oracle (an upper bound: the lookahead search anchored on
    hindsight static, or a fixed setting's run where that does better), oracle-search (the
    search anchored on best static, no proven bound), oracle-forecast (the search on a
    persistence forecast of the arrivals: how much of its gain is foresight), oracle-causal
    (arrivals and output lengths forecast: what a controller could know), policy:PATH (an ONNX
    policy, or a policy set's JSON: each trace gets its workload's policy),
    policy-unguarded:PATH (the same without its out-of-distribution guard), module:factory"""
    rate_scales: str = "1,2,4,8"
    """rate scales, comma-separated positive numbers (2 = twice the trace's request rate)"""
    interval_s: float = DEFAULT_INTERVAL_S
    """the decision interval, engine seconds"""
    tuning_scales: str | None = None
    """rate scales best-static is tuned at, comma-separated (default 0.5,0.75,1,1.5,2: around
    the trace's own rate; a trace far past one accelerator's capacity needs lower ones)"""
    capacity: bool = True
    """find each controller's capacity by bisection (--no-capacity skips it)"""
    capacity_controllers: str | None = None
    """the controllers whose capacity is searched, comma-separated (default: every one; the
    oracle's bisection costs most of an oracle run, and best static's sets the loads past
    capacity and the scorecard loads)"""
    past_capacity: str = ",".join(f"{m:g}" for m in PAST_CAPACITY_MULTIPLES)
    """loads past capacity, comma-separated multiples of best static's capacity at 99%: every
    controller runs there and its goodput is reported as a share of its goodput at its own
    capacity (needs best-static among --controllers and the capacity search; "" skips)"""
    load_neighbours: str = ",".join(f"{m:g}" for m in LOAD_NEIGHBOURS)
    """multiples of each load past best static's capacity at 99% at which every controller but
    the lookahead searches runs again, comma-separated: the never-worse figure there is the mean
    margin over the load and these neighbours, since past capacity one replay's attainment moves
    by up to a point when the load moves by half a percent (needs best-static among
    --controllers and the capacity search; "" judges each load on one replay)"""
    frontier_ratios: str = ",".join(f"{r:g}" for r in FRONTIER_RATIOS)
    """KV ratios of the static frontier, comma-separated: best static's pick with each held
    fixed, replayed at every rate scale (default: its grid's ratios, read from its own search;
    another ratio is searched, then cached; "" skips)"""
    match_static: float | None = None
    """also run every controller at the load where the static default (first come first
    served, classes ignored) attains this share of interactive requests (e.g. 0.68: the
    scorecard's headline target)"""
    scorecard_loads: str = ",".join(f"{m:g}" for m in SCORECARD_LOADS)
    """the scorecard's loads (co-tenant memory, batch goodput, their shares of the oracle's
    gain), comma-separated multiples of best static's capacity at 99% (needs best-static among
    --controllers and the capacity search; "" skips)"""
    scorecard_rate_scales: str = ""
    """the scorecard's loads as rate scales instead, comma-separated (every trace)"""
    static_grid: str = ""
    """the knob grid of best static's and hindsight static's capacity searches,
    ``window=..;chunk=..;ratio=..`` (an axis left out keeps the default grid's: windows 5, 20,
    60 ms; chunks 256 to 8,192; ratios 0.5 to 0.95)"""
    hindsight_frontier: bool = True
    """with hindsight-static among --controllers, replay its grid at the scorecard loads (the
    memory target's hindsight frontier; --no-hindsight-frontier skips it)"""
    oracle: OracleConfig = field(default_factory=OracleConfig)
    """how the oracle searches (the co-tenant search of the KV ratio: the candidates
    agents.oracle.KV_CANDIDATES at the price KV_MEMORY_PRICE; docs/scorecard.md)"""
    workers: int = 2
    """worker processes (or the CPUs of a local Ray with --ray)"""
    ray: bool = False
    """run the jobs on Ray: the cluster at RAY_ADDRESS or a local Ray of --workers CPUs
    (docs/ray.md); RAY_ADDRESS alone also does"""
    out: Path = Path("runs/evaluate")
    """folder for the plots and results.json"""
    json: bool = False
    """print one JSON object instead of the table"""
    report: Path | None = None
    """print the tables of a results.json an earlier run wrote (the scorecard among them) and run
    nothing"""
    engine: Literal["sim", "vllm"] = "sim"
    """sim: the arena on the simulator; vllm: on a live vLLM engine at the two loads the
    calibrated simulator names (agents/vllm_arena.py, docs/vllm.md; in the vLLM venv, with
    --profile the profile measured on it)"""
    vllm: VllmArena = field(default_factory=VllmArena)
    """--engine vllm: the window, loads and repeats"""

    def scales(self) -> list[float]:
        return positive_numbers(self.rate_scales, "--rate-scales", empty=False)

    def names(self, text: str, flag: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        if not names:
            raise ValueError(f"{flag} names nothing: {text!r}")
        return names


def positive_numbers(text: str, flag: str, *, empty: bool = True) -> list[float]:
    """Comma-separated positive numbers from a flag's text; ``empty``: none at all is allowed.
    Raises ValueError naming ``flag``."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = [math.nan]
    if (not values and not empty) or not all(0 < v < math.inf for v in values):
        raise ValueError(f"{flag} must be comma-separated positive numbers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    cfg = tyro.cli(Config, args=argv, description=__doc__.splitlines()[0])
    if cfg.engine == "vllm":
        return main_vllm(cfg)
    if cfg.report is not None:
        try:
            result = json.loads(cfg.report.read_text())
        except (OSError, ValueError) as e:
            print(f"evaluate: --report {cfg.report}: {e}", file=sys.stderr)
            return 2
        print(tables(result))
        return 0
    try:
        scales = cfg.scales()
        controllers = cfg.names(cfg.controllers, "--controllers")
        traces = cfg.names(cfg.trace, "--trace")
        if cfg.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {cfg.workers}")
        if cfg.oracle.arrivals != "trace" or cfg.oracle.output_lengths != "trace":
            raise ValueError(f"--oracle.arrivals {cfg.oracle.arrivals} --oracle.output-lengths "
                             f"{cfg.oracle.output_lengths}: the oracle row is the upper bound "
                             f"and sees the trace; name {FORECAST_NAME} or {CAUSAL_NAME} among "
                             "--controllers for its search on forecasts")
        profile = cfg.spec()
        config = cfg.engine_config()
        tuning = (tuple(float(x) for x in cfg.tuning_scales.split(",") if x.strip())
                  if cfg.tuning_scales else None)
        past = positive_numbers(cfg.past_capacity, "--past-capacity")
        searched = (None if cfg.capacity_controllers is None else
                    cfg.names(cfg.capacity_controllers, "--capacity-controllers"))
        for c in searched or ():
            if c not in controllers:
                raise ValueError(f"--capacity-controllers: {c} is not among --controllers")
        neighbours = positive_numbers(cfg.load_neighbours, "--load-neighbours")
        if 1.0 in neighbours:
            raise ValueError("--load-neighbours: 1 is the load itself, not a neighbour")
        ratios = positive_numbers(cfg.frontier_ratios, "--frontier-ratios")
        card_loads = positive_numbers(cfg.scorecard_loads, "--scorecard-loads")
        card_scales = positive_numbers(cfg.scorecard_rate_scales, "--scorecard-rate-scales")
        ratio = KNOB_SPECS[KNOB_NAMES.index(RATIO_KNOB)]
        for r in ratios:
            if not ratio.low <= r <= ratio.high:
                raise ValueError(f"--frontier-ratios: {r:g} is outside the KV ratio's range "
                                 f"[{ratio.low:g}, {ratio.high:g}]")
        grid = parse_grid(cfg.static_grid) if cfg.static_grid else None
        spec = EvalSpec(traces[0], cfg.split, profile, cfg.interval_s, config,
                        tuning_scales=tuning, oracle=cfg.oracle, static_grid=grid)
        for t in traces:  # fail fast on a missing or unreadable trace, or one too short
            split_trace(t, cfg.split)
        for c in controllers:
            if c not in ("best-static", HINDSIGHT, *SEARCH_NAMES):  # these search first
                make_controller(c, spec)  # fail fast on a bad name or policy file
    except (ValueError, FileNotFoundError) as e:
        print(f"evaluate: {e}", file=sys.stderr)
        return 2
    result = evaluate(traces, controllers, scales, part=cfg.split, interval_s=cfg.interval_s,
                      profile_path=profile, config=config, capacity=cfg.capacity,
                      workers=cfg.workers, ray=cfg.ray or None, progress=not cfg.json,
                      match_static=cfg.match_static, tuning_scales=tuning,
                      past_capacity=past, frontier_ratios=ratios, scorecard_loads=card_loads,
                      scorecard_rate_scales=card_scales, oracle=cfg.oracle,
                      capacity_controllers=searched, neighbours=neighbours, static_grid=grid,
                      hindsight_frontier=cfg.hindsight_frontier)
    plots = plot(result["rows"], cfg.out, result["frontier"])
    path = write_json(result, cfg.out / "results.json")
    if cfg.json:
        print(json.dumps(result))
        return 0
    print(tables(result))
    if past and not result["past_capacity"]:
        print(f"\n(no goodput past capacity: it needs {REFERENCE} among --controllers and the "
              "capacity search)")
    print(f"\nplots: {', '.join(str(p) for p in plots)}\nresults: {path}")
    return 0


def tables(result: dict) -> str:
    """The arena's tables (the rows at neighbouring loads left out: they only feed the
    never-worse target, and results.json keeps them), then the scorecard, as markdown."""
    rows = [r for r in result["rows"] if "neighbour_of" not in r]
    # a results.json written before the scorecard had its name keeps it under "figures"
    card = result["scorecard"] if "scorecard" in result else result["figures"]
    fixed = fixed_settings_table(result.get("fixed_settings", {}))
    return (markdown_table(rows, result["capacity"], result["past_capacity"],
                           result["frontier"]) + ("\n\n" + fixed if fixed else "")
            + "\n\n" + scorecard_table(card))


if __name__ == "__main__":
    sys.exit(main())
