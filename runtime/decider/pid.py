"""A PID controller in velocity form over the three knobs: the decider's fallback.

Velocity form: each interval the controller moves the knobs (in action coordinates, [-1, 1]) by

    du = -(Kp * (e_k - e_{k-1}) + Ki * e_k)

so it needs only the current knobs and the last two errors, all of which the observation carries
(``*_prev`` fields). The decider is therefore stateless per request and scales out behind any
load balancer; there is no integrator to wind up, since the knobs themselves are the integral and
are clamped to their ranges. The derivative term is left out (D needs e_{k-2}, and interval
percentiles are too noisy to differentiate twice).

Loops (errors are log2 ratios clipped to +-3, so a 10x overshoot moves no faster than 8x):

- batch window <- TTFT: ``e = log2(ttft_p99_ratio / ttft_setpoint)``. TTFT above the set point
  shortens the window; slack lengthens it slowly (bigger prefill batches, fewer decode stalls).
- prefill chunk <- TPOT against TTFT: ``e = log2(tpot_ratio / tpot_setpoint) -
  log2(ttft_ratio / ttft_setpoint)``. Per-token latency closer to its target than time to first
  token shrinks the chunk (fewer decode stalls); the other way round grows it (faster prefill).
- KV ratio <- KV pressure: ``e = kv_utilization - kv_setpoint``, plus one unit per interval with
  preemptions (more KV needed) and minus ``oom_push`` when an OOM happened (activations need room).
  The sign is inverted: pressure raises the ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from runtime.knobs import NUM_KNOBS, Knobs, action_to_knobs
from runtime.observation import OBSERVATION_INDEX, fields_from_vector

_I = OBSERVATION_INDEX


@dataclass(frozen=True)
class PidGains:
    """Gains and set points (tuned with ``python -m agents.tune_pid``; see its output in the
    project README)."""

    window_kp: float = 0.10
    window_ki: float = 0.05
    chunk_kp: float = 0.10
    chunk_ki: float = 0.05
    kv_kp: float = 0.5
    kv_ki: float = 0.2
    ttft_setpoint: float = 0.5
    """target p99 TTFT as a share of the TTFT SLO"""
    tpot_setpoint: float = 0.7
    """target p99 TPOT as a share of the TPOT SLO"""
    kv_setpoint: float = 0.85
    """KV utilisation the ratio loop aims for"""
    preempt_push: float = 0.3
    """extra KV error per interval with preemptions"""
    oom_push: float = 1.0
    """KV error subtracted per interval with an OOM"""


def _log_err(ratio: float, setpoint: float) -> float:
    return max(-3.0, min(3.0, math.log2(max(ratio, 1e-3) / setpoint)))


class PidController:
    name = "pid"

    def __init__(self, gains: PidGains | None = None) -> None:
        self.gains = gains if gains is not None else PidGains()

    def reset(self) -> None:
        pass  # stateless: everything it needs is in the observation

    def errors(self, f: dict[str, float]) -> tuple[tuple[float, float], ...]:
        """((e_k, e_{k-1}) for window, chunk, kv) from named observation fields."""
        g = self.gains
        ttft, ttft_prev = f["ttft_p99_ratio"], f["ttft_p99_ratio_prev"]
        tpot, tpot_prev = f["tpot_p99_ratio"], f["tpot_p99_ratio_prev"]
        e_w = _log_err(ttft, g.ttft_setpoint)
        e_w_prev = _log_err(ttft_prev, g.ttft_setpoint)
        e_c = _log_err(tpot, g.tpot_setpoint) - e_w
        e_c_prev = _log_err(tpot_prev, g.tpot_setpoint) - e_w_prev
        e_k = f["kv_utilization"] - g.kv_setpoint
        if f["preemptions"] > 0.5:
            e_k += g.preempt_push
        if f["ooms"] > 0.5:
            e_k -= g.oom_push
        e_k_prev = f["kv_utilization_prev"] - g.kv_setpoint
        return (e_w, e_w_prev), (e_c, e_c_prev), (e_k, e_k_prev)

    def decide(self, observation: np.ndarray) -> Knobs:
        f = fields_from_vector(observation)
        g = self.gains
        u = np.asarray(observation, dtype=np.float64)[-NUM_KNOBS:].copy()
        (e_w, e_w1), (e_c, e_c1), (e_k, e_k1) = self.errors(f)
        u[0] -= g.window_kp * (e_w - e_w1) + g.window_ki * e_w
        u[1] -= g.chunk_kp * (e_c - e_c1) + g.chunk_ki * e_c
        u[2] += g.kv_kp * (e_k - e_k1) + g.kv_ki * e_k
        return action_to_knobs(np.clip(u, -1.0, 1.0))
