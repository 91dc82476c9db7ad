"""The registry of controllers: every controller the arena, training and the replay scripts can
name, built from that name.

Names: ``static`` (the static default, or ``static_knobs``), ``best-static`` (the fixed setting
with the highest capacity at 99% on the trace's training split: the deployable one, searched and
cached, :mod:`agents.controllers.capacity_search`), ``hindsight-static`` (the same search on the
evaluated window itself: the best any fixed setting could have done there, not deployable),
``pid``, ``aimd``, ``heuristic``, ``oracle`` (the lookahead oracle's search anchored on hindsight
static's setting; the arena makes it an upper bound by taking, at every load, the best of that
search's run and the fixed settings' runs: :mod:`agents.oracle_bound`), ``oracle-search`` (the
search anchored on best static, as training's periodic evaluation runs it: it sees the future,
but no bound is proven for it), ``oracle-forecast`` (the search anchored on best static on a
persistence forecast of the arrivals instead of the trace's future: how much of the search's gain
is foresight), ``oracle-causal`` (and the output lengths forecast too: the search knowing
nothing a controller could not), ``policy:PATH`` (an ONNX policy through the guarded decider;
PATH may be a policy set, which gives each trace its workload's policy;
``policy-unguarded:PATH`` the same without its out-of-distribution guard) and
``module:factory`` (any importable factory called with no arguments that returns a
:class:`runtime.decider.controller.Controller`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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
UNGUARDED_PREFIX = "policy-unguarded:"
"""``policy-unguarded:PATH``: the policy (or policy set) without its out-of-distribution guard"""
HINDSIGHT = "hindsight-static"
"""the best fixed setting in hindsight: searched on the evaluated window, so not deployable"""
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
    static_grid: dict[str, tuple] | None = None
    """the knob grid best static's and hindsight static's capacity searches walk (None: the
    grid of :data:`agents.controllers.best_static.GRID`, 90 settings)"""


def best_static(spec: EvalSpec, kv_cache_ratio: float | None = None,
                target: float = 0.99) -> BestStatic:
    """Best static's setting for the spec: the fixed setting with the highest capacity at
    ``target`` on the trace's training split (:func:`capacity_search`), the ``best-static`` row
    and every oracle search's anchor but the bound's. With ``kv_cache_ratio``: the static
    frontier's point at that ratio instead (the knob grid's best mean attainment at the tuning
    scales with the ratio held, then its lever search:
    :func:`agents.controllers.best_static.best_static_setting`)."""
    if kv_cache_ratio is not None:
        from agents.controllers.best_static import best_static_setting

        scales = {} if spec.tuning_scales is None else {"scales": spec.tuning_scales}
        return best_static_setting(spec.trace, part="train", profile_path=spec.profile_path,
                                   config=spec.config, kv_cache_ratio=kv_cache_ratio, **scales)
    return capacity_search(spec, "train", target)["best"]["setting"]


def reference_knobs(spec: EvalSpec, **options: Any) -> Knobs:
    """Training's reference for the spec's trace: best static's knobs (capacity at 99% on the
    train split) under the deployment's admission policy, which no controller may change: the
    best-ranked setting of best static's search that keeps it (the whole knob grid's first pass
    runs under it). The differential reward's pairing, the imitation oracle's anchor and the
    periodic evaluation's best static are then the arena's best static wherever it keeps the
    deployment's admission. ``options``: the search's, when it is not cached (workers, ray,
    progress)."""
    from agents.controllers.capacity_search import rank

    found = capacity_search(spec, "train", 0.99, **options)
    for e in rank(found["table"]):
        if e["setting"].admission == spec.config.admission:
            return e["setting"].knobs
    return found["best"]["setting"].knobs


def hindsight_static(spec: EvalSpec, target: float = 0.99) -> BestStatic:
    """The best fixed setting in hindsight: the highest capacity at ``target`` on the evaluated
    split itself, best static's own setting among the candidates (so it is never below it)."""
    return hindsight_search(spec, target)["best"]["setting"]


def capacity_search(spec: EvalSpec, part: str, target: float,
                    extra: tuple[BestStatic, ...] = (), **options: Any) -> dict:
    """The capacity search of :mod:`agents.controllers.capacity_search` on the ``part`` split
    of the spec's trace, under its deployment (cached; ``options``: workers, ray, progress; by
    default one process and no progress bar, as a search not filled beforehand runs wherever it
    is first asked for: the arena fills them in parallel before it fans out)."""
    from agents.controllers.capacity_search import capacity_static

    options = {"workers": 1, "progress": False, **options}
    return capacity_static(spec, part, target, extra=extra, grid=spec.static_grid, **options)


def hindsight_search(spec: EvalSpec, target: float = 0.99) -> dict:
    """Hindsight static's whole search on the evaluated split (top settings, table). On the
    train split it is best static's own search."""
    if spec.part == "train":
        return capacity_search(spec, "train", target)
    return capacity_search(spec, spec.part, target, (best_static(spec, target=target),))


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


def oracle_setting(best: BestStatic, spec: EvalSpec):
    """A fixed setting as the oracle's candidate: its knobs, and its admission policy as a lever
    where it is not the deployment's."""
    from agents.oracle import LEVERS, Setting

    levers = (() if best.admission == spec.config.admission
              else (("admission", LEVERS["admission"].parse(best.admission)),))
    return Setting(best.knobs, levers)


def make_controller(name: str, spec: EvalSpec) -> Controller:
    """A controller by its name (see the module docstring). Raises ValueError for an unknown
    name and FileNotFoundError for a missing policy file."""
    static = spec.config.start_knobs(spec.static_knobs)
    if name == "static":
        return StaticController(static)
    if name in ("best-static", HINDSIGHT):
        from agents.controllers.best_static import BestStaticController

        best = best_static(spec) if name == "best-static" else hindsight_static(spec)
        return BestStaticController(best.knobs, best.admission, name=name)
    if name in SEARCH_NAMES:
        from agents.oracle import LookaheadOracle, search_config

        anchor = hindsight_static(spec) if name == ORACLE_NAME else best_static(spec)
        others = [best_static(spec)] if name == ORACLE_NAME else []
        return LookaheadOracle(search_config(name, spec.oracle),
                               anchor=oracle_setting(anchor, spec),
                               extra=[oracle_setting(s, spec) for s in others],
                               interval_s=spec.interval_s, name=name)
    if name == "pid":
        return PidController(static=static)
    if name == "aimd":
        from agents.controllers.aimd import AimdController

        return AimdController()
    if name == "heuristic":
        from agents.controllers.heuristic import HeuristicController

        target = spec.config.slo_classes[spec.config.default_slo_class].tpot_s
        return HeuristicController(Profile.load(spec.profile_path).memory, tpot_target_s=target)
    if name.startswith(("policy:", UNGUARDED_PREFIX)):
        from agents.policy_controller import PolicyController

        return PolicyController(policy_file(name.split(":", 1)[1], spec.trace), name=name,
                                ood_guard=not name.startswith(UNGUARDED_PREFIX), static=static)
    if ":" in name:
        module, attr = name.split(":", 1)
        obj = getattr(importlib.import_module(module), attr)()
        if not isinstance(obj, Controller):
            raise ValueError(f"{name} returned {type(obj).__name__}, which lacks name, decide() "
                             "or reset()")
        return obj
    raise ValueError(f"unknown controller {name!r}; expected one of {', '.join(BASELINES)}, "
                     f"{', '.join(SEARCH_NAMES)}, policy:PATH or module:factory")
