"""Derived profiles against published measurements: replay the published fixed workload through
the simulator and report the ratio of the simulated figure to the published one.

    python scripts/check_published.py [--json]

Each row of :data:`PUBLISHED` is a figure from a public table for the same model, precision and
accelerator as a catalogue profile. Throughput rows: ``batch`` requests of ``input`` prompt
tokens and ``output`` output tokens all arrive at once (the tables' static batch), the engine
runs them with ``max_num_seqs = batch`` and the knobs below, and the figure is output tokens
over the time until the last one finishes. Latency rows: one request of ``input`` tokens and
one output token; the figure is its TTFT in ms. The simulated time is split into the cost
model's terms, each named by the efficiency assumption that sets it, so that a ratio far from 1
says which assumption to move (a term that dominates and is off moves its efficiency by about
the ratio). Every figure here is derived; none was measured on an accelerator.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import numpy as np
import tyro

from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.executor import GIB, Batch, IterationResult
from runtime.engine.profile import Profile
from runtime.engine.roofline import ACCELERATORS, derive
from runtime.engine.sim_executor import SimulatedExecutor
from runtime.knobs import Knobs

TRTLLM_A100_FP16 = ("TensorRT-LLM docs/source/performance.md (v0.6.1 tables), "
                    "A100 GPUs (FP16), gptSessionBenchmark")
"""the source of the A100 rows (its H100 and L40S tables are FP8: not comparable to bf16)"""


@dataclass(frozen=True)
class Published:
    """One published figure and the workload that produced it."""

    model: str
    """catalogue model"""
    accelerator: str
    """catalogue accelerator"""
    tp: int
    """tensor-parallel degree"""
    batch: int
    """requests in the batch"""
    input: int
    """prompt tokens per request"""
    output: int
    """output tokens per request"""
    figure: float
    """the published value: output tokens/s, or TTFT in ms when ``kind`` is ttft"""
    kind: str
    """``throughput`` or ``ttft``"""
    source: str
    """where the figure is published"""
    precision: str = "fp16"
    """the precision it was measured in (bf16 and fp16 cost the same in the roofline)"""
    per_gpu_ambiguous: bool = False
    """the table does not say whether a tensor-parallel row is per GPU or for all of them
    (its header says "out tok/s", the same release's H100 table "out tok/s/GPU"): both
    readings are reported"""


PUBLISHED: tuple[Published, ...] = (
    Published("llama2-7b", "a100", 1, 384, 128, 128, 5586, "throughput", TRTLLM_A100_FP16),
    Published("llama2-7b", "a100", 1, 60, 128, 2048, 1928, "throughput", TRTLLM_A100_FP16),
    Published("llama2-7b", "a100", 1, 52, 2048, 128, 591, "throughput", TRTLLM_A100_FP16),
    Published("llama2-7b", "a100", 2, 64, 2048, 2048, 782, "throughput", TRTLLM_A100_FP16,
              per_gpu_ambiguous=True),
    Published("llama2-70b", "a100", 4, 1280, 128, 128, 670, "throughput", TRTLLM_A100_FP16,
              per_gpu_ambiguous=True),
    Published("llama2-70b", "a100", 4, 240, 128, 2048, 525, "throughput", TRTLLM_A100_FP16,
              per_gpu_ambiguous=True),
    Published("llama2-70b", "a100", 4, 120, 2048, 128, 79, "throughput", TRTLLM_A100_FP16,
              per_gpu_ambiguous=True),
    Published("llama2-7b", "a100", 1, 1, 128, 1, 16, "ttft", TRTLLM_A100_FP16),
    Published("llama2-7b", "a100", 1, 1, 2048, 1, 133, "ttft", TRTLLM_A100_FP16),
    Published("llama2-70b", "a100", 4, 1, 128, 1, 47, "ttft", TRTLLM_A100_FP16),
    Published("llama2-70b", "a100", 4, 1, 2048, 1, 377, "ttft", TRTLLM_A100_FP16),
)
KNOBS = Knobs(5.0, 16384, 0.9)
"""the largest chunk (the tables' whole-batch context phase) and a ratio that leaves it room"""
TERMS = {"const": "weights_stream (+ launch, all-reduce latency)", "prefill": "gemm",
         "attention": "attention", "decode_seq": "decode_flops", "decode_ctx": "kv_stream",
         "allreduce": "allreduce"}
"""each cost term and the efficiency assumption that sets it"""


class TermExecutor(SimulatedExecutor):
    """The simulated executor, adding up each cost-model term of the iterations it runs."""

    def __init__(self, profile: Profile) -> None:
        super().__init__(profile)
        self.terms = dict.fromkeys(TERMS, 0.0)
        self._comm = float(profile.derivation.get("comm_token_s", 0.0))

    def execute(self, batch: Batch, kv_cache_ratio: float) -> IterationResult:
        res = super().execute(batch, kv_cache_ratio)
        if not res.oom:
            c, t = self._cost, self.terms
            t["const"] += c.const_s
            t["prefill"] += (c.prefill_token_s - self._comm) * batch.prefill_tokens
            t["attention"] += c.prefill_attn_pair_s * batch.prefill_attn_pairs
            t["decode_seq"] += (c.decode_seq_s - self._comm) * len(batch.decodes)
            t["decode_ctx"] += c.decode_ctx_token_s * batch.decode_ctx_tokens
            t["allreduce"] += self._comm * (batch.prefill_tokens + len(batch.decodes))
        return res


def replay_published(p: Published) -> dict:
    """Simulate one published workload on the derived profile (all of each accelerator's
    memory, as the tables' engines had)."""
    memory_gib = ACCELERATORS[p.accelerator].memory_bytes / GIB
    profile = derive(p.model, p.accelerator, memory_gib, p.tp)
    ex = TermExecutor(profile)
    engine = Engine(ex, KNOBS, EngineConfig(max_num_seqs=p.batch, fast_path=False))
    n = p.batch
    engine.add_requests(np.zeros(n), np.full(n, p.input), np.full(n, p.output))
    while engine.has_work():
        engine.run_until(engine.now + 10.0)
    s = engine.summary()
    if p.kind == "ttft":
        simulated = 1e3 * s.ttft_p50_s
    else:  # (run_until leaves the clock at its deadline: the makespan is the last finish)
        simulated = n * p.output / max(r.finish_s for r in engine.requests)
    total = sum(ex.terms.values())
    return {"model": p.model, "accelerator": p.accelerator, "tp": p.tp, "batch": p.batch,
            "input": p.input, "output": p.output, "kind": p.kind, "precision": p.precision,
            "published": p.figure, "simulated": simulated, "ratio": simulated / p.figure,
            "ratio_if_per_gpu": (simulated / (p.figure * p.tp) if p.per_gpu_ambiguous
                                 else None),
            "profile": profile.name, "preemptions": s.preemptions, "ooms": s.ooms,
            "rejected": s.rejected, "source": p.source,
            "time_shares": {TERMS[k]: v / total for k, v in ex.terms.items() if v > 0}}


@dataclass
class Args:
    json: bool = False
    """one JSON object per row"""


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    rows = [replay_published(p) for p in PUBLISHED]
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    print("| model | GPU x TP | batch | in / out | figure | published | simulated | "
          "sim / pub | sim / (pub x TP) | where the simulated time goes |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        unit = "TTFT ms" if r["kind"] == "ttft" else "out tok/s"
        shares = ", ".join(f"{k} {v:.0%}" for k, v in sorted(
            r["time_shares"].items(), key=lambda kv: -kv[1]) if v >= 0.05)
        print(f"| {r['model']} | {r['accelerator']} x{r['tp']} | {r['batch']} | "
              f"{r['input']} / {r['output']} | {unit} | {r['published']:,.0f} | "
              f"{r['simulated']:,.0f} | {r['ratio']:.2f} | "
              f"{'' if r['ratio_if_per_gpu'] is None else format(r['ratio_if_per_gpu'], '.2f')} "
              f"| {shares} |")
    print(f"\nsource: {rows[0]['source']}; precision fp16 (the profiles' bf16 costs the same); "
          "every simulated figure is derived from datasheets and assumed efficiencies")
    return 0


if __name__ == "__main__":
    sys.exit(main())
