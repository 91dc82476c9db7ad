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

The class and admission levers are searched second, around the best three knobs (a full product
would multiply the grid's 90 settings by every lever setting): the admission policy with its
slack (:data:`ADMISSION_GRID`: first come first served, or shedding at 0.5 or 1 TTFT target;
the policy is a deployment setting, so best static may pick it as an operator would) and, only
when the trace has batch-class requests, the batch share (:data:`BATCH_SHARE_GRID`). The
deployment's own setting (the engine config's) is the first candidate and wins ties. This second
search is cached beside the first (``...-levers-KEY.json``); it costs 3 settings (no batch work)
or 12 (batch work) against the first search's 90.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from env.replay import replay
from env.traces import rate_scale, split
from env.traces.resolve import resolve_trace, trace_label
from runtime.decider.controller import StaticController
from runtime.engine.admission import AdmissionPolicy
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.profile import Profile
from runtime.knobs import DEFAULT_KNOBS, KNOB_NAMES, Knobs
from runtime.locations import best_static_dir

TUNING_SCALES: tuple[float, ...] = (0.5, 0.75, 1.0, 1.5, 2.0)
TIE_TOLERANCE = 0.001
"""settings whose mean attainment is this close to the best count as tied"""
RATIO_KNOB = "kv_cache_ratio"
"""the knob the arena's static frontier holds fixed"""
_RATIO_INDEX = KNOB_NAMES.index(RATIO_KNOB)
GRID: dict[str, tuple] = {
    "batch_window_ms": (5.0, 20.0, 60.0),
    "prefill_chunk_tokens": (256, 512, 1024, 2048, 4096, 8192),
    "kv_cache_ratio": (0.5, 0.7, 0.8, 0.9, 0.95),
}


GRID_KEYS = {"window": "batch_window_ms", "chunk": "prefill_chunk_tokens",
             "ratio": "kv_cache_ratio"}
"""the short names of the knob grid's axes on a command line"""


def parse_grid(text: str) -> dict[str, tuple]:
    """A knob grid from ``window=5,20;chunk=512,1024;ratio=0.9,0.95`` (an axis left out keeps
    :data:`GRID`'s values); ValueError naming the part that is wrong."""
    grid = dict(GRID)
    for part in (p.strip() for p in text.split(";") if p.strip()):
        key, sep, values = part.partition("=")
        if not sep or key.strip() not in GRID_KEYS:
            raise ValueError(f"--static-grid: {part!r} is not one of "
                             f"{', '.join(k + '=v1,v2,...' for k in GRID_KEYS)}")
        name = GRID_KEYS[key.strip()]
        try:
            vals = tuple(float(v) for v in values.split(",") if v.strip())
        except ValueError:
            raise ValueError(f"--static-grid: {part!r} holds a value that is not a number") \
                from None
        if not vals:
            raise ValueError(f"--static-grid: {part!r} names no value")
        grid[name] = tuple(int(v) for v in vals) if name == "prefill_chunk_tokens" else vals
        try:
            for v in grid[name]:
                Knobs(**{**DEFAULT_KNOBS.as_dict(), name: v})
        except ValueError as e:
            raise ValueError(f"--static-grid: {e}") from None
    return grid


ADMISSION_GRID: tuple[tuple[str, float], ...] = (
    (AdmissionPolicy.FCFS.value, 1.0), (AdmissionPolicy.SHED.value, 0.5),
    (AdmissionPolicy.SHED.value, 1.0))
"""(admission policy, admission slack) settings the lever search tries"""
BATCH_SHARE_GRID: tuple[float, ...] = (1.0, 0.5, 0.25, 0.1)
"""batch shares the lever search tries when the trace has batch-class requests"""


def _score(args: tuple) -> tuple[tuple, list[float]]:
    """Attainment at each scale of a setting: ``knobs_t`` (3 or 5 knob values) under ``config``
    (whose admission policy applies)."""
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
    """Every knob setting of the grid with its scores (:func:`grid_search`'s ``table``), from
    the cache or a fresh grid search (then cached)."""
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


def best_static_knobs(trace_spec: str, *, kv_cache_ratio: float | None = None,
                      **search: Any) -> Knobs:
    """The best static knobs of the grid (the first three; the others are the config's) for a
    trace (``search``: :func:`best_static_table`'s options).

    :param kv_cache_ratio: the best among the settings at this KV ratio (a point of the arena's
        static frontier): read from the grid's own table when the grid has the ratio, else
        from a search of the grid with the ratio held fixed
    """
    grid = search.pop("grid", None) or GRID
    if kv_cache_ratio is not None and kv_cache_ratio not in grid[RATIO_KNOB]:
        grid = {**grid, RATIO_KNOB: (kv_cache_ratio,)}
    table = best_static_table(trace_spec, grid=grid, **search)
    if kv_cache_ratio is not None:
        table = [r for r in table if r["knobs"][_RATIO_INDEX] == kv_cache_ratio]
    config = search.get("config") or EngineConfig()
    return config.start_knobs(Knobs(*select_best(table)["knobs"]))


@dataclass(frozen=True)
class BestStatic:
    """Best static's choice: the five knobs, and the admission policy (a deployment setting)."""

    knobs: Knobs
    admission: str


def _lever_candidates(config: EngineConfig, batch_work: bool) -> list[tuple[str, float, float]]:
    """(admission, slack, batch share) settings, the deployment's first."""
    base = (config.admission, config.admission_slack, config.batch_share)
    shares = BATCH_SHARE_GRID if batch_work else (config.batch_share,)
    out = [base] + [(a, slack, share) for a, slack in ADMISSION_GRID for share in shares]
    return list(dict.fromkeys(out))


def lever_settings(setting: BestStatic, batch_work: bool) -> list[BestStatic]:
    """The lever search's settings around ``setting``'s first three knobs: its own levers first,
    then every admission policy and slack of :data:`ADMISSION_GRID` (and with ``batch_work``
    every batch share of :data:`BATCH_SHARE_GRID`)."""
    k = setting.knobs
    shares = BATCH_SHARE_GRID if batch_work else (k.batch_share,)
    out = [setting] + [BestStatic(replace(k, admission_slack=slack, batch_share=share), a)
                       for a, slack in ADMISSION_GRID for share in shares]
    return list(dict.fromkeys(out))


def lever_search(trace_spec: str, knobs: Knobs, *, part: str = "train",
                 scales: Sequence[float] = TUNING_SCALES,
                 profile_path: str | Path | None = None, config: EngineConfig | None = None,
                 batch_work: bool = False, workers: int = 2, ray: bool | None = None,
                 progress: bool = True) -> dict:
    """Score the admission and (with ``batch_work``) batch-share settings around ``knobs`` (the
    best of the knob grid); returns the best and the whole table (see the module docstring)."""
    from agents.parallel import run_jobs

    config = config or EngineConfig()
    profile_path = str(profile_path) if profile_path else None
    candidates = _lever_candidates(config, batch_work)
    neutral = replace(config, batch_share=DEFAULT_KNOBS.batch_share,
                      admission_slack=DEFAULT_KNOBS.admission_slack)
    jobs = [(trace_spec, part, tuple(scales),
             replace(knobs, admission_slack=slack, batch_share=share).as_tuple(),
             profile_path, replace(neutral, admission=admission))
            for admission, slack, share in candidates]
    t0 = time.perf_counter()
    scored = run_jobs(_score, jobs, workers=workers, ray=ray, progress=progress,
                      desc=f"best-static lever search on {trace_label(trace_spec)}")
    table = [{"admission": a, "admission_slack": slack, "batch_share": share,
              "attainment": atts, "mean_attainment": float(np.mean(atts))}
             for (a, slack, share), (_, atts) in zip(candidates, scored)]
    top = max(r["mean_attainment"] for r in table)
    best = next(r for r in table if r["mean_attainment"] >= top - TIE_TOLERANCE)
    return {"best": best, "knobs": list(knobs.as_tuple()), "table": table,
            "seconds": time.perf_counter() - t0}


def best_static_setting(trace_spec: str, *, part: str = "train",
                        scales: Sequence[float] = TUNING_SCALES,
                        profile_path: str | Path | None = None,
                        config: EngineConfig | None = None, grid: dict[str, tuple] | None = None,
                        cache_dir: Path | None = None, workers: int = 2,
                        ray: bool | None = None, progress: bool = True,
                        kv_cache_ratio: float | None = None) -> BestStatic:
    """Best static's knobs and admission policy: the knob grid (:func:`best_static_knobs`),
    then the lever search around its best (:func:`lever_search`), each from its cache or
    computed and cached.

    :param kv_cache_ratio: hold the KV ratio at this value (the arena's static frontier): the
        best knobs at that ratio (:func:`best_static_knobs`), then the lever search around them
    """
    config = config or EngineConfig()
    grid = grid or GRID
    knobs = best_static_knobs(trace_spec, part=part, scales=scales, profile_path=profile_path,
                              config=config, grid=grid, cache_dir=cache_dir, workers=workers,
                              ray=ray, progress=progress, kv_cache_ratio=kv_cache_ratio)
    profile = Profile.load(profile_path)
    trace_classes = set(split(resolve_trace(trace_spec), part).slo_class.tolist())
    batch_work = any(config.slo_classes[c].is_batch for c in trace_classes)
    key = cache_key(trace_spec, part, scales, profile, config, grid, sorted(trace_classes))
    desc = {"knobs": list(knobs.as_tuple()), "admission": ADMISSION_GRID,
            "batch_share": BATCH_SHARE_GRID if batch_work else None}
    sub = hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:8]
    path = (Path(cache_dir or best_static_dir())
            / f"{trace_label(trace_spec)}-{key}-levers-{sub}.json")
    if path.exists():
        best = json.loads(path.read_text())["best"]
    else:
        result = lever_search(trace_spec, knobs, part=part, scales=scales,
                              profile_path=profile_path, config=config, batch_work=batch_work,
                              workers=workers, ray=ray, progress=progress)
        result["key"] = f"{key}-{sub}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
        best = result["best"]
    return BestStatic(replace(knobs, batch_share=best["batch_share"],
                              admission_slack=best["admission_slack"]), best["admission"])


def best_static_reference(trace_spec: str, *, config: EngineConfig | None = None,
                          **search: Any) -> Knobs:
    """Best static's knobs under the deployment's own admission policy: training's reference
    (the differential reward's pairing, the imitation oracle's anchor) and the arena's
    best-static row are then one setting. That is :func:`best_static_setting`'s knobs, lever
    search included (on ``mixed`` the batch share: 0.1, where the knob grid alone keeps 1), when
    it keeps the deployment's admission policy; when it picks another one (which no controller
    may change), the knob grid's best under the deployment's levers."""
    config = config or EngineConfig()
    best = best_static_setting(trace_spec, config=config, **search)
    if best.admission == config.admission:
        return best.knobs
    return best_static_knobs(trace_spec, config=config, **search)


def fixed_config(config: EngineConfig, admission: str | None) -> EngineConfig:
    """``config`` for an engine that starts with a fixed setting's knobs: its admission policy,
    and the batch share and slack left to the knobs (the config's would override them)."""
    return replace(config, admission=admission or config.admission,
                   batch_share=DEFAULT_KNOBS.batch_share,
                   admission_slack=DEFAULT_KNOBS.admission_slack)


class BestStaticController(StaticController):
    """A fixed setting (best static's, hindsight static's, a frontier point): its knobs, with its
    admission policy set on the engine it is bound to. A fixed setting is what an engine starts
    with, so the arena builds the engine with it (:meth:`start`) rather than switching to it
    after the first interval; a replay that needs no timeline then runs straight through."""

    def __init__(self, knobs: Knobs, admission: str | None = None, *,
                 name: str = "best-static") -> None:
        super().__init__(knobs, name=name)
        self.admission = admission

    def start(self, config: EngineConfig) -> tuple[Knobs, EngineConfig]:
        """The knobs and the engine config an engine under this setting starts with."""
        return self.knobs, fixed_config(config, self.admission)

    def bind(self, engine: Engine) -> None:
        if self.admission is not None and self.admission != engine.admission:
            engine.set_admission(self.admission)
