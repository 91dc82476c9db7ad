"""Profile the torch executor (or a live vLLM engine) and write a measured executor profile.

    python scripts/profile_executor.py --device cpu --shape tiny \
        --out checkpoints/profiles/cpu-tiny-measured.json
    .venv-vllm/bin/python scripts/profile_executor.py --engine vllm \
        --out checkpoints/profiles/cpu-vllm-tiny-measured.json
    python scripts/profile_executor.py --device cuda --shape llama2-7b --budget-gib 40 \
        --compare checkpoints/profiles/h200-llama2-7b-40gib-roofline.json --out h200-measured.json

Times iterations over a grid of prefill chunks (tokens x earlier context), decode batches
(sequences x context) and mixes, takes the median of the repeats (the project machines are shared
and noisy), fits the cost model by non-negative least squares on relative error
(:mod:`runtime.engine.profiling`), reports the error on held-out points, measures the cost of KV
resizes, block moves and OOMs, and writes a profile recording the hardware, the model shape, the
dtype and the fit. It also prints the executor's efficiency: decode bandwidth (weights + KV read
per decode step over its time) and prefill FLOP/s, as fractions of the device's peaks when known.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import tyro

from runtime.engine.executor import GIB
from runtime.engine.profile import CostModel, Profile
from runtime.engine.profiling import (
    Measurement,
    SyntheticRequests,
    default_grid,
    fit_with_holdout,
    make_batch,
    measure,
    nnls,
)
from runtime.engine.torch_executor import TorchExecutor, default_budget_gib
from runtime.engine.torch_model import SHAPES, LlamaConfig
from runtime.steady_cpu import steady_allocator

MIB = 1024 ** 2
PROFILE_RATIO = 0.9
"""the pool size the grid runs at (the default knob); the memory check uses it too"""

# Grids per shape: (full, quick). Context and chunk sizes follow what the engine produces with
# its default knobs; the 7B quick grid fits the accelerator check's time limit.
GRIDS = {
    "tiny": (dict(prefill_tokens=(16, 32, 64, 128, 256, 512, 1024), prefill_starts=(0, 128, 512),
                  decode_seqs=(1, 2, 4, 8, 16, 32, 64), decode_contexts=(32, 128, 512, 1024),
                  mixed_chunks=(64, 256)),
             dict(prefill_tokens=(16, 128, 512, 1024), prefill_starts=(0, 512),
                  decode_seqs=(1, 4, 16, 64), decode_contexts=(32, 512), mixed_chunks=(128,))),
    "llama2-7b": (dict(prefill_tokens=(64, 128, 256, 512, 1024, 2048, 4096),
                       prefill_starts=(0, 1024, 4096), decode_seqs=(1, 8, 32, 64, 128, 256),
                       decode_contexts=(128, 512, 2048), mixed_chunks=(256, 1024)),
                  dict(prefill_tokens=(128, 512, 2048), prefill_starts=(0, 2048),
                       decode_seqs=(1, 16, 64, 256), decode_contexts=(256, 2048),
                       mixed_chunks=(512,))),
}


def grid_for(shape: str) -> tuple[dict, dict]:
    """The grids of a shape: its own, else tiny's for the CPU shapes and the 7B grid for the
    full-size catalogue shapes (their layers are as wide)."""
    if shape in GRIDS:
        return GRIDS[shape]
    return GRIDS["tiny" if shape.endswith("-cpu") else "llama2-7b"]


# Datasheet peaks by device name fragment, for efficiency fractions (DESIGN.md's figures).
PEAKS = {"H200": {"hbm_bytes_per_s": 4.8e12, "bf16_flops": 989e12},
         "H100": {"hbm_bytes_per_s": 3.35e12, "bf16_flops": 989e12},
         "A100": {"hbm_bytes_per_s": 2.0e12, "bf16_flops": 312e12}}


def hardware_info(device: torch.device) -> dict:
    info = {"device": device.type, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(), "platform": platform.platform()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(accelerator=props.name, device_memory_bytes=props.total_memory,
                    cuda=torch.version.cuda)
        for key, peak in PEAKS.items():
            if key in props.name:
                info.update(peak)
    else:
        model = platform.processor()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        info["accelerator"] = f"CPU: {model}"
    return info


def efficiency(ms: list[Measurement], ex: TorchExecutor, hw: dict) -> dict:
    """Decode bandwidth and prefill FLOP/s achieved on the grid (the best and the median of the
    larger points), as fractions of the datasheet peaks when the device is known."""
    cfg, mem = ex.cfg, ex.memory
    weights = mem.weight_bytes
    dec, pre = [], []
    for m in ms:
        f = m.features
        if m.point.kind == "decode":
            moved = weights + f[4] * mem.kv_bytes_per_token
            dec.append((f[3], moved / m.median_s))
        elif m.point.kind == "prefill":
            flops = 2 * cfg.matmul_params * f[1] + 4 * cfg.num_layers * cfg.hidden_size * f[2]
            pre.append((f[1], flops / m.median_s))
    out: dict = {}
    for name, rows, peak_key in (("decode_bytes_per_s", dec, "hbm_bytes_per_s"),
                                 ("prefill_flops", pre, "bf16_flops")):
        if not rows:
            continue
        vals = np.array([v for _, v in rows])
        big = np.array([v for size, v in rows if size >= np.median([s for s, _ in rows])])
        out[name] = {"best": float(vals.max()), "median_of_larger_half": float(np.median(big))}
        if peak_key in hw:
            out[name]["best_fraction_of_peak"] = float(vals.max() / hw[peak_key])
            out[name]["median_fraction_of_peak"] = float(np.median(big) / hw[peak_key])
    out["note"] = ("decode: (weight bytes + KV bytes of the context) / step time; prefill: "
                   "(2 * matmul params * tokens + 4 * layers * hidden * attention pairs) / time")
    return out


def measure_resize(ex: TorchExecutor, repeats: int) -> dict:
    """Fit resize time = fixed + per GiB changed (NNLS), and the time per moved block."""
    mem = ex.memory
    ratios = [0.9, 0.5, 0.9, 0.7, 0.4, 0.95, 0.6, 0.9] * max(1, repeats // 3)
    rows, times = [], []
    cur = ex.kv.num_blocks
    for r in ratios:
        n = mem.num_kv_blocks(r)
        if n == cur:
            continue
        t = ex.resize_kv(n, {})
        rows.append([1.0, abs(n - cur) * mem.kv_block_bytes / GIB])
        times.append(t)
        cur = n
    a, y = np.array(rows), np.array(times)
    scale = a.max(axis=0)
    fixed, per_gib = nnls(a / scale, y) / scale
    # block moves: shrink by M blocks with M moves against the same shrink without moves
    n_hi = mem.num_kv_blocks(PROFILE_RATIO)
    m = max(1, min(256, n_hi // 4))
    with_moves, without = [], []
    for _ in range(max(3, repeats)):
        ex.resize_kv(n_hi, {})
        without.append(ex.resize_kv(n_hi - m, {}))
        ex.resize_kv(n_hi, {})
        with_moves.append(ex.resize_kv(n_hi - m, {n_hi - m + i: i for i in range(m)}))
    ex.resize_kv(n_hi, {})
    per_block = max(0.0, (statistics.median(with_moves) - statistics.median(without)) / m)
    return {"resize_fixed_s": float(fixed), "resize_per_gib_s": float(per_gib),
            "block_copy_s": per_block, "resize_samples": len(times), "moves_per_sample": m}


def measure_oom(ex: TorchExecutor, repeats: int) -> float:
    mem = ex.memory
    too_many = (mem.workspace_bytes(PROFILE_RATIO) - mem.act_fixed_bytes) // mem.act_bytes_per_token
    n = int(too_many) + 16
    synth = SyntheticRequests(ex.kv.num_blocks, ex.block_size)
    r = synth.decode(2)  # the refused batch needs no blocks of its own: it never runs
    batch = make_batch([r], [])
    batch.prefill_tokens = n  # only the size is checked before an OOM
    times = []
    for _ in range(max(3, repeats)):
        res = ex.execute(batch, PROFILE_RATIO)
        if not res.oom:
            raise RuntimeError(f"a batch of {n} tokens did not run out of memory")
        times.append(res.duration_s)
    return float(statistics.median(times))


def compare(measured: Profile, reference: Profile) -> dict:
    """Measured over reference, coefficient by coefficient."""
    out = {"reference": reference.name, "reference_kind": reference.kind, "ratio": {}}
    for k in CostModel.__dataclass_fields__:
        a, b = getattr(measured.cost, k), getattr(reference.cost, k)
        out["ratio"][k] = a / b if b else None
    for k in ("act_fixed_bytes", "act_bytes_per_token", "weight_bytes"):
        a, b = getattr(measured.memory, k), getattr(reference.memory, k)
        out["ratio"][k] = a / b if b else None
    return out


@dataclass
class Args:
    out: Path
    """the profile file to write"""
    engine: Literal["torch", "vllm"] = "torch"
    """what to profile: the torch executor, or a live vLLM engine (``--model``, in the vLLM
    venv; docs/vllm.md)"""
    model: str | None = None
    """--engine vllm: the model folder (default: the tiny dummy-weight model, written to a
    temporary folder)"""
    kv_cache_gib: float = 1 / 16
    """--engine vllm: the KV pool vLLM allocates at start-up, GiB"""
    device: Literal["cpu", "cuda"] = "cpu"
    """torch device to measure on"""
    shape: str = "tiny"
    """model shape, a key of runtime.engine.torch_model.SHAPES"""
    budget_gib: float | None = None
    """memory budget (default: 0.25 for tiny, 40 for llama2-7b)"""
    quick: bool = False
    """a smaller grid and fewer repeats"""
    repeats: int | None = None
    """timed runs per point, of which the median is fitted (default: 3 with --quick; else 15 on
    the CPU, whose shared hosts spread single timings by 5-15%, and 7 on CUDA)"""
    threads: int = 1
    """torch CPU threads (1 by default: steadier on a shared machine)"""
    seed: int = 0
    """seed of the synthetic requests and the model's weights"""
    timer: Literal["wall", "thread"] | None = None
    """iteration timer (default: thread CPU time on the CPU with one thread, where a shared
    host's wall clock also measures its neighbours; the wall clock on CUDA)"""
    checkpoint: str | None = None
    """HF safetensors file or folder"""
    compare: Path | None = None
    """a profile (e.g. the roofline one) to compare the coefficients with"""
    name: str | None = None
    """profile name (default from device and shape)"""


# the vLLM profile's grid, sized for the tiny model on a 2-core CPU: (full, quick)
VLLM_GRIDS = (dict(prefill_tokens=(64, 256, 1024, 2048), prefill_starts=(0, 1024),
                   decode_seqs=(1, 4, 16, 48), decode_contexts=(128, 512, 1536),
                   mixed_chunks=(256,)),
              dict(prefill_tokens=(64, 512, 2048), prefill_starts=(0, 1024),
                   decode_seqs=(1, 8, 32), decode_contexts=(128, 1024), mixed_chunks=(256,)))


def profile_vllm(args: Args) -> int:
    """The vLLM engine's profile: vLLM's own steps on the grid, the cost model fitted to them."""
    import tempfile

    from runtime.vllm.engine import VllmServer, VllmSettings
    from runtime.vllm.model import write_tiny_model
    from runtime.vllm.probe import measure_cap_changes, measure_vllm, memory_model, spread

    t_start = time.perf_counter()
    model = args.model or str(write_tiny_model(tempfile.mkdtemp(prefix="tiny-llama-")))
    server = VllmServer.start(VllmSettings(model=model, kv_cache_gib=args.kv_cache_gib,
                                           seed=args.seed))
    repeats = args.repeats if args.repeats is not None else 3 if args.quick else 5
    mem = memory_model(server)
    grid = default_grid(server.max_model_len, server.pool_blocks, mem.block_size,
                        **VLLM_GRIDS[1 if args.quick else 0])
    print(f"profiling vLLM {server.version} ({model}), {server.pool_blocks} KV blocks of "
          f"{mem.block_size} tokens, {len(grid)} points x {repeats} repeats", flush=True)
    ms, raw = measure_vllm(server, grid, repeats=repeats, seed=args.seed, progress=True)
    if len(ms) < 8:
        raise SystemExit(f"only {len(ms)} grid points ran: too few to fit the cost model")
    rep = fit_with_holdout(ms)
    resize = measure_cap_changes(server)
    hw = hardware_info(torch.device("cpu"))
    name = args.name or "cpu-vllm-tiny-measured"
    profile = Profile(
        name=name, kind="measured", memory=mem, cost=rep.cost, oom_penalty_s=0.0,
        resize_fixed_s=resize["resize_fixed_s"], resize_per_gib_s=resize["resize_per_gib_s"],
        block_copy_s=0.0, max_model_len=server.max_model_len,
        hardware={**hw, "engine": f"vllm {server.version}", "kv_cache_gib": args.kv_cache_gib,
                  "timer": "wall", "shared_machine_load_1m": os.getloadavg()[0]},
        model={**server.model_config, "weights": "dummy (random)" if args.model is None
               else model},
        derivation={"script": "scripts/profile_executor.py --engine vllm",
                    "grid": "quick" if args.quick else "full", "repeats": repeats,
                    "startup_s": round(server.startup_s, 1), "resize": resize,
                    "repeat_spread": spread(ms),
                    "notes": "each point set up untimed in vLLM and its step timed (decodes: "
                             "consecutive steps); features as vLLM scheduled them; points in a "
                             "fresh random order each pass; no OOM (vLLM reserves activation "
                             "memory at start-up) and no block copies (the cap withholds blocks)",
                    "seconds": round(time.perf_counter() - t_start, 1)},
        fit={**rep.as_dict(),
             "points_table": [{"point": m.point.label(), "kind": m.point.kind,
                               "median_s": m.median_s, "samples": len(m.times_s),
                               "predicted_s": float(np.dot(m.features, [
                                   rep.cost.const_s, rep.cost.prefill_token_s,
                                   rep.cost.prefill_attn_pair_s, rep.cost.decode_seq_s,
                                   rep.cost.decode_ctx_token_s]))} for m in ms]},
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    profile.save(args.out)
    print(json.dumps({"profile": str(args.out), "points": rep.num_points, "samples": len(raw),
                      **rep.as_dict(), "cost": {k: getattr(rep.cost, k)
                                                for k in CostModel.__dataclass_fields__},
                      "repeat_spread": spread(ms), **resize,
                      "seconds": round(time.perf_counter() - t_start, 1)}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    if args.engine == "vllm":
        return profile_vllm(args)
    if args.shape not in SHAPES:
        print(f"profile_executor: --shape must be one of {', '.join(sorted(SHAPES))}, got "
              f"{args.shape!r}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    steady_allocator()
    cfg: LlamaConfig = SHAPES[args.shape]
    budget_gib = args.budget_gib if args.budget_gib is not None else default_budget_gib(args.shape)
    repeats = (args.repeats if args.repeats is not None else 3 if args.quick
               else 15 if args.device == "cpu" else 7)
    t_start = time.perf_counter()
    timer = args.timer or ("thread" if args.device == "cpu" and args.threads == 1 else "wall")
    ex = TorchExecutor(cfg, budget_bytes=int(budget_gib * GIB), device=args.device,
                       seed=args.seed, checkpoint=args.checkpoint, timer=timer)
    mem = ex.memory
    num_blocks = mem.num_kv_blocks(PROFILE_RATIO)
    ex.resize_kv(num_blocks, {})
    hw = hardware_info(ex.device)
    print(f"profiling {cfg.name} on {hw['accelerator']} ({ex.dtype}), budget {budget_gib:g} GiB, "
          f"{num_blocks} KV blocks at ratio {PROFILE_RATIO}; activations: {ex.activation_source}",
          flush=True)
    grid = default_grid(cfg.max_position, num_blocks, ex.block_size,
                        **grid_for(args.shape)[1 if args.quick else 0])
    ms, skipped = measure(ex, grid, num_blocks, ex.block_size, PROFILE_RATIO, repeats=repeats,
                          warmup=2, progress=True)
    if len(ms) < 8:
        raise SystemExit(f"only {len(ms)} grid points ran ({len(skipped)} out of memory): "
                         "too few to fit the cost model")
    rep = fit_with_holdout(ms)
    resize = measure_resize(ex, repeats)
    oom_s = measure_oom(ex, repeats)
    eff = efficiency(ms, ex, hw)
    device_label = "cpu" if ex.device.type == "cpu" else hw["accelerator"].split()[-1].lower()
    name = args.name or f"{device_label}-{cfg.name}-{budget_gib:g}gib-measured"
    profile = Profile(
        name=name, kind="measured", memory=mem, cost=rep.cost, oom_penalty_s=oom_s,
        resize_fixed_s=resize["resize_fixed_s"], resize_per_gib_s=resize["resize_per_gib_s"],
        block_copy_s=resize["block_copy_s"], max_model_len=cfg.max_position,
        hardware={**hw, "memory_budget_gib": budget_gib, "timer": timer},
        model={**cfg.as_dict(), "dtype": str(ex.dtype).replace("torch.", ""),
               "weights": args.checkpoint or f"random (seed {args.seed})"},
        derivation={"script": "scripts/profile_executor.py", "grid": "quick" if args.quick
                    else "full", "repeats": repeats, "kv_cache_ratio": PROFILE_RATIO,
                    "activation_memory": ex.activation_source,
                    "skipped_points": skipped, "resize": resize,
                    "oom_note": "an OOM is refused by the memory model before the forward; its "
                                "cost is that check (plus, on CUDA, a real allocator failure "
                                "would cost the partial forward)",
                    "seconds": round(time.perf_counter() - t_start, 1)},
        fit={**rep.as_dict(), "efficiency": eff,
             "points_table": [{"point": m.point.label(), "kind": m.point.kind,
                               "median_s": m.median_s,
                               "predicted_s": float(np.dot(m.features, [
                                   rep.cost.const_s, rep.cost.prefill_token_s,
                                   rep.cost.prefill_attn_pair_s, rep.cost.decode_seq_s,
                                   rep.cost.decode_ctx_token_s]))} for m in ms]},
    )
    if args.compare is not None:
        profile.fit["vs_reference"] = compare(profile, Profile.load(args.compare))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    profile.save(args.out)
    c = rep.cost
    summary = {
        "profile": str(args.out), "points": rep.num_points, "skipped": len(skipped),
        "heldout_rel_err_median": rep.heldout_median, "heldout_rel_err_p90": rep.heldout_p90,
        "all_points_rel_err_median": rep.train_median, "all_points_rel_err_p90": rep.train_p90,
        "cost": {k: getattr(c, k) for k in CostModel.__dataclass_fields__},
        "oom_penalty_s": oom_s, **{k: resize[k] for k in ("resize_fixed_s", "resize_per_gib_s",
                                                          "block_copy_s")},
        "efficiency": eff, "seconds": round(time.perf_counter() - t_start, 1),
    }
    if "vs_reference" in profile.fit:
        summary["vs_reference"] = profile.fit["vs_reference"]
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
