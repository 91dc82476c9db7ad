"""Replay a trace window through the engine on the torch executor in wall-clock time, with a
controller retuning the knobs every decision interval; print the run's summary as JSON.

    python scripts/serve_replay.py --device cpu --shape tiny --rate 8 --duration 20
    python scripts/serve_replay.py --trace azure-conv --start 600 --duration 20 --controller pid
    python scripts/serve_replay.py --executor sim \
        --profile checkpoints/profiles/cpu-tiny-measured.json
    .venv-vllm/bin/python scripts/serve_replay.py --engine vllm --trace azure-conv --controller pid

``--controller`` is any name of the controller registry (:mod:`agents.registry`): ``static``
(the knobs given), ``pid``, ``aimd``, ``policy:PATH``, or ``module:factory`` for any other
controller (called with no arguments; it answers ``decide(observation) -> Decision``). The
summary has the fields of the simulated replay (``Engine.summary()``) plus ``wall_s``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import tyro

from agents.registry import EvalSpec, make_controller
from env.traces import LogNormalLengths, Trace, poisson, time_window
from env.traces.lengths import Z_99
from env.traces.resolve import resolve_trace
from runtime.engine.engine import EngineConfig
from runtime.engine.profile import Profile
from runtime.engine.slo import SloTarget
from runtime.knobs import Knobs
from runtime.locations import profiles_dir
from runtime.session import DEFAULT_HISTORY, RunResult, SimulatedPacer, replay
from runtime.steady_cpu import steady_allocator
from runtime.vllm import PROFILE_NAME, slo_classes_for
from runtime.wallclock import WallClockPacer

# Defaults sized for the CPU tiny shape (an iteration takes a few milliseconds): targets that
# put attainment in the middle of its range under the default load, so errors show.
TINY_SLO = {"ttft_s": 0.25, "tpot_s": 0.02}
H200_SLO = {"ttft_s": 1.0, "tpot_s": 0.05}


@dataclass
class ServeReplayArgs:
    """The window, engine, executor and controller of a wall-clock replay (shared with
    ``scripts/fidelity.py``)."""

    device: Literal["cpu", "cuda"] = "cpu"
    """torch device of the executor"""
    shape: Literal["tiny", "llama2-7b"] = "tiny"
    """model shape of the torch executor"""
    budget_gib: float | None = None
    """KV cache memory budget, GiB (default: the executor's for the shape)"""
    checkpoint: str | None = None
    """HF safetensors file or folder"""
    threads: int = 1
    """torch CPU threads"""
    timer: Literal["wall", "thread"] = "wall"
    """iteration timer of the torch executor: wall clock, or the thread's CPU time (CPU, one
    thread; a replay then runs in engine time, not wall-clock time)"""
    trace: str | None = None
    """synthetic | azure-conv | azure-code | PATH of any trace format (default: a Poisson
    stream sized for the shape)"""
    start: float = 0.0
    """window start in the trace, seconds from its first request"""
    duration: float = 20.0
    """window length, seconds"""
    rate: float = 8.0
    """Poisson rate, requests/s"""
    prompt_median: float = 200.0
    """median prompt length of the Poisson stream, tokens"""
    output_median: float = 24.0
    """median output length of the Poisson stream, tokens"""
    seed: int = 0
    """seed of the Poisson stream"""
    controller: str = "static"
    """static | pid | module:factory"""
    interval: float = 1.0
    """decision interval, seconds"""
    window_ms: float = 5.0
    """batch_window_ms of the starting knobs"""
    chunk: int = 512
    """prefill_chunk_tokens of the starting knobs"""
    ratio: float = 0.9
    """kv_cache_ratio of the starting knobs"""
    ttft_slo: float | None = None
    """TTFT target, seconds (default: 0.25 tiny, 1.0 llama2-7b)"""
    tpot_slo: float | None = None
    """TPOT target, seconds (default: 0.02 tiny, 0.05 llama2-7b)"""
    max_num_seqs: int = 256
    """most sequences in a batch"""
    engine: Literal["torch", "vllm"] = "torch"
    """the engine: the project's engine on the torch executor, or a live vLLM engine (run in
    the vLLM venv, .venv-vllm; docs/vllm.md)"""
    model: str | None = None
    """--engine vllm: the model folder (default: the tiny dummy-weight Llama, written to a
    temporary folder)"""
    kv_cache_gib: float = 1 / 16
    """--engine vllm: the KV pool vLLM allocates at start-up, GiB (the cap at the top of the
    ratio knob's range)"""


@dataclass
class Args(ServeReplayArgs):
    executor: Literal["torch", "sim"] = "torch"
    """torch: wall-clock serving; sim: the simulated replay of --profile"""
    profile: Path | None = None
    """profile for --executor sim"""
    out: Path | None = None
    """also write the result here"""


PROMPT_SIGMA, PROMPT_MAX = 0.8, 1024
OUTPUT_SIGMA, OUTPUT_MAX = 0.7, 128
"""log-normal spread and clip of the Poisson window's lengths (sized for the tiny model)"""


def lengths(median: float, sigma: float, max_tokens: int) -> LogNormalLengths:
    """The log-normal of this median and sigma, as the trace generators parameterise it."""
    return LogNormalLengths(mean=median * math.exp(sigma * sigma / 2),
                            p99=median * math.exp(Z_99 * sigma), max_tokens=max_tokens)


def window_from_args(args: ServeReplayArgs) -> Trace:
    """``--trace`` (any trace the project reads) cut to ``[--start, --start + --duration)``, or
    a Poisson stream of ``--rate`` requests/s from the project's generator."""
    if args.trace is not None:
        return time_window(resolve_trace(args.trace), args.start, args.start + args.duration)
    return poisson(args.rate, args.duration, seed=args.seed,
                   prompt=lengths(args.prompt_median, PROMPT_SIGMA, PROMPT_MAX),
                   output=lengths(args.output_median, OUTPUT_SIGMA, OUTPUT_MAX))


def vllm_slo(args: ServeReplayArgs) -> dict[str, float]:
    """--engine vllm: targets scaled to vLLM's speed, from the measured profile (``--profile``,
    else the committed one: runtime.vllm.slo_classes_for)."""
    path = getattr(args, "profile", None) or profiles_dir() / PROFILE_NAME
    target = slo_classes_for(Profile.load(path))["interactive"]
    return {"ttft_s": target.ttft_s, "tpot_s": target.tpot_s,
            "ttft_per_prompt_token_s": target.ttft_per_prompt_token_s}


def engine_config_from_args(args: ServeReplayArgs) -> EngineConfig:
    slo = (vllm_slo(args) if args.engine == "vllm" else TINY_SLO) if args.shape == "tiny" \
        else H200_SLO
    target = SloTarget(args.ttft_slo if args.ttft_slo is not None else slo["ttft_s"],
                       args.tpot_slo if args.tpot_slo is not None else slo["tpot_s"],
                       ttft_per_prompt_token_s=slo.get("ttft_per_prompt_token_s", 0.0))
    return EngineConfig(max_num_seqs=args.max_num_seqs, slo_classes={"interactive": target},
                        default_slo_class="interactive")


def build_torch_executor(args: ServeReplayArgs, **kw):
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


def run(args: ServeReplayArgs, executor, realtime: bool,
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


def start_vllm(args: ServeReplayArgs):
    """vLLM started in this process for ``--engine vllm`` (tens of seconds)."""
    import tempfile

    from runtime.vllm.engine import VllmServer, VllmSettings
    from runtime.vllm.model import write_tiny_model

    model = args.model or str(write_tiny_model(tempfile.mkdtemp(prefix="tiny-llama-")))
    return VllmServer.start(VllmSettings(model=model, kv_cache_gib=args.kv_cache_gib,
                                         max_num_seqs=args.max_num_seqs, seed=args.seed))


def run_vllm(args: ServeReplayArgs, server, record_steps: bool = False, on_interval=None):
    """Replay the window of ``args`` on a live vLLM engine under the interval loop, the
    controller behind a fail-safe (a fault holds the static knobs, vLLM keeps serving). Returns
    the run's result and the engine (its step timings when ``record_steps``)."""
    from runtime.decider.failsafe import FailSafe
    from runtime.session import run_engine
    from runtime.vllm.engine import VllmPacer

    w = window_from_args(args)
    knobs = Knobs.clamped(args.window_ms, args.chunk, args.ratio)
    config = engine_config_from_args(args)
    spec = EvalSpec(args.trace or "synthetic", "train", None, args.interval, config, knobs)
    engine = server.engine(config, knobs, seed=args.seed, record_steps=record_steps)
    engine.add_requests(w.arrival_s, w.prompt_tokens, w.output_tokens, w.slo_class)
    decider = FailSafe(make_controller(args.controller, spec), knobs)
    return run_engine(engine, VllmPacer(), decider, interval_s=args.interval,
                      on_interval=on_interval), engine


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])

    t = time.perf_counter()
    if args.engine == "vllm":
        server = start_vllm(args)
        w = window_from_args(args)
        print(f"replaying {len(w)} requests ({w.source}) on vLLM {server.version} "
              f"(started in {server.startup_s:.0f} s), controller {args.controller}",
              file=sys.stderr)
        first: list[float] = []

        def on_interval(record) -> None:
            if not first:
                first.append(time.perf_counter() - t)

        res, engine = run_vllm(args, server, on_interval=on_interval)
        out = {"summary": res.as_dict(), "setup_s": time.perf_counter() - t - res.wall_s,
               "vllm_startup_s": server.startup_s,
               "first_decision_s": first[0] if first else None,  # from the command's main
               "window": w.source, "conservation": engine.check_conservation(),
               "controller_cost": engine.controller_cost(
                   sum(r.decide_us for r in res.intervals) * 1e-6),
               "intervals": [r.as_dict() for r in res.intervals]}
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps({**out["summary"], "conservation": out["conservation"]}, indent=2))
        return 0
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
