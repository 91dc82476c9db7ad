"""Oracle labels at scale: observation in, the lookahead oracle's setting out, for imitation.

    batchpilot oracle-label --trace azure-code --windows 8 \\
        --rate-scales 0.5 1.0 --out runs/labels/azure-code.npz

Random windows of a trace split (start uniform, rate scale drawn from ``rate_scales``; seeded)
are replayed through the same session the environment trains in. At every decision interval the
oracle searches from the engine's state (one search per observation) and drives the session with
the setting it found, so the states labelled are the ones the oracle's own control visits. Each
label is the observation the session gave at the end of the interval and the setting chosen from
there. A window is labelled until its last request has arrived (as an environment episode ends).

The compressed ``.npz`` holds:

- ``observations`` [n, OBS_DIM] float32: the observation vectors (``runtime.observation``)
- ``settings`` [n, k] float32: the chosen setting, one column per name in ``setting_names``
  (the knobs in their units, then any lever; NaN where a lever is left unset)
- ``actions`` [n, NUM_KNOBS] float32: the chosen knobs as actions in [-1, 1] (``knobs_to_action``)
- ``scores`` [n, candidates] float32: every candidate's horizon score (for soft or ranked labels)
- ``window``, ``t_s``, ``rate_scale`` [n]: which window, the simulated time, its load
- ``setting_names``, ``candidates`` (labels of the candidate settings), ``config`` (JSON)
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from agents.oracle import (
    LookaheadOracle,
    OracleConfig,
    Setting,
    setting_names,
    setting_vector,
)
from env.session import ServingSession
from env.traces import rate_scale, split, time_window
from env.traces.resolve import resolve_trace
from env.traces.trace import Trace
from runtime.engine.engine import EngineConfig
from runtime.engine.profile import Profile
from runtime.knobs import DEFAULT_KNOBS, NUM_KNOBS, knobs_to_action
from runtime.observation import OBS_DIM


@dataclass
class LabelConfig:
    """What to label and how the oracle searches."""

    out: Path = Path("runs/labels/oracle_labels.npz")
    """the compressed .npz written"""
    trace: str = "synthetic"
    """synthetic | azure-conv | azure-code | a trace file"""
    split: str = "train"
    """the part of the trace windows are drawn from: train | eval | all"""
    windows: int = 4
    """how many windows to label"""
    window_s: float = 120.0
    """length of a window in simulated seconds (after rate scaling)"""
    rate_scales: tuple[float, ...] = (0.5, 1.0, 1.5)
    """each window's load is drawn from these rate scales"""
    seed: int = 0
    """seeds the windows' starts and loads"""
    interval_s: float = 0.25
    """the decision interval: one observation, one search"""
    horizon_s: float = 10.0
    """simulated seconds each candidate runs ahead"""
    candidates: str = OracleConfig.candidates
    """the grid searched (``agents.oracle.parse_candidates``)"""
    violation_weight: float = 1.0
    """score = met - violation_weight * violations over the horizon"""
    anchor: bool = True
    """put best static's setting for the trace first (it wins ties) and roll each candidate out
    with it, as the arena's oracle does (a trace file without a cached grid search gets one)"""
    profile: str | None = None
    """executor profile file (default: the shipped roofline H200 profile)"""
    progress: bool = True
    """show a progress bar on stderr (a tick per window)"""
    workers: int = 1
    """windows labelled at once: local processes, or the CPUs of a local Ray with --ray"""
    ray: bool = False
    """label on Ray: the cluster at RAY_ADDRESS or a local Ray of --workers CPUs (docs/ray.md);
    RAY_ADDRESS alone also does"""
    oracle: OracleConfig = field(init=False)
    """the oracle's configuration, built from the fields above (one search per interval)"""

    def __post_init__(self) -> None:
        if self.windows < 1:
            raise ValueError(f"LabelConfig.windows must be >= 1, got {self.windows}")
        if not self.window_s > 0:
            raise ValueError(f"LabelConfig.window_s must be positive, got {self.window_s}")
        if not self.rate_scales or min(self.rate_scales) <= 0:
            raise ValueError(f"LabelConfig.rate_scales must be positive, got {self.rate_scales}")
        if not self.interval_s > 0:
            raise ValueError(f"LabelConfig.interval_s must be positive, got {self.interval_s}")
        if self.workers < 1:
            raise ValueError(f"LabelConfig.workers must be >= 1, got {self.workers}")
        self.oracle = OracleConfig(period_s=self.interval_s, horizon_s=self.horizon_s,
                                   candidates=self.candidates,
                                   violation_weight=self.violation_weight)


@dataclass
class Labels:
    """Labels of one or more windows, with what they cost."""

    observations: list[np.ndarray] = field(default_factory=list)
    settings: list[np.ndarray] = field(default_factory=list)
    actions: list[tuple[float, ...]] = field(default_factory=list)
    scores: list[tuple[float, ...]] = field(default_factory=list)
    window: list[int] = field(default_factory=list)
    t_s: list[float] = field(default_factory=list)
    rate_scale: list[float] = field(default_factory=list)
    sim_s: float = 0.0
    """simulated seconds the labelled sessions advanced (not counting the look aheads)"""
    wall_s: float = 0.0
    """wall seconds spent labelling"""
    cpu_s: float = 0.0
    """CPU seconds of this process spent labelling (on a shared machine, the honest cost)"""

    def __len__(self) -> int:
        return len(self.observations)

    def add(self, observation: np.ndarray, oracle: LookaheadOracle, setting: Setting,
            window: int, t_s: float, rate_scale: float) -> None:
        """One label: ``oracle`` (which has just searched) chose ``setting`` at ``observation``,
        at engine time ``t_s`` of window ``window`` replayed at ``rate_scale``."""
        found = oracle.last_search
        if found is None:
            raise RuntimeError("Labels.add: the oracle has not searched yet")
        self.observations.append(observation)
        self.settings.append(setting_vector(setting, setting_names(oracle.candidates)))
        self.actions.append(knobs_to_action(setting.knobs))
        self.scores.append(found.scores)
        self.window.append(window)
        self.t_s.append(t_s)
        self.rate_scale.append(rate_scale)

    def extend(self, other: Labels) -> None:
        """Append ``other``'s labels and add its costs."""
        for name in ("observations", "settings", "actions", "scores", "window", "t_s",
                     "rate_scale"):
            getattr(self, name).extend(getattr(other, name))
        self.sim_s += other.sim_s
        self.wall_s += other.wall_s
        self.cpu_s += other.cpu_s


def label_window(window: Trace, oracle: LookaheadOracle, labels: Labels, *, index: int = 0,
                 scale: float = 1.0, interval_s: float = 0.25, profile: Profile | None = None,
                 config: EngineConfig | None = None, on_label=None) -> None:
    """Replay ``window`` with ``oracle`` deciding every interval and append a label per
    observation to ``labels``. ``on_label()`` is called after each (for progress)."""
    t0, c0 = time.perf_counter(), time.process_time()
    session = ServingSession(window, interval_s=interval_s, profile=profile, config=config,
                             knobs=DEFAULT_KNOBS)
    oracle.bind(session.engine)
    result = session.step(DEFAULT_KNOBS)
    while not session.window_over:
        knobs = oracle.decide(result.observation).knobs
        labels.add(result.observation, oracle, oracle.current, index, session.now, scale)
        result = session.step(knobs)
        if on_label is not None:
            on_label()
    labels.sim_s += session.now
    labels.wall_s += time.perf_counter() - t0
    labels.cpu_s += time.process_time() - c0


def draw_windows(cfg: LabelConfig) -> list[tuple[Trace, float]]:
    """The windows to label and their rate scales, drawn from ``cfg.seed``."""
    trace = split(resolve_trace(cfg.trace), cfg.split)
    rng = np.random.default_rng(cfg.seed)
    span_end = float(trace.arrival_s[-1])
    out = []
    for _ in range(cfg.windows):
        scale = float(rng.choice(cfg.rate_scales))
        span = cfg.window_s * scale  # trace seconds that become window_s after scaling
        for _attempt in range(100):
            start = float(rng.uniform(0.0, max(0.0, span_end - span)))
            window = time_window(trace, start, start + span)
            if len(window) >= 2:
                break
        else:
            raise ValueError(f"trace {cfg.trace!r} ({cfg.split}) has no {span:g} s stretch with "
                             "two requests in 100 draws")
        out.append((rate_scale(window, scale) if scale != 1.0 else window, scale))
    return out


def _label_job(job: tuple[LabelConfig, Setting | None, int, Trace, float]) -> Labels:
    """One window's labels, by a fresh oracle: a window is an episode of its own, so the
    windows can be labelled in any order, on any worker, with the same result."""
    cfg, anchor, index, window, scale = job
    oracle = LookaheadOracle(cfg.oracle, anchor=anchor, interval_s=cfg.interval_s)
    labels = Labels()
    label_window(window, oracle, labels, index=index, scale=scale, interval_s=cfg.interval_s,
                 profile=Profile.load(cfg.profile))
    return labels


def label(cfg: LabelConfig) -> tuple[Labels, LookaheadOracle]:
    """Label ``cfg.windows`` windows, ``cfg.workers`` at a time (:class:`agents.parallel.
    JobRunner`); returns the labels, in window order, and an oracle of the configuration that
    made them. ``wall_s`` is the whole labelling's elapsed time, ``cpu_s`` the workers' sum."""
    from agents.parallel import run_jobs

    anchor = None
    if cfg.anchor:
        from agents.controllers.best_static import best_static_knobs

        anchor = Setting(best_static_knobs(cfg.trace, part="train", profile_path=cfg.profile))
    jobs = [(cfg, anchor, i, window, scale) for i, (window, scale) in enumerate(draw_windows(cfg))]
    t0 = time.perf_counter()
    parts = run_jobs(_label_job, jobs, workers=cfg.workers, ray=cfg.ray or None,
                     progress=cfg.progress, desc="oracle label windows")
    labels = Labels()
    for part in parts:
        labels.extend(part)
    labels.wall_s = time.perf_counter() - t0
    return labels, LookaheadOracle(cfg.oracle, anchor=anchor, interval_s=cfg.interval_s)


def save(labels: Labels, oracle: LookaheadOracle, cfg: LabelConfig) -> Path:
    """Write ``labels`` to ``cfg.out`` as a compressed .npz (see the module docstring)."""
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    names = setting_names(oracle.candidates)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    np.savez_compressed(
        cfg.out,
        observations=np.asarray(labels.observations, dtype=np.float32).reshape(-1, OBS_DIM),
        settings=np.asarray(labels.settings, dtype=np.float32).reshape(-1, len(names)),
        actions=np.asarray(labels.actions, dtype=np.float32).reshape(-1, NUM_KNOBS),
        scores=np.asarray(labels.scores, dtype=np.float32).reshape(-1, len(oracle.candidates)),
        window=np.asarray(labels.window, dtype=np.int32),
        t_s=np.asarray(labels.t_s, dtype=np.float64),
        rate_scale=np.asarray(labels.rate_scale, dtype=np.float32),
        setting_names=np.asarray(names),
        candidates=np.asarray([c.label() for c in oracle.candidates]),
        config=np.asarray(json.dumps(config)),
    )
    return cfg.out


def main(argv: list[str] | None = None) -> int:
    import tyro

    cfg = tyro.cli(LabelConfig, args=argv, description=__doc__.splitlines()[0])
    labels, oracle = label(cfg)
    path = save(labels, oracle, cfg)
    n = max(len(labels), 1)
    cpu = labels.cpu_s / n
    print(f"{len(labels)} labels from {cfg.windows} windows of {cfg.trace} ({cfg.split}), "
          f"{len(oracle.candidates)} candidates x {cfg.horizon_s:g} s ahead per "
          f"{cfg.interval_s:g} s interval: {labels.wall_s:.1f} s wall "
          f"({labels.wall_s / n * 1e3:.1f} ms a label, "
          f"{labels.sim_s / labels.wall_s:.2f} simulated s per wall s), "
          f"{labels.cpu_s:.1f} s CPU ({cpu * 1e3:.1f} ms a label, "
          f"{labels.sim_s / labels.cpu_s:.2f} simulated s per CPU s); 100k labels at this CPU "
          f"cost: {cpu * 1e5 / 3600:.2f} h on one core -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
