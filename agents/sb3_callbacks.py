"""The stable-baselines3 plumbing ``train.py`` hands to PPO: its logger into W&B, the callback
that logs serving metrics per rollout and evaluates (keeping the best model) every so many steps,
and the curriculum's callback that turns episode outcomes into window probabilities.

What each evaluation logs to W&B (under ``eval/``): the policy's SLO attainment per window and
its mean; every baseline's mean (static, PID, best static and, when evaluated, the oracle's search
anchored on best static);
``gap_to_best_static`` and ``gap_to_oracle`` (the policy's mean minus theirs, in attainment);
``oracle_gain_share`` (the share of the oracle's gain over best static the policy takes, where the
oracle gains anything); the mean of every knob the policy chose (``knobs/<name>``); and the knobs
it chose over time on the first window (``knobs_over_time``, a table of simulated time and knobs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import wandb
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import KVWriter
from stable_baselines3.common.vec_env import VecNormalize
from tqdm import tqdm

from agents.oracle import SEARCH_ONLY_NAME
from agents.sb3_controller import SB3PolicyController
from env.windows import Curriculum
from runtime.decider.decision import Decision
from runtime.knobs import KNOB_NAMES

SERVING_INFO_KEYS = ("slo_attainment", "goodput_rps", "ttft_p99_ratio", "tpot_p99_ratio",
                     "preemptions", "ooms", *KNOB_NAMES, "rate_scale")
"""the environment's info entries logged (as rollout means) under ``serving/``"""


class WandbWriter(KVWriter):
    """SB3's logger into W&B (losses under train/, rollout stats under rollout/)."""

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any],
              step: int = 0) -> None:
        wandb.log({k: v for k, v in key_values.items()
                   if isinstance(v, (int, float, np.floating, np.integer))}, step=step)

    def close(self) -> None:
        pass


class KnobRecorder:
    """A controller that records the knobs another one decides (for the evaluations' knobs over
    time); everything else is the wrapped controller's."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.knobs: list[tuple] = []

    def reset(self) -> None:
        self.inner.reset()

    def bind(self, engine) -> None:
        bind = getattr(self.inner, "bind", None)
        if bind is not None:
            bind(engine)

    def decide(self, observation: np.ndarray) -> Decision:
        d = self.inner.decide(observation)
        self.knobs.append(d.knobs.as_tuple())
        return d


def gaps(policy_mean: float, baselines: dict[str, dict[str, float]]) -> dict[str, float]:
    """The policy's gap to best static and to the oracle's search (mean attainment; no bound is
    proven for the search, it only sees the future), and its share of the search's gain over
    best static (only where the search gains anything)."""
    out = {}
    best = baselines.get("best-static", {}).get("mean")
    oracle = baselines.get(SEARCH_ONLY_NAME, baselines.get("oracle", {})).get("mean")
    if best is not None:
        out["gap_to_best_static"] = policy_mean - best
    if oracle is not None:
        out["gap_to_oracle"] = policy_mean - oracle
        if best is not None and oracle - best > 1e-9:
            out["oracle_gain_share"] = (policy_mean - best) / (oracle - best)
    return out


class PeriodicEval(BaseCallback):
    """Serving metrics of each rollout, and evaluation + best model every ``eval_every`` steps.

    :param evaluate: a controller's evaluation (``{"<window>": attainment, ..., "mean": m}``,
        with ``"score"`` when there is a co-tenant: the best model is the best score, or mean)
    :param venv: the training VecNormalize (its statistics normalise the evaluated policy's input)
    :param run_dir: the best model and its normaliser are saved here
    :param baselines: the baselines' evaluations, logged beside the policy's
    :param eval_every: environment steps between evaluations (0: none in between; training
        evaluates before it starts and after it ends either way)
    :param on_evaluate: called with every evaluation (``{"step": ..., **result}``)
    :param interval_s: the decision interval (the time axis of the knobs over time)
    :param timeline_len: decisions of the knobs-over-time table (the first window's, when the
        first window is at least this long)
    :param attainment_floor: with a score, only evaluations whose mean attainment reaches this
        compete on score (the scorecard's co-tenant memory target: attainment within half a
        point of best static's); while none does, the best mean attainment is kept
    """

    def __init__(self, evaluate: Callable[[Any], dict[str, float]], venv: VecNormalize,
                 run_dir: Path, baselines: dict[str, dict[str, float]], eval_every: int,
                 on_evaluate: Callable[[dict[str, float]], None] | None = None, *,
                 interval_s: float = 0.25, timeline_len: int = 240,
                 attainment_floor: float = -float("inf")) -> None:
        super().__init__()
        self.attainment_floor = attainment_floor
        self.interval_s = interval_s
        self.timeline_len = timeline_len
        self.on_evaluate = on_evaluate
        self.evaluate_controller = evaluate
        self.venv = venv
        self.run_dir = run_dir
        self.baselines = baselines
        if eval_every < 0:
            raise ValueError(f"eval_every must be >= 0 (0: no periodic evaluation), got "
                             f"{eval_every}")
        self.eval_every = eval_every
        self.next_eval = eval_every if eval_every > 0 else math.inf
        self.best = -float("inf")
        """the kept evaluation's score (or mean attainment)"""
        self.best_key: tuple[int, float] = (-1, -float("inf"))
        """the kept evaluation's rank: (1, score) at or above the attainment floor, else (0,
        mean attainment)"""
        self.history: list[dict[str, float]] = []
        self.best_entry: dict[str, float] = {}
        """the evaluation of the kept model"""
        self._acc: dict[str, list[float]] = {}

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            for k in SERVING_INFO_KEYS:
                self._acc.setdefault(k, []).append(float(info[k]))
        if self.num_timesteps >= self.next_eval:
            self.next_eval += self.eval_every
            self.evaluate()
        return True

    def _on_rollout_end(self) -> None:
        wandb.log({f"serving/{k}": float(np.mean(v)) for k, v in self._acc.items()},
                  step=self.num_timesteps)
        self._acc = {}

    def rank(self, res: dict[str, float]) -> tuple[int, float]:
        """An evaluation's rank for the kept model (higher is better): without a score, its mean
        attainment; with one, its score if its mean attainment reaches the floor, and below the
        floor (ranked under every evaluation above it) its mean attainment."""
        if "score" not in res:
            return (1, res["mean"])
        if res["mean"] >= self.attainment_floor:
            return (1, res["score"])
        return (0, res["mean"])

    def evaluate(self) -> None:
        """Evaluate the current policy; save it as the best model if it beats the best so far."""
        recorder = KnobRecorder(SB3PolicyController(self.model, self.venv))
        res = self.evaluate_controller(recorder)
        extra = gaps(res["mean"], self.baselines)
        best = self.baselines.get("best-static", {})
        if "score" in res and "score" in best:
            extra["score_gap_to_best_static"] = res["score"] - best["score"]
        knobs = np.asarray(recorder.knobs, dtype=np.float64).reshape(-1, len(KNOB_NAMES))
        means = {f"knobs/{k}": float(v) for k, v in zip(KNOB_NAMES, knobs.mean(axis=0))}
        self.history.append({"step": self.num_timesteps, **res, **extra, **means})
        if self.on_evaluate is not None:
            self.on_evaluate(self.history[-1])
        first = knobs[:self.timeline_len]
        wandb.log({f"eval/policy/{k}": v for k, v in res.items()}
                  | {f"eval/{n}/mean": r["mean"] for n, r in self.baselines.items()}
                  | {f"eval/{k}": v for k, v in {**extra, **means}.items()}
                  | {"eval/knobs_over_time": wandb.Table(
                      columns=["t_s", *KNOB_NAMES],
                      data=[[i * self.interval_s, *row] for i, row in enumerate(first.tolist())])},
                  step=self.num_timesteps)
        score = res.get("score", res["mean"])  # the co-tenant's score where there is one
        key = self.rank(res)
        if key > self.best_key:
            self.best_key, self.best = key, score
            self.model.save(self.run_dir / "best_model.zip")
            self.venv.save(str(self.run_dir / "best_vecnormalize.pkl"))
            self.best_entry = self.history[-1]
        baselines = ", ".join(f"{n} {r['mean']:.2%}" + (f" ({r['score']:.4f})" if "score" in r
                                                         else "")
                              for n, r in self.baselines.items())
        mine = f"{res['mean']:.2%}" + (f", score {score:.4f}" if "score" in res else "")
        tqdm.write(f"step {self.num_timesteps:,}: eval mean attainment {mine} "
                   f"(best {self.best:.4g}; {baselines})")


class ObservationRecorder(BaseCallback):
    """Keeps a uniform sample (reservoir sampling, at most ``capacity`` rows) of the raw
    observations the training environments produced, before normalisation: the distribution the
    exported policy carries for the decider's out-of-distribution guard
    (:mod:`runtime.decider.ood_guard`)."""

    def __init__(self, capacity: int = 50_000, seed: int = 0) -> None:
        super().__init__()
        self.capacity = capacity
        self.rows: np.ndarray | None = None
        self.seen = 0
        self._rng = np.random.default_rng(seed)

    def add(self, obs: np.ndarray) -> None:
        """Offer rows ``[n, OBS_DIM]`` to the sample."""
        obs = np.asarray(obs, dtype=np.float32).reshape(-1, obs.shape[-1])
        if self.rows is None:
            self.rows = np.empty((self.capacity, obs.shape[1]), dtype=np.float32)
        for row in obs:
            if self.seen < self.capacity:
                self.rows[self.seen] = row
            else:
                j = int(self._rng.integers(0, self.seen + 1))
                if j < self.capacity:
                    self.rows[j] = row
            self.seen += 1

    def sample(self) -> np.ndarray:
        """The rows kept so far."""
        if self.rows is None:
            return np.empty((0, 0), dtype=np.float32)
        return self.rows[:min(self.seen, self.capacity)]

    def _on_step(self) -> bool:
        env = self.training_env
        obs = env.get_original_obs() if hasattr(env, "get_original_obs") else None
        if obs is not None:
            self.add(obs)
        return True


class CurriculumCallback(BaseCallback):
    """Feeds every finished episode's outcome against best static (``info["episode_gap"]``, from
    :class:`env.wrappers.StaticReference`) on its window (``info["window_id"]``, from
    :class:`env.wrappers.PooledWindows`) into its trace's :class:`env.windows.Curriculum`, and
    after every rollout sends each environment copy its trace's window probabilities.

    :param trace_of_env: the trace label of each environment copy, in the vector's order
    :param curricula: a curriculum per trace label
    """

    def __init__(self, trace_of_env: list[str], curricula: dict[str, Curriculum]) -> None:
        super().__init__()
        self.trace_of_env = trace_of_env
        self.curricula = curricula
        self.episodes = 0

    def _on_step(self) -> bool:
        for i, info in enumerate(self.locals["infos"]):
            if "episode_gap" in info and info.get("window_id", -1) >= 0:
                self.curricula[self.trace_of_env[i]].record(info["window_id"],
                                                            -info["episode_gap"])
                self.episodes += 1
        return True

    def _on_rollout_end(self) -> None:
        stats = {}
        for trace, c in self.curricula.items():
            p = c.probabilities()
            for i, t in enumerate(self.trace_of_env):
                if t == trace:
                    self.training_env.env_method("set_window_probabilities", p, indices=[i])
            seen = ~np.isnan(c.loss)
            stats |= {f"curriculum/{trace}/max_probability": float(p.max()),
                      f"curriculum/{trace}/windows_seen": int(seen.sum()),
                      f"curriculum/{trace}/mean_loss": float(np.mean(c.loss[seen]))
                      if seen.any() else 0.0}
        wandb.log(stats, step=self.num_timesteps)
