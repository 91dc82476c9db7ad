"""The heuristics of the design documents this project comes from.

An EWMA batch estimator::

    batch = clamp(1, 256, free_vram_GiB * 1024 / (ewma_latency_ms * 0.8))

with the EWMA over the last 64 latency samples, weighted ``exp(linspace(-1, 0, n))`` (the newest
weighs e times the oldest), and a formula for the KV ratio from batch and chunk sizes::

    ratio = clamp(0.4, 0.95, (0.7 + 0.2 * min(batch / 16, 1)) * (chunk / 1024))

How they map onto the three knobs:

- the latency sample of an interval is its p99 TPOT in ms (the time of an engine iteration as
  decodes see it; the observation carries it as a ratio to the TPOT target);
- ``free_vram_GiB`` is the memory not holding data: the free KV blocks plus the activation
  workspace, from the executor's memory model and the observed KV utilisation;
- the batch (1..256 sequences) sets the prefill chunk at 64 tokens a sequence, so the batch range
  spans the chunk range (64..16384 tokens) exactly;
- the ratio comes from the formula; the documents give no rule for the batch window, which stays
  at the static default;
- nor for the SLO classes: the batch share moves as the PID moves it
  (:func:`runtime.decider.pid.batch_share_step`: closed fast when interactive TTFT or attainment
  is under pressure, opened slowly in calm), and the admission slack holds where it is.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import numpy as np

from runtime.decider.decision import Decision, decided_by
from runtime.decider.pid import PidGains, batch_share_step, share_error
from runtime.engine.executor import GIB, MemoryModel
from runtime.engine.slo import DEFAULT_SLO_CLASS, DEFAULT_SLO_CLASSES
from runtime.knobs import DEFAULT_KNOBS, KNOB_SPEC_BY_NAME, Knobs
from runtime.observation import fields_from_vector

TOKENS_PER_SEQUENCE = 64
EWMA_SAMPLES = 64


def ewma(samples: list[float] | deque) -> float:
    n = len(samples)
    w = np.exp(np.linspace(-1.0, 0.0, n))
    return float(np.dot(w, np.asarray(samples, dtype=np.float64)) / w.sum())


def _share_from_action(share: float, du: float) -> float:
    """The batch share moved by ``du`` action units (the share's action is linear: 2 units span
    its range)."""
    spec = KNOB_SPEC_BY_NAME["batch_share"]
    return share + du * (spec.high - spec.low) / 2.0


def heuristic_ratio(batch: float, chunk: float) -> float:
    return min(0.95, max(0.4, (0.7 + 0.2 * min(batch / 16.0, 1.0)) * (chunk / 1024.0)))


class HeuristicController:
    name = "heuristic"

    def __init__(self, memory: MemoryModel, tpot_target_s: float | None = None) -> None:
        """:param memory: the executor's memory model (for free memory)
        :param tpot_target_s: the TPOT target the observation's ratio refers to
        """
        self.memory = memory
        self.tpot_target_s = (tpot_target_s if tpot_target_s is not None
                              else DEFAULT_SLO_CLASSES[DEFAULT_SLO_CLASS].tpot_s)
        self._latencies_ms: deque[float] = deque(maxlen=EWMA_SAMPLES)
        self._default = decided_by(DEFAULT_KNOBS, self.name)
        self._gains = PidGains()

    def reset(self) -> None:
        self._latencies_ms.clear()

    def decide(self, observation: np.ndarray) -> Decision:
        f = fields_from_vector(observation)
        tpot_ms = f["tpot_p99_ratio"] * self.tpot_target_s * 1e3
        if tpot_ms > 0:  # an interval without completions has no latency sample
            self._latencies_ms.append(tpot_ms)
        if not self._latencies_ms:  # the static default, the class and admission knobs kept
            if (f["batch_share"], f["admission_slack"]) == (DEFAULT_KNOBS.batch_share,
                                                            DEFAULT_KNOBS.admission_slack):
                return self._default
            return decided_by(replace(DEFAULT_KNOBS, batch_share=f["batch_share"],
                                      admission_slack=f["admission_slack"]), self.name)
        share = _share_from_action(
            f["batch_share"], batch_share_step(share_error(f["ttft_p99_ratio"], self._gains),
                                               share_error(f["ttft_p99_ratio_prev"], self._gains),
                                               f["slo_attainment"], self._gains))
        ratio_now = f["kv_cache_ratio"]
        m = self.memory
        free_bytes = ((1.0 - f["kv_utilization"]) * m.kv_bytes(ratio_now)
                      + m.workspace_bytes(ratio_now))
        batch = free_bytes / GIB * 1024.0 / (ewma(self._latencies_ms) * 0.8)
        batch = min(256.0, max(1.0, batch))
        chunk = batch * TOKENS_PER_SEQUENCE
        return decided_by(Knobs.clamped(DEFAULT_KNOBS.batch_window_ms, chunk,
                                        heuristic_ratio(batch, chunk), share,
                                        f["admission_slack"]), self.name)
