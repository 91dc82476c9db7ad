"""A PID controller in velocity form over the knobs: the decider's fallback.

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
  The chunk moves only on evidence. An interval that finished no request measured no TPOT (its
  ratio reads 0, ``unmeasured_tpot_holds_chunk``), and one that asks for a larger chunk while
  TTFT is under its set point asks for what nothing needs (``calm_ttft_holds_growth``: the chunk
  grows for TTFT, and a calm TPOT next to a calmer TTFT is no call for faster prefill): the chunk
  does not move there, and the next interval with evidence moves it from a zero error. Wherever
  one or two requests run at a time most intervals finish nothing: read as calm TPOT (the rule
  until 2026-12-07), a chunk halved after a TPOT miss grew back within an interval or two; read
  as a zero error in the velocity form (the first hold, 2026-12-07), the next unmeasured interval
  took back the proportional step the miss had made; and each request that then finished calm
  grew it again. With the bad interval's chunk rule below, the PID's capacity on the held-out
  Azure code window under shed at slack 0.5 is 0.576x at 99% and 1.01x at 90% (0.285x / 0.545x
  under the rules before 2026-12-07, 0.495x / 0.878x under the first hold; the static default
  0.279x / 0.511x), on Mooncake's long-context trace at 90% 0.093x (0.052x, 0.065x; static
  0.052x) (docs/results.md, "Traffic none of the policies saw").
- KV ratio <- KV pressure: ``e = kv_utilization - kv_setpoint``, plus one unit per interval with
  preemptions (more KV needed) and minus ``oom_push`` when an OOM happened (activations need room).
  The sign is inverted: pressure raises the ratio.
- batch share <- interactive TTFT: the window's error, ``du = -(Kp * (e_k - e_{k-1}) + Ki * e_k)``
  (:func:`batch_share_step`): interactive TTFT above its set point closes the batch tap, calm
  opens it; interval SLO attainment under ``share_attainment`` closes it by at least
  ``share_close_step``. The move is slew-limited asymmetrically: it closes fast (at most
  ``share_close_step`` a decision) and opens slowly (at most ``share_open_step``), and never
  opens past the static share (the static default lets batch work take everything).
- admission slack: held at the static knob (no measured rule beats a fixed slack; see
  ``agents/controllers/best_static.py`` for the search that picks it).

Safety. The PID is the fallback, so it must never do much worse than leaving the knobs alone: on
the Mooncake trace the unguarded loops drove the KV ratio down and the chunk up and attained 19.8
points less than the static default at 1.25x load (5.9 points less on the Azure conversation trace
at 2x). Four guards bound it around the static knobs (``static``, the decider's last resort):

- bounded authority: each knob stays within its ``*_box`` (action units) of the static knob. The
  KV ratio's box is empty by default: measured on the arena (static against PID, rate scales
  0.5 to 8, on the synthetic, Azure conversation and code, and Mooncake traces), lowering the
  ratio cost preemptions and raising it cost OOMs, 1.5 to 2.8 points at 1.5-2x load either way,
  while the window and chunk loops alone never lost more than 0.1 point and gained up to 6.6
  on the Azure code trace. The KV loop still runs, for a deployment that widens its box;
- an OOM guard: an interval with an OOM puts the chunk and the KV ratio back to the static
  knobs (under which the activation workspace was sized), whatever the loops say;
- a return to static when calm: after two intervals with p99 TTFT and TPOT both under their
  set points there is nothing for the window loop to answer, so the window goes back to the
  static knob. Left to drift while calm, the window lengthened and (under the rules of then) the
  chunk shrank, which delayed the first token of the next long prompt: on the held-out Azure
  code window the PID's capacity at 99% attainment was 0.247x against the static default's
  0.279x, under fcfs and under shed at slack 0.5 alike (``scripts/experiments/pid_vs_static.py``);
  with this guard it was 0.285x. The chunk went back with the window until 2026-12-07
  (``calm_static_chunk``); it no longer does, since the held chunk above is what pays: with both
  changes the PID's capacity at 99% and at 90% is at or above the static default's on every
  trace measured (held-out Azure code, conversation and mixed windows, the long-prompt
  conversation trace, the decode-heavy and flash-crowd families, Mooncake; shed at slack 0.5
  with the co-tenant), though on Azure conversation at 90% it is one bisection step under the
  earlier rules (x2.40, the static default's, against x2.43);
- a return to static on bad signals: when interval SLO attainment falls below
  ``bad_attainment``, the loops are not holding the SLO, so the window and the KV ratio go back
  to static, and the chunk too where the interval's TPOT was met; an interval that measured no
  TPOT holds the chunk and one whose TPOT missed its SLO leaves it to its loop
  (``bad_interval_chunk_by_tpot``): a bad interval is no evidence against a smaller chunk unless
  TPOT was met. Where one request finishes an interval, the interval that measures a TPOT miss is
  the interval whose attainment is 0: putting the chunk back to static there undid every halving
  the miss called for (Mooncake at 90%: 0.074x without this, 0.093x with it). The batch share
  keeps closing (pressure is what its loop answers; closing the tap gives the accelerator back to
  the interactive requests the attainment counts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from runtime.decider.decision import Decision, decided_by
from runtime.knobs import DEFAULT_KNOBS, NUM_KNOBS, Knobs, action_to_knobs, knobs_to_action
from runtime.observation import OBS_DIM, OBSERVATION_FIELDS, OBSERVATION_INDEX

_I = OBSERVATION_INDEX


def _inverse(name: str, transform: str) -> tuple[int, float, float]:
    """(index, a, b) to undo one field's transform exactly as ``fields_from_vector`` does:
    ``expm1(v * a)`` for a log field, ``a + v * b`` for a linear one. Raises if the spec gives the
    field another transform than the fast path below was written for."""
    f = OBSERVATION_FIELDS[_I[name]]
    if f.transform != transform:
        raise ValueError(f"the PID fast path reads {name!r} as a {transform} field, but the "
                         f"observation spec makes it {f.transform}")
    if transform == "log":
        return _I[name], math.log1p(f.high), 0.0
    return _I[name], f.low, f.high - f.low


# The fields the errors read, with the constants of their inverse transforms, computed once.
_TTFT, _TTFT_PREV, _TPOT, _TPOT_PREV, _PREEMPT, _OOM = (
    _inverse(n, "log") for n in ("ttft_p99_ratio", "ttft_p99_ratio_prev", "tpot_p99_ratio",
                                 "tpot_p99_ratio_prev", "preemptions", "ooms"))
_KV, _KV_PREV, _ATT = (_inverse(n, "linear")
                       for n in ("kv_utilization", "kv_utilization_prev", "slo_attainment"))


@dataclass(frozen=True)
class PidGains:
    """Gains and set points, tuned by ``batchpilot tune-pid`` (random search, 40 candidates,
    on 600-s training windows of the synthetic, Azure conversation and Azure code traces near
    where the static default starts to miss; rounded to two figures). Mean SLO attainment over
    those windows: 84.7% with these gains, 81.9% for the static default, 78.0% for the
    hand-set gains they replaced (window 0.1/0.05, chunk 0.1/0.05, KV 0.5/0.2, set points
    0.5/0.7/0.85, pushes 0.3/1.0). The search found a slow chunk loop and a fast KV-ratio
    integrator best: the ratio follows KV pressure within seconds, the chunk drifts.
    Re-measured on 2026-12-08 (``batchpilot tune-pid --candidates 1``, the engine changed since):
    85.85% under the chunk rules of that day (held where TPOT went unmeasured, grown only where
    TTFT is over its set point, kept through a bad interval unless TPOT was met), at or above the
    static default on every window; 84.55% under the first hold of 2026-12-07 (azure-conv x1.75
    68.6% against the static default's 68.7%), 82.34% under the rules before it, 81.94% for the
    static default."""

    window_kp: float = 0.25
    window_ki: float = 0.01
    chunk_kp: float = 0.06
    chunk_ki: float = 0.005
    kv_kp: float = 0.08
    kv_ki: float = 0.34
    ttft_setpoint: float = 0.6
    """target p99 TTFT as a share of the TTFT SLO"""
    tpot_setpoint: float = 0.68
    """target p99 TPOT as a share of the TPOT SLO"""
    kv_setpoint: float = 0.68
    """KV utilisation the ratio loop aims for"""
    preempt_push: float = 0.28
    """extra KV error per interval with preemptions"""
    oom_push: float = 0.32
    """KV error subtracted per interval with an OOM"""
    window_box: float = 1.0
    """how far (action units) the window may move from the static knob"""
    chunk_box: float = 0.25
    """how far (action units) the chunk may move from the static knob (0.25: a factor 2)"""
    kv_box_down: float = 0.0
    """how far (action units) the KV ratio may fall below the static knob"""
    kv_box_up: float = 0.0
    """how far (action units) the KV ratio may rise above the static knob"""
    bad_attainment: float = 0.5
    """interval SLO attainment below which every knob goes back to static"""
    share_kp: float = 0.5
    """proportional gain of the batch share loop (on the interactive TTFT error)"""
    share_ki: float = 0.1
    """integral gain of the batch share loop"""
    share_attainment: float = 0.95
    """interval SLO attainment below which the batch tap closes by at least
    ``share_close_step``"""
    share_close_step: float = 0.5
    """the most the batch share may fall in one decision (action units: 0.5 = a quarter of the
    share's range)"""
    share_open_step: float = 0.1
    """the most the batch share may rise in one decision (action units: 0.1 = 5% of the
    range)"""
    share_box: float = 2.0
    """how far (action units) the batch share may fall below the static knob (2: to 0)"""
    calm_static: bool = True
    """after two intervals with p99 TTFT and TPOT both under their set points, the window goes
    back to the static knob (False: it keeps drifting while calm)"""
    calm_static_chunk: bool = False
    """the chunk goes back to the static knob with the window after two calm intervals (the
    rule until 2026-12-07; False: the chunk stays where its loop put it, within its box)"""
    unmeasured_tpot_holds_chunk: bool = True
    """an interval that finished no request measured no TPOT (its ratio reads 0): the chunk does
    not move there, and the next interval's move starts from a zero error (False: the ratio of 0
    reads as calm, the rule until 2026-12-07; the first hold of that day read it as a zero error,
    from which the velocity form took the last step back)"""
    calm_ttft_holds_growth: bool = True
    """the chunk grows only where TTFT is over its set point: an interval whose chunk error asks
    for a larger chunk (TPOT calmer than TTFT) while TTFT is under its set point leaves the chunk
    where it is, and the next interval moves it from a zero error (False: the loop balances the
    two ratios while TTFT is calm, the rule until 2026-12-08)"""
    bad_interval_chunk_by_tpot: bool = True
    """under ``bad_attainment`` the chunk goes back to static only where the interval's TPOT was
    measured and met (ratio <= 1); one that measured none holds it, one whose TPOT missed leaves
    it to its loop (False: every bad interval puts it back, the rule until 2026-12-08)"""


def _log_err(ratio: float, setpoint: float) -> float:
    return max(-3.0, min(3.0, math.log2(max(ratio, 1e-3) / setpoint)))


def _chunk_evidence(tpot: float, e: float, e_w: float, g: PidGains) -> bool:
    """Whether an interval with TPOT ratio ``tpot``, chunk error ``e`` and window error ``e_w``
    says anything to the chunk loop: not where its TPOT went unmeasured (a ratio of exactly 0,
    under ``unmeasured_tpot_holds_chunk``), nor where the error calls for a larger chunk while
    TTFT is under its set point (``calm_ttft_holds_growth``)."""
    if g.unmeasured_tpot_holds_chunk and tpot == 0.0:
        return False
    return not (g.calm_ttft_holds_growth and e < 0.0 and e_w < 0.0)


def _chunk_errors(tpot: float, tpot_prev: float, e_w: float, e_w_prev: float,
                  g: PidGains) -> tuple[float, float]:
    """The chunk loop's errors now and an interval ago from the TPOT ratios and the window's
    errors. An interval without evidence (:func:`_chunk_evidence`) counts as a zero error: both
    are 0 when it is now (so the chunk does not move), the earlier one when it is the last
    interval (the move starts from a zero error)."""
    e = _log_err(tpot, g.tpot_setpoint) - e_w
    e_prev = _log_err(tpot_prev, g.tpot_setpoint) - e_w_prev
    if not _chunk_evidence(tpot, e, e_w, g):
        return 0.0, 0.0
    if not _chunk_evidence(tpot_prev, e_prev, e_w_prev, g):
        return e, 0.0
    return e, e_prev


def keeps_chunk_when_bad(tpot: float, g: PidGains) -> bool:
    """Whether an interval under ``bad_attainment`` with this TPOT ratio leaves the chunk where
    its loop put it (not measured, or missed) instead of putting it back to static."""
    return g.bad_interval_chunk_by_tpot and (tpot == 0.0 or tpot > 1.0)


def share_error(ttft_p99_ratio: float, g: PidGains) -> float:
    """The batch share loop's error for an interval's TTFT p99 ratio (the window loop's)."""
    return _log_err(ttft_p99_ratio, g.ttft_setpoint)


def batch_share_step(e: float, e_prev: float, attainment: float, g: PidGains) -> float:
    """The batch share's move this decision, in action units, from the interactive TTFT error
    (``log2(ttft_p99_ratio / ttft_setpoint)``, clipped to +-3) now and an interval ago and the
    interval's SLO attainment: velocity-form PI, at least ``share_close_step`` closed under
    ``share_attainment``, slew-limited to ``[-share_close_step, share_open_step]``. The PID,
    AIMD and the heuristic all move the share with it."""
    du = -(g.share_kp * (e - e_prev) + g.share_ki * e)
    if attainment < g.share_attainment:
        du = min(du, -g.share_close_step)
    return min(max(du, -g.share_close_step), g.share_open_step)


class PidController:
    """:param gains: gains, set points and guards
    :param static: the knobs the guards bound the loops around and return to
    """

    name = "pid"

    def __init__(self, gains: PidGains | None = None, static: Knobs = DEFAULT_KNOBS) -> None:
        self.gains = gains if gains is not None else PidGains()
        self.static = static
        self._static_action = knobs_to_action(static)

    def reset(self) -> None:
        pass  # stateless: everything it needs is in the observation

    def errors(self, f: dict[str, float]) -> tuple[tuple[float, float], ...]:
        """((e_k, e_{k-1}) for window, chunk, kv) from named observation fields (the batch
        share's loop reads the window's)."""
        g = self.gains
        ttft, ttft_prev = f["ttft_p99_ratio"], f["ttft_p99_ratio_prev"]
        tpot, tpot_prev = f["tpot_p99_ratio"], f["tpot_p99_ratio_prev"]
        e_w = _log_err(ttft, g.ttft_setpoint)
        e_w_prev = _log_err(ttft_prev, g.ttft_setpoint)
        e_c, e_c_prev = _chunk_errors(tpot, tpot_prev, e_w, e_w_prev, g)
        e_k = f["kv_utilization"] - g.kv_setpoint
        if f["preemptions"] > 0.5:
            e_k += g.preempt_push
        if f["ooms"] > 0.5:
            e_k -= g.oom_push
        e_k_prev = f["kv_utilization_prev"] - g.kv_setpoint
        return (e_w, e_w_prev), (e_c, e_c_prev), (e_k, e_k_prev)

    def decide(self, observation: np.ndarray) -> Decision:
        return decided_by(action_to_knobs(self.action(observation)), self.name)

    def action(self, observation: np.ndarray) -> tuple[float, float, float, float, float]:
        """The next knobs in action coordinates, clipped to [-1, 1] (what :meth:`decide` maps
        to knobs).

        This is the decider's fallback hot path, so it reads the eight fields the errors need
        straight from the vector instead of building every field with ``fields_from_vector``
        (that took ~60 us a decision on the 2-core project machine, more than the policy). It
        computes the same float64 expressions in the same order, so its result is identical to
        ``errors(fields_from_vector(observation))``, non-finite inputs included (the tests
        compare the two).
        """
        if type(observation) is not np.ndarray:
            observation = np.asarray(observation, dtype=np.float64)
        if observation.shape != (OBS_DIM,):
            raise ValueError(f"an observation has shape ({OBS_DIM},), got {observation.shape}")
        v = observation.tolist()
        u0, u1, u2, u3, u4 = v[-NUM_KNOBS:]
        if not math.isfinite(u0 + u1 + u2 + u3 + u4):
            # fields_from_vector refuses non-finite knobs (with the knob named): do the same
            action_to_knobs((u0, u1, u2, u3, u4))
        g = self.gains
        ttft = math.expm1(v[_TTFT[0]] * _TTFT[1])
        ttft_prev = math.expm1(v[_TTFT_PREV[0]] * _TTFT_PREV[1])
        e_w = _log_err(ttft, g.ttft_setpoint)
        e_w1 = _log_err(ttft_prev, g.ttft_setpoint)
        tpot = math.expm1(v[_TPOT[0]] * _TPOT[1])
        tpot1 = math.expm1(v[_TPOT_PREV[0]] * _TPOT_PREV[1])
        e_t = _log_err(tpot, g.tpot_setpoint)
        e_t1 = _log_err(tpot1, g.tpot_setpoint)
        e_c = e_t - e_w
        e_c1 = e_t1 - e_w1
        # an interval without evidence for the chunk (_chunk_evidence) counts as a zero error:
        # a TPOT not measured (its ratio reads 0), or growth asked for while TTFT is calm
        hold0, calm = g.unmeasured_tpot_holds_chunk, g.calm_ttft_holds_growth
        if (hold0 and tpot == 0.0) or (calm and e_c < 0.0 and e_w < 0.0):
            e_c = e_c1 = 0.0
        elif (hold0 and tpot1 == 0.0) or (calm and e_c1 < 0.0 and e_w1 < 0.0):
            e_c1 = 0.0
        oom = math.expm1(v[_OOM[0]] * _OOM[1]) > 0.5
        e_k = (_KV[1] + v[_KV[0]] * _KV[2]) - g.kv_setpoint
        if math.expm1(v[_PREEMPT[0]] * _PREEMPT[1]) > 0.5:
            e_k += g.preempt_push
        if oom:
            e_k -= g.oom_push
        e_k1 = (_KV_PREV[1] + v[_KV_PREV[0]] * _KV_PREV[2]) - g.kv_setpoint
        u0 -= g.window_kp * (e_w - e_w1) + g.window_ki * e_w
        u1 -= g.chunk_kp * (e_c - e_c1) + g.chunk_ki * e_c
        u2 += g.kv_kp * (e_k - e_k1) + g.kv_ki * e_k
        attainment = _ATT[1] + v[_ATT[0]] * _ATT[2]
        u3 += batch_share_step(e_w, e_w1, attainment, g)
        s0, s1, s2, s3, s4 = self._static_action
        u4 = s4  # the admission slack stays static
        if g.calm_static and e_w < 0.0 and e_t < 0.0 and e_w1 < 0.0 and e_t1 < 0.0:
            u0 = s0  # two calm intervals: nothing for the window to answer
            if g.calm_static_chunk:
                u1 = s1
        if attainment < g.bad_attainment:
            u0, u2 = s0, s2  # the loops are not holding the SLO: back to static
            if oom or not keeps_chunk_when_bad(tpot, g):
                u1 = s1  # the chunk too, unless its TPOT says it should not be larger
        elif oom:
            u1, u2 = s1, s2  # activations did not fit: back to the validated chunk and ratio
        # bounded authority, then the ranges. Conditional clamps (0.03 us against 0.4 for
        # min(max(.))) that keep NaN as np.clip does, so action_to_knobs refuses it the same way
        lo, hi = s0 - g.window_box, s0 + g.window_box
        u0 = lo if u0 < lo else hi if u0 > hi else u0
        lo, hi = s1 - g.chunk_box, s1 + g.chunk_box
        u1 = lo if u1 < lo else hi if u1 > hi else u1
        lo, hi = s2 - g.kv_box_down, s2 + g.kv_box_up
        u2 = lo if u2 < lo else hi if u2 > hi else u2
        lo = s3 - g.share_box
        u3 = lo if u3 < lo else s3 if u3 > s3 else u3
        return (-1.0 if u0 < -1.0 else 1.0 if u0 > 1.0 else u0,
                -1.0 if u1 < -1.0 else 1.0 if u1 > 1.0 else u1,
                -1.0 if u2 < -1.0 else 1.0 if u2 > 1.0 else u2,
                -1.0 if u3 < -1.0 else 1.0 if u3 > 1.0 else u3,
                -1.0 if u4 < -1.0 else 1.0 if u4 > 1.0 else u4)
