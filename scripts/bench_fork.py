"""What a snapshot of the engine costs against a replay, for the lookahead oracle.

    PYTHONPATH=$PWD python scripts/bench_fork.py --trace azure-conv --rate-scale 1.5

A lookahead oracle needs the engine's state at ``t`` once per candidate. Three ways to get it,
timed side by side in one run at a few points of a session (decided every interval, so the
interval counters are as short as they are in use):

- replay: rebuild the engine and re-run the window from 0 to ``t`` with the same knobs;
- deepcopy: ``copy.deepcopy(engine)`` (every request of the trace, finished and future);
- fork: ``Engine.fork(horizon_s)`` (requests in flight and those arriving within the horizon).

Also prints what one candidate's look ahead over the horizon costs after a fork, the unit a
search multiplies by its candidates.
"""

from __future__ import annotations

import argparse
import copy
import functools
import time

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="azure-conv")
    ap.add_argument("--split", default="eval")
    ap.add_argument("--rate-scale", type=float, default=1.0)
    ap.add_argument("--at", default="60,300,600", help="comma-separated session times (s)")
    ap.add_argument("--horizon-s", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    trace = split(resolve_trace(args.trace), args.split)
    if args.rate_scale != 1.0:
        trace = rate_scale(trace, args.rate_scale)
    session = ServingSession(trace, knobs=DEFAULT_KNOBS)
    print(f"{args.trace} ({args.split}) x{args.rate_scale:g}: {len(trace)} requests, "
          f"horizon {args.horizon_s:g} s, best of {args.repeat}")
    print("| t s | in flight | replay 0..t ms | deepcopy ms | fork ms | look ahead ms | "
          "replay/fork | deepcopy/fork |")
    print("|---|---|---|---|---|---|---|---|")
    for t in sorted(float(x) for x in args.at.split(",")):
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
