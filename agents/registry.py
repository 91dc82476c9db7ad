"""The registry of controllers: every controller the arena, training and the replay scripts can
name, built from that name.

Names: ``static`` (the static default, or ``static_knobs``), ``best-static`` (a grid search on
the trace's training split, cached), ``pid``, ``aimd``, ``heuristic``, ``oracle`` (the lookahead
oracle anchored on best static: an upper bound that reads the engine), ``oracle-forecast`` (the
same search on a persistence forecast of the arrivals instead of the trace's future: how much of
the oracle's gain is foresight; not an upper bound), ``oracle-causal`` (and the output lengths
forecast too: the search knowing nothing a controller could not), ``policy:PATH`` (an ONNX
policy through the guarded decider; PATH may be a policy set, which gives each trace its
workload's policy) and ``module:factory`` (any importable factory called with
no arguments that returns a :class:`runtime.decider.controller.Controller`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agents.oracle import ORACLE_NAME, SEARCH_NAMES, OracleConfig
from runtime.decider.controller import Controller, StaticController
from runtime.decider.pid import PidController
from runtime.engine.engine import EngineConfig
from runtime.engine.profile import Profile
from runtime.knobs import DEFAULT_KNOBS, Knobs
from runtime.session import DEFAULT_INTERVAL_S

if TYPE_CHECKING:
    from agents.controllers.best_static import BestStatic

BASELINES = ("static", "best-static", "pid", "aimd", "heuristic")
"""the baselines every evaluation shows"""
ORACLE = ORACLE_NAME
"""the lookahead oracle (:mod:`agents.oracle`): an upper bound, run only when named"""


@dataclass
class EvalSpec:
    """Everything a worker process needs to rebuild a controller and a window."""

    trace: str
    """the trace spec (best-static tunes on its training split)"""
    part: str = "eval"
    """the split the windows come from: train | eval | all"""
    profile_path: str | None = None
    """the executor profile (None: the shipped roofline profile)"""
    interval_s: float = DEFAULT_INTERVAL_S
    """the decision interval, engine seconds"""
    config: EngineConfig = field(default_factory=EngineConfig)
    """engine limits and SLO classes"""
    static_knobs: Knobs = DEFAULT_KNOBS
    """the knobs of ``static`` and the PID's (with the engine config's batch share and admission
    slack where it sets them: :meth:`runtime.engine.engine.EngineConfig.start_knobs`)"""
    tuning_scales: tuple[float, ...] | None = None
    """the rate scales best-static is tuned at (None: its TUNING_SCALES, around the trace's
    own rate)"""
    oracle: OracleConfig = field(default_factory=OracleConfig)
    """how the oracle searches (its candidates, period, horizon and prices)"""


def best_static(spec: EvalSpec, kv_cache_ratio: float | None = None) -> BestStatic:
    """Best static's setting for the spec, tuned at its tuning scales: best-static's and the
    oracle's anchor, so that both rows of an arena run stand on the same search (with
    ``kv_cache_ratio``: the static frontier's point at that ratio)."""
    from agents.controllers.best_static import best_static_setting

    scales = {} if spec.tuning_scales is None else {"scales": spec.tuning_scales}
    return best_static_setting(spec.trace, part="train", profile_path=spec.profile_path,
                               config=spec.config, kv_cache_ratio=kv_cache_ratio, **scales)


def policy_file(path: str, trace: str) -> str:
    """The ONNX policy ``policy:PATH`` runs on ``trace``: PATH itself, or, when PATH is a policy
    set (:mod:`runtime.decider.policy_set`), the policy it names for the trace (by its spec,
    then by its label: ``azure-code``, a file's stem) or its default."""
    if not path.endswith(".json"):
        return path
    from env.traces.resolve import trace_label
    from runtime.decider.policy_set import PolicySet

    policies = PolicySet.load(path)
    workload = trace if trace in policies.workloads else trace_label(trace)
    return str(policies.file_for(workload))


def make_controller(name: str, spec: EvalSpec) -> Controller:
    """A controller by its name (see the module docstring). Raises ValueError for an unknown
    name and FileNotFoundError for a missing policy file."""
    static = spec.config.start_knobs(spec.static_knobs)
    if name == "static":
        return StaticController(static)
    if name == "best-static":
        from agents.controllers.best_static import BestStaticController

        best = best_static(spec)
        return BestStaticController(best.knobs, best.admission)
    if name in SEARCH_NAMES:
        from agents.oracle import LEVERS, LookaheadOracle, Setting, search_config

        best = best_static(spec)
        levers = (() if best.admission == spec.config.admission
                  else (("admission", LEVERS["admission"].parse(best.admission)),))
        return LookaheadOracle(search_config(name, spec.oracle),
                               anchor=Setting(best.knobs, levers),
                               interval_s=spec.interval_s)
    if name == "pid":
        return PidController(static=static)
    if name == "aimd":
        from agents.controllers.aimd import AimdController

        return AimdController()
    if name == "heuristic":
        from agents.controllers.heuristic import HeuristicController

        target = spec.config.slo_classes[spec.config.default_slo_class].tpot_s
        return HeuristicController(Profile.load(spec.profile_path).memory, tpot_target_s=target)
    if name.startswith("policy:"):
        from agents.policy_controller import PolicyController

        return PolicyController(policy_file(name.split(":", 1)[1], spec.trace))
    if ":" in name:
        module, attr = name.split(":", 1)
        obj = getattr(importlib.import_module(module), attr)()
        if not isinstance(obj, Controller):
            raise ValueError(f"{name} returned {type(obj).__name__}, which lacks name, decide() "
                             "or reset()")
        return obj
    raise ValueError(f"unknown controller {name!r}; expected one of {', '.join(BASELINES)}, "
                     f"{', '.join(SEARCH_NAMES)}, policy:PATH or module:factory")
