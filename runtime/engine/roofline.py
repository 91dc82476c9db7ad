"""Roofline profiles: model shapes and accelerators from their published figures, and the one
derivation that turns a (model, accelerator, memory budget, tensor-parallel degree) into an
executor profile.

The profiles are generated here rather than committed file by file: five shapes on four
accelerators at any budget are a hundred files that would only restate this table, and every one
of them would have to be regenerated whenever an efficiency assumption moved. A profile is named
``{accelerator}[x{tp}]-{model}-{gib}gib-roofline`` (e.g. ``h100-llama3.1-8b-40gib-roofline``,
``h100x4-llama3.1-70b-40gib-roofline``); :meth:`runtime.engine.profile.Profile.load` takes such a
name wherever it takes a path, and a file of that name in ``checkpoints/profiles`` wins over the
derivation (the shipped default is such a file). Every coefficient is a datasheet figure divided
by an efficiency from :data:`EFFICIENCY`; the file records both (``derivation``), and
``kind = "roofline"`` marks it derived, not measured.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from runtime.engine.executor import GIB, MemoryModel
from runtime.engine.profile import PROFILE_SOURCES, CostModel, Profile, ProfileSource

BLOCK_SIZE = 16
"""KV block size in tokens of every derived profile"""


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A Llama-architecture decoder's shape, as its Hugging Face ``config.json`` gives it."""

    name: str
    """the model's published name"""
    layers: int
    """decoder layers"""
    hidden: int
    """width of the residual stream"""
    heads: int
    """query heads"""
    kv_heads: int
    """key/value heads (grouped-query attention when fewer than ``heads``)"""
    intermediate: int
    """width of the SwiGLU MLP"""
    vocab: int
    """tokens in the vocabulary"""
    params: float
    """parameters, as the model card states them"""
    max_model_len: int
    """the context window the engine serves (prompt + output tokens)"""
    rope_theta: float
    """base of the rotary frequencies"""
    default_tp: int = 1
    """accelerators it is split over when none is named"""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def matmul_params(self) -> float:
        """Parameters every token multiplies through: all but the input embedding (a lookup)."""
        return self.params - self.vocab * self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


@dataclass(frozen=True, slots=True)
class Accelerator:
    """One accelerator's datasheet figures."""

    name: str
    """the product, as its datasheet names it"""
    memory_bytes: float
    """device memory (decimal bytes, as datasheets state it)"""
    memory_bw: float
    """device memory bandwidth, bytes/s"""
    bf16_flops: float
    """dense bf16 tensor-core peak, FLOP/s (without sparsity)"""
    link_bw: float
    """accelerator-to-accelerator bandwidth in one direction, bytes/s (NVLink, else PCIe)"""
    link: str
    """what ``link_bw`` is"""


MODELS: dict[str, ModelShape] = {
    # Llama-2-7B. Its own window is 4,096 tokens; the project has served it at 16,384 since the
    # first build (the Azure traces' longest prompts fit), and the shipped results assume that.
    "llama2-7b": ModelShape("Llama-2-7B", 32, 4096, 32, 32, 11008, 32000, 6.74e9, 16384, 1e4),
    # Llama-3.1-8B: GQA with 8 KV heads (128 KiB of KV per token in bf16), 128k context.
    "llama3.1-8b": ModelShape("Llama-3.1-8B", 32, 4096, 32, 8, 14336, 128256, 8.03e9, 131072,
                              5e5),
    # Mistral-7B-v0.3: GQA with 8 KV heads, 32k context, no sliding window.
    "mistral-7b": ModelShape("Mistral-7B-v0.3", 32, 4096, 32, 8, 14336, 32768, 7.25e9, 32768,
                             1e6),
    # Qwen2.5-7B: GQA with 4 KV heads (56 KiB per token), 32k native context (its q/k/v biases
    # are left out: 0.01% of the parameters).
    "qwen2.5-7b": ModelShape("Qwen2.5-7B", 28, 3584, 28, 4, 18944, 152064, 7.62e9, 32768, 1e6),
    # Llama-3.1-70B: 80 layers, GQA with 8 KV heads, 128k context; 141 GB of bf16 weights, so
    # it is split over several accelerators (tensor parallel, 4 by default).
    # Llama-2-70B: 80 layers, GQA with 8 KV heads, 4k context (TensorRT-LLM's "LLaMA 70B").
    "llama2-70b": ModelShape("Llama-2-70B", 80, 8192, 64, 8, 28672, 32000, 68.98e9, 4096, 1e4,
                             default_tp=4),
    "llama3.1-70b": ModelShape("Llama-3.1-70B", 80, 8192, 64, 8, 28672, 128256, 70.6e9, 131072,
                               5e5, default_tp=4),
}
ACCELERATORS: dict[str, Accelerator] = {
    # NVIDIA H100 SXM5 datasheet: 80 GB HBM3 at 3.35 TB/s, 989 TFLOP/s dense bf16, NVLink 4
    # at 900 GB/s (both directions together).
    "h100": Accelerator("NVIDIA H100 SXM5 80GB", 80e9, 3.35e12, 989e12, 450e9, "NVLink 4"),
    # NVIDIA H200 SXM: 141 GB HBM3e at 4.8 TB/s, 989 TFLOP/s dense bf16, NVLink 4 at 900 GB/s.
    "h200": Accelerator("NVIDIA H200 SXM", 141e9, 4.8e12, 989e12, 450e9, "NVLink 4"),
    # NVIDIA A100 SXM4 80GB: HBM2e at 2.039 TB/s, 312 TFLOP/s dense bf16, NVLink 3 at 600 GB/s.
    "a100": Accelerator("NVIDIA A100 SXM4 80GB", 80e9, 2.039e12, 312e12, 300e9, "NVLink 3"),
    # NVIDIA L40S: 48 GB GDDR6 at 864 GB/s, 362 TFLOP/s dense bf16 (733 with sparsity); no
    # NVLink, PCIe Gen4 x16 at 64 GB/s (both directions together).
    "l40s": Accelerator("NVIDIA L40S", 48e9, 864e9, 362.05e12, 32e9, "PCIe Gen4 x16"),
}

# Assumed efficiencies, the same on every accelerator. Large bf16 GEMMs reach about 80% of peak
# on an H200 (790 of 989 TFLOP/s measured with PyTorch at 8192^3); the 4096-wide GEMMs of a 7B
# model are smaller: 60%. Weight and KV streaming: a device copy reaches about 90% of HBM
# bandwidth (4.3 of 4.8 TB/s); a decode step's many small kernels reach less: 80% for weights,
# 70% for paged KV reads. Attention in prefill (FlashAttention-style) reaches about 40% of peak.
# A ring all-reduce moves 2 (tp - 1) / tp of its bytes over each link at about 70% of the link's
# one-way bandwidth (NCCL's bus bandwidth on NVLink), after a fixed latency.
EFFICIENCY = {"gemm": 0.60, "weights_stream": 0.80, "kv_stream": 0.70, "attention": 0.40,
              "decode_flops": 1.0, "allreduce": 0.70}
LAUNCH_OVERHEAD_S = 0.3e-3
"""scheduler and kernel launches per iteration with CUDA graphs"""
ALLREDUCE_LATENCY_S = {"NVLink 4": 8e-6, "NVLink 3": 10e-6, "PCIe Gen4 x16": 25e-6}
"""fixed time of one small all-reduce over the link (two per layer in tensor parallel)"""
ROOFLINE_SUFFIX = "gib-roofline"


def profile_name(model: str, accelerator: str, memory_gib: float, tp: int = 1) -> str:
    """The catalogue name of a derived profile, e.g. ``h100-llama3.1-8b-40gib-roofline``."""
    accel = accelerator if tp == 1 else f"{accelerator}x{tp}"
    return f"{accel}-{model}-{memory_gib:g}{ROOFLINE_SUFFIX}"


def parse_profile_name(name: str) -> tuple[str, str, float, int] | None:
    """``(model, accelerator, memory_gib, tp)`` of a catalogue name, or None if it is not one."""
    if not name.endswith(ROOFLINE_SUFFIX):
        return None
    for accel in ACCELERATORS:
        if not name.startswith(accel):
            continue
        rest = name[len(accel):]
        tp = 1
        if rest.startswith("x"):
            digits, _, rest = rest[1:].partition("-")
            if not digits.isdigit():
                continue
            tp, rest = int(digits), "-" + rest
        if not rest.startswith("-"):
            continue
        model, _, gib = rest[1:-len(ROOFLINE_SUFFIX)].rpartition("-")
        if model in MODELS:
            try:
                return model, accel, float(gib), tp
            except ValueError:
                return None
    return None


def derive(model: str, accelerator: str, memory_gib: float, tp: int | None = None,
           dtype_bytes: int = 2) -> Profile:
    """The roofline profile of ``model`` on ``tp`` x ``accelerator``, each held to
    ``memory_gib`` GiB (the engine plans with the sum over the ``tp`` accelerators).

    :param tp: tensor-parallel degree (default: the model's ``default_tp``); weights, KV heads
        and FLOPs split evenly, and every layer pays two all-reduces of its activations.
    """
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r} (known: {', '.join(MODELS)})")
    if accelerator not in ACCELERATORS:
        raise ValueError(f"unknown accelerator {accelerator!r} (known: {', '.join(ACCELERATORS)})")
    m, a, eff = MODELS[model], ACCELERATORS[accelerator], EFFICIENCY
    tp = m.default_tp if tp is None else tp
    if tp not in (1, 2, 4, 8) or m.kv_heads % tp:
        raise ValueError(f"tp={tp} must be 1, 2, 4 or 8 and divide {m.name}'s "
                         f"{m.kv_heads} KV heads")
    device_gib = a.memory_bytes / GIB
    if not 0 < memory_gib <= device_gib:
        raise ValueError(f"memory_gib={memory_gib:g} must lie in (0, {device_gib:.1f}] GiB, "
                         f"the memory of one {a.name}")
    weight_bytes = int(m.params * dtype_bytes)
    total_bytes = int(tp * memory_gib * GIB)
    if weight_bytes >= total_bytes:
        raise ValueError(f"{m.name}'s {weight_bytes / GIB:.1f} GiB of weights do not fit in "
                         f"tp={tp} x {memory_gib:g} GiB; raise memory_gib or tp")
    kv_per_token = m.kv_bytes_per_token(dtype_bytes)
    flops_per_token = 2 * m.matmul_params
    attn_flops_per_pair = 4 * m.layers * m.hidden  # QK^T and PV, 2 FLOP per MAC
    qkv = m.hidden + 2 * m.kv_heads * m.head_dim
    # Activations per token in flight, over all tp accelerators: the residual stream and norms
    # (4 x hidden, on every accelerator) and one layer's QKV and gate/up/down tensors (split),
    # in bf16, with 2x allocator slack.
    act_per_token = 2 * dtype_bytes * (4 * m.hidden * tp + qkv + 3 * m.intermediate)
    # Fixed workspace: logits for up to 256 sampled sequences in fp32, cuBLAS/attention
    # workspaces on every accelerator.
    act_fixed = 256 * m.vocab * 4 + tp * 192 * 2 ** 20
    # Tensor parallel: two all-reduces of hidden-wide bf16 activations per layer and token.
    if tp > 1:
        comm_token_s = (2 * m.layers * 2 * (tp - 1) / tp * m.hidden * dtype_bytes
                        / (a.link_bw * eff["allreduce"]))
        comm_fixed_s = 2 * m.layers * ALLREDUCE_LATENCY_S[a.link]
    else:
        comm_token_s = comm_fixed_s = 0.0
    flops, bw = tp * a.bf16_flops, tp * a.memory_bw

    cost = CostModel(
        const_s=weight_bytes / (bw * eff["weights_stream"]) + LAUNCH_OVERHEAD_S + comm_fixed_s,
        prefill_token_s=flops_per_token / (flops * eff["gemm"]) + comm_token_s,
        prefill_attn_pair_s=attn_flops_per_pair / (flops * eff["attention"]),
        # Decode GEMMs are memory-bound below ~150 sequences, so their FLOPs overlap the weight
        # read; charging each sequence its FLOPs at peak stays within 2x of max(compute, memory).
        decode_seq_s=flops_per_token / (flops * eff["decode_flops"]) + comm_token_s,
        decode_ctx_token_s=kv_per_token / (bw * eff["kv_stream"]),
    )
    memory = MemoryModel(total_bytes=total_bytes, weight_bytes=weight_bytes,
                         kv_bytes_per_token=kv_per_token, block_size=BLOCK_SIZE,
                         act_fixed_bytes=act_fixed, act_bytes_per_token=act_per_token)
    block_bytes = kv_per_token * BLOCK_SIZE
    hardware = {"accelerator": a.name, "hbm_bytes": a.memory_bytes,
                "hbm_bandwidth_bytes_per_s": a.memory_bw, "bf16_flops": a.bf16_flops,
                "memory_budget_gib": memory_gib}
    if tp > 1:
        hardware.update(tensor_parallel=tp, link=a.link, link_bytes_per_s=a.link_bw)
    derivation = {
        "note": "Derived from datasheet figures and assumed efficiencies, not measured. "
                "Replace with a measured profile from scripts/profile_executor.py.",
        "efficiency": {k: v for k, v in eff.items() if tp > 1 or k != "allreduce"},
        "launch_overhead_s": LAUNCH_OVERHEAD_S,
        "weight_bytes": "params * 2 (bf16)",
        "const_s": "weights / (HBM bandwidth * weights_stream) + launch overhead",
        "prefill_token_s": "2 * (params - embedding) / (bf16 peak * gemm)",
        "prefill_attn_pair_s": "4 * layers * hidden / (bf16 peak * attention)",
        "decode_seq_s": "2 * (params - embedding) / (bf16 peak * decode_flops)",
        "decode_ctx_token_s": "KV bytes per token / (HBM bandwidth * kv_stream)",
        "act_bytes_per_token": "2 (slack) * 2 bytes * (4 * hidden * tp + q + k + v "
                               "+ 3 * intermediate)",
        "act_fixed_bytes": "256 * vocab * 4 (logits) + tp * 192 MiB (workspaces)",
    }
    if tp > 1:
        derivation.update(
            comm_token_s=comm_token_s, comm_fixed_s=comm_fixed_s,
            tensor_parallel=f"bandwidth, FLOPs and memory are tp={tp} times one accelerator's; "
                            "2 all-reduces per layer add 2 * layers * latency to const_s and "
                            "2 * layers * 2 (tp-1)/tp * hidden * 2 bytes / (link * allreduce) "
                            "to every prefill token and decode sequence",
            allreduce_latency_s=ALLREDUCE_LATENCY_S[a.link])
    return Profile(
        name=profile_name(model, accelerator, memory_gib, tp), kind="roofline",
        memory=memory, cost=cost,
        # A failed allocation surfaces after most of the forward pass was launched; the retry
        # also pays an allocator flush. Charge about one large prefill iteration.
        oom_penalty_s=0.05,
        # A pool resize drains the in-flight iteration and calls the allocator (fixed), and
        # zero-fills new memory at about half the memory bandwidth.
        resize_fixed_s=5e-3,
        resize_per_gib_s=GIB / (0.5 * bw),
        block_copy_s=2 * block_bytes / (bw * 0.8),
        max_model_len=m.max_model_len,
        hardware=hardware,
        model={**{k: v for k, v in asdict(m).items() if k != "default_tp"},
               "dtype": "bf16" if dtype_bytes == 2 else f"{dtype_bytes}-byte"},
        derivation=derivation,
    )


def derive_named(name: str) -> Profile | None:
    """The profile a catalogue name derives (``h100-llama3.1-8b-40gib-roofline``), or None when
    the name is not the catalogue's."""
    parsed = parse_profile_name(name)
    return None if parsed is None else derive(*parsed)


PROFILE_SOURCES.append(ProfileSource(
    derive_named, f"{profile_name('MODEL', 'ACCELERATOR', 40)} with MODEL one of "
                  f"{', '.join(MODELS)}, ACCELERATOR one of {', '.join(ACCELERATORS)} "
                  "(optionally xTP: h100x4)"))


@dataclass
class ProfileChoice:
    """How a command names its executor profile: a file or name, or a catalogue model on an
    accelerator (``--model llama3.1-8b --accelerator h100 --memory-gib 40``)."""

    profile: str | None = None
    """a profile file, or a profile name (a file in checkpoints/profiles or a catalogue name);
    default: the shipped roofline H200 Llama-2-7B profile"""
    model: str | None = None
    """a catalogue model (llama2-7b, llama3.1-8b, mistral-7b, qwen2.5-7b, llama2-70b,
    llama3.1-70b)"""
    accelerator: str | None = None
    """a catalogue accelerator (h100, h200, a100, l40s)"""
    memory_gib: float = 40.0
    """memory the engine may use on each accelerator, GiB"""
    tp: int | None = None
    """tensor-parallel degree (default: the model's own)"""

    def spec(self) -> str | None:
        """What :meth:`Profile.load` takes: the profile, or the catalogue name (None: default)."""
        if self.model is None and self.accelerator is None:
            return self.profile
        if self.profile is not None:
            raise ValueError("give either profile or model and accelerator, not both")
        if self.model is None or self.accelerator is None:
            raise ValueError("model and accelerator go together "
                             f"(got model={self.model!r}, accelerator={self.accelerator!r})")
        derive(self.model, self.accelerator, self.memory_gib, self.tp)  # refuse bad ones now
        tp = self.tp if self.tp is not None else MODELS[self.model].default_tp
        return profile_name(self.model, self.accelerator, self.memory_gib, tp)

    @staticmethod
    def add_arguments(ap) -> None:
        """Add ``--profile --model --accelerator --memory-gib --tp`` to an argparse parser."""
        ap.add_argument("--profile", default=None,
                        help="executor profile file or name (default: the roofline H200 "
                             "Llama-2-7B profile)")
        ap.add_argument("--model", default=None, choices=list(MODELS),
                        help="catalogue model, with --accelerator, instead of --profile")
        ap.add_argument("--accelerator", default=None, choices=list(ACCELERATORS))
        ap.add_argument("--memory-gib", type=float, default=40.0,
                        help="memory per accelerator with --model (default 40 GiB)")
        ap.add_argument("--tp", type=int, default=None,
                        help="tensor-parallel degree with --model (default: the model's)")

    @classmethod
    def from_args(cls, args) -> ProfileChoice:
        return cls(args.profile, args.model, args.accelerator, args.memory_gib, args.tp)
