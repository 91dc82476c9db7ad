"""AIMD, after Clipper (NSDI'17): additive increase while latency holds, multiplicative decrease
when it is missed.

Clipper tunes one knob, the maximum batch size, against one latency SLO. Here it drives each
knob from the signal that knob trades against, independently:

- ``prefill_chunk_tokens`` is the batch size: it grows by ``chunk_step`` tokens while the p99
  TPOT (the per-iteration latency decodes see) meets its target, and shrinks by
  ``backoff`` (Clipper's 10%) when it does not.
- ``batch_window_ms`` grows by ``window_step_ms`` while the p99 TTFT meets its target and is cut
  by half when it does not (waiting is the first thing to give up when TTFT suffers).
- ``kv_cache_ratio`` grows by ``ratio_step`` after an interval with preemptions (the KV pool was
  too small) and its excess over the lowest ratio is cut by ``backoff`` after an OOM (the
  activations needed room); otherwise it holds.
- ``batch_share`` (the batch tap) grows by ``share_step`` while interactive p99 TTFT meets its
  target and interval attainment is at least ``share_attainment``, and is cut by ``backoff_share``
  (half) when either fails: batch work backs off fast in a burst and returns slowly in calm.
- ``admission_slack`` holds where it is (the deployment's setting).

Stateless: the current knobs and the signals are all in the observation.
"""

from __future__ import annotations

import numpy as np

from runtime.decider.decision import Decision, decided_by
from runtime.knobs import KNOB_SPECS, Knobs
from runtime.observation import fields_from_vector


class AimdController:
    name = "aimd"

    def __init__(self, *, chunk_step: int = 256, window_step_ms: float = 1.0,
                 ratio_step: float = 0.02, backoff: float = 0.9, share_step: float = 0.05,
                 backoff_share: float = 0.5, share_attainment: float = 0.95) -> None:
        """:param chunk_step: additive chunk increase per interval (tokens)
        :param window_step_ms: additive window increase per interval (ms)
        :param ratio_step: additive KV ratio increase after preemptions
        :param backoff: multiplicative decrease factor (Clipper uses 0.9)
        :param share_step: additive batch share increase per calm interval
        :param backoff_share: multiplicative batch share decrease under pressure
        :param share_attainment: interval attainment below which the batch share backs off
        """
        for name, v in (("backoff", backoff), ("backoff_share", backoff_share)):
            if not 0 < v < 1:
                raise ValueError(f"{name} must lie in (0, 1), got {v}")
        self.share_step = share_step
        self.backoff_share = backoff_share
        self.share_attainment = share_attainment
        self.chunk_step = chunk_step
        self.window_step_ms = window_step_ms
        self.ratio_step = ratio_step
        self.backoff = backoff

    def reset(self) -> None:
        pass

    def decide(self, observation: np.ndarray) -> Decision:
        f = fields_from_vector(observation)
        window, chunk, ratio = (f["batch_window_ms"], f["prefill_chunk_tokens"],
                                f["kv_cache_ratio"])
        if f["tpot_p99_ratio"] <= 1.0:
            chunk += self.chunk_step
        else:
            chunk *= self.backoff
        if f["ttft_p99_ratio"] <= 1.0:
            window += self.window_step_ms
        else:
            window *= 0.5
        low = KNOB_SPECS[2].low
        if f["ooms"] > 0.5:
            ratio = low + (ratio - low) * self.backoff
        elif f["preemptions"] > 0.5:
            ratio += self.ratio_step
        share = f["batch_share"]
        if f["ttft_p99_ratio"] <= 1.0 and f["slo_attainment"] >= self.share_attainment:
            share += self.share_step
        else:
            share *= self.backoff_share
        return decided_by(Knobs.clamped(window, chunk, ratio, share, f["admission_slack"]),
                          self.name)
