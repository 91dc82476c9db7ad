"""How a command line names the engine's SLO classes and levers: one dataclass that the arena's
and the replay's typed configs both inherit, so the flags and their meaning are written once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import tyro

from env.traces.cotenant import cotenant_demand
from runtime.engine.admission import AdmissionPolicy
from runtime.engine.config import KvShrink
from runtime.engine.engine import EngineConfig
from runtime.engine.slo import slo_classes_from_arg


@dataclass
class EngineChoice:
    """The SLO classes and the engine's levers (``--slo --batch-share --admission
    --admission-slack --cotenant --kv-shrink``)."""

    slo: str | None = None
    """SLO classes: a preset (default, long-context) or name:ttft_s:tpot_s[:deadline_s],...,
    ttft_s optionally BASE+SECONDS/tok (default: the engine's DEFAULT_SLO_CLASSES)"""
    batch_share: float = EngineConfig.batch_share
    """the batch_share knob to start with: share of each step's chunk, of the sequence slots and
    of the KV blocks that batch-class requests may take (a controller may move it)"""
    admission: Annotated[AdmissionPolicy, tyro.conf.EnumChoicesFromValues] = AdmissionPolicy(
        EngineConfig.admission)
    """what happens to interactive requests late for their first token (a deployment setting,
    not a knob: no controller changes it; best static and the oracle may choose it)"""
    admission_slack: float = EngineConfig.admission_slack
    """the admission_slack knob to start with: a request is late after waiting this many TTFT
    targets without a first token (a controller may move it)"""
    cotenant: bool = False
    """lend the memory the engine leaves to the default co-tenant demand
    (env/traces/cotenant.py) and report the share served"""
    kv_shrink: KvShrink = EngineConfig.kv_shrink
    """a KV ratio lowered below what running requests hold: preempt the newest at once, or wait
    (shrink only as far as they leave room, the rest as they finish; simulator only, a study
    setting: the shipped lending guard's hold starts from a preemption, docs/results.md)"""

    def engine_config(self, *, seed: int = 0, **fields: Any) -> EngineConfig:
        """The engine config these flags name (``seed``: the co-tenant demand's; ``fields``:
        any other EngineConfig fields). Raises ValueError on a bad SLO list."""
        config = EngineConfig(batch_share=self.batch_share, admission=self.admission.value,
                              admission_slack=self.admission_slack,
                              cotenant=cotenant_demand(seed=seed) if self.cotenant else None,
                              kv_shrink=self.kv_shrink, **fields)
        if self.slo:
            config.slo_classes = slo_classes_from_arg(self.slo)
            config.default_slo_class = next(iter(config.slo_classes))
        return config
