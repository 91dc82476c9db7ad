"""Imitation of the lookahead oracle, PPO's warm start: behaviour cloning, then DAgger.

Behaviour cloning (:func:`clone`) fits the actor of an SB3 ``MlpPolicy`` (the same network PPO
then fine-tunes and :mod:`agents.export` exports) to the oracle's labels: the mean action of the
policy's Gaussian against the oracle's knobs as actions (``knobs_to_action``), by mean squared
error, on observations normalised by the trainer's ``VecNormalize``. The value head and the log
standard deviation are left to PPO.

Cloning alone learns the oracle's choices on the states the oracle's own control visits; a
cloned policy drifts to states the oracle never showed it. DAgger (Ross et al., 2011) closes
that gap: :func:`visit_and_label` drives the training environment with the current policy and
asks the oracle, at every state the policy visits, what it would have chosen there (the oracle
reads the engine: it is bound to the episode's engine and searches from its state). The labels of
every round are pooled and the policy is cloned again on all of them.

The labels of the first round come from :func:`agents.oracle_label.label_window` (the oracle
drives); both rounds label one observation per decision interval.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import numpy as np
import torch

from agents.oracle import ORACLE_NAME, LookaheadOracle, OracleConfig, Setting, search_name
from agents.oracle_label import Labels, label_window
from env.traces.trace import Trace
from env.windows import window_config
from runtime.engine.engine import EngineConfig
from runtime.engine.profile import Profile


@dataclass
class ImitationConfig:
    """How the oracle labels and how the policy is cloned."""

    horizon_s: float = 4.0
    """simulated seconds each oracle candidate runs ahead (the arena's oracle looks 10 s ahead;
    labelling searches every interval, so a shorter look ahead keeps it affordable)"""
    candidates: str = OracleConfig.candidates
    """the oracle's candidate grid (:func:`agents.oracle.parse_candidates`)"""
    epochs: int = 60
    """passes over the labels per cloning"""
    batch_size: int = 256
    """labels per gradient step"""
    learning_rate: float = 1e-3
    """Adam's learning rate for cloning"""
    holdout: float = 0.2
    """share of the labelled windows held out to measure the cloned policy's action error"""
    memory_price: float = 0.0
    """the labelling oracle's score per GiB of KV pool held on average
    (:attr:`agents.oracle.OracleConfig.memory_price`): positive to imitate lending memory to a
    co-tenant, with ``ratio`` values in the candidates"""
    workers: int = 1
    """processes labelling windows at once (:func:`agents.parallel.run_jobs`); each window is
    labelled by its own oracle, so the labels do not depend on it"""
    weighting: Literal["none", "regret"] = "none"
    """how much each label counts in cloning: ``none``, all alike; ``regret``, by what holding
    the anchor (best static's setting, the oracle's first candidate) would have lost there in
    the oracle's own score, plus the mean of that over the labels (:func:`regret_weights`)"""
    arrivals: Literal["trace", "repeat"] = "trace"
    """what the labelling oracle's forks see arrive (:attr:`agents.oracle.OracleConfig.arrivals`):
    the trace's future, or a persistence forecast (a teacher that knows no more of the future
    than the policy it teaches)"""


@dataclass
class ImitationReport:
    """What the warm start did, for the card."""

    teacher: str = ORACLE_NAME
    """who labelled: the oracle, or its search on forecast arrivals (its controller name)"""
    rounds: list[dict] = field(default_factory=list)
    """per round: labels, held-out action MSE before and after cloning, seconds"""
    observations: np.ndarray | None = None
    """every labelled observation (raw vectors): where the clone was taught"""

    def as_dict(self) -> dict:
        return {"teacher": self.teacher, "rounds": self.rounds}


def mean_actions(policy, observations: np.ndarray) -> torch.Tensor:
    """The mean action of ``policy``'s Gaussian (SB3's deterministic action, before clipping)."""
    obs = torch.as_tensor(observations, dtype=torch.float32)
    features = policy.extract_features(obs, policy.pi_features_extractor)
    return policy.action_net(policy.mlp_extractor.forward_actor(features))


def action_mse(policy, observations: np.ndarray, actions: np.ndarray) -> float:
    """Mean squared error of the policy's clipped deterministic action against ``actions``."""
    with torch.no_grad():
        pred = torch.clamp(mean_actions(policy, observations), -1.0, 1.0)
    return float(torch.mean((pred - torch.as_tensor(actions, dtype=torch.float32)) ** 2))


def regret_weights(scores: np.ndarray) -> np.ndarray:
    """Per label ``[n, candidates]`` of horizon scores: what holding the first candidate (the
    anchor) would have lost against the oracle's choice, plus the mean of that over the labels.

    Where the oracle gains most by leaving the anchor, the label counts most; the added mean
    gives the labels where nothing is at stake (ties, the anchor chosen) each the mean regret,
    so that, when they are most of the labels, together they weigh about as much as all the
    regret, and the clone still holds the anchor there. All ones when nothing is ever at
    stake.
    (The cost-sensitive idea of AggreVaTe, Ross and Bagnell 2014, applied to cloning: the
    oracle's choices are mostly the anchor, and the few that are not carry its gain.)"""
    s = np.asarray(scores, dtype=np.float64)
    regret = s.max(axis=1) - s[:, 0]
    mean = float(regret.mean()) if len(regret) else 0.0
    return regret + mean if mean > 0 else np.ones(len(s))


def clone(policy, observations: np.ndarray, actions: np.ndarray, *, epochs: int = 60,
          batch_size: int = 256, learning_rate: float = 1e-3, seed: int = 0,
          weights: np.ndarray | None = None) -> list[float]:
    """Fit the actor (feature extractor, policy MLP, action head) of ``policy`` to ``actions``
    by mean squared error, each label weighted by ``weights`` (all alike when None); returns
    the mean loss of each epoch. ``observations`` are what the policy sees (normalised as in
    training)."""
    params = [*policy.mlp_extractor.policy_net.parameters(), *policy.action_net.parameters()]
    opt = torch.optim.Adam(params, lr=learning_rate)
    obs = torch.as_tensor(observations, dtype=torch.float32)
    target = torch.as_tensor(actions, dtype=torch.float32)
    w = torch.as_tensor(np.ones(len(obs)) if weights is None else weights, dtype=torch.float32)
    w = w / w.mean()  # the loss keeps the scale of the unweighted one
    gen = torch.Generator().manual_seed(seed)
    losses = []
    policy.train()
    for _ in range(epochs):
        order = torch.randperm(len(obs), generator=gen)
        total = 0.0
        for i in range(0, len(obs), batch_size):
            idx = order[i:i + batch_size]
            se = torch.mean((mean_actions(policy, obs[idx]) - target[idx]) ** 2, dim=1)
            loss = torch.sum(w[idx] * se) / len(idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        losses.append(total / len(obs))
    policy.eval()
    return losses


def oracle_config(cfg: ImitationConfig, interval_s: float) -> OracleConfig:
    """The labelling oracle's configuration: one search per decision interval."""
    return OracleConfig(period_s=interval_s, horizon_s=cfg.horizon_s, candidates=cfg.candidates,
                        memory_price=cfg.memory_price, arrivals=cfg.arrivals)


def oracle_for(cfg: ImitationConfig, anchor: Setting | None, interval_s: float) -> LookaheadOracle:
    """A labelling oracle (:func:`oracle_config`)."""
    return LookaheadOracle(oracle_config(cfg, interval_s), anchor=anchor, interval_s=interval_s)


def oracle_labels(windows: Sequence[tuple[Trace, float]], cfg: ImitationConfig,
                  anchor: Setting | None, *, interval_s: float, profile: Profile | None,
                  config: EngineConfig | None = None,
                  starts: Sequence[float] | None = None) -> Labels:
    """Behaviour cloning's labels: the oracle drives each window and labels every state
    (``cfg.workers`` windows at a time). ``starts``: where each window was cut from its split,
    for the co-tenant's demand there (:func:`env.windows.window_config`, as the training
    environments run it); None: from the demand's start."""
    from agents.parallel import run_jobs

    t0 = time.perf_counter()
    shared = _OracleJob(cfg, anchor, interval_s, profile, config)
    starts = [0.0] * len(windows) if starts is None else list(starts)
    if len(starts) != len(windows):
        raise ValueError(f"{len(windows)} windows and {len(starts)} starts")
    jobs = [(window, shared, i, scale, start)
            for i, ((window, scale), start) in enumerate(zip(windows, starts))]
    return _pooled(run_jobs(_oracle_job, jobs, workers=cfg.workers, progress=False), t0)


@dataclass(frozen=True)
class _OracleJob:
    """What every labelling job of a round shares."""

    cfg: ImitationConfig
    anchor: Setting | None
    interval_s: float
    profile: Profile | None
    config: EngineConfig | None


def _oracle_job(job: tuple[Trace, _OracleJob, int, float, float]) -> Labels:
    window, o, index, scale, start = job
    labels = Labels()
    label_window(window, oracle_for(o.cfg, o.anchor, o.interval_s), labels, index=index,
                 scale=scale, interval_s=o.interval_s, profile=o.profile,
                 config=window_config(o.config, start))
    return labels


def _pooled(parts: Sequence[Labels], t0: float) -> Labels:
    """The labels of several jobs, in job order; ``wall_s`` is the time since ``t0``."""
    labels = Labels()
    for part in parts:
        labels.extend(part)
    labels.wall_s = time.perf_counter() - t0
    return labels


def visit_and_label(env, act: Callable[[np.ndarray], np.ndarray],
                    windows: Sequence[tuple[float, float]], cfg: ImitationConfig,
                    anchor: Setting | None, *, first_index: int = 0) -> Labels:
    """DAgger's labels: ``act`` (observation -> action) drives ``env`` (a
    :class:`env.serving_env.ServingEnv`, possibly wrapped) on each window ``(start_s,
    rate_scale)``, and the oracle labels every state the policy visits."""
    labels = Labels()
    u = env.unwrapped
    t0, c0 = time.perf_counter(), time.process_time()
    for i, (start, scale) in enumerate(windows):
        obs, _ = u.reset(options={"start_s": start, "rate_scale": scale})
        oracle = oracle_for(cfg, anchor, u.interval_s)
        oracle.bind(u.session.engine)
        done = False
        while not done:
            setting = oracle.decide_setting()
            labels.add(obs, oracle, setting, first_index + i, u.session.now, scale)
            obs, _, term, trunc, _ = u.step(act(obs))
            done = term or trunc
        labels.sim_s += u.session.now
    labels.wall_s += time.perf_counter() - t0
    labels.cpu_s += time.process_time() - c0
    return labels


def split_by_window(labels: Labels, holdout: float) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks (train, held out) over the labels: the last ``holdout`` share of the
    windows (at least one, when there are two or more) is held out whole, so that the held-out
    error measures states of windows the cloning never saw."""
    window = np.asarray(labels.window)
    ids = np.unique(window)
    n_out = min(len(ids) - 1, max(1, round(holdout * len(ids)))) if holdout > 0 else 0
    held = np.isin(window, ids[len(ids) - n_out:]) if n_out else np.zeros(len(window), bool)
    return ~held, held


def as_arrays(labels: Labels) -> tuple[np.ndarray, np.ndarray]:
    """``(observations [n, OBS_DIM], actions [n, NUM_KNOBS])`` as float32."""
    return (np.asarray(labels.observations, dtype=np.float32),
            np.asarray(labels.actions, dtype=np.float32))


class PolicyActor:
    """observation -> the policy's deterministic action, normalised with the trainer's
    statistics as they are now; picklable (a copy of the policy and of the statistics), so that
    DAgger's windows can be driven in other processes."""

    def __init__(self, policy, venv) -> None:
        import copy

        self.policy = copy.deepcopy(policy).cpu().eval()
        self.mean = np.array(venv.obs_rms.mean, dtype=np.float64)
        self.std = np.sqrt(np.array(venv.obs_rms.var, dtype=np.float64) + venv.epsilon)
        self.clip = float(venv.clip_obs)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        x = np.clip((np.asarray(obs, dtype=np.float64) - self.mean) / self.std, -self.clip,
                    self.clip)
        with torch.no_grad():
            a = torch.clamp(mean_actions(self.policy, x[None, :].astype(np.float32)), -1.0, 1.0)
        return a.numpy().reshape(-1)


def _dagger_job(job: tuple) -> Labels:
    make_env, act, cfg, anchor, index, start, scale = job
    torch.set_num_threads(1)
    return visit_and_label(make_env(), act, [(start, scale)], cfg, anchor, first_index=index)


def _fit_round(policy, venv, labels: Labels, cfg: ImitationConfig, seed: int,
               new: np.ndarray) -> dict:
    """Clone on every label not held out; the held-out error is measured on ``new`` (this
    round's labels) before and after."""
    obs, actions = as_arrays(labels)
    x = venv.normalize_obs(obs)
    train, held = split_by_window(labels, cfg.holdout)
    held_new = held & new
    before = action_mse(policy, x[held_new], actions[held_new]) if held_new.any() else None
    weights = (regret_weights(np.asarray(labels.scores)[train])
               if cfg.weighting == "regret" else None)
    losses = clone(policy, x[train], actions[train], epochs=cfg.epochs,
                   batch_size=cfg.batch_size, learning_rate=cfg.learning_rate, seed=seed,
                   weights=weights)
    after = action_mse(policy, x[held_new], actions[held_new]) if held_new.any() else None
    return {"labels": int(new.sum()), "labels_total": len(labels),
            "held_out_labels": int(held_new.sum()), "held_out_mse_before": before,
            "held_out_mse_after": after, "train_loss_first": losses[0],
            "train_loss_last": losses[-1]}


def warm_start(policy, venv, windows: dict[str, list[tuple[Trace, float, float, float]]],
               make_env: dict[str, Callable[[], object]], anchors: dict[str, Setting | None],
               cfg: ImitationConfig, *, dagger_rounds: int, interval_s: float,
               profile: Profile | None, config: EngineConfig | None = None, seed: int = 0,
               log=print) -> ImitationReport:
    """Behaviour cloning on the oracle's labels of ``windows``, then ``dagger_rounds`` rounds of
    DAgger on the same windows, the labels of every round pooled; every round labels
    ``cfg.workers`` windows at a time.

    :param policy: the SB3 policy (its actor is trained in place)
    :param venv: the trainer's VecNormalize: its observation statistics are updated with the
        first round's observations and then used, unchanged, for every round
    :param windows: per trace label, ``(window, rate_scale, start_s, pool_scale)`` of each
        window to label (the window cut from the split, and where it came from)
    :param make_env: per trace label, a picklable function that builds a training environment
        of the trace (DAgger drives it)
    :param anchors: best static's setting per trace (the oracle's first candidate)
    :param config: the engine's SLO classes and levers (the training environments')
    """
    from agents.parallel import run_jobs

    report = ImitationReport(search_name(oracle_config(cfg, interval_s)))
    t0 = time.perf_counter()
    labels = Labels()
    first = 0
    for trace, ws in windows.items():
        part = oracle_labels([(w, x) for w, x, _, _ in ws], cfg, anchors.get(trace),
                             interval_s=interval_s, profile=profile, config=config,
                             starts=[s for _, _, s, _ in ws])
        part.window = [first + i for i in part.window]
        labels.extend(part)
        first += len(ws)
    obs, _ = as_arrays(labels)
    venv.obs_rms.update(obs.astype(np.float64))
    row = _fit_round(policy, venv, labels, cfg, seed, np.ones(len(labels), dtype=bool))
    report.rounds.append({"round": "bc", **row, "seconds": time.perf_counter() - t0})
    log(f"behaviour cloning: {row['labels']} {report.teacher} labels, held-out action MSE "
        f"{row['held_out_mse_before']} -> {row['held_out_mse_after']} "
        f"({time.perf_counter() - t0:.0f} s)")
    for r in range(dagger_rounds):
        t0 = time.perf_counter()
        n_before = len(labels)
        act = PolicyActor(policy, venv)
        jobs, first = [], 0
        for trace, ws in windows.items():
            jobs += [(make_env[trace], act, cfg, anchors.get(trace), first + i, s, x)
                     for i, (_, _, s, x) in enumerate(ws)]
            first += len(ws)
        for part in run_jobs(_dagger_job, jobs, workers=cfg.workers, progress=False):
            labels.extend(part)
        new = np.arange(len(labels)) >= n_before
        row = _fit_round(policy, venv, labels, cfg, seed + r + 1, new)
        report.rounds.append({"round": f"dagger-{r + 1}", **row,
                              "seconds": time.perf_counter() - t0})
        log(f"DAgger round {r + 1}: {row['labels']} labels on the policy's own states, held-out "
            f"action MSE {row['held_out_mse_before']} -> {row['held_out_mse_after']} "
            f"({time.perf_counter() - t0:.0f} s)")
    report.observations = as_arrays(labels)[0]
    return report


def imitate(cfg, model, venv, trace_ranges: list[tuple[str, tuple]],
            references: dict[str, Any]):
    """train.py's warm start by imitation of the oracle (``--warm-start``): the first
    ``imitation_windows`` windows of each trace's pool, labelled by the oracle anchored on best
    static, cloned; then DAgger rounds."""
    import gymnasium as gym

    import env
    from agents.training import env_kwargs_of
    from env.traces import split
    from env.traces.resolve import resolve_trace, trace_label
    from env.windows import WindowPool, cut_window

    windows, envs, anchors = {}, {}, {}
    for t, scale_range in trace_ranges:
        part = split(resolve_trace(t), "train")
        pool = WindowPool.draw(part, cfg.windows, cfg.episode_s, scale_range, cfg.seed)
        n = min(cfg.imitation_windows, len(pool))
        label = trace_label(t)
        windows[label] = [(cut_window(part, s, x, cfg.episode_s), x, s, x)
                          for s, x in zip(pool.starts[:n], pool.scales[:n])]
        envs[label] = partial(gym.make, env.ENV_ID, trace=t, rate_scale_range=scale_range,
                              **env_kwargs_of(cfg))
        anchors[label] = Setting(references[t])
    icfg = ImitationConfig(horizon_s=cfg.imitation_horizon_s, epochs=cfg.imitation_epochs,
                           memory_price=cfg.imitation_memory_price, workers=cfg.workers,
                           arrivals=cfg.imitation_arrivals, weighting=cfg.imitation_weighting,
                           **({"candidates": cfg.imitation_candidates}
                              if cfg.imitation_candidates else {}))
    return warm_start(model.policy, venv, windows, envs, anchors, icfg,
                      dagger_rounds=cfg.dagger_rounds if cfg.warm_start == "dagger" else 0,
                      interval_s=cfg.interval_s, profile=Profile.load(cfg.profile),
                      config=cfg.engine_config(seed=cfg.seed), seed=cfg.seed)
