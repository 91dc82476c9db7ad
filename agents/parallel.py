"""One executor for the embarrassingly parallel jobs: arena rows, capacity bisections, the
best-static grid search, oracle labelling and seed sweeps.

    with JobRunner(workers=2) as runner:              # local processes
        rows = runner.map(row_job, jobs, desc="runs")
    with JobRunner(workers=2, ray=True) as runner:    # a local Ray of 2 CPUs, or RAY_ADDRESS
        rows = runner.map(row_job, jobs, desc="runs")

``map`` calls a picklable, module-level function on every job and returns the results in the
order of the jobs, whatever order they finish in, with a tqdm bar on stderr. A job is a pure
function of its argument (every replay is seeded by its job), so the backend cannot change a
result: the tests compare the two backends on real jobs, digit for digit.

Backends:

- ``process`` (the default): a ``ProcessPoolExecutor`` of ``workers`` processes on this machine;
  ``workers=1`` runs the jobs in this process, with no pool.
- ``ray``: one Ray task per job, each holding one CPU. Chosen by ``ray=True`` (the commands'
  ``--ray``) or, when ``ray`` is left ``None``, by the ``RAY_ADDRESS`` environment variable. With
  ``RAY_ADDRESS`` set the runner joins that cluster and ships this checkout to it as the job's
  working directory (see docs/ray.md); otherwise it starts a local Ray of ``workers`` CPUs and
  stops it again on close. A Ray already initialised in this process is used as it is.

Ray is the optional ``ray`` extra: nothing imports it unless the ray backend is chosen.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, TypeVar

J = TypeVar("J")
R = TypeVar("R")

RAY_ADDRESS_ENV = "RAY_ADDRESS"
"""the environment variable naming a running Ray cluster (Ray's own convention)"""
REPO_ROOT = Path(__file__).resolve().parents[1]
SHIPPED_EXCLUDES = [".git", ".venv", ".venv-*", "runs", "**/__pycache__", "*.egg-info",
                    ".pytest_cache", ".hypothesis", ".mypy_cache", "wandb"]
"""what a cluster job's working directory leaves behind (environments, run outputs, caches)"""
FORWARDED_ENV_PREFIXES = ("BATCHPILOT_", "WANDB_")
"""environment variables of the driver that Ray workers on a cluster get too"""


def ray_requested(ray: bool | None) -> bool:
    """Whether a runner built with ``ray`` runs on Ray (``None``: when ``RAY_ADDRESS`` is set)."""
    return bool(os.environ.get(RAY_ADDRESS_ENV)) if ray is None else ray


def import_ray():
    """``ray``, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as e:
        raise ImportError("the Ray backend needs Ray: pip install 'batchpilot[ray]' "
                          f"(or 'ray[tune]'); {e}") from e
    return ray


def init_ray(workers: int) -> bool:
    """Connect to ``RAY_ADDRESS`` or start a local Ray of ``workers`` CPUs, unless this process
    already has one. Returns whether this call started it (and so should shut it down)."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    address = os.environ.get(RAY_ADDRESS_ENV)
    if address:
        env_vars = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}
        runtime_env: dict[str, Any] = {"env_vars": env_vars}
        if (REPO_ROOT / "pyproject.toml").exists():  # a source checkout: ship it
            runtime_env |= {"working_dir": str(REPO_ROOT), "excludes": SHIPPED_EXCLUDES}
        ray.init(address=address, runtime_env=runtime_env, logging_level="WARNING")
    else:
        ray.init(num_cpus=max(1, workers), include_dashboard=False, logging_level="WARNING")
    return True


def _progress(total: int, desc: str | None, show: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=not show, leave=False, dynamic_ncols=True)


class JobRunner:
    """Maps a function over jobs on local processes or on Ray (see the module docstring).

    :param workers: local processes, or the CPUs of a local Ray; 1 runs jobs in this process
        (on a Ray cluster the cluster's CPUs decide)
    :param ray: True to run on Ray, False for local processes, None to follow ``RAY_ADDRESS``
    :param progress: show a tqdm bar per ``map``
    """

    def __init__(self, workers: int = 2, *, ray: bool | None = None,
                 progress: bool = True) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.workers = workers
        self.progress = progress
        self.backend = "ray" if ray_requested(ray) else ("process" if workers > 1 else "serial")
        self._pool: ProcessPoolExecutor | None = None
        self._owns_ray = False
        self._remotes: dict[Callable, Any] = {}

    def __enter__(self) -> JobRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the pool, and the local Ray if this runner started it."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._owns_ray:
            import_ray().shutdown()
            self._owns_ray = False

    def map(self, fn: Callable[[J], R], jobs: Iterable[J], *, desc: str | None = None) -> list[R]:
        """``[fn(job) for job in jobs]``, run in parallel; results in the order of ``jobs``."""
        jobs = list(jobs)
        with _progress(len(jobs), desc, self.progress and bool(jobs)) as bar:
            if self.backend == "ray":
                return self._map_ray(fn, jobs, bar)
            if self.backend == "serial":
                out = []
                for j in jobs:
                    out.append(fn(j))
                    bar.update()
                return out
            return self._map_pool(fn, jobs, bar)

    def _map_pool(self, fn: Callable[[J], R], jobs: Sequence[J], bar) -> list[R]:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers)
        futures: dict[Future, int] = {self._pool.submit(fn, j): i for i, j in enumerate(jobs)}
        out: list[Any] = [None] * len(jobs)
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    out[futures[f]] = f.result()
                    bar.update()
        except BaseException:
            for f in pending:
                f.cancel()
            raise
        return out

    def _map_ray(self, fn: Callable[[J], R], jobs: Sequence[J], bar) -> list[R]:
        ray = import_ray()
        if not ray.is_initialized():
            self._owns_ray = init_ray(self.workers)
        remote = self._remotes.get(fn)
        if remote is None:
            remote = self._remotes[fn] = ray.remote(num_cpus=1, max_retries=0)(fn)
        refs = [remote.remote(j) for j in jobs]
        index = {r: i for i, r in enumerate(refs)}
        out: list[Any] = [None] * len(jobs)
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for r in done:
                    out[index[r]] = ray.get(r)
                    bar.update()
        except BaseException:
            for r in pending:
                ray.cancel(r)
            raise
        return out


def run_jobs(fn: Callable[[J], R], jobs: Iterable[J], *, workers: int = 2,
             ray: bool | None = None, desc: str | None = None, progress: bool = True) -> list[R]:
    """One ``map`` on a runner of its own (see :class:`JobRunner`)."""
    with JobRunner(workers, ray=ray, progress=progress) as runner:
        return runner.map(fn, jobs, desc=desc)
