"""Replay a trace window through the engine on the torch executor in wall-clock time, with a
controller retuning the knobs every decision interval; print the run's summary as JSON.

    python scripts/serve_replay.py --device cpu --shape tiny --rate 8 --duration 20
    python scripts/serve_replay.py --trace azure-conv --start 600 --duration 20 --controller pid
    python scripts/serve_replay.py --executor sim \
        --profile checkpoints/profiles/cpu-tiny-measured.json

``--controller`` is any name of the controller registry (:mod:`agents.registry`): ``static``
(the knobs given), ``pid``, ``aimd``, ``policy:PATH``, or ``module:factory`` for any other
controller (called with no arguments; it answers ``decide(observation) -> Decision``). The
summary has the fields of the simulated replay (``Engine.summary()``) plus ``wall_s``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from steady_cpu import steady_allocator  # noqa: E402

from agents.registry import EvalSpec, make_controller  # noqa: E402
from env.traces import LogNormalLengths, Trace, poisson, time_window  # noqa: E402
from env.traces.lengths import Z_99  # noqa: E402
from env.traces.resolve import resolve_trace  # noqa: E402
from runtime.engine.engine import EngineConfig  # noqa: E402
from runtime.engine.profile import Profile  # noqa: E402
from runtime.engine.slo import SloTarget  # noqa: E402
from runtime.knobs import Knobs  # noqa: E402
from runtime.session import DEFAULT_HISTORY, RunResult, SimulatedPacer, replay  # noqa: E402
from runtime.wallclock import WallClockPacer  # noqa: E402

# Defaults sized for the CPU tiny shape (an iteration takes a few milliseconds): targets that
# put attainment in the middle of its range under the default load, so errors show.
TINY_SLO = {"ttft_s": 0.25, "tpot_s": 0.02}
H200_SLO = {"ttft_s": 1.0, "tpot_s": 0.05}


def add_common_args(ap: argparse.ArgumentParser) -> None:
    """Arguments shared with ``scripts/fidelity.py``."""
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--shape", choices=("tiny", "llama2-7b"), default="tiny")
    ap.add_argument("--budget-gib", type=float, default=None)
    ap.add_argument("--checkpoint", default=None, help="HF safetensors file or folder")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--timer", choices=("wall", "thread"), default="wall",
                    help="iteration timer of the torch executor: wall clock, or the thread's "
                         "CPU time (CPU, one thread; a replay then runs in engine time, not "
                         "wall-clock time)")
    ap.add_argument("--trace", default=None,
                    help="synthetic | azure-conv | azure-code | PATH of any trace format "
                         "(default: a Poisson stream sized for the shape)")
    ap.add_argument("--start", type=float, default=0.0,
                    help="window start in the trace, seconds from its first request")
    ap.add_argument("--duration", type=float, default=20.0, help="window length, seconds")
    ap.add_argument("--rate", type=float, default=8.0, help="Poisson rate, requests/s")
    ap.add_argument("--prompt-median", type=float, default=200.0)
    ap.add_argument("--output-median", type=float, default=24.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--controller", default="static", help="static | pid | module:factory")
    ap.add_argument("--interval", type=float, default=1.0, help="decision interval, seconds")
    ap.add_argument("--window-ms", type=float, default=5.0)
    ap.add_argument("--chunk", type=int, default=512, help="prefill_chunk_tokens")
    ap.add_argument("--ratio", type=float, default=0.9, help="kv_cache_ratio")
    ap.add_argument("--ttft-slo", type=float, default=None,
                    help="TTFT target, seconds (default: 0.25 tiny, 1.0 llama2-7b)")
    ap.add_argument("--tpot-slo", type=float, default=None,
                    help="TPOT target, seconds (default: 0.02 tiny, 0.05 llama2-7b)")
    ap.add_argument("--max-num-seqs", type=int, default=256)


PROMPT_SIGMA, PROMPT_MAX = 0.8, 1024
OUTPUT_SIGMA, OUTPUT_MAX = 0.7, 128
"""log-normal spread and clip of the Poisson window's lengths (sized for the tiny model)"""


def lengths(median: float, sigma: float, max_tokens: int) -> LogNormalLengths:
    """The log-normal of this median and sigma, as the trace generators parameterise it."""
    return LogNormalLengths(mean=median * math.exp(sigma * sigma / 2),
                            p99=median * math.exp(Z_99 * sigma), max_tokens=max_tokens)


def window_from_args(args: argparse.Namespace) -> Trace:
    """``--trace`` (any trace the project reads) cut to ``[--start, --start + --duration)``, or
    a Poisson stream of ``--rate`` requests/s from the project's generator."""
    if args.trace is not None:
        return time_window(resolve_trace(args.trace), args.start, args.start + args.duration)
    return poisson(args.rate, args.duration, seed=args.seed,
                   prompt=lengths(args.prompt_median, PROMPT_SIGMA, PROMPT_MAX),
                   output=lengths(args.output_median, OUTPUT_SIGMA, OUTPUT_MAX))


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    slo = TINY_SLO if args.shape == "tiny" else H200_SLO
    target = SloTarget(args.ttft_slo if args.ttft_slo is not None else slo["ttft_s"],
                       args.tpot_slo if args.tpot_slo is not None else slo["tpot_s"])
    return EngineConfig(max_num_seqs=args.max_num_seqs, slo_classes={"interactive": target},
                        default_slo_class="interactive")


def build_torch_executor(args: argparse.Namespace, **kw):
    import torch

    from runtime.engine.torch_executor import TorchExecutor

    torch.set_num_threads(args.threads)
    steady_allocator()  # the same allocator settings the profile was measured under
    return TorchExecutor.for_shape(args.shape, device=args.device, budget_gib=args.budget_gib,
                                   checkpoint=args.checkpoint, max_num_seqs=args.max_num_seqs,
                                   timer=args.timer, **kw)


def warm_up(executor, iterations: int = 5) -> None:
    """Run a few small batches so that allocator and kernel start-up costs are paid before the
    clock starts (the pool is resized again by the engine)."""
    from runtime.engine.profiling import SyntheticRequests, make_batch

    blocks = 256
    executor.resize_kv(blocks, {})
    synth = SyntheticRequests(blocks, executor.memory.block_size)
    batches = [make_batch([], [synth.prefill(0, 256)]),
               make_batch([synth.decode(64) for _ in range(8)], [synth.prefill(0, 64)])]
    for _ in range(iterations):
        for b in batches:
            executor.execute(b, 0.5)


def run(args: argparse.Namespace, executor, realtime: bool,
        lags: list[float] | None = None) -> RunResult:
    """Replay the window of ``args`` on ``executor``; in wall-clock time when ``realtime``
    (every iteration's lag then goes to ``lags`` when given)."""
    w = window_from_args(args)
    knobs = Knobs.clamped(args.window_ms, args.chunk, args.ratio)
    config = engine_config_from_args(args)
    spec = EvalSpec(args.trace or "synthetic", "train", None, args.interval, config, knobs)
    pacer = (WallClockPacer(on_lag=lags.append if lags is not None else None) if realtime
             else SimulatedPacer())
    return replay(executor, w.arrival_s, w.prompt_tokens, w.output_tokens,
                  decider=make_controller(args.controller, spec), knobs=knobs,
                  interval_s=args.interval, pacer=pacer, config=config,
                  history=DEFAULT_HISTORY)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap)
    ap.add_argument("--executor", choices=("torch", "sim"), default="torch",
                    help="torch: wall-clock serving; sim: the simulated replay of --profile")
    ap.add_argument("--profile", type=Path, default=None, help="profile for --executor sim")
    ap.add_argument("--out", type=Path, default=None, help="also write the result here")
    args = ap.parse_args(argv)

    t = time.perf_counter()
    if args.executor == "torch":
        executor = build_torch_executor(args)
        warm_up(executor)
        realtime = args.timer == "wall"
    else:
        from runtime.engine.sim_executor import SimulatedExecutor
        executor = SimulatedExecutor(Profile.load(args.profile))
        realtime = False
    setup_s = time.perf_counter() - t
    w = window_from_args(args)
    print(f"replaying {len(w)} requests ({w.source}) on {args.executor} "
          f"({args.shape}, {args.device}), controller {args.controller}", file=sys.stderr)
    res = run(args, executor, realtime)
    out = {"summary": res.as_dict(), "setup_s": setup_s, "window": w.source,
           "intervals": [r.as_dict() for r in res.intervals]}
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["summary"], indent=2))
    return out


if __name__ == "__main__":
    main()
