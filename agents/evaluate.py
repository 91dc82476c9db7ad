"""The evaluation harness: every controller on the same windows and loads, side by side.

    python -m agents.evaluate --trace azure-conv,azure-code --split eval \\
        --controllers static,best-static,pid,aimd,heuristic --rate-scales 1,2,4,8

Each controller replays the trace split (the whole split is one window) at each rate scale,
deciding every interval through the same session the environment trains in; the replay runs
until every request of the window has finished or been rejected. Prints a markdown table (SLO
attainment, goodput, TTFT and TPOT p99, preemptions, OOMs, mean knobs, mean KV memory reserved,
burst recovery time) and each controller's capacity: the largest rate scale at which attainment
stays >= 99% (and >= 90%), found by bisection to within 2%. Writes PNG plots to ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agents.parallel import JobRunner
from env.session import ServingSession
from env.traces import rate_scale, split
from env.traces.resolve import resolve_trace, trace_label
from env.traces.trace import Trace
from runtime.decider.controller import Controller, StaticController
from runtime.decider.pid import PidController
from runtime.engine.engine import EngineConfig
from runtime.engine.executor import GIB
from runtime.engine.metrics import burst_onsets, recovery_times
from runtime.engine.profile import Profile
from runtime.knobs import DEFAULT_KNOBS

BASELINES = ("static", "best-static", "pid", "aimd", "heuristic")
DRAIN_LIMIT_S = 1800.0
"""a replay that has not drained this long after its last arrival is cut off (aborted)"""


@dataclass
class EvalSpec:
    """Everything a worker process needs to rebuild a controller and a window."""

    trace: str
    part: str
    profile_path: str | None
    interval_s: float
    config: EngineConfig = field(default_factory=EngineConfig)


def make_controller(name: str, spec: EvalSpec) -> Controller:
    """A controller by its command-line name (``policy:PATH`` for an ONNX policy)."""
    profile = Profile.load(spec.profile_path)
    if name == "static":
        return StaticController(DEFAULT_KNOBS)
    if name == "best-static":
        from agents.controllers.best_static import BestStaticController, best_static_knobs

        knobs = best_static_knobs(spec.trace, part="train", profile_path=spec.profile_path,
                                  config=spec.config)
        return BestStaticController(knobs)
    if name == "pid":
        return PidController()
    if name == "aimd":
        from agents.controllers.aimd import AimdController

        return AimdController()
    if name == "heuristic":
        from agents.controllers.heuristic import HeuristicController

        target = spec.config.slo_classes[spec.config.default_slo_class].tpot_s
        return HeuristicController(profile.memory, tpot_target_s=target)
    if name.startswith("policy:"):
        from agents.policy_controller import PolicyController

        return PolicyController(name.split(":", 1)[1])
    raise ValueError(f"unknown controller {name!r}; expected one of {', '.join(BASELINES)} "
                     "or policy:PATH")


@dataclass
class EpisodeResult:
    summary: dict
    timeline: dict[str, list[float]]
    mean_knobs: tuple[float, float, float]
    mean_kv_gib: float
    decisions: int
    sources: dict[str, int]


def run_episode(window: Trace, controller: Controller, *, interval_s: float,
                profile: Profile, config: EngineConfig | None = None,
                record: bool = False) -> EpisodeResult:
    """Replay ``window`` with ``controller`` deciding every interval, until it has drained."""
    controller.reset()
    session = ServingSession(window, interval_s=interval_s, profile=profile, config=config,
                             knobs=DEFAULT_KNOBS)
    result = session.step(DEFAULT_KNOBS)
    block_gib = session.engine.memory.kv_block_bytes / GIB
    knob_sum = np.zeros(3)
    kv_gib_sum = 0.0
    n = 0
    tl: dict[str, list[float]] = {k: [] for k in (
        "t", "batch_window_ms", "prefill_chunk_tokens", "kv_cache_ratio", "waiting", "running",
        "slo_attainment", "arrival_rate", "kv_utilization")}
    sources: dict[str, int] = {}
    cutoff = session.end_s + DRAIN_LIMIT_S
    while not session.window_over or session.has_work:
        if session.now > cutoff:
            session.abort()
            break
        knobs = controller.decide(result.observation)
        src = getattr(controller, "last_source", controller.name)
        sources[src] = sources.get(src, 0) + 1
        result = session.step(knobs)
        s = result.stats
        knob_sum += result.knobs.as_tuple()
        kv_gib_sum += s.kv_blocks * block_gib
        n += 1
        if record:
            for k, v in (("t", s.end_s), ("waiting", s.waiting), ("running", s.running),
                         ("slo_attainment", s.slo_attainment), ("arrival_rate", s.arrival_rate),
                         ("kv_utilization", s.kv_utilization),
                         *zip(("batch_window_ms", "prefill_chunk_tokens", "kv_cache_ratio"),
                              result.knobs.as_tuple())):
                tl[k].append(float(v))
    summary = session.engine.summary().as_dict()
    n = max(n, 1)
    return EpisodeResult(summary, tl, tuple(knob_sum / n), kv_gib_sum / n, n, sources)


@functools.lru_cache(maxsize=8)
def _split_trace(trace_spec: str, part: str) -> Trace:
    return split(resolve_trace(trace_spec), part)


def _window(spec: EvalSpec, scale: float) -> Trace:
    trace = _split_trace(spec.trace, spec.part)
    return rate_scale(trace, scale) if scale != 1.0 else trace


def _row_job(args: tuple) -> dict:
    spec, name, scale, record = args
    profile = Profile.load(spec.profile_path)
    controller = make_controller(name, spec)
    t0 = time.perf_counter()
    ep = run_episode(_window(spec, scale), controller, interval_s=spec.interval_s,
                     profile=profile, config=spec.config, record=True)
    s = ep.summary
    row = {"controller": name, "trace": trace_label(spec.trace), "rate_scale": scale,
           "slo_attainment": s["slo_attainment"], "goodput_rps": s["goodput_rps"],
           "ttft_p99_s": s["ttft_p99_s"], "tpot_p99_s": s["tpot_p99_s"],
           "preemptions": s["preemptions"], "ooms": s["ooms"], "requests": s["requests"],
           "rejected": s["rejected"],
           "mean_batch_window_ms": ep.mean_knobs[0], "mean_prefill_chunk_tokens": ep.mean_knobs[1],
           "mean_kv_cache_ratio": ep.mean_knobs[2], "mean_kv_gib": ep.mean_kv_gib,
           "decision_sources": ep.sources, "wall_s": time.perf_counter() - t0}
    onsets = burst_onsets(ep.timeline["arrival_rate"], spec.interval_s)
    if onsets:
        rec = recovery_times(ep.timeline["slo_attainment"], onsets, spec.interval_s)
        finite = [r for r in rec if math.isfinite(r)]
        row["bursts"] = len(onsets)
        row["recovery_s_mean"] = float(np.mean(finite)) if finite else math.inf
        row["unrecovered_bursts"] = len(rec) - len(finite)
    if record:
        row["timeline"] = ep.timeline
    return row


def find_capacity(attainment: Callable[[float], float], target: float,
                  known: dict[float, float], *, tolerance: float = 0.02,
                  lowest: float = 1 / 64, highest: float = 64.0) -> float:
    """The largest rate scale with attainment >= ``target``, by geometric bisection until the
    bracket is within ``tolerance``. ``known`` holds scales already measured (and gets the new
    ones). Returns 0 when even ``lowest`` misses, ``highest`` when it never misses."""

    def att(s: float) -> float:
        if s not in known:
            known[s] = attainment(s)
        return known[s]

    failing = sorted(s for s, a in known.items() if a < target)
    hi = failing[0] if failing else None
    if hi is None:
        hi = max(known) if known else 1.0
        while att(hi) >= target:
            if hi >= highest:
                return highest
            hi = min(highest, hi * 2)
    passing = sorted(s for s, a in known.items() if a >= target and s < hi)
    lo = passing[-1] if passing else hi / 2
    while att(lo) < target:
        hi = lo
        if lo <= lowest:
            return 0.0
        lo = max(lowest, lo / 2)
    while hi / lo > 1 + tolerance:
        mid = math.sqrt(lo * hi)
        if att(mid) >= target:
            lo = mid
        else:
            hi = mid
    return lo


def _capacity_job(args: tuple) -> dict:
    spec, name, known = args
    profile = Profile.load(spec.profile_path)
    controller = make_controller(name, spec)
    known = dict(known)

    def attainment(scale: float) -> float:
        return run_episode(_window(spec, scale), controller, interval_s=spec.interval_s,
                           profile=profile, config=spec.config).summary["slo_attainment"]

    cap99 = find_capacity(attainment, 0.99, known)
    cap90 = find_capacity(attainment, 0.90, known)
    return {"controller": name, "trace": trace_label(spec.trace), "capacity_99": cap99,
            "capacity_90": cap90, "evaluations": len(known)}


def short_name(controller: str) -> str:
    """``policy:runs/x/policy.onnx`` -> ``policy:x``: names short enough for tables and plots."""
    if controller.startswith("policy:"):
        return f"policy:{Path(controller.split(':', 1)[1]).parent.name or 'onnx'}"
    return controller


def _fmt(x: float, spec: str) -> str:
    return "inf" if isinstance(x, float) and math.isinf(x) else format(x, spec)


def markdown_table(rows: Sequence[dict], capacity: Sequence[dict]) -> str:
    lines = ["| trace | controller | rate x | SLO att. | goodput rps | TTFT p99 s | TPOT p99 ms "
             "| preempt | OOMs | window ms | chunk | KV ratio | KV GiB | recovery s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rec = ("-" if "bursts" not in r else
               f"{_fmt(r['recovery_s_mean'], '.1f')} ({r['bursts']} bursts)")
        rate = f"{r['rate_scale']:.3g}" + (" (static match)" if r.get("matched_static") else "")
        lines.append(
            f"| {r['trace']} | {short_name(r['controller'])} | {rate} | "
            f"{r['slo_attainment']:.2%} | {r['goodput_rps']:.2f} | {r['ttft_p99_s']:.2f} | "
            f"{r['tpot_p99_s'] * 1e3:.1f} | {r['preemptions']} | {r['ooms']} | "
            f"{r['mean_batch_window_ms']:.0f} | {r['mean_prefill_chunk_tokens']:.0f} | "
            f"{r['mean_kv_cache_ratio']:.2f} | {r['mean_kv_gib']:.1f} | {rec} |")
    if capacity:
        lines += ["", "| trace | controller | capacity @99% | capacity @90% |", "|---|---|---|---|"]
        for c in capacity:
            lines.append(f"| {c['trace']} | {short_name(c['controller'])} | "
                         f"{c['capacity_99']:.3g} | "
                         f"{c['capacity_90']:.3g} |")
    return "\n".join(lines)


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


def evaluate(traces: Sequence[str], controllers: Sequence[str], scales: Sequence[float], *,
             part: str = "eval", interval_s: float = 0.25, profile_path: str | None = None,
             config: EngineConfig | None = None, capacity: bool = True, workers: int = 2,
             ray: bool | None = None, progress: bool = True,
             match_static: float | None = None) -> dict:
    """Run the arena; returns ``{"rows": [...], "capacity": [...], "static_match": [...]}``.

    Rows and capacity bisections run in parallel through :class:`agents.parallel.JobRunner`:
    ``workers`` local processes, or Ray with ``ray=True`` (``None``: when ``RAY_ADDRESS`` is set).

    :param match_static: also find, per trace, the rate scale at which the static default
        attains this share (bisection to 2%), and run every controller there; those rows carry
        ``"matched_static": True``
    """
    config = config or EngineConfig()
    specs = {t: EvalSpec(t, part, profile_path, interval_s, config) for t in traces}
    for t in traces:  # resolve names and warm the best-static cache before fanning out
        resolve_trace(t)
        if "best-static" in controllers:
            make_controller("best-static", specs[t])
    jobs = [(specs[t], c, s, True) for t in traces for c in controllers for s in scales]
    t0 = time.perf_counter()
    rows: list[dict] = []
    with JobRunner(workers, ray=ray, progress=progress) as pool:
        rows.extend(pool.map(_row_job, jobs, desc="runs"))
        matched: list[dict] = []
        if match_static is not None:
            for t in traces:
                known = {r["rate_scale"]: r["slo_attainment"] for r in rows
                         if r["trace"] == trace_label(t) and r["controller"] == "static"}
                static = make_controller("static", specs[t])
                profile = Profile.load(profile_path)

                def att(scale: float, t=t, static=static, profile=profile) -> float:
                    return run_episode(_window(specs[t], scale), static, interval_s=interval_s,
                                       profile=profile, config=config).summary["slo_attainment"]

                scale = find_capacity(att, match_static, known)
                matched.append({"trace": trace_label(t), "target": match_static,
                                "rate_scale": scale, "static_attainment": known.get(scale)
                                if scale in known else att(scale)})
            mjobs = [(specs[t], c, m["rate_scale"], False) for t, m in zip(traces, matched)
                     for c in controllers]
            for row in pool.map(_row_job, mjobs, desc="runs at the static match"):
                row["matched_static"] = True
                rows.append(row)
        cap: list[dict] = []
        if capacity:
            cjobs = []
            for t in traces:
                for c in controllers:
                    known = {r["rate_scale"]: r["slo_attainment"] for r in rows
                             if r["trace"] == trace_label(t) and r["controller"] == c}
                    cjobs.append((specs[t], c, known))
            # the capacity jobs take longest for the best controllers: start them first
            cjobs.sort(key=lambda j: -sum(j[2].values()))
            cap.extend(pool.map(_capacity_job, cjobs, desc="capacities"))
    return {"rows": rows, "capacity": cap, "static_match": matched, "split": part,
            "interval_s": interval_s,
            "profile": Profile.load(profile_path).name, "wall_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agents.evaluate",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="synthetic",
                    help="comma-separated: synthetic | azure-conv | azure-code | PATH")
    ap.add_argument("--split", choices=("train", "eval", "all"), default="eval")
    ap.add_argument("--controllers", default=",".join(BASELINES),
                    help=f"comma-separated: {', '.join(BASELINES)}, policy:PATH")
    ap.add_argument("--rate-scales", default="1,2,4,8")
    ap.add_argument("--interval-s", type=float, default=0.25)
    ap.add_argument("--profile", default=None, help="executor profile (default: roofline H200)")
    ap.add_argument("--no-capacity", action="store_true", help="skip the capacity bisection")
    ap.add_argument("--match-static", type=float, default=None, metavar="SHARE",
                    help="also run every controller at the load where the static default "
                         "attains SHARE (e.g. 0.68)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ray", action="store_true",
                    help="run the jobs on Ray: RAY_ADDRESS's cluster or a local Ray of --workers "
                         "CPUs (docs/ray.md); RAY_ADDRESS alone also does")
    ap.add_argument("--out", type=Path, default=Path("runs/evaluate"),
                    help="folder for the plots and results.json (default runs/evaluate)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    try:
        scales = [float(x) for x in args.rate_scales.split(",") if x.strip()]
        if not scales or min(scales) <= 0:
            raise ValueError(f"--rate-scales must be positive numbers, got {args.rate_scales!r}")
        controllers = [c.strip() for c in args.controllers.split(",") if c.strip()]
        traces = [t.strip() for t in args.trace.split(",") if t.strip()]
        spec = EvalSpec(traces[0], args.split, args.profile, args.interval_s)
        for c in controllers:
            if c != "best-static":
                make_controller(c, spec)  # fail fast on a bad name or policy file
    except (ValueError, FileNotFoundError) as e:
        print(f"evaluate: {e}", file=sys.stderr)
        return 2
    result = evaluate(traces, controllers, scales, part=args.split, interval_s=args.interval_s,
                      profile_path=args.profile, capacity=not args.no_capacity,
                      workers=args.workers, ray=args.ray or None, progress=not args.json,
                      match_static=args.match_static)
    plots = plot(result["rows"], args.out)
    for r in result["rows"]:
        r.pop("timeline", None)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result))
    else:
        print(markdown_table(result["rows"], result["capacity"]))
        print(f"\nplots: {', '.join(str(p) for p in plots)}\nresults: {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
