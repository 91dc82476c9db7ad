"""What a snapshot of the engine costs against a replay, for the lookahead oracle.

    PYTHONPATH=$PWD python scripts/bench_fork.py --trace azure-conv --rate-scale 1.5 --at 60 200 400

A lookahead oracle needs the engine's state at ``t`` once per candidate. Three ways to get it,
timed side by side in one run at a few points of a session (decided every interval, so the
interval counters are as short as they are in use):

- replay: rebuild the engine and re-run the window from 0 to ``t`` with the same knobs;
- deepcopy: ``copy.deepcopy(engine)`` (every request of the trace, finished and future);
- fork: ``Engine.fork(horizon_s)`` (requests in flight and those arriving within the horizon).

Also prints what one candidate's look ahead over the horizon costs after a fork, the unit a
search multiplies by its candidates, and with ``--grids`` what a whole search of each candidate
grid costs at the same points, side by side (a search per grid, the first grid's time the
reference):

    PYTHONPATH=$PWD python scripts/bench_fork.py --trace mixed --at 100 302 400 600 --grids \
        "window=5;chunk=256,512,1024,2048,4096,8192,16384;ratio=0.95;batch_share=0,0.5,1" \
        "window=5;chunk=1024;ratio=0.95;batch_share=0,0.25,0.5,1"
"""

from __future__ import annotations

import copy
import functools
import time
from dataclasses import dataclass

import tyro

from agents.oracle import parse_candidates, search
from env.session import ServingSession
from env.traces import rate_scale, split
from env.traces.resolve import resolve_trace
from runtime.knobs import DEFAULT_KNOBS


def _best_of(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _replay_to(trace, t: float) -> None:
    """What an oracle without snapshots pays per candidate: the window again from 0 to ``t``."""
    again = ServingSession(trace, knobs=DEFAULT_KNOBS)
    while again.now < t:
        again.step(DEFAULT_KNOBS)


def _look_ahead(engine, horizon_s: float) -> None:
    engine.fork(horizon_s).run_until(engine.now + horizon_s)


@dataclass
class Args:
    """Where to measure."""

    trace: str = "azure-conv"
    """the trace spec"""
    split: str = "eval"
    """train | eval | all"""
    rate_scale: float = 1.0
    """load, x the trace's own rate"""
    at: tuple[float, ...] = (60.0, 300.0, 600.0)
    """session times (simulated s) at which to measure"""
    horizon_s: float = 10.0
    """how far a fork looks ahead (only arrivals within it are copied)"""
    repeat: int = 5
    """timings are the best of this many (half as many for the slow replay and deepcopy)"""
    grids: tuple[str, ...] = ()
    """candidate grids (the oracle's grammar) whose whole search is timed at each point"""


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    trace = split(resolve_trace(args.trace), args.split)
    if args.rate_scale != 1.0:
        trace = rate_scale(trace, args.rate_scale)
    session = ServingSession(trace, knobs=DEFAULT_KNOBS)
    print(f"{args.trace} ({args.split}) x{args.rate_scale:g}: {len(trace)} requests, "
          f"horizon {args.horizon_s:g} s, best of {args.repeat}")
    print("| t s | in flight | replay 0..t ms | deepcopy ms | fork ms | look ahead ms | "
          "replay/fork | deepcopy/fork |")
    print("|---|---|---|---|---|---|---|---|")
    grids = [parse_candidates(g) for g in args.grids]
    searches = []
    for t in sorted(args.at):
        while session.now < t:
            session.step(DEFAULT_KNOBS)
        engine = session.engine
        now = engine.now

        rep = _best_of(functools.partial(_replay_to, trace, now), max(1, args.repeat // 2))
        deep = _best_of(functools.partial(copy.deepcopy, engine), max(1, args.repeat // 2))
        fork = _best_of(functools.partial(engine.fork, args.horizon_s), args.repeat)
        ahead = _best_of(functools.partial(_look_ahead, engine, args.horizon_s),
                         args.repeat) - fork
        inflight = len(engine.running) + len(engine.waiting)
        print(f"| {now:.1f} | {inflight} | {rep * 1e3:.1f} | {deep * 1e3:.2f} | {fork * 1e3:.3f} | "
              f"{ahead * 1e3:.2f} | {rep / fork:.0f}x | {deep / fork:.0f}x |")
        backlog = len(engine.waiting_batch) + sum(r.is_batch for r in engine.running)
        searches.append((now, inflight, backlog, [_best_of(functools.partial(
            search, engine, g, args.horizon_s), 1) for g in grids]))
    if grids:
        print("\n| t s | in flight | batch in flight | "
              + " | ".join(f"search of grid {i + 1} ({len(g)} candidates) ms"
                           for i, g in enumerate(grids)) + " | grid 1 / others |")
        print("|---|---|---|" + "---|" * len(grids) + "---|")
        for now, inflight, backlog, times in searches:
            print(f"| {now:.1f} | {inflight} | {backlog} | "
                  + " | ".join(f"{x * 1e3:.0f}" for x in times) + " | "
                  + ", ".join(f"{times[0] / x:.1f}x" for x in times[1:]) + " |")
        totals = [sum(s[3][i] for s in searches) for i in range(len(grids))]
        print("| all | | | " + " | ".join(f"{x * 1e3:.0f}" for x in totals) + " | "
              + ", ".join(f"{totals[0] / x:.1f}x" for x in totals[1:]) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
