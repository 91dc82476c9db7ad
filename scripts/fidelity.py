"""Simulator fidelity: replay one window through the torch executor (wall-clock) and through the
simulator calibrated from it, and report how far they disagree.

    python scripts/fidelity.py --json
    .venv-vllm/bin/python scripts/fidelity.py --engine vllm --trace azure-conv --json
    python scripts/fidelity.py --device cuda --shape llama2-7b --profile h200-measured.json --json

Calibration. The simulator's profile is the shipped (or given) measured profile, with its cost
coefficients refit in situ when ``--calibrate-seconds`` > 0 (the default): a calibration replay of
another window (seed + 1000, same load) runs first on the torch executor, and the cost model is
fitted (NNLS on relative error) to its iterations. On a shared machine whose speed drifts with the
other tenants' load, this calibrates the simulator against the executor as it runs now; the
measured window itself is never used for fitting.

Figures (relative errors are |simulated - measured| / measured):

- ``iter_err_median``, ``iter_err_p90``: every iteration of the measured replay, its batch priced
  by the simulator's cost model against its latency as the engine lived it (the executor's time
  plus the scheduler's work before it; OOM refusals excluded);
- ``ttft_p50_err``, ``ttft_p99_err``, ``tpot_p50_err``, ``tpot_p99_err``: the replays' percentiles;
- ``attainment_diff``: simulated minus measured SLO attainment, in percentage points (signed);
- ``shipped_profile_iter_err_median``: the same iteration error with the shipped profile's own
  coefficients (how far the offline grid fit carries to serving conditions);
- ``retime`` (with ``--retime N`` > 0, the default on the CPU): where the iteration error comes
  from. A random sample of N measured iterations is rebuilt (same decode contexts and prefill
  chunks on synthetic requests) and timed again, ``--retime-repeats`` times each in shuffled
  passes: ``repeat_noise_median`` is how far one timing of a batch lies from the median of its
  own repeats (the measurement noise: no cost model can predict single timings closer than
  about this); ``replay_over_retimed_by_decile`` is the in-replay time over the re-timed median,
  per tenth of the replay (the host's speed drifting during the replay, and since);
  ``shape_fit_err_median`` is the error of the cost model fitted to the re-timed medians
  themselves (how well the executor's cost has the cost model's shape once noise and drift are
  averaged out), and ``calibrated_err_vs_retimed_median`` the simulator's cost model against
  those medians.

The SLO targets default to values scaled to the shape's speed (see ``serve_replay.py``).

Timing. ``--timer wall`` replays in wall-clock time (the serving runtime as deployed);
``--timer thread`` (CPU only) times every forward pass by the CPU time of its thread and replays
in engine time, as a dedicated core would run it. On a shared CPU host the wall clock measures
the other tenants as much as the executor, so the CPU figures in docs/results.md use ``thread``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tyro

from runtime.engine.executor import Executor
from runtime.engine.profile import CostModel, Profile
from runtime.engine.profiling import (
    SyntheticRequests,
    batch_features,
    fit_cost_model,
    make_batch,
    predict,
)
from runtime.engine.recording import RecordingExecutor, record_features
from runtime.engine.sim_executor import SimulatedExecutor
from runtime.gc_pause import gc_paused
from runtime.locations import profiles_dir
from runtime.vllm import PROFILE_NAME

# the sibling script: a module of the package batchpilot_scripts when installed, a top-level
# module beside this file when run as `python scripts/fidelity.py`
if __package__:
    from .serve_replay import (
        ServeReplayArgs,
        build_torch_executor,
        run,
        run_vllm,
        start_vllm,
        warm_up,
    )
else:
    from serve_replay import (
        ServeReplayArgs,
        build_torch_executor,
        run,
        run_vllm,
        start_vllm,
        warm_up,
    )

DEFAULT_PROFILES = {"tiny": "cpu-tiny-measured.json"}
"""the measured profile of each shape, a file in :func:`profiles_dir`"""



def rel(sim: float, meas: float) -> float:
    return abs(sim - meas) / meas if meas > 0 else (0.0 if sim == 0 else float("inf"))


KINDS = ("decode_only", "prefill_only", "mixed")


def kind_masks(x: np.ndarray) -> dict[str, np.ndarray]:
    """Feature rows by iteration kind (no prefill tokens / no decodes / both)."""
    return {"decode_only": x[:, 1] == 0, "prefill_only": x[:, 3] == 0,
            "mixed": (x[:, 1] > 0) & (x[:, 3] > 0)}


def retime(executor: Executor, rec: RecordingExecutor, cost: CostModel, kv_cache_ratio: float,
           samples: int, repeats: int, seed: int) -> dict:
    """Time a random sample of the recorded iterations again (see the module docstring)."""
    ran = [i for i, r in enumerate(rec.records) if not r.oom]
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(ran, size=min(samples, len(ran)), replace=False))
    num_blocks = executor.memory.num_kv_blocks(kv_cache_ratio)
    executor.resize_kv(num_blocks, {})
    synth = SyntheticRequests(num_blocks, executor.memory.block_size)
    batches = []
    for i in idx:
        decodes, prefills = rec.shapes[i]
        b = make_batch([synth.decode(c) for c in decodes],
                       [synth.prefill(s, n) for s, n in prefills])
        synth.release(b)  # one batch runs at a time: they share the blocks
        batches.append(b)
    times: list[list[float]] = [[] for _ in batches]
    with gc_paused():
        for k in range(repeats + 1):  # the first pass warms up
            for j in rng.permutation(len(batches)):
                res = executor.execute(batches[j], kv_cache_ratio)
                if res.oom:
                    raise RuntimeError(f"re-timing iteration {idx[j]}: out of memory, though "
                                       "it ran in the replay")
                if k:
                    times[j].append(res.duration_s)
    t = np.array(times)
    med = np.median(t, axis=1)
    x = np.stack([batch_features(b) for b in batches])
    replay_t = np.array([rec.records[i].duration_s for i in idx])
    ratio = replay_t / med
    shape_cost = fit_cost_model(x, med)
    shape_err = np.abs(predict(shape_cost, x) - med) / med
    masks = kind_masks(x)
    return {
        "iterations": int(len(idx)), "repeats": repeats,
        "repeat_noise_median": float(np.median(np.abs(t - med[:, None]) / med[:, None])),
        "replay_over_retimed_p10_p50_p90": [float(v) for v in np.percentile(ratio, [10, 50, 90])],
        "replay_over_retimed_by_decile": [float(np.median(c)) for c in np.array_split(ratio, 10)
                                          if len(c)],
        "shape_fit_err_median": float(np.median(shape_err)),
        "shape_fit_err_median_by_kind": {k: float(np.median(shape_err[m]))
                                         for k, m in masks.items() if m.any()},
        "calibrated_err_vs_retimed_median": float(np.median(
            np.abs(predict(cost, x) - med) / med)),
        "shape_fit_cost": dataclasses.asdict(shape_cost),
    }


@dataclass
class Args(ServeReplayArgs):
    rate: float = 20.0
    """Poisson rate, requests/s"""
    duration: float = 40.0
    """window length, seconds"""
    profile: Path | None = None
    """the measured profile (default: the shipped one for the shape)"""
    calibrate_seconds: float = 20.0
    """length of the in-situ calibration window (0: use the profile as is)"""
    json: bool = False
    """print only the JSON figures"""
    out: Path | None = None
    """also write the JSON (with details)"""
    retime: int | None = None
    """measured iterations to time again for the noise/drift/shape breakdown (0: skip; default
    120 on the CPU, 0 on CUDA, where it would cost minutes of accelerator time)"""
    retime_repeats: int = 4
    """timings of every re-timed iteration"""
    repeats: int = 3
    """--engine vllm: (calibration, measured) replay pairs, one after the other; each figure
    is reported as the median of the pairs with its range"""
    save_profile: Path | None = None
    """--engine vllm: write the profile calibrated in situ, its cost model fitted to every
    pair's calibration steps together (the steps as the interval loop lived them, scheduling and
    the controller included), to this file: the profile for the arena and for training
    (``--profile``) on this machine"""


FIGURES = ("iter_err_median", "iter_err_p90", "iter_bias_median", "ttft_p50_err",
           "ttft_p99_err", "tpot_p50_err", "tpot_p99_err", "attainment_diff",
           "attainment_measured", "attainment_simulated", "shipped_profile_iter_err_median",
           "controller_cost_ratio")
"""the figures of one replay pair (see the module docstring)"""


def compare_runs(profile: Profile, shipped: Profile, x: np.ndarray, y: np.ndarray,
                 measured, simulated) -> dict:
    """The figures of a measured replay (its iterations' features ``x`` and times ``y``)
    against the simulated replay of the same window."""
    err = np.abs(predict(profile.cost, x) - y) / y
    shipped_err = np.abs(predict(shipped.cost, x) - y) / y
    m, s = measured.as_dict(), simulated.as_dict()
    return {
        "iter_err_median": float(np.median(err)),
        "iter_err_p90": float(np.percentile(err, 90)),
        "iter_bias_median": float(np.median((predict(profile.cost, x) - y) / y)),
        "iter_err_median_by_kind": {k: float(np.median(err[v]))
                                    for k, v in kind_masks(x).items() if v.any()},
        "ttft_p50_err": rel(s["ttft_p50_s"], m["ttft_p50_s"]),
        "ttft_p99_err": rel(s["ttft_p99_s"], m["ttft_p99_s"]),
        "tpot_p50_err": rel(s["tpot_p50_s"], m["tpot_p50_s"]),
        "tpot_p99_err": rel(s["tpot_p99_s"], m["tpot_p99_s"]),
        "attainment_diff": 100.0 * (s["slo_attainment"] - m["slo_attainment"]),
        "attainment_measured": m["slo_attainment"],
        "attainment_simulated": s["slo_attainment"],
        "shipped_profile_iter_err_median": float(np.median(shipped_err)),
        "shipped_profile_iter_bias_median": float(np.median((predict(shipped.cost, x) - y) / y)),
        "iterations_measured": m["iterations"], "iterations_simulated": s["iterations"],
        "requests": m["requests"],
        "measured": {k: m[k] for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
                                       "slo_attainment", "preemptions", "ooms", "finished",
                                       "wall_s")},
        "simulated": {k: s[k] for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
                                        "slo_attainment", "preemptions", "ooms", "finished")},
    }


def step_features(engine) -> tuple[np.ndarray, np.ndarray]:
    """A vLLM replay's steps: feature rows and the step times as the loop lived them."""
    x = np.array([st.features for st in engine.steps], dtype=np.float64).reshape(-1, 5)
    y = np.array([st.lived_s for st in engine.steps], dtype=np.float64)
    return x, y


def save_in_situ(base: Profile, calibration: list[tuple[np.ndarray, np.ndarray]], args: Args,
                 version: str, path: Path) -> dict:
    """Fit the cost model to every calibration replay's steps together and write ``base`` with
    it to ``path``, marked measured in situ; returns what the file's ``fit`` records."""
    x = np.concatenate([cx for cx, _ in calibration])
    y = np.concatenate([cy for _, cy in calibration])
    cost = fit_cost_model(x, y)
    fit = {"method": "in situ: the cost model fitted to vLLM's steps as the interval loop lived "
                     "them (scripts/fidelity.py --save-profile)",
           "engine": f"vllm {version}", "steps": int(len(y)),
           "replays": len(calibration), "seconds_each": args.calibrate_seconds,
           "rate_rps": args.rate, "trace": args.trace, "controller": args.controller,
           "fit_rel_err_median": float(np.median(np.abs(predict(cost, x) - y) / y)),
           "load_1m": os.getloadavg()[0], "machine": platform.node()}
    profile = dataclasses.replace(base, name=path.stem, kind="measured", cost=cost,
                                  fit={**base.fit, "in_situ": fit})
    path.parent.mkdir(parents=True, exist_ok=True)
    profile.save(path)
    return {"path": str(path), "cost": dataclasses.asdict(cost), **fit}


def fidelity_vllm(args: Args, log) -> dict:
    """The fidelity figures against a live vLLM engine: ``repeats`` pairs of a calibration
    replay (the next window of the trace, or the Poisson stream of seed + 1000) and a measured
    replay through vLLM, the simulator calibrated on the first replaying the second."""
    shipped = Profile.load(args.profile or profiles_dir() / PROFILE_NAME)
    t0 = time.perf_counter()
    server = start_vllm(args)
    log(f"vLLM {server.version} started in {server.startup_s:.0f} s")
    cargs = copy.copy(args)
    cargs.duration = args.calibrate_seconds
    if args.trace is not None:
        cargs.start = args.start + args.duration
    else:
        cargs.seed = args.seed + 1000
    pairs = []
    calibration: list[tuple[np.ndarray, np.ndarray]] = []
    for k in range(args.repeats):
        log(f"pair {k + 1}/{args.repeats}: calibration replay ({cargs.duration:g} s) ...")
        _, cal = run_vllm(cargs, server, record_steps=True)
        cx, cy = step_features(cal)
        calibration.append((cx, cy))
        cost = fit_cost_model(cx, cy)
        profile = dataclasses.replace(shipped, name=shipped.name + "+in-situ", cost=cost)
        log(f"pair {k + 1}/{args.repeats}: measured replay ({args.duration:g} s) ...")
        measured, eng = run_vllm(args, server, record_steps=True)
        x, y = step_features(eng)
        simulated = run(args, SimulatedExecutor(profile), realtime=False)
        pair = compare_runs(profile, shipped, x, y, measured, simulated)
        pair["calibration"] = {"iterations": int(len(cy)), "cost": dataclasses.asdict(cost),
                               "fit_rel_err_median": float(np.median(
                                   np.abs(predict(cost, cx) - cy) / cy))}
        pair["conservation"] = eng.check_conservation()
        pair["controller_cost"] = eng.controller_cost(
            sum(r.decide_us for r in measured.intervals) * 1e-6)
        pair["load_1m"] = os.getloadavg()[0]
        pair["controller_cost_ratio"] = pair["controller_cost"]["ratio"]
        pairs.append(pair)
        log(f"  iteration error median {pair['iter_err_median']:.1%}, attainment "
            f"{pair['attainment_measured']:.1%} measured / {pair['attainment_simulated']:.1%} "
            f"simulated")
    out: dict = {}
    if args.save_profile is not None:
        out["saved_profile"] = save_in_situ(shipped, calibration, args, server.version,
                                            args.save_profile)
        log(f"in-situ profile -> {args.save_profile}")
    for key in FIGURES:
        values = [p[key] for p in pairs]
        out[key] = float(np.median(values))
        out[key + "_range"] = [float(min(values)), float(max(values))]
    out.update({"engine": f"vllm {server.version}", "vllm_startup_s": server.startup_s,
                "pairs": pairs, "profile": str(args.profile or PROFILE_NAME),
                "controller": args.controller, "trace": args.trace, "start_s": args.start,
                "duration_s": args.duration, "calibrate_seconds": args.calibrate_seconds,
                "rate_rps": args.rate, "repeats": args.repeats,
                "seconds": time.perf_counter() - t0,
                "note": "a pair's vLLM replays run in wall-clock time on a shared machine: the "
                        "ranges are the spread over the pairs, load_1m the machine's load"})
    return out


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    log = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr))
    if args.engine == "vllm":
        out = fidelity_vllm(args, log)
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps({k: v for k, v in out.items() if k != "pairs"},
                         indent=None if args.json else 2))
        return 0
    if args.retime is None:
        args.retime = 120 if args.device == "cpu" else 0

    default_name = DEFAULT_PROFILES.get(args.shape)
    profile_path = args.profile or (profiles_dir() / default_name if default_name else None)
    if profile_path is None:
        raise SystemExit(f"--profile is required for shape {args.shape}")
    shipped = Profile.load(profile_path)

    t = time.perf_counter()
    torch_ex = build_torch_executor(args)
    if torch_ex.memory != shipped.memory:
        log(f"note: the profile's memory model differs from the executor's:\n  profile  "
            f"{shipped.memory}\n  executor {torch_ex.memory}")
    warm_up(torch_ex)
    profile = shipped
    calib: dict = {}
    if args.calibrate_seconds > 0:
        log(f"calibration replay ({args.calibrate_seconds:g} s, seed {args.seed + 1000}) ...")
        cargs = copy.copy(args)
        cargs.seed, cargs.duration = args.seed + 1000, args.calibrate_seconds
        crec = RecordingExecutor(torch_ex)
        clags: list[float] = []
        run(cargs, crec, realtime=args.timer == "wall", lags=clags)
        x, y = record_features(crec.records, clags or None)
        cost = fit_cost_model(x, y)
        profile = dataclasses.replace(shipped, name=shipped.name + "+in-situ", cost=cost)
        calib = {"iterations": int(len(y)), "seconds": args.calibrate_seconds,
                 "fit_rel_err_median": float(np.median(np.abs(predict(cost, x) - y) / y)),
                 "cost": dataclasses.asdict(cost)}
    rec = RecordingExecutor(torch_ex, keep_shapes=args.retime > 0)
    log(f"measured replay ({args.timer} timer, {args.duration:g} s window) ...")
    lags: list[float] = []
    measured = run(args, rec, realtime=args.timer == "wall", lags=lags)
    torch_s = time.perf_counter() - t
    log("simulated replay ...")
    t = time.perf_counter()
    simulated = run(args, SimulatedExecutor(profile), realtime=False)
    sim_s = time.perf_counter() - t

    x, y = record_features(rec.records, lags or None)
    out = {
        **compare_runs(profile, shipped, x, y, measured, simulated),
        "engine_lag_per_iter_s": measured.as_dict().get("lag_per_call_s", 0.0),
        "timer": args.timer,
        "calibration": calib,
        "profile": str(profile_path), "shape": args.shape, "device": args.device,
        "controller": args.controller, "rate_rps": args.rate, "duration_s": args.duration,
        "torch_replays_s": torch_s, "sim_replay_s": sim_s,
    }
    if args.retime > 0:
        log(f"re-timing {args.retime} measured iterations x {args.retime_repeats} ...")
        out["retime"] = retime(torch_ex, rec, profile.cost, args.ratio, args.retime,
                               args.retime_repeats, args.seed)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**out, "intervals_measured":
                                        [r.as_dict() for r in measured.intervals],
                                        "intervals_simulated":
                                        [r.as_dict() for r in simulated.intervals]},
                                       indent=2) + "\n")
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
