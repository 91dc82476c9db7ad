"""Choosing an executor by name: what the environment's ``executor="sim" | "torch"`` maps to.

torch is imported only when the torch executor is asked for, so the simulated path (and all of
``runtime``) works without torch installed.
"""

from __future__ import annotations

from pathlib import Path

from runtime.engine.executor import Executor
from runtime.engine.profile import Profile

EXECUTOR_KINDS = ("sim", "torch")


def make_executor(kind: str = "sim", *, profile: Profile | str | Path | None = None,
                  shape: str = "tiny", device: str | None = None,
                  budget_gib: float | None = None, **torch_kw) -> Executor:
    """:param kind: ``sim`` (cost model from a profile) or ``torch`` (a real model)
    :param profile: the simulator's profile (a Profile or a path; default: the shipped one)
    :param shape: the torch executor's model shape (``tiny`` or ``llama2-7b``)
    :param device: ``cuda`` or ``cpu`` for the torch executor (default: CUDA when present)
    :param budget_gib: the torch executor's memory budget (default: the shape's)
    :param torch_kw: further :class:`runtime.engine.torch_executor.TorchExecutor` arguments

    With ``kind="torch"`` the engine's clock advances by measured iteration times (for wall-clock
    serving, pace the run with :class:`runtime.wallclock.WallClockPacer`).
    """
    if kind == "sim":
        from runtime.engine.sim_executor import SimulatedExecutor
        if profile is not None and not isinstance(profile, Profile):
            profile = Profile.load(profile)
        return SimulatedExecutor(profile)
    if kind == "torch":
        from runtime.engine.torch_executor import TorchExecutor
        return TorchExecutor.for_shape(shape, device=device, budget_gib=budget_gib, **torch_kw)
    raise ValueError(f"executor must be one of {EXECUTOR_KINDS}, got {kind!r}")
