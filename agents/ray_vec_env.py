"""Environments as Ray actors behind stable-baselines3's ``VecEnv``: rollouts across machines,
with SB3 staying the learner.

    venv = RayVecEnv([make_env(i) for i in range(64)], n_workers=16)   # 4 environments an actor

Each worker is one Ray actor holding a contiguous block of the environments and one CPU. A
``step`` sends every worker its block of actions at once; a worker steps its environments one
after the other and answers with their results, so the learner pays one round trip per worker
per step, not one per environment (an environment step takes about 0.4 ms, about what a Ray
call costs: a worker of one environment would spend as long talking as stepping).

Semantics are SubprocVecEnv's, to the digit: a finished episode resets at once, its last
observation goes into ``info["terminal_observation"]``, ``info["TimeLimit.truncated"]`` marks a
truncation, and ``reset`` passes each environment its seed from ``seed()`` and its options from
``set_options()``. The tests compare observations and rewards with DummyVecEnv and
SubprocVecEnv under the same seeds and actions, across episode ends.

Ray must be initialised or startable (see :func:`agents.parallel.init_ray`: ``RAY_ADDRESS`` joins
a cluster, otherwise a local Ray gets one CPU per worker); the environment constructors are
pickled to the actors, so they must be picklable (a ``functools.partial`` of a module-level
function is).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnv,
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)

from agents.parallel import import_ray, init_ray


class EnvGroup:
    """The environments one worker holds (a Ray actor); every method takes local indices."""

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]]) -> None:
        from stable_baselines3.common.vec_env.patch_gym import _patch_env

        self.envs = [_patch_env(fn()) for fn in env_fns]
        self.step_seconds = 0.0
        """wall seconds spent in ``step`` so far (what the learner waits for; see stepping_time)"""

    def spaces(self) -> tuple[gym.Space, gym.Space]:
        return self.envs[0].observation_space, self.envs[0].action_space

    def reset(self, seeds: Sequence[int | None], options: Sequence[dict]) -> list[tuple]:
        out = []
        for env, seed, opts in zip(self.envs, seeds, options):
            maybe_options = {"options": opts} if opts else {}
            out.append(env.reset(seed=seed, **maybe_options))
        return out

    def step(self, actions: np.ndarray) -> list[tuple]:
        t0 = time.perf_counter()
        out = []
        for env, action in zip(self.envs, actions):
            obs, reward, terminated, truncated, info = env.step(action)
            done = terminated or truncated
            info["TimeLimit.truncated"] = truncated and not terminated
            reset_info: dict[str, Any] = {}
            if done:
                info["terminal_observation"] = obs
                obs, reset_info = env.reset()
            out.append((obs, reward, done, info, reset_info))
        self.step_seconds += time.perf_counter() - t0
        return out

    def stepping_time(self) -> float:
        return self.step_seconds

    def get_attr(self, name: str, local: Sequence[int]) -> list[Any]:
        return [self.envs[i].get_wrapper_attr(name) for i in local]

    def has_attr(self, name: str) -> bool:
        try:
            for env in self.envs:
                env.get_wrapper_attr(name)
        except AttributeError:
            return False
        return True

    def set_attr(self, name: str, value: Any, local: Sequence[int]) -> None:
        for i in local:
            setattr(self.envs[i], name, value)

    def env_method(self, name: str, args: tuple, kwargs: dict, local: Sequence[int]) -> list:
        return [self.envs[i].get_wrapper_attr(name)(*args, **kwargs) for i in local]

    def is_wrapped(self, wrapper_class: type[gym.Wrapper], local: Sequence[int]) -> list[bool]:
        from stable_baselines3.common.env_util import is_wrapped

        return [is_wrapped(self.envs[i], wrapper_class) for i in local]

    def render(self) -> list:
        return [env.render() for env in self.envs]

    def close(self) -> None:
        for env in self.envs:
            env.close()


def blocks(n_envs: int, n_workers: int) -> list[range]:
    """``n_envs`` split into ``n_workers`` contiguous blocks whose sizes differ by at most one."""
    if not 1 <= n_workers <= n_envs:
        raise ValueError(f"n_workers must be in 1..{n_envs} (the number of environments), "
                         f"got {n_workers}")
    size, extra = divmod(n_envs, n_workers)
    out, start = [], 0
    for w in range(n_workers):
        stop = start + size + (w < extra)
        out.append(range(start, stop))
        start = stop
    return out


class RayVecEnv(VecEnv):
    """SB3's ``VecEnv`` over Ray actors (see the module docstring).

    :param env_fns: picklable environment constructors, one per environment
    :param n_workers: actors to spread them over (default: one per environment)
    :param cpus_per_worker: CPUs each actor reserves in the Ray scheduler
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], n_workers: int | None = None,
                 cpus_per_worker: float = 1.0) -> None:
        ray = import_ray()
        self._ray = ray
        n_envs = len(env_fns)
        self.blocks = blocks(n_envs, n_workers or n_envs)
        self._owns_ray = False
        if not ray.is_initialized():
            self._owns_ray = init_ray(max(1, int(np.ceil(len(self.blocks) * cpus_per_worker))))
        actor = ray.remote(num_cpus=cpus_per_worker)(EnvGroup)
        self.workers = [actor.remote([env_fns[i] for i in b]) for b in self.blocks]
        self._where = [(w, i - b.start) for w, b in enumerate(self.blocks) for i in b]
        observation_space, action_space = ray.get(self.workers[0].spaces.remote())
        self._pending: list | None = None
        self.closed = False
        super().__init__(n_envs, observation_space, action_space)

    # ------------------------------------------------------------------ stepping
    def step_async(self, actions: np.ndarray) -> None:
        self._pending = [w.step.remote(actions[b.start:b.stop])
                         for w, b in zip(self.workers, self.blocks)]

    def step_wait(self) -> VecEnvStepReturn:
        assert self._pending is not None, "step_wait without step_async"
        results = [r for group in self._ray.get(self._pending) for r in group]
        self._pending = None
        obs, rews, dones, infos, self.reset_infos = zip(*results)
        return np.stack(obs), np.stack(rews), np.stack(dones), list(infos)

    def reset(self) -> VecEnvObs:
        refs = [w.reset.remote([self._seeds[i] for i in b], [self._options[i] for i in b])
                for w, b in zip(self.workers, self.blocks)]
        results = [r for group in self._ray.get(refs) for r in group]
        obs, self.reset_infos = zip(*results)
        self._reset_seeds()
        self._reset_options()
        return np.stack(obs)

    def close(self) -> None:
        if self.closed:
            return
        if self._pending is not None:
            self._ray.get(self._pending)
        self._ray.get([w.close.remote() for w in self.workers])
        for w in self.workers:
            self._ray.kill(w)
        if self._owns_ray:
            self._ray.shutdown()
        self.closed = True

    def get_images(self) -> Sequence[np.ndarray | None]:
        return [img for group in self._ray.get([w.render.remote() for w in self.workers])
                for img in group]

    def stepping_seconds(self) -> list[float]:
        """Each worker's wall seconds spent stepping its environments so far."""
        return self._ray.get([w.stepping_time.remote() for w in self.workers])

    # ------------------------------------------------------------------ attributes and methods
    def _by_worker(self, indices: VecEnvIndices) -> dict[int, list[int]]:
        """Worker -> its local indices, in the order of ``indices``' workers."""
        out: dict[int, list[int]] = {}
        for i in self._get_indices(indices):
            w, local = self._where[i]
            out.setdefault(w, []).append(local)
        return out

    def _gather(self, indices: VecEnvIndices, call: Callable[[Any, list[int]], Any]) -> list:
        order = [self._where[i] for i in self._get_indices(indices)]
        by_worker = self._by_worker(indices)
        answers = dict(zip(by_worker, self._ray.get(
            [call(self.workers[w], local) for w, local in by_worker.items()])))
        seen: dict[int, int] = {}
        out = []
        for w, _ in order:  # back into the order of ``indices``
            k = seen.get(w, 0)
            out.append(answers[w][k])
            seen[w] = k + 1
        return out

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return self._gather(indices, lambda w, loc: w.get_attr.remote(attr_name, loc))

    def has_attr(self, attr_name: str) -> bool:
        return all(self._ray.get([w.has_attr.remote(attr_name) for w in self.workers]))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        self._ray.get([self.workers[w].set_attr.remote(attr_name, value, loc)
                       for w, loc in self._by_worker(indices).items()])

    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None,
                   **method_kwargs) -> list[Any]:
        return self._gather(indices, lambda w, loc: w.env_method.remote(
            method_name, method_args, method_kwargs, loc))

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper],
                       indices: VecEnvIndices = None) -> list[bool]:
        return self._gather(indices, lambda w, loc: w.is_wrapped.remote(wrapper_class, loc))
