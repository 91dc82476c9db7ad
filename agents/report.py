"""The arena's report: a markdown table, the JSON results and the plots."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path


def short_name(controller: str) -> str:
    """``policy:runs/x/policy.onnx`` -> ``policy:x``: names short enough for tables and plots."""
    if controller.startswith("policy:"):
        return f"policy:{Path(controller.split(':', 1)[1]).parent.name or 'onnx'}"
    return controller


def _fmt(x: float, spec: str) -> str:
    return "inf" if isinstance(x, float) and math.isinf(x) else format(x, spec)


def markdown_table(rows: Sequence[dict], capacity: Sequence[dict]) -> str:
    lines = ["| trace | controller | rate x | SLO att. | interactive att. | batch tok/s "
             "| goodput rps | TTFT p99 s | TPOT p99 ms | preempt | OOMs | shed / expired / late "
             "| window ms | chunk | KV ratio | KV GiB | recovery s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rec = ("-" if "bursts" not in r else
               f"{_fmt(r['recovery_s_mean'], '.1f')} ({r['bursts']} bursts)")
        rate = f"{r['rate_scale']:.3g}" + (" (static match)" if r.get("matched_static") else "")
        lines.append(
            f"| {r['trace']} | {short_name(r['controller'])} | {rate} | "
            f"{r['slo_attainment']:.2%} | {r['interactive_attainment']:.2%} | "
            f"{r['batch_goodput_tps']:.0f} | {r['goodput_rps']:.2f} | {r['ttft_p99_s']:.2f} | "
            f"{r['tpot_p99_s'] * 1e3:.1f} | {r['preemptions']} | {r['ooms']} | "
            f"{r['shed']} / {r['expired']} / {r['late']} | "
            f"{r['mean_batch_window_ms']:.0f} | {r['mean_prefill_chunk_tokens']:.0f} | "
            f"{r['mean_kv_cache_ratio']:.2f} | {r['mean_kv_gib']:.1f} | {rec} |")
    if capacity:
        lines += ["", "| trace | controller | capacity @99% | capacity @90% |", "|---|---|---|---|"]
        for c in capacity:
            lines.append(f"| {c['trace']} | {short_name(c['controller'])} | "
                         f"{c['capacity_99']:.3g} | "
                         f"{c['capacity_90']:.3g} |")
    return "\n".join(lines)


def write_json(result: dict, path: Path) -> Path:
    """The arena's result without the per-interval timelines (they go to the plots)."""
    for r in result["rows"]:
        r.pop("timeline", None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def plot(rows: Sequence[dict], out_dir: Path) -> list[Path]:
    """Attainment against load per trace; knobs, queue and attainment over time for one window."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for trace in sorted({r["trace"] for r in rows}):
        sub = [r for r in rows if r["trace"] == trace]
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for name in dict.fromkeys(r["controller"] for r in sub):
            pts = sorted((r["rate_scale"], r["slo_attainment"]) for r in sub
                         if r["controller"] == name)
            ax.plot([p[0] for p in pts], [p[1] * 100 for p in pts], marker="o",
                    label=short_name(name))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rate scale (x trace rate)")
        ax.set_ylabel("SLO attainment (%)")
        ax.set_title(f"SLO attainment against load: {trace}")
        ax.axhline(99, color="grey", lw=0.6, ls="--")
        ax.axhline(90, color="grey", lw=0.6, ls=":")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        p = out_dir / f"attainment_vs_load_{trace}.png"
        fig.tight_layout()
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)

        # one window over time: the median rate scale of the run
        scales = sorted({r["rate_scale"] for r in sub})
        scale = scales[len(scales) // 2]
        ts = [r for r in sub if r["rate_scale"] == scale and "timeline" in r]
        if not ts:
            continue
        fig, axes = plt.subplots(5, 1, figsize=(8, 10), sharex=True)
        keys = [("batch_window_ms", "window (ms)"), ("prefill_chunk_tokens", "chunk (tokens)"),
                ("kv_cache_ratio", "KV ratio"), ("waiting", "waiting requests"),
                ("slo_attainment", "interval SLO attainment")]
        for r in ts:
            t = r["timeline"]
            for ax, (k, label) in zip(axes, keys):
                ax.plot(t["t"], t[k], lw=0.8, label=short_name(r["controller"]))
                ax.set_ylabel(label, fontsize=8)
        axes[1].set_yscale("log", base=2)
        axes[3].set_yscale("symlog")
        axes[0].legend(fontsize=7, ncol=3)
        axes[-1].set_xlabel("simulated time (s)")
        fig.suptitle(f"{trace} at rate x{scale:g}: knobs, queue and attainment over time")
        fig.tight_layout()
        p = out_dir / f"timeline_{trace}_x{scale:g}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths
