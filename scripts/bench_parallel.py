"""The arena and the best-static grid search on a local Ray against the process pool, side by
side in one run: identical results, and Ray's overhead.

    python scripts/bench_parallel.py                      # 2 workers, ABBA order
    python scripts/bench_parallel.py --order AB --trace azure-conv --rate-scales 1,2

Each workload runs on the process pool (A) and on a local Ray of ``--workers`` CPUs (B) in the
order ``--order`` gives (ABBA by default, so that a machine getting slower or faster during the
run weighs on both alike), and the script checks that every result is identical to the last
digit (the arena rows without their ``wall_s``, the grid search's table) before it reports the
wall time of each and the ratio B / A. Ray's start-up (``ray.init``, once, before the first B) is
reported on its own and counted once in a last ratio: a running cluster does not pay it. The
pool starts its processes in every arena and grid search (inside the timings); Ray's workers
stay up between them. On a shared machine the absolute times
vary; the ratio of runs interleaved in one process is the figure to read.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

import tyro


@dataclass
class Args:
    trace: str = "synthetic"
    """trace of both workloads"""
    controllers: str = "static,pid,aimd,heuristic"
    """arena controllers"""
    rate_scales: str = "1,2,4"
    """arena rate scales"""
    capacity: bool = True
    """include the arena's capacity bisections"""
    grid_windows: tuple[float, ...] = (5.0, 60.0)
    """grid search: batch windows (ms)"""
    grid_chunks: tuple[int, ...] = (512, 2048, 8192)
    """grid search: prefill chunks (tokens)"""
    grid_ratios: tuple[float, ...] = (0.5, 0.9)
    """grid search: KV cache ratios"""
    grid_scales: tuple[float, ...] = (1.0, 2.0)
    """grid search: tuning rate scales"""
    workers: int = 2
    """pool processes, and CPUs of the local Ray"""
    order: str = "ABBA"
    """A: process pool, B: local Ray; the order the runs go in"""
    json: bool = False
    """print one JSON object"""


def run_arena(args: Args, ray: bool) -> tuple[dict, float]:
    from agents.arena import evaluate

    t0 = time.perf_counter()
    res = evaluate([args.trace], [c for c in args.controllers.split(",") if c],
                   [float(s) for s in args.rate_scales.split(",")], part="eval",
                   capacity=args.capacity, workers=args.workers, ray=ray, progress=False)
    wall = time.perf_counter() - t0
    for r in res["rows"]:
        r.pop("wall_s")
        r.pop("timeline", None)
    res.pop("wall_s")
    return res, wall


def run_grid(args: Args, ray: bool) -> tuple[dict, float]:
    from agents.controllers.best_static import grid_search

    grid = {"batch_window_ms": args.grid_windows, "prefill_chunk_tokens": args.grid_chunks,
            "kv_cache_ratio": args.grid_ratios}
    t0 = time.perf_counter()
    res = grid_search(args.trace, scales=args.grid_scales, grid=grid, workers=args.workers,
                      ray=ray, progress=False)
    wall = time.perf_counter() - t0
    res.pop("seconds")
    return res, wall


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    if set(args.order) - {"A", "B"} or not {"A", "B"} <= set(args.order):
        print(f"bench_parallel: --order must use both A and B and nothing else, got "
              f"{args.order!r}", file=sys.stderr)
        return 2
    from agents.parallel import import_ray, init_ray

    ray = import_ray()
    walls: dict[str, dict[str, list[float]]] = {"arena": {"A": [], "B": []},
                                                "grid": {"A": [], "B": []}}
    results: dict[str, dict[str, object]] = {"arena": {}, "grid": {}}
    start_s = None
    load = [os.getloadavg()[0]]
    try:
        for backend in args.order:
            if backend == "B" and start_s is None:
                t0 = time.perf_counter()
                init_ray(args.workers)
                start_s = time.perf_counter() - t0
            for name, fn in (("arena", run_arena), ("grid", run_grid)):
                res, wall = fn(args, backend == "B")
                walls[name][backend].append(wall)
                prev = results[name].setdefault(backend, res)
                if res != prev:
                    raise AssertionError(f"{name}: two runs on {backend} differ")
                print(f"{name} on {'Ray' if backend == 'B' else 'the pool'}: {wall:.1f} s",
                      file=sys.stderr)
            load.append(os.getloadavg()[0])
    finally:
        if ray.is_initialized():
            ray.shutdown()
    out = {"workers": args.workers, "order": args.order, "ray_start_s": start_s,
           "load_avg_1min": load, "cpus": os.cpu_count(), "workloads": {}}
    for name in walls:
        a, b = sum(walls[name]["A"]), sum(walls[name]["B"])
        out["workloads"][name] = {
            "identical": results[name]["A"] == results[name]["B"],
            "pool_s": walls[name]["A"], "ray_s": walls[name]["B"], "ray_over_pool": b / a}
    a = sum(sum(walls[n]["A"]) for n in walls)
    b = sum(sum(walls[n]["B"]) for n in walls)
    out["all"] = {"ray_over_pool": b / a, "ray_with_start_over_pool": (b + start_s) / a}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"machine: {os.cpu_count()} CPUs shared with other jobs, 1-minute load average "
              f"{min(load):.1f}-{max(load):.1f} during the run; order {args.order}")
        print(f"Ray start-up (once): {start_s:.1f} s\n")
        print("| workload | identical | process pool s | local Ray s | Ray / pool |")
        print("|---|---|---|---|---|")
        for name, w in out["workloads"].items():
            print(f"| {name} | {'yes' if w['identical'] else 'NO'} | "
                  f"{' + '.join(f'{x:.1f}' for x in w['pool_s'])} | "
                  f"{' + '.join(f'{x:.1f}' for x in w['ray_s'])} | {w['ray_over_pool']:.3f} |")
        print(f"\nboth workloads: Ray / pool {out['all']['ray_over_pool']:.3f}; counting Ray's "
              f"start-up once: {out['all']['ray_with_start_over_pool']:.3f}")
    return 0 if all(w["identical"] for w in out["workloads"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
