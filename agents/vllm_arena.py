"""The arena on a live vLLM engine: controllers side by side on held-out windows, at the loads
the calibrated simulator names, each run on vLLM and predicted by the simulator.

A vLLM run takes the wall time of its window, so this arena does not bisect capacities on vLLM:
the simulator calibrated against this vLLM (its measured profile) finds, per trace, the load at
which the static default attains ``static_target`` and best static's capacity (the largest load
it holds at ``capacity_target``), on the window itself, best static being tuned on a window of
the training split of the same length (:func:`tuned_best_static`: the arena's own best static
searches the whole split, too long a search per vLLM run); then every controller replays the window
on vLLM at both loads, the arms interleaved (the controllers' order rotates each repeat) and
repeated, and the simulator replays it too. A row reports vLLM's interactive attainment (median
and range over the repeats), the simulator's, their difference in points, mean KV GiB on both,
and that every request ended (requests = finished + rejected, per class and reason).

    .venv-vllm/bin/python -m agents.evaluate --engine vllm --trace azure-conv,azure-code \\
        --profile checkpoints/profiles/cpu-vllm-tiny-measured.json \\
        --controllers static,best-static,pid,policy:runs/vllm-policy/policy.onnx
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agents.arena import find_capacity, run_episode, static_default
from agents.controllers.best_static import BestStaticController, best_static_setting
from agents.registry import EvalSpec, make_controller
from env.traces import rate_scale, split, time_window
from env.traces.resolve import resolve_trace, trace_label
from env.traces.trace import Trace
from runtime.decider.controller import Controller
from runtime.engine.config import EngineConfig
from runtime.engine.profile import Profile


@dataclass
class VllmArena:
    """``--engine vllm``: the arena on a live vLLM engine (docs/vllm.md)."""

    model: str | None = None
    """the model folder (default: the tiny dummy-weight Llama, written to a temporary folder)"""
    kv_cache_gib: float = 1 / 16
    """the KV pool vLLM allocates at start-up, GiB (the profile's memory model must match)"""
    window_start_s: float = 80.0
    """where each trace's window starts in its held-out split, seconds of the trace after its
    first request (before rate scaling; 80 s steps over the burst azure-code's split opens
    with: 478 requests in its first 80 s, against a median of 57 per 80 s after)"""
    window_s: float = 20.0
    """each run's window of arrivals, seconds of wall clock (after rate scaling)"""
    repeats: int = 2
    """runs of every (trace, load, controller) on vLLM, interleaved"""
    loads: str = "auto"
    """rate scales, comma-separated, or auto: the static default's ``static_target`` load and
    best static's capacity at ``capacity_target``, found by the calibrated simulator"""
    static_target: float = 0.68
    """the static default's interactive attainment at the first load"""
    capacity_target: float = 0.99
    """the attainment that defines best static's capacity (the second load)"""
    drain_s: float = 120.0
    """a run still draining this long after its last arrival is cut off (aborted)"""


def window(trace: str, scale: float, arena: VllmArena) -> Trace:
    """The held-out window of ``trace`` at ``scale`` (scaled, then cut: a run's wall time stays
    ``window_s`` whatever the load)."""
    scaled = rate_scale(split(resolve_trace(trace), "eval"), scale)
    t0 = (float(scaled.arrival_s[0]) if len(scaled) else 0.0) + arena.window_start_s / scale
    w = time_window(scaled, t0, t0 + arena.window_s)
    if len(w) < 2:
        raise ValueError(f"{trace}: the window of {arena.window_s:g} s at rate scale {scale:g} "
                         f"holds {len(w)} requests")
    return w


def simulate(spec: EvalSpec, controller: Controller, w: Trace, profile: Profile) -> dict:
    """The calibrated simulator's summary of ``controller`` on ``w``."""
    return run_episode(w, controller, interval_s=spec.interval_s, profile=profile,
                       config=spec.config).summary


TUNING_MULTIPLES = (0.5, 1.0, 2.0)
"""best static is tuned at these multiples of the static default's first load"""
LOWEST_SCALE = 1 / 16
"""the lightest rate scale the load searches try"""


def tuned_best_static(trace: str, spec: EvalSpec, arena: VllmArena, static_load: float,
                      cache_dir: Path) -> Controller:
    """Best static tuned on the trace's training split, as the arena's best static is, but on
    a window of the arena's length (the simulator replays each of the grid's settings there, at
    ``TUNING_MULTIPLES`` of the static default's load): deployable (it never sees the held-out
    window), and cheap enough to search per run."""
    # a static default under target even at the lightest load tried (the search's 0): tune at
    # that load rather than on an empty window
    scales = tuple(m * max(static_load, LOWEST_SCALE) for m in TUNING_MULTIPLES)
    train = split(resolve_trace(trace), "train")
    t0 = float(train.arrival_s[0]) + arena.window_start_s
    raw = time_window(train, t0, t0 + arena.window_s * max(scales))
    if len(raw) == 0:
        raise ValueError(f"{trace}: best static cannot be tuned: the training split holds no "
                         f"request from {arena.window_start_s:g} s to "
                         f"{arena.window_start_s + arena.window_s * max(scales):g} s (a bursty "
                         "trace: start the window elsewhere, window_start_s)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"{trace_label(trace)}-train-window.csv"
    rows = ["arrival_s,prompt_tokens,output_tokens,slo_class"]
    rows += [f"{a:.6f},{p},{o},{c}" for a, p, o, c in
             zip(raw.arrival_s.tolist(), raw.prompt_tokens.tolist(), raw.output_tokens.tolist(),
                 raw.slo_class.tolist())]
    path.write_text("\n".join(rows) + "\n")
    setting = best_static_setting(str(path), part="all", scales=scales,
                                  profile_path=spec.profile_path, config=spec.config,
                                  cache_dir=cache_dir, progress=False)
    return BestStaticController(setting.knobs, setting.admission)


def controller_for(name: str, spec: EvalSpec, tuned: dict[str, Controller]) -> Controller:
    return tuned[name] if name in tuned else make_controller(name, spec)


def find_loads(spec: EvalSpec, trace: str, arena: VllmArena, profile: Profile,
               best: Controller) -> dict:
    """The two loads by the calibrated simulator on the window (see the module docstring)."""
    static_spec = dataclasses.replace(spec, config=static_default(spec.config))
    static68 = find_capacity(
        lambda s: simulate(static_spec, make_controller("static", static_spec),
                           window(trace, s, arena), profile)["interactive_attainment"],
        arena.static_target, {}, lowest=LOWEST_SCALE, highest=16.0)
    cap = find_capacity(
        lambda s: simulate(spec, best, window(trace, s, arena), profile)["slo_attainment"],
        arena.capacity_target, {}, lowest=LOWEST_SCALE, highest=16.0)
    return {f"static@{arena.static_target:g}": static68,
            f"best-static capacity@{arena.capacity_target:g}": cap}


def static_load(spec: EvalSpec, trace: str, arena: VllmArena, profile: Profile) -> float:
    static_spec = dataclasses.replace(spec, config=static_default(spec.config))
    return find_capacity(
        lambda s: simulate(static_spec, make_controller("static", static_spec),
                           window(trace, s, arena), profile)["interactive_attainment"],
        arena.static_target, {}, lowest=LOWEST_SCALE, highest=16.0)


def run_on_vllm(server, spec: EvalSpec, ctrl: Controller, w: Trace, arena: VllmArena) -> dict:
    """One run of ``ctrl`` on ``w`` through vLLM (behind the fail-safe)."""
    from runtime.decider.failsafe import FailSafe
    from runtime.session import run_engine
    from runtime.vllm.engine import VllmPacer

    ctrl.reset()
    engine = server.engine(spec.config, spec.static_knobs)
    engine.add_requests(w.arrival_s, w.prompt_tokens, w.output_tokens, w.slo_class)
    end = float(w.arrival_s[-1]) if len(w) else 0.0
    res = run_engine(engine, VllmPacer(), FailSafe(ctrl, spec.static_knobs),
                     interval_s=spec.interval_s, max_s=end + arena.drain_s)
    s = res.as_dict()
    cost = engine.controller_cost(sum(r.decide_us for r in res.intervals) * 1e-6)
    return {**s, "conservation": engine.check_conservation(), "controller_cost": cost,
            "load_1m": os.getloadavg()[0]}


def rotated(items: Sequence[str], k: int) -> list[str]:
    k %= max(1, len(items))
    return [*items[k:], *items[:k]]


def run_vllm_arena(traces: Sequence[str], controllers: Sequence[str], profile_path: str,
                   config: EngineConfig, interval_s: float, arena: VllmArena,
                   out: Path | None = None, log=print) -> dict:
    """The whole arena on vLLM (see the module docstring); returns rows and loads."""
    import tempfile

    from runtime.vllm import slo_classes_for
    from runtime.vllm.engine import VllmServer, VllmSettings
    from runtime.vllm.model import write_tiny_model

    t0 = time.perf_counter()
    profile = Profile.load(profile_path)
    if config.slo_classes == EngineConfig().slo_classes:  # no --slo: scaled to vLLM's speed
        config = dataclasses.replace(config, slo_classes=slo_classes_for(profile),
                                     default_slo_class="interactive")
    model = arena.model or str(write_tiny_model(tempfile.mkdtemp(prefix="tiny-llama-")))
    server = VllmServer.start(VllmSettings(model=model, kv_cache_gib=arena.kv_cache_gib))
    log(f"vLLM {server.version} started in {server.startup_s:.0f} s; "
        f"{server.pool_blocks} KV blocks")
    rows: list[dict] = []
    loads: dict[str, dict] = {}
    for trace in traces:
        spec = EvalSpec(trace, "eval", profile_path, interval_s, config)
        s68 = static_load(spec, trace, arena, profile)
        tuned: dict[str, Controller] = {}
        if "best-static" in controllers or arena.loads == "auto":
            tuned["best-static"] = tuned_best_static(
                trace, spec, arena, s68, (out or Path("runs/evaluate")) / "best_static")
        if arena.loads == "auto":
            loads[trace] = find_loads(spec, trace, arena, profile, tuned["best-static"])
        else:
            loads[trace] = {f"x{float(x):g}": float(x) for x in arena.loads.split(",") if x}
        log(f"{trace_label(trace)}: loads {loads[trace]}"
            + (f"; best static {tuned['best-static'].knobs.as_dict()}" if tuned else ""))
        for load_name, scale in loads[trace].items():
            w = window(trace, scale, arena)
            predicted = {c: simulate(spec, controller_for(c, spec, tuned), w, profile)
                         for c in controllers}
            runs: dict[str, list[dict]] = {c: [] for c in controllers}
            for k in range(arena.repeats):
                for c in rotated(controllers, k):
                    r = run_on_vllm(server, spec, controller_for(c, spec, tuned), w, arena)
                    runs[c].append(r)
                    log(f"  {trace_label(trace)} {load_name} (x{scale:.3g}, {len(w)} requests) "
                        f"{c} #{k + 1}: interactive {r['interactive_attainment']:.1%} on vLLM, "
                        f"{predicted[c]['interactive_attainment']:.1%} simulated "
                        f"(load {r['load_1m']:.1f})")
            for c in controllers:
                att = [r["interactive_attainment"] for r in runs[c]]
                sim = predicted[c]
                rows.append({
                    "trace": trace_label(trace), "load": load_name, "rate_scale": scale,
                    "requests": len(w), "controller": c,
                    "vllm_interactive_attainment": float(np.median(att)),
                    "vllm_interactive_attainment_range": [float(min(att)), float(max(att))],
                    "sim_interactive_attainment": sim["interactive_attainment"],
                    "diff_points": 100.0 * (float(np.median(att))
                                            - sim["interactive_attainment"]),
                    "vllm_mean_kv_gib": float(np.median([r["mean_kv_gib"] for r in runs[c]])),
                    "sim_mean_kv_gib": sim["mean_kv_gib"],
                    "conserved": all(r["requests"] == r["finished"] + r["rejected"]
                                     + r["rejected_by_reason"].get("aborted", 0)
                                     for r in runs[c]),
                    "conservation": runs[c][-1]["conservation"],
                    "rejected_by_reason": runs[c][-1]["rejected_by_reason"],
                    "sources": runs[c][-1]["sources"],
                    "load_1m": [r["load_1m"] for r in runs[c]],
                    "controller_cost_ratio": [r["controller_cost"]["ratio"] for r in runs[c]],
                })
    result = {"engine": f"vllm {server.version}", "profile": profile_path, "loads": loads,
              "rows": rows, "repeats": arena.repeats, "window_s": arena.window_s,
              "config": {"admission": config.admission, "admission_slack": config.admission_slack,
                         "slo": {k: dataclasses.asdict(v) for k, v in config.slo_classes.items()}},
              "vllm_startup_s": server.startup_s, "seconds": time.perf_counter() - t0}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "vllm_arena.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def table(result: dict) -> str:
    """The arena's rows as a markdown table."""
    head = ("| trace | load | controller | vLLM interactive (range) | simulated | diff, points "
            "| KV GiB vLLM / sim | conserved |\n|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in result["rows"]:
        lo, hi = r["vllm_interactive_attainment_range"]
        lines.append(
            f"| {r['trace']} | {r['load']} (x{r['rate_scale']:.3g}) | {r['controller']} | "
            f"{r['vllm_interactive_attainment']:.1%} ({lo:.1%}-{hi:.1%}) | "
            f"{r['sim_interactive_attainment']:.1%} | {r['diff_points']:+.1f} | "
            f"{r['vllm_mean_kv_gib']:.3f} / {r['sim_mean_kv_gib']:.3f} | "
            f"{'yes' if r['conserved'] else 'NO'} |")
    return "\n".join(lines)


def main_vllm(cfg) -> int:
    """``agents.evaluate --engine vllm`` (``cfg``: its Config)."""
    try:
        traces = cfg.names(cfg.trace, "--trace")
        controllers = cfg.names(cfg.controllers, "--controllers")
        if cfg.profile is None:
            raise ValueError("--engine vllm needs --profile: the profile measured on this vLLM "
                             "(checkpoints/profiles/cpu-vllm-tiny-measured.json)")
        profile = str(cfg.spec())
        config = cfg.engine_config()
    except ValueError as e:
        print(f"evaluate: {e}", file=sys.stderr)
        return 2
    result = run_vllm_arena(traces, controllers, profile, config, cfg.interval_s, cfg.vllm,
                            cfg.out, log=lambda *a: print(*a, file=sys.stderr, flush=True))
    if cfg.json:
        print(json.dumps(result))
    else:
        print(table(result))
    return 0 if all(r["conserved"] for r in result["rows"]) and not any(
        math.isnan(r["vllm_interactive_attainment"]) for r in result["rows"]) else 1
