"""Derive a roofline executor profile for a Llama-shaped model on a named accelerator.

    python scripts/make_roofline_profile.py \
        --out checkpoints/profiles/h200-llama2-7b-40gib-roofline.json

Every coefficient is a datasheet figure divided by an assumed efficiency; the assumptions are
written into the file's ``derivation`` field next to the numbers they produce. Use a measured
profile (``scripts/profile_executor.py``) wherever one exists.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import tyro

from runtime.engine.executor import GIB, MemoryModel
from runtime.engine.profile import CostModel, Profile

ACCELERATORS = {
    # NVIDIA H200 SXM datasheet: 141 GB HBM3e at 4.8 TB/s, 989 TFLOP/s dense bf16.
    "h200": {"name": "NVIDIA H200 SXM", "hbm_bytes": 141e9, "hbm_bw": 4.8e12,
             "bf16_flops": 989e12},
}
MODELS = {
    # Llama-2-7B: 32 layers, hidden 4096, 32 heads, 32 KV heads, MLP 11008, vocab 32000.
    "llama2-7b": {"name": "Llama-2-7B", "layers": 32, "hidden": 4096, "heads": 32,
                  "kv_heads": 32, "intermediate": 11008, "vocab": 32000, "params": 6.74e9},
}
# Assumed efficiencies. Large bf16 GEMMs reach about 80% of peak on an H200 (790 of 989 TFLOP/s
# measured with PyTorch at 8192^3); the 4096-wide GEMMs of a 7B model are smaller: 60%.
# Weight and KV streaming: a device copy reaches about 90% of HBM bandwidth (4.3 of 4.8 TB/s);
# a decode step's many small kernels reach less: 80% for weights, 70% for paged KV reads.
# Attention in prefill (FlashAttention-style) reaches about 40% of peak.
EFFICIENCY = {"gemm": 0.60, "weights_stream": 0.80, "kv_stream": 0.70, "attention": 0.40,
              "decode_flops": 1.0}
LAUNCH_OVERHEAD_S = 0.3e-3  # scheduler and kernel launches per iteration with CUDA graphs


def derive(accel: str, model: str, budget_gib: float, dtype_bytes: int = 2) -> Profile:
    a, m = ACCELERATORS[accel], MODELS[model]
    eff = EFFICIENCY
    weight_bytes = int(m["params"] * dtype_bytes)
    head_dim = m["hidden"] // m["heads"]
    kv_per_token = 2 * m["layers"] * m["kv_heads"] * head_dim * dtype_bytes
    flops_per_token = 2 * m["params"]
    attn_flops_per_pair = 4 * m["layers"] * m["hidden"]  # QK^T and PV, 2 FLOP per MAC
    # Activations per token in flight: the residual stream, QKV, attention output and the
    # gate/up/down MLP tensors of one layer alive at once, in bf16, with 2x allocator slack.
    act_per_token = 2 * dtype_bytes * (4 * m["hidden"] + 3 * m["hidden"] + 3 * m["intermediate"])
    # Fixed workspace: logits for up to 256 sampled sequences in fp32, cuBLAS/attention workspaces.
    act_fixed = 256 * m["vocab"] * 4 + 192 * 2 ** 20

    cost = CostModel(
        const_s=weight_bytes / (a["hbm_bw"] * eff["weights_stream"]) + LAUNCH_OVERHEAD_S,
        prefill_token_s=flops_per_token / (a["bf16_flops"] * eff["gemm"]),
        prefill_attn_pair_s=attn_flops_per_pair / (a["bf16_flops"] * eff["attention"]),
        # Decode GEMMs are memory-bound below ~150 sequences, so their FLOPs overlap the weight
        # read; charging each sequence its FLOPs at peak stays within 2x of max(compute, memory).
        decode_seq_s=flops_per_token / (a["bf16_flops"] * eff["decode_flops"]),
        decode_ctx_token_s=kv_per_token / (a["hbm_bw"] * eff["kv_stream"]),
    )
    block_size = 16
    memory = MemoryModel(total_bytes=int(budget_gib * GIB), weight_bytes=weight_bytes,
                         kv_bytes_per_token=kv_per_token, block_size=block_size,
                         act_fixed_bytes=act_fixed, act_bytes_per_token=act_per_token)
    block_bytes = kv_per_token * block_size
    return Profile(
        name=f"{accel}-{model}-{budget_gib:g}gib-roofline", kind="roofline",
        memory=memory, cost=cost,
        # A failed allocation surfaces after most of the forward pass was launched; the retry
        # also pays an allocator flush. Charge about one large prefill iteration.
        oom_penalty_s=0.05,
        # A pool resize drains the in-flight iteration and calls the allocator (fixed), and
        # zero-fills new memory at about half the HBM bandwidth.
        resize_fixed_s=5e-3,
        resize_per_gib_s=GIB / (0.5 * a["hbm_bw"]),
        block_copy_s=2 * block_bytes / (a["hbm_bw"] * 0.8),
        hardware={"accelerator": a["name"], "hbm_bytes": a["hbm_bytes"],
                  "hbm_bandwidth_bytes_per_s": a["hbm_bw"], "bf16_flops": a["bf16_flops"],
                  "memory_budget_gib": budget_gib},
        model={**m, "dtype": "bf16" if dtype_bytes == 2 else f"{dtype_bytes}-byte"},
        derivation={
            "note": "Derived from datasheet figures and assumed efficiencies, not measured. "
                    "Replace with a measured profile from scripts/profile_executor.py.",
            "efficiency": eff, "launch_overhead_s": LAUNCH_OVERHEAD_S,
            "weight_bytes": "params * 2 (bf16)",
            "const_s": "weights / (HBM bandwidth * weights_stream) + launch overhead",
            "prefill_token_s": "2 * params / (bf16 peak * gemm)",
            "prefill_attn_pair_s": "4 * layers * hidden / (bf16 peak * attention)",
            "decode_seq_s": "2 * params / (bf16 peak * decode_flops)",
            "decode_ctx_token_s": "KV bytes per token / (HBM bandwidth * kv_stream)",
            "act_bytes_per_token": "2 (slack) * 2 bytes * (7 * hidden + 3 * intermediate)",
            "act_fixed_bytes": "256 * vocab * 4 (logits) + 192 MiB (workspaces)",
        },
    )


@dataclass
class Args:
    out: Path
    """the profile file to write"""
    accelerator: str = "h200"
    """accelerator, a key of ACCELERATORS"""
    model: str = "llama2-7b"
    """model shape, a key of MODELS"""
    budget_gib: float = 40.0
    """accelerator memory the engine may use, GiB"""


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    for flag, value, known in (("--accelerator", args.accelerator, ACCELERATORS),
                               ("--model", args.model, MODELS)):
        if value not in known:
            print(f"make_roofline_profile: {flag} must be one of {', '.join(sorted(known))}, "
                  f"got {value!r}", file=sys.stderr)
            return 2
    profile = derive(args.accelerator, args.model, args.budget_gib)
    profile.save(args.out)
    c, mem = profile.cost, profile.memory
    print(f"wrote {args.out}: {mem.num_kv_blocks(0.9)} KV blocks at ratio 0.9, "
          f"decode step {c.const_s * 1e3:.2f} ms + {c.decode_ctx_token_s * 1e6:.3f} us/ctx token, "
          f"prefill {c.prefill_token_s * 1e6:.1f} us/token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
