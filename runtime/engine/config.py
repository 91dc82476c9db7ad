"""The engine's configuration: its limits, SLO classes and levers (:class:`EngineConfig`), and the
latest arrival it accepts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal, get_args

from runtime.engine.admission import ADMISSION_SLACK_RANGE, AdmissionPolicy
from runtime.engine.cotenant import CoTenantDemand
from runtime.engine.slo import DEFAULT_SLO_CLASS, DEFAULT_SLO_CLASSES, SloTarget
from runtime.knobs import DEFAULT_KNOBS, Knobs

KvShrink = Literal["preempt", "wait"]
"""what a KV ratio lowered below the blocks in use does (``EngineConfig.kv_shrink``)"""
KV_SHRINK_MODES: tuple[str, ...] = get_args(KvShrink)
KV_SHRINK_PREEMPT: KvShrink = "preempt"
KV_SHRINK_WAIT: KvShrink = "wait"
assert (KV_SHRINK_PREEMPT, KV_SHRINK_WAIT) == KV_SHRINK_MODES

MAX_ARRIVAL_S = 1e10
"""The latest arrival the engine accepts, in seconds (about 317 years). float64 still resolves
a microsecond there (an iteration's time must not vanish in rounding, or time would stop);
a Unix-epoch timestamp (1.7e9 s) fits, 1e300 does not."""


@dataclass
class EngineConfig:
    max_num_seqs: int = 256
    """the most requests running at once (vLLM's max_num_seqs)"""
    max_model_len: int | None = None
    """the most tokens (prompt + output) one request may have; longer ones are rejected.
    None: the executor's (the profile's model context)"""
    watermark: float = 0.01
    """share of KV blocks kept free at admission while other requests run"""
    slo_classes: dict[str, SloTarget] = field(default_factory=lambda: dict(DEFAULT_SLO_CLASSES))
    """targets by class name; requests without a class get ``default_slo_class``"""
    default_slo_class: str = DEFAULT_SLO_CLASS
    """the class of requests added without one"""
    fast_path: bool = True
    """advance decode-only stretches in closed form when the executor allows it"""
    keep_requests: bool = True
    """keep every request in ``Engine.requests`` after it ends (tests and per-request reports);
    False drops finished and rejected ones, so a long-running serving loop's memory stays
    bounded (the run summary is exact either way)"""
    batch_share: float = DEFAULT_KNOBS.batch_share
    """the ``batch_share`` knob to start with: share of each step's prefill chunk, of the
    sequence slots and of the KV blocks that batch-class requests may take, in [0, 1] (a knob:
    ``Engine.set_knobs`` changes it at run time)"""
    admission: str = AdmissionPolicy.FCFS.value
    """what happens to an interactive request late for its first token: fcfs, shed or
    late_to_back (see runtime.engine.admission)"""
    admission_slack: float = DEFAULT_KNOBS.admission_slack
    """the ``admission_slack`` knob to start with: a request is late once it has waited this
    many TTFT targets without a first token (a knob: ``Engine.set_knobs`` changes it)"""
    cotenant: CoTenantDemand | None = None
    """the memory demand of a co-located tenant, served from the memory the engine leaves"""
    kv_shrink: KvShrink = KV_SHRINK_PREEMPT
    """what a ``kv_cache_ratio`` lowered below what the running requests hold does: preempt (the
    newest requests, at once, until the pool fits) or wait (the pool shrinks only as far as what
    is held leaves room for, no request is preempted for it, and each later application of the
    ratio shrinks it further as requests finish: memory is lent as it frees; a driver that
    applies a ratio once, as the oracle's rollouts do, leaves a partial shrink where it was)"""

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if not 0 <= self.watermark < 0.5:
            raise ValueError(f"watermark must lie in [0, 0.5), got {self.watermark}")
        if self.default_slo_class not in self.slo_classes:
            raise ValueError(f"default_slo_class {self.default_slo_class!r} is not one of "
                             f"{sorted(self.slo_classes)}")
        check_batch_share(self.batch_share)
        if self.admission not in tuple(AdmissionPolicy):
            raise ValueError(f"admission must be one of {', '.join(AdmissionPolicy)}, got "
                             f"{self.admission!r}")
        if self.kv_shrink not in KV_SHRINK_MODES:
            raise ValueError(f"kv_shrink must be one of {', '.join(KV_SHRINK_MODES)}, got "
                             f"{self.kv_shrink!r}")
        lo, hi = ADMISSION_SLACK_RANGE
        if not lo <= self.admission_slack <= hi:
            raise ValueError(f"admission_slack must lie in [{lo:g}, {hi:g}] TTFT targets, got "
                             f"{self.admission_slack}")

    def start_knobs(self, knobs: Knobs) -> Knobs:
        """The knobs an engine built with this config and ``knobs`` starts with: ``knobs``, with
        the config's ``batch_share`` and ``admission_slack`` where the config sets them (a value
        other than the static default's). Raises ValueError when both set one differently."""
        changes = {}
        for name in _CONFIG_KNOBS:
            mine, theirs = getattr(self, name), getattr(knobs, name)
            default = getattr(DEFAULT_KNOBS, name)
            if mine != default and theirs != mine:
                if theirs != default:
                    raise ValueError(f"{name} is {mine} in the engine config but {theirs} in the "
                                     "knobs: set it in one place")
                changes[name] = mine
        return dataclasses.replace(knobs, **changes) if changes else knobs


_CONFIG_KNOBS = ("batch_share", "admission_slack")
"""the knobs an EngineConfig may also set (their start values)"""


def check_batch_share(share: float) -> None:
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"batch_share must lie in [0, 1], got {share}")

