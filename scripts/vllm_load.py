"""A trace window through a vLLM server's OpenAI completions API (loopback only), each request
at its arrival time, streamed; prints what became of every request, attainment per class and the
TTFT and TPOT percentiles (``runtime.vllm.serve.loadtest`` describes each count).

    batchpilot vllm-load --url http://127.0.0.1:8000 --model /models/tiny \\
        --trace azure-conv --start 600 --duration 20 --scale 0.3 --slo profile
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import tyro

from env.traces import rate_scale, split, time_window
from env.traces.resolve import resolve_trace
from runtime.vllm.serve.loadtest import LoadTest, LoadTestError
from runtime.vllm.serve.settings import slo_classes


@dataclass
class Args:
    """A load test of one server (see the module docstring)."""

    url: str = "http://127.0.0.1:8000"
    """the server (a loopback address: the test refuses any other)"""
    model: str = ""
    """the served model's name (its --model); required"""
    trace: str = "azure-conv"
    """synthetic | azure-conv | azure-code | PATH of any trace format"""
    part: str = "eval"
    """the trace's split: train | eval | all"""
    start: float = 0.0
    """window start, seconds of the trace after its split's first request (before scaling)"""
    duration: float = 20.0
    """seconds of arrivals sent (after scaling)"""
    scale: float = 1.0
    """rate scale (2: twice the trace's rate)"""
    slo: str = "profile"
    """the classes requests are judged by: the server's BATCHPILOT_VLLM_SLO value"""
    max_requests: int = 2000
    """send at most this many"""
    max_s: float = 600.0
    """stop after this many seconds, closing what is open"""
    seed: int = 0
    """seed of the prompts' token ids"""
    vocab_size: int = 32000
    """token ids are drawn below this (the model's vocabulary)"""


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    if not args.model:
        print("vllm-load: error: --model is required (the server's model name)", file=sys.stderr)
        return 2
    try:
        trace = rate_scale(split(resolve_trace(args.trace), args.part), args.scale)  # type: ignore
        t0 = (float(trace.arrival_s[0]) if len(trace) else 0.0) + args.start / args.scale
        w = time_window(trace, t0, t0 + args.duration)
        test = LoadTest(args.url, args.model, slo_classes(args.slo), max_requests=args.max_requests,
                        max_s=args.max_s, vocab_size=args.vocab_size, seed=args.seed)
    except (LoadTestError, ValueError, OSError) as e:
        print(f"vllm-load: error: {e}", file=sys.stderr)
        return 2
    print(f"sending {len(w)} requests of {w.source} to {args.url}", file=sys.stderr, flush=True)
    out = test.run(w.arrival_s.tolist(), w.prompt_tokens.tolist(), w.output_tokens.tolist(),
                   [str(c) for c in w.slo_class.tolist()])
    print(json.dumps(out, indent=2))
    return 0 if out["conserved"] and out["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
