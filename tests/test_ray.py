"""Ray: the executor's ray backend and the Ray VecEnv, on a local Ray of 2 CPUs (what CI runs;
Ray is the optional ``ray`` extra, and without it these tests skip)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parents[1]

from agents.arena import _row_job  # noqa: E402
from agents.controllers.best_static import _score  # noqa: E402
from agents.parallel import JobRunner, run_jobs  # noqa: E402
from runtime.knobs import NUM_KNOBS  # noqa: E402
from tests.parallel_jobs import (  # noqa: E402
    arena_jobs,
    grid_jobs,
    without_wall_time,
    write_small_trace,
)


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray of 2 CPUs for the module (starting one costs seconds)."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


def test_ray_gives_the_process_pool_results_to_the_last_digit(local_ray, tmp_path):
    path = write_small_trace(tmp_path)
    with JobRunner(2, ray=True, progress=False) as on_ray:
        grid_ray = on_ray.map(_score, grid_jobs(path))
        rows_ray = on_ray.map(_row_job, arena_jobs(path))
    with JobRunner(2, ray=False, progress=False) as pool:
        grid_pool = pool.map(_score, grid_jobs(path))
        rows_pool = pool.map(_row_job, arena_jobs(path))
    assert grid_ray == grid_pool
    assert without_wall_time(rows_ray) == without_wall_time(rows_pool)
    assert [(r["controller"], r["rate_scale"]) for r in rows_ray] == [
        (j[1], j[2]) for j in arena_jobs(path)]
    assert ray.is_initialized()  # a runner leaves a Ray it did not start running


def test_a_failing_ray_task_raises_its_own_error(local_ray, tmp_path):
    missing = str(tmp_path / "no-such-trace.csv")
    with pytest.raises(FileNotFoundError, match="no-such-trace.csv"):
        run_jobs(_score, [(missing, "all", (1.0,), (5.0, 2048, 0.9), None, None)], ray=True,
                 progress=False)


def rollout(venv, actions: np.ndarray) -> dict[str, list]:
    """Seeded reset, then the given actions; everything a learner sees."""
    venv.seed(7)
    out: dict[str, list] = {"obs": [venv.reset()], "rewards": [], "dones": [], "terminal": [],
                            "truncated": []}
    for a in actions:
        obs, rewards, dones, infos = venv.step(a)
        out["obs"].append(obs)
        out["rewards"].append(rewards)
        out["dones"].append(dones)
        for i, info in enumerate(infos):
            if "terminal_observation" in info:
                out["terminal"].append((i, info["terminal_observation"]))
                out["truncated"].append(info["TimeLimit.truncated"])
    out["rate_scale"] = venv.get_attr("rate_scale")
    out["window_start_s"] = venv.env_method("get_wrapper_attr", "start_s", indices=[2, 0])
    venv.close()
    return out


def test_ray_vec_env_sees_what_dummy_and_subproc_vec_envs_see(local_ray):
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from agents.ray_vec_env import RayVecEnv
    from agents.training import make_env

    # 12 intervals an episode: every copy resets within the 30 steps
    fns = [partial(make_env, "synthetic", (0.5, 2.5), {"episode_s": 3.0})] * 3
    actions = np.random.default_rng(0).uniform(-1, 1, size=(30, 3, NUM_KNOBS)).astype(np.float32)
    dummy = rollout(DummyVecEnv(fns), actions)
    subproc = rollout(SubprocVecEnv(fns), actions)
    got = rollout(RayVecEnv(fns, n_workers=2), actions)  # blocks of 2 and 1 environments
    for want in (subproc, dummy):
        np.testing.assert_array_equal(np.stack(got["obs"]), np.stack(want["obs"]))
        np.testing.assert_array_equal(np.stack(got["dones"]), np.stack(want["dones"]))
        assert [i for i, _ in got["terminal"]] == [i for i, _ in want["terminal"]]
        for (_, a), (_, b) in zip(got["terminal"], want["terminal"]):
            np.testing.assert_array_equal(a, b)
        assert got["truncated"] == want["truncated"]
        assert got["rate_scale"] == want["rate_scale"]
        assert got["window_start_s"] == want["window_start_s"]
    # rewards: float64 as SubprocVecEnv hands them over; DummyVecEnv keeps a float32 buffer
    np.testing.assert_array_equal(np.stack(got["rewards"]), np.stack(subproc["rewards"]))
    np.testing.assert_array_equal(np.stack(got["rewards"]).astype(np.float32),
                                  np.stack(dummy["rewards"]))
    want = dummy
    assert len(want["terminal"]) >= 6  # every environment ended an episode at least twice
    assert all(want["truncated"])  # running out of trace is truncation


def test_a_sweep_on_a_running_ray_trains_every_trial_and_reports_its_evaluations(local_ray,
                                                                               tmp_path):
    # the sweep joins the running Ray through RAY_ADDRESS, as it joins a cluster: this checkout
    # travels to it as the job's working directory
    address = ray.get_runtime_context().gcs_address
    out = subprocess.run(
        [sys.executable, "scripts/sweep.py", "--seeds", "0", "--grid", "learning_rate=1e-4,3e-4",
         "--wandb-mode", "disabled", "--out-dir", str(tmp_path), "--name", "t", "--json",
         "--", "--total-timesteps", "256", "--n-envs", "1", "--n-steps", "128",
         "--batch-size", "64", "--eval-every", "128", "--eval-episode-s", "20"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), RAY_ADDRESS=address),
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    trials = result["trials"]
    assert [(t["seed"], t["learning_rate"]) for t in trials] == [(0, "1e-4"), (0, "3e-4")]
    for t in trials:
        assert 0.0 <= t["best_eval_mean"] <= 1.0
        assert set(t) >= {"final/synthetic/x1.5", "run_dir"}
        card = json.loads((Path(t["run_dir"]) / "card.json").read_text())
        assert card["config"]["learning_rate"] == float(t["learning_rate"])
        # the starting policy, every --eval-every steps, and the final weights
        assert [e["step"] for e in card["training"]["periodic_evaluations"]] == [0, 128, 256, 256]
    assert result["best"] in trials
    assert (tmp_path / "t" / "sweep.json").is_file()


def test_train_py_vec_env_ray_puts_its_environment_copies_on_ray_actors(local_ray):
    from agents.ray_vec_env import RayVecEnv
    from agents.training import make_vec_env, parse_traces
    from train import parse_config

    cfg = parse_config(["--preset", "smoke", "--vec-env", "ray", "--n-envs", "3",
                        "--ray-workers", "2"])
    venv = make_vec_env(cfg, parse_traces(cfg.trace, (cfg.rate_scale_min, cfg.rate_scale_max)))
    try:
        assert isinstance(venv.venv, RayVecEnv)
        assert [list(b) for b in venv.venv.blocks] == [[0, 1], [2]]
        obs = venv.reset()
        obs, rewards, dones, infos = venv.step(np.zeros((3, NUM_KNOBS), dtype=np.float32))
        assert obs.shape == (3, venv.observation_space.shape[0]) and len(infos) == 3
    finally:
        venv.close()
