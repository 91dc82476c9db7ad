"""Best static: the knobs an offline tuner would pick, by grid search on the training windows.

The search replays the trace's training split at each tuning rate scale with every knob setting
of :data:`GRID` held fixed, and keeps the setting with the highest mean SLO attainment (ties go
to the one reserving less memory: among the settings within :data:`TIE_TOLERANCE` of the best
mean, the lowest KV ratio, then the shortest window). The tuning loads,
:data:`TUNING_SCALES`, run from half to twice the trace's own rate in five steps: the load an
operator tunes for and the range around it, dense enough that settings differ somewhere (on the
conversation trace every setting meets its SLOs at 1x and misses at 2x), but not the overload of
the arena's higher rate scales, where only settings that matter once every controller has
failed would be picked. The result is cached in ``checkpoints/best_static/`` under a
key of everything it depends on (trace, split, scales, profile, SLO classes, grid), so it is
computed once per configuration and shipped with the repository.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from env.replay import replay
from env.traces import rate_scale, split
from env.traces.resolve import resolve_trace, trace_label
from runtime.decider.controller import StaticController
from runtime.engine.engine import EngineConfig
from runtime.engine.profile import Profile
from runtime.knobs import Knobs
from runtime.locations import best_static_dir

TUNING_SCALES: tuple[float, ...] = (0.5, 0.75, 1.0, 1.5, 2.0)
TIE_TOLERANCE = 0.001
"""settings whose mean attainment is this close to the best count as tied"""
GRID: dict[str, tuple] = {
    "batch_window_ms": (5.0, 20.0, 60.0),
    "prefill_chunk_tokens": (256, 512, 1024, 2048, 4096, 8192),
    "kv_cache_ratio": (0.5, 0.7, 0.8, 0.9, 0.95),
}


def _score(args: tuple) -> tuple[tuple, list[float]]:
    trace_spec, part, scales, knobs_t, profile_path, config = args
    trace = split(resolve_trace(trace_spec), part)
    profile = Profile.load(profile_path)
    atts = []
    for s in scales:
        t = rate_scale(trace, s) if s != 1.0 else trace
        atts.append(replay(t, Knobs(*knobs_t), profile=profile, config=config)
                    .summary.slo_attainment)
    return knobs_t, atts


def select_best(table: list[dict]) -> dict:
    """The best row of a grid-search table (see the module docstring for the tie rule)."""
    top = max(r["mean_attainment"] for r in table)
    tied = [r for r in table if r["mean_attainment"] >= top - TIE_TOLERANCE]
    return min(tied, key=lambda r: (r["knobs"][2], r["knobs"][0], -r["mean_attainment"]))


_LEVERS = ("batch_share", "admission", "admission_slack")
"""engine options beyond the knobs that change a replay's outcome; keyed only when they differ
from their defaults, so that adding one keeps the keys of the caches computed without it"""


def cache_key(trace_spec: str, part: str, scales: Sequence[float], profile: Profile,
              config: EngineConfig, grid: dict[str, tuple],
              classes_used: Sequence[str] | None = None) -> str:
    """The key of a grid search: everything its outcome depends on. The SLO classes are those
    of ``classes_used`` (the trace's; all of the config's when None), so that a class no request
    has does not change the key."""
    used = config.slo_classes if classes_used is None else classes_used
    desc = {"trace": trace_label(trace_spec), "split": part, "scales": list(scales),
            "profile": profile.to_json(),
            # (a zero prompt allowance is left out, so keys from before it existed still hold)
            "slo": {k: {f: x for f, x in asdict(config.slo_classes[k]).items()
                        if f != "ttft_per_prompt_token_s" or x} for k in used},
            "default_slo_class": config.default_slo_class, "grid": grid}
    defaults = EngineConfig()
    levers = {k: getattr(config, k) for k in _LEVERS if getattr(config, k) != getattr(defaults, k)}
    if levers:
        desc["levers"] = levers
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:12]


def grid_search(trace_spec: str, *, part: str = "train", scales: Sequence[float] = TUNING_SCALES,
                profile_path: str | Path | None = None, config: EngineConfig | None = None,
                grid: dict[str, tuple] | None = None, workers: int = 2,
                ray: bool | None = None, progress: bool = True) -> dict:
    """Score every knob setting of ``grid``; returns the best knobs and the whole table.

    The settings are scored in parallel by :class:`agents.parallel.JobRunner`: ``workers`` local
    processes, or Ray with ``ray=True`` (``None``: when ``RAY_ADDRESS`` is set)."""
    from agents.parallel import run_jobs

    grid = grid or GRID
    config = config or EngineConfig()
    profile_path = str(profile_path) if profile_path else None
    combos = list(itertools.product(*grid.values()))
    jobs = [(trace_spec, part, tuple(scales), c, profile_path, config) for c in combos]
    t0 = time.perf_counter()
    scored = run_jobs(_score, jobs, workers=workers, ray=ray, progress=progress,
                      desc=f"best-static grid search on {trace_label(trace_spec)}")
    results = [{"knobs": list(knobs_t), "attainment": atts,
                "mean_attainment": sum(atts) / len(atts)} for knobs_t, atts in scored]
    best = select_best(results)
    return {"best": best["knobs"], "best_mean_attainment": best["mean_attainment"],
            "trace": trace_label(trace_spec), "split": part, "scales": list(scales),
            "grid": {k: list(v) for k, v in grid.items()}, "table": results,
            "seconds": time.perf_counter() - t0}


def best_static_table(trace_spec: str, *, part: str = "train",
                      scales: Sequence[float] = TUNING_SCALES,
                      profile_path: str | Path | None = None, config: EngineConfig | None = None,
                      grid: dict[str, tuple] | None = None, cache_dir: Path | None = None,
                      workers: int = 2, ray: bool | None = None,
                      progress: bool = True) -> list[dict]:
    """Every setting of the grid search with its scores (:func:`grid_search`'s ``table``), from
    the cache or a fresh search (then cached). The arena's static frontier reads it too."""
    config = config or EngineConfig()
    grid = grid or GRID
    profile = Profile.load(profile_path)
    classes_used = sorted(set(split(resolve_trace(trace_spec), part).slo_class.tolist()))
    key = cache_key(trace_spec, part, scales, profile, config, grid, classes_used)
    path = Path(cache_dir or best_static_dir()) / f"{trace_label(trace_spec)}-{key}.json"
    if path.exists():
        return json.loads(path.read_text())["table"]
    result = grid_search(trace_spec, part=part, scales=scales, profile_path=profile_path,
                         config=config, grid=grid, workers=workers, ray=ray,
                         progress=progress)
    result["key"] = key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return result["table"]


def best_static_knobs(trace_spec: str, **search) -> Knobs:
    """The best static knobs for a trace (``search``: :func:`best_static_table`'s options)."""
    return Knobs(*select_best(best_static_table(trace_spec, **search))["knobs"])


class BestStaticController(StaticController):
    def __init__(self, knobs: Knobs) -> None:
        super().__init__(knobs, name="best-static")
