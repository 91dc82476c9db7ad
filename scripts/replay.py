"""Replay a request trace through the serving engine with fixed knobs and report SLO attainment.

    python scripts/replay.py --trace synthetic
    python scripts/replay.py --trace azure-conv --rate-scale 2 --window-ms 10 --chunk 2048 \\
        --kv-ratio 0.9 --json
    python scripts/replay.py --trace mooncake --model llama3.1-8b --accelerator h100 \\
        --memory-gib 40 --slo long-context
    python scripts/replay.py --trace mixed --batch-share 0.5 --admission shed --cotenant

``--trace`` takes ``synthetic`` (the embedded default), ``azure-conv``, ``azure-code`` (read
from ../shared/traces or $BATCHPILOT_TRACES_DIR), ``mixed`` (azure-conv plus batch drops;
``mixed:SPEC`` for the drops on another trace) or the path of a trace file (Azure CSV,
Mooncake JSONL, BurstGPT CSV or a plain ``arrival_s,prompt_tokens,output_tokens`` CSV; each may
carry an ``slo_class`` column).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Literal

import tyro

from env.engine_choice import EngineChoice
from env.replay import replay
from env.traces import rate_scale, split
from env.traces.resolve import TRACE_ALIASES, resolve_trace
from runtime.engine.profile import Profile
from runtime.engine.roofline import ProfileChoice
from runtime.knobs import DEFAULT_KNOBS, Knobs


@dataclass
class Args(ProfileChoice, EngineChoice):
    trace: str = "synthetic"
    """synthetic | azure-conv | azure-code | mixed | mixed:SPEC | PATH"""
    split: Literal["train", "eval", "all"] = "all"
    """the first 40 minutes (train), the rest (eval), or all"""
    rate_scale: float = 1.0
    """compress time by this factor (2 = twice the request rate)"""
    window_ms: float = DEFAULT_KNOBS.batch_window_ms
    """batch window, milliseconds"""
    chunk: int = DEFAULT_KNOBS.prefill_chunk_tokens
    """prefill chunk, tokens"""
    kv_ratio: float = DEFAULT_KNOBS.kv_cache_ratio
    """KV cache ratio"""
    seed: int = 0
    """seed of the synthetic trace and of the mixed workload's drops"""
    step_by_step: bool = False
    """no closed-form decode stretches (the reference path, slower)"""
    json: bool = False
    """print one JSON object"""


def parse_args(argv: list[str] | None = None) -> Args:
    epilog = "traces: " + "; ".join(f"{k}: {v}" for k, v in TRACE_ALIASES.items())
    return tyro.cli(Args, args=argv, description=__doc__.splitlines()[0] + "\n\n" + epilog)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        trace = split(resolve_trace(args.trace, seed=args.seed), args.split)
        if args.rate_scale != 1.0:
            trace = rate_scale(trace, args.rate_scale)
        config = args.engine_config(seed=args.seed, fast_path=not args.step_by_step)
        # the knobs the engine runs with: the flags', with the config's batch share and slack
        knobs = config.start_knobs(Knobs(args.window_ms, args.chunk, args.kv_ratio))
        profile = Profile.load(args.spec())
        trace.check_classes(config.slo_classes)
    except (ValueError, FileNotFoundError) as e:
        print(f"replay: {e}", file=sys.stderr)
        return 2
    result = replay(trace, knobs, profile=profile, config=config)
    out = {"trace": args.trace, "split": args.split, "rate_scale": args.rate_scale,
           "knobs": knobs.as_dict(), "profile": profile.name, **result.as_dict()}
    if trace.skipped:
        out["skipped_rows"] = trace.skipped
    if trace.num_reordered:
        out["reordered_rows"] = trace.num_reordered
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"trace {args.trace} ({args.split}, rate x{args.rate_scale:g}), "
          f"{len(trace)} requests over {trace.duration_s:.0f} s; profile {profile.name}")
    print(f"knobs: window {knobs.batch_window_ms:g} ms, chunk {knobs.prefill_chunk_tokens} "
          f"tokens, KV ratio {knobs.kv_cache_ratio:g}, batch share {knobs.batch_share:g}, "
          f"admission slack {knobs.admission_slack:g} ({config.admission})")
    rows = [("SLO attainment", f"{out['slo_attainment']:.2%}"),
            ("interactive attainment", f"{out['interactive_attainment']:.2%}"),
            ("batch: requests / met / goodput",
             f"{out['batch_requests']} / {out['batch_met']} / "
             f"{out['batch_goodput_tps']:.0f} tokens/s"),
            ("rejected by reason", ", ".join(f"{k} {v}" for k, v in
                                             out["rejected_by_reason"].items()) or "none"),
            ("mean KV / co-tenant served", f"{out['mean_kv_gib']:.2f} GiB / "
                                           f"{out['cotenant_served_share']:.1%}"),
            ("goodput", f"{out['goodput_rps']:.2f} req/s"),
            ("finished / rejected", f"{out['finished']} / {out['rejected']}"),
            ("TTFT p50 / p99", f"{out['ttft_p50_s']:.3f} s / {out['ttft_p99_s']:.3f} s"),
            ("TPOT p50 / p99", f"{out['tpot_p50_s'] * 1e3:.1f} ms / "
                               f"{out['tpot_p99_s'] * 1e3:.1f} ms"),
            ("preemptions / OOMs", f"{out['preemptions']} / {out['ooms']}"),
            ("simulated / wall", f"{out['sim_seconds']:.0f} s / {out['wall_s']:.2f} s "
                                 f"({out['speedup']:.0f}x)")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    if trace.skipped:
        print(f"  skipped rows: {trace.skipped}")
    if trace.num_reordered:
        print(f"  reordered rows: {trace.num_reordered} were out of arrival order (re-sorted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
