"""The stable-baselines3 plumbing ``train.py`` hands to PPO: its logger into W&B, and the callback
that logs serving metrics per rollout and evaluates (keeping the best model) every so many steps.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import wandb
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import KVWriter
from stable_baselines3.common.vec_env import VecNormalize
from tqdm import tqdm

from agents.sb3_controller import SB3PolicyController

SERVING_INFO_KEYS = ("slo_attainment", "goodput_rps", "ttft_p99_ratio", "tpot_p99_ratio",
                     "preemptions", "ooms", "batch_window_ms", "prefill_chunk_tokens",
                     "kv_cache_ratio", "rate_scale")
"""the environment's info entries logged (as rollout means) under ``serving/``"""


class WandbWriter(KVWriter):
    """SB3's logger into W&B (losses under train/, rollout stats under rollout/)."""

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any],
              step: int = 0) -> None:
        wandb.log({k: v for k, v in key_values.items()
                   if isinstance(v, (int, float, np.floating, np.integer))}, step=step)

    def close(self) -> None:
        pass


class PeriodicEval(BaseCallback):
    """Serving metrics of each rollout, and evaluation + best model every ``eval_every`` steps.

    :param evaluate: a controller's evaluation (``{"<window>": attainment, ..., "mean": m}``)
    :param venv: the training VecNormalize (its statistics normalise the evaluated policy's input)
    :param run_dir: the best model and its normaliser are saved here
    :param baselines: the baselines' evaluations, logged beside the policy's
    :param eval_every: environment steps between evaluations
    :param on_evaluate: called with every evaluation (``{"step": ..., **result}``)
    """

    def __init__(self, evaluate: Callable[[Any], dict[str, float]], venv: VecNormalize,
                 run_dir: Path, baselines: dict[str, dict[str, float]], eval_every: int,
                 on_evaluate: Callable[[dict[str, float]], None] | None = None) -> None:
        super().__init__()
        self.on_evaluate = on_evaluate
        self.evaluate_controller = evaluate
        self.venv = venv
        self.run_dir = run_dir
        self.baselines = baselines
        self.eval_every = eval_every
        self.next_eval = eval_every
        self.best = -1.0
        self.history: list[dict[str, float]] = []
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

    def evaluate(self) -> None:
        """Evaluate the current policy; save it as the best model if it beats the best so far."""
        res = self.evaluate_controller(SB3PolicyController(self.model, self.venv))
        self.history.append({"step": self.num_timesteps, **res})
        if self.on_evaluate is not None:
            self.on_evaluate(self.history[-1])
        wandb.log({f"eval/policy/{k}": v for k, v in res.items()}
                  | {f"eval/{n}/mean": r["mean"] for n, r in self.baselines.items()},
                  step=self.num_timesteps)
        if res["mean"] > self.best:
            self.best = res["mean"]
            self.model.save(self.run_dir / "best_model.zip")
            self.venv.save(str(self.run_dir / "best_vecnormalize.pkl"))
        baselines = ", ".join(f"{n} {r['mean']:.2%}" for n, r in self.baselines.items())
        tqdm.write(f"step {self.num_timesteps:,}: eval mean SLO attainment {res['mean']:.2%} "
                   f"(best {self.best:.2%}; {baselines})")
