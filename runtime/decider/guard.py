"""The guarded decider: the ONNX policy when it can be trusted, the PID when it cannot, and
static knobs when not even the PID can read the observation.

Per decision, in order:

1. The observation must be a vector of ``OBS_DIM`` numbers, or the static knobs are used
   (``bad input shape``): without the current knobs there is nothing the PID could move.
2. A NaN or infinity anywhere sends the decision to the PID (``non-finite input``); the PID
   reads eight fields and decides when those and the knobs are finite, else the static knobs.
3. No loaded policy: the PID, with the reason the policy is missing (``model missing``,
   ``model corrupt``, ``spec mismatch``, ``bad model signature``).
4. The circuit breaker (:mod:`runtime.decider.breaker`) takes the interval's SLO attainment
   and may keep the policy out (``circuit open``).
4b. A policy that carries the distribution of its training observations
   (:mod:`runtime.decider.ood_guard`) is kept out while the live observation has left it
   (``out of distribution``): in the embedded runtime once at least ``patience`` of the last
   ``window`` intervals were out, until ``window`` in a row are back in; for a client's
   observation, whenever that observation is out.
4c. With a decision time limit (the embedded runtime of ``vllm serve``), a policy whose
   decisions were slow several times in a row is kept out for a while (``policy slow``; see
   :mod:`runtime.decider.slow_guard`).
5. The policy runs; an exception (``policy error``) or a NaN or infinite action
   (``non-finite output``) sends the decision to the PID. A policy of an older spec (three
   actions) decides the first three knobs; the others are the static knobs.
6. Whoever decided, the change is clamped, in action coordinates, to ``max_step`` per decision
   around the knobs the observation carries (the slew rate), and to [-1, 1] (the ranges); then
   :func:`runtime.knobs.action_to_knobs` maps the action to knobs. A policy that carries a
   lending guard (:mod:`runtime.decider.lend_guard`) has its KV ratio raised to the guard's
   floor, after the slew limit, while the observation's pool is fuller than the guard's
   threshold, or while a hold after lending preempted runs (the decision stays the policy's;
   ``lend_guard_hits`` counts them).

``decide`` never raises: any exception becomes a PID or static decision whose ``reason`` says
why, and the exception text is kept in ``last_error``.

State. The knobs depend only on the observation (the PID is in velocity form and the slew is
taken around the observation's knobs), so any replica answers any request. What persists in a
process is the loaded policy and the circuit breaker. Only the embedded serving runtime feeds the
breaker (``decide(observation)``, whose observation describes the interval that followed this
decider's previous decision); decisions for clients (``decide(observation, client=True)`` and
:meth:`GuardedDecider.decide_batch`, what the REST routes call) read the breaker's state but
never feed it, so no client can switch the policy off for the others (see the breaker's module).
Training should clamp the slew the same way (:func:`slew_limit`) so that the policy sees
in production what it saw in training.

Reload. The loaded policy and the reason for its absence are held in one tuple that a reload
replaces in a single assignment, after the new policy has been read, checked and warmed. A
decision reads that tuple once, so it runs wholly on the old policy or wholly on the new one; a
failed reload leaves the old one in place.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from runtime.decider.breaker import CircuitBreaker
from runtime.decider.decision import (
    BAD_INPUT_SHAPE,
    CIRCUIT_OPEN,
    MODEL_MISSING,
    NON_FINITE_INPUT,
    NON_FINITE_OUTPUT,
    OUT_OF_DISTRIBUTION,
    PID_FAILED,
    POLICY_ERROR,
    POLICY_SLOW,
    Decision,
    Source,
)
from runtime.decider.lend_guard import (
    CURRENT_RATIO_INDEX,
    PREEMPTED,
    PREEMPTIONS_INDEX,
    RATIO_INDEX,
    UTILIZATION_INDEX,
)
from runtime.decider.onnx_policy import DEFAULT_MAX_POLICY_BYTES, OnnxPolicy, PolicyLoadError
from runtime.decider.pid import PidController
from runtime.decider.slow_guard import SlowPolicyGuard
from runtime.decider.window import DecisionWindow
from runtime.knobs import (
    DEFAULT_KNOBS,
    NUM_KNOBS,
    Knobs,
    action_to_knobs,
    actions_to_columns,
    knobs_to_action,
)
from runtime.observation import OBS_DIM, OBSERVATION_FIELDS, OBSERVATION_INDEX, SPEC_VERSION

log = logging.getLogger(__name__)

DEFAULT_MAX_STEP = 0.5
"""The slew rate: the most a knob may move in one decision, in action units (the action range
[-1, 1] is 2 units wide). 0.5 lets the window move by at most 40^(1/4) = 2.5x, the chunk by
256^(1/4) = 4x and the KV ratio by 0.1375 per decision: a policy can cross a knob's whole range
in four decisions, but one bad answer cannot throw a knob from one end to the other."""

_SHAPE = (OBS_DIM,)
_ATTAINMENT = OBSERVATION_INDEX["slo_attainment"]
_att_field = OBSERVATION_FIELDS[_ATTAINMENT]
if _att_field.transform != "linear" or (_att_field.low, _att_field.high) != (0.0, 1.0):
    raise ImportError("the breaker reads slo_attainment straight from the vector, which needs "
                      f"a linear 0..1 transform; the spec has {_att_field}")


assert NUM_KNOBS == 5, "slew_limit_one is unrolled over the five knobs"


def slew_limit_one(action: Sequence[float], current: Sequence[float],
                   max_step: float) -> tuple[float, float, float, float, float]:
    """Clamp one action to ``current +- max_step`` and to [-1, 1] (action coordinates): the
    slew limit of every decision, and of every step of the training environment. Unrolled over
    the knobs, with conditional expressions rather than ``min(max(.))`` (20 clamps a decision
    at 0.03 us against 0.4): this is on the decider's hot path, where numpy's per-call cost
    would dominate. A NaN passes through as ``min(max(.))`` lets it (the mapping refuses it)."""
    a0, a1, a2, a3, a4 = action
    c0, c1, c2, c3, c4 = current
    m = max_step
    a0 = c0 - m if a0 < c0 - m else c0 + m if a0 > c0 + m else a0
    a1 = c1 - m if a1 < c1 - m else c1 + m if a1 > c1 + m else a1
    a2 = c2 - m if a2 < c2 - m else c2 + m if a2 > c2 + m else a2
    a3 = c3 - m if a3 < c3 - m else c3 + m if a3 > c3 + m else a3
    a4 = c4 - m if a4 < c4 - m else c4 + m if a4 > c4 + m else a4
    return (-1.0 if a0 < -1.0 else 1.0 if a0 > 1.0 else a0,
            -1.0 if a1 < -1.0 else 1.0 if a1 > 1.0 else a1,
            -1.0 if a2 < -1.0 else 1.0 if a2 > 1.0 else a2,
            -1.0 if a3 < -1.0 else 1.0 if a3 > 1.0 else a3,
            -1.0 if a4 < -1.0 else 1.0 if a4 > 1.0 else a4)


def slew_limit(action: np.ndarray, current: np.ndarray, max_step: float) -> np.ndarray:
    """:func:`slew_limit_one` row by row for ``[..., NUM_KNOBS]`` actions (the REST batch
    route)."""
    a = np.clip(action, current - max_step, current + max_step)
    return np.clip(a, -1.0, 1.0)


class BatchDecisions(NamedTuple):
    """A batch's decisions as arrays (:meth:`GuardedDecider.decide_batch_columns`)."""

    knobs: np.ndarray
    """``[n, NUM_KNOBS]`` float64, in :data:`runtime.knobs.KNOB_NAMES` order (the chunk's
    values are whole numbers)"""
    sources: list[Source]
    """who decided each row"""
    reasons: list[str | None]
    """why the policy did not, per row (None where it did)"""
    policy_version: str | None
    """the policy the whole batch ran on (None: none loaded)"""
    fallbacks: dict[int, Decision]
    """the rows the policy did not decide, by index, as their decisions"""
    tally: dict[tuple[Source, str | None], int]
    """the rows by (source, reason)"""

    def decisions(self) -> list[Decision]:
        """One :class:`Decision` a row."""
        trusted, version, fallbacks = Knobs._trusted, self.policy_version, self.fallbacks
        out = []
        for i, (w, c, r, b, a) in enumerate(self.knobs.tolist()):
            d = fallbacks.get(i)
            out.append(d if d is not None else
                       Decision(trusted(w, int(c), r, b, a), "policy", SPEC_VERSION, version,
                                None))
        return out


class GuardedDecider:
    """Decides knobs from observations with the guard described in the module docstring.

    :param policy: a loaded :class:`OnnxPolicy`, a path to load one from, or None (PID only)
    :param pid: the fallback controller (default gains when None)
    :param static_knobs: the last resort, when not even the PID can decide
    :param max_step: the slew rate in action units per decision (see :data:`DEFAULT_MAX_STEP`);
        2.0 or more leaves only the range clamp
    :param breaker: the circuit breaker (a default one when None; ``CircuitBreaker(trip_after=0)``
        disables it)
    :param max_policy_bytes: a policy file larger than this is refused before it is read
    :param ood_guard: run the out-of-distribution guard of a policy that carries one (False:
        the policy decides wherever it can, as before the guard; for measuring what it buys)
    :param decision_limit_s: time the policy's decisions in the embedded runtime and hand a
        policy slower than this to the PID (:mod:`runtime.decider.slow_guard`); None: no limit
        (replays and the arena, whose results must not depend on the machine's speed)
    """

    def __init__(self, policy: OnnxPolicy | str | Path | None = None, *,
                 pid: PidController | None = None, static_knobs: Knobs = DEFAULT_KNOBS,
                 max_step: float = DEFAULT_MAX_STEP, breaker: CircuitBreaker | None = None,
                 max_policy_bytes: int = DEFAULT_MAX_POLICY_BYTES,
                 ood_guard: bool = True, decision_limit_s: float | None = None) -> None:
        if not max_step > 0.0:
            raise ValueError(f"max_step must be > 0 action units per decision, got {max_step}")
        self.pid = pid if pid is not None else PidController()
        self.static_knobs = static_knobs
        self._static_action = knobs_to_action(static_knobs)
        self._static_row = np.asarray(self._static_action, dtype=np.float64)
        self.max_step = float(max_step)
        self.max_policy_bytes = max_policy_bytes
        self.ood_guard = ood_guard
        """whether a policy's out-of-distribution guard runs"""
        self.breaker = breaker if breaker is not None else CircuitBreaker()
        self.slow_guard = (SlowPolicyGuard(decision_limit_s) if decision_limit_s is not None
                           else None)
        """times the policy's embedded decisions (None: no decision time limit)"""
        self.recent = DecisionWindow()
        """decisions by source and fallback reason over the last minute"""
        self._reload_lock = threading.Lock()
        self.num_reloads = 0
        self.num_failed_reloads = 0
        self.last_error: str | None = None
        """the latest exception or refusal, with its details (for ``GET /v1/policy``)"""
        self.last_error_at: float | None = None
        self.lend_guard_hits = 0
        """policy decisions whose KV ratio the policy's lending guard raised"""
        # (policy, reason it is absent): replaced whole by a reload, read once per decision
        self._active: tuple[OnnxPolicy | None, str] = (None, MODEL_MISSING)
        if isinstance(policy, OnnxPolicy):
            self._active = (policy, MODEL_MISSING)
        elif policy is not None:
            try:
                self._active = (OnnxPolicy.load(policy, max_policy_bytes), MODEL_MISSING)
            except PolicyLoadError as e:
                self._active = (None, e.reason)
                self._note_error(str(e))
                log.warning("no policy, deciding with the PID: %s", e)

    # ------------------------------------------------------------------ policy
    @property
    def policy(self) -> OnnxPolicy | None:
        return self._active[0]

    @property
    def active(self) -> tuple[OnnxPolicy | None, str]:
        """(the policy, why it is absent), read as one: what a copy of this decider needs."""
        return self._active

    @property
    def missing_reason(self) -> str | None:
        """Why there is no policy (None when there is one)."""
        policy, reason = self._active
        return None if policy is not None else reason

    def reload(self, path: str | Path) -> OnnxPolicy:
        """Load the policy at ``path`` and, once it is checked and warmed, swap it in atomically
        and reset the circuit breaker. On failure raise :class:`PolicyLoadError` and keep the
        policy (or its absence) as it was."""
        with self._reload_lock:  # two reloads at once: one after the other, the last one wins
            try:
                policy = OnnxPolicy.load(path, self.max_policy_bytes)
            except PolicyLoadError as e:
                self.refuse_reload(str(e))
                raise
            self._active = (policy, MODEL_MISSING)
            self.breaker.reset()
            if self.slow_guard is not None:
                self.slow_guard.reset()
            self.num_reloads += 1
            return policy

    def refuse_reload(self, message: str) -> None:
        """Count a reload refused before or while its file was read (a name that leads out of
        the policy folder, a file refused by :meth:`reload`), with ``message`` as the last
        error: every refusal is counted and reported the same way."""
        self.num_failed_reloads += 1
        self._note_error(message)

    def refuse_start_policy(self, reason: str, message: str) -> None:
        """Record why the start-up policy was not even read (e.g. it leads out of the policy
        folder): the PID decides, with ``reason``."""
        self._active = (None, reason)
        self._note_error(message)

    def absorb_batch(self, tally: dict[tuple[Source, str | None], int], lend_guard_hits: int,
                     errors: Sequence[str]) -> None:
        """Count a batch that a copy of this decider answered (the batch worker process): its
        decisions in the last minute's window, its lending-guard hits, its errors."""
        for (source, reason), count in tally.items():
            self.recent.record(source, reason, count)
        self.lend_guard_hits += lend_guard_hits
        for message in errors:
            self._note_error(message)

    def _note_error(self, message: str) -> None:
        self.last_error = message
        self.last_error_at = time.time()

    # ------------------------------------------------------------------ deciding
    def decide(self, observation: np.ndarray, *, client: bool = False) -> Decision:
        """Knobs for the next interval from an observation vector (``runtime.observation``).

        :param client: the observation comes from a client (REST), not from the runtime this
            decider drives: the breaker's state is read but the reading does not feed it
        """
        try:
            d = self._decide(observation, not client)
        except Exception as e:  # the last line of defence: never raise into the serving loop
            self._note_error(f"decide: {type(e).__name__}: {e}")
            d = self._static(None, POLICY_ERROR, self._active[0])
        if not client:
            self.breaker.decided(d.source == "policy")
        self.recent.record(d.source, d.reason)
        return d

    def _decide(self, observation: np.ndarray, feed_breaker: bool) -> Decision:
        policy, missing = self._active
        if type(observation) is not np.ndarray:
            try:
                observation = np.asarray(observation, dtype=np.float64)
            except (TypeError, ValueError):  # ragged, or not numbers
                return self._static(None, BAD_INPUT_SHAPE, policy)
        if observation.shape != _SHAPE or observation.dtype.kind not in "fiu":
            return self._static(None, BAD_INPUT_SHAPE, policy)
        v = observation.tolist()
        s = sum(v)
        # NaN or an infinity somewhere (a float64 sum of 20 finite float32 values cannot overflow)
        if s - s != 0.0:
            return self._fallback(observation, v, NON_FINITE_INPUT, policy)
        if policy is None:
            return self._fallback(observation, v, missing, None)
        ood = policy.ood_guard if self.ood_guard else None
        # the embedded guard sees every interval, whoever then decides it
        in_range = ood is None or (ood.observe(v) if feed_breaker else ood.allows_client(v))
        breaker = self.breaker
        if not (breaker.allow_policy(v[_ATTAINMENT]) if feed_breaker else breaker.is_closed()):
            return self._fallback(observation, v, CIRCUIT_OPEN, policy)
        if not in_range:
            return self._fallback(observation, v, OUT_OF_DISTRIBUTION, policy)
        slow = self.slow_guard if feed_breaker else None
        if slow is not None and slow.skip():
            return self._fallback(observation, v, POLICY_SLOW, policy)
        try:
            if slow is None:
                a = policy.act(observation)
            else:
                t0 = time.perf_counter()
                a = policy.act(observation)
                slow.timed(time.perf_counter() - t0)
            if policy.num_actions != NUM_KNOBS:  # an older spec's: the other knobs are static
                a.extend(self._static_action[policy.num_actions:])
            if not math.isfinite(sum(a)):
                return self._fallback(observation, v, NON_FINITE_OUTPUT, policy)
            if policy.lend_guard is None:
                knobs = self._knobs(a, v)
            else:
                limited = slew_limit_one(a, v[-NUM_KNOBS:], self.max_step)
                latch = policy.lend_latch
                holding = (latch.observe(v) if feed_breaker and latch is not None
                           else policy.lend_guard.lent_and_preempted(v))
                floored = policy.lend_guard.floor(limited, v[UTILIZATION_INDEX], holding)
                if floored is not None:
                    self.lend_guard_hits += 1
                knobs = action_to_knobs(limited if floored is None else floored)
        except Exception as e:
            self._note_error(f"policy {policy.policy_version}: {type(e).__name__}: {e}")
            return self._fallback(observation, v, POLICY_ERROR, policy)
        return Decision(knobs, "policy", SPEC_VERSION, policy.policy_version, None)

    def _knobs(self, a: Sequence[float], v: list[float]) -> Knobs:
        """Slew-limit the action around the observation's knobs, clamp it to the ranges, map it."""
        return action_to_knobs(slew_limit_one(a, v[-NUM_KNOBS:], self.max_step))

    def _fallback(self, observation: np.ndarray, v: list[float], reason: str,
                  policy: OnnxPolicy | None) -> Decision:
        """The PID's decision, or the static one when the PID cannot decide."""
        version = policy.policy_version if policy is not None else None
        try:
            a = self.pid.action(observation)
            if math.isfinite(sum(a)):
                return Decision(self._knobs(a, v), "pid", SPEC_VERSION, version, reason)
        except Exception as e:
            self._note_error(f"pid: {type(e).__name__}: {e}")
        return self._static(v, reason, policy)

    def _static(self, v: list[float] | None, reason: str, policy: OnnxPolicy | None) -> Decision:
        """The static knobs, slew-limited around the observation's knobs when they are finite."""
        version = policy.policy_version if policy is not None else None
        if v is not None and math.isfinite(sum(v[-NUM_KNOBS:])):
            knobs = self._knobs(self._static_action, v)
        else:
            knobs = self.static_knobs
        return Decision(knobs, "static", SPEC_VERSION, version, reason + PID_FAILED)

    def decide_batch(self, observations: np.ndarray) -> list[Decision]:
        """Decisions for observations ``[n, OBS_DIM]``, in order, with the policy evaluated once on
        the stacked rows. Each row is guarded as :meth:`decide` guards a client's one (the rows
        come from clients: they read the breaker's state, never feed it). Raises ValueError for
        an array of another shape."""
        return self.decide_batch_columns(observations).decisions()

    def decide_batch_columns(self, observations: np.ndarray,
                             circuit_open: bool | None = None) -> BatchDecisions:
        """:meth:`decide_batch` as arrays: the knobs of every row in one array and who decided
        each, without a :class:`Decision` for the rows the policy decided (the REST batch route
        answers thousands of rows a request from these). ``circuit_open``: the state of the
        breaker of the decider this one copies (the batch worker process); None reads this
        decider's own."""
        x = np.asarray(observations, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != OBS_DIM:
            raise ValueError(f"a batch of observations has shape [n, {OBS_DIM}], got "
                             f"{list(x.shape)}")
        n = len(x)
        policy, missing = self._active
        version = policy.policy_version if policy is not None else None
        finite: np.ndarray = np.isfinite(x).all(axis=1)  # type: ignore[assignment]
        ok: np.ndarray = np.zeros(n, dtype=bool)  # rows with a finite, slew-limited policy action
        knobs = np.empty((n, NUM_KNOBS), dtype=np.float64)
        failed = False
        if policy is not None and n:
            try:
                raw = np.full((n, NUM_KNOBS), np.nan, dtype=np.float64)
                width = policy.num_actions
                if finite.all():
                    raw[:, :width] = policy.act_batch(x)
                elif finite.any():
                    raw[finite, :width] = policy.act_batch(x[finite])
                raw[:, width:] = self._static_row[width:]  # an older spec's: the rest static
                limited = slew_limit(raw, x[:, -NUM_KNOBS:].astype(np.float64), self.max_step)
                lend = policy.lend_guard
                if lend is not None:
                    # in float64, as one decision compares it (float32 against a Python
                    # float would compare in float32)
                    pressed = x[:, UTILIZATION_INDEX].astype(np.float64) > lend.kv_utilization
                    if lend.preemption_hold:  # each client row judged alone, as one decision
                        pressed |= ((x[:, PREEMPTIONS_INDEX].astype(np.float64) > PREEMPTED)
                                    & (x[:, CURRENT_RATIO_INDEX].astype(np.float64)
                                       < lend.ratio_action))
                    low = pressed & (limited[:, RATIO_INDEX] < lend.ratio_action)
                    limited[low, RATIO_INDEX] = lend.ratio_action
                    self.lend_guard_hits += int(low.sum())
                # numpy's stubs type all(axis=...) as a scalar or an array
                ok = np.isfinite(raw).all(axis=1)  # type: ignore[assignment]
                # map the good rows at once (the per-row mapping dominated a batch's time)
                if ok.all():
                    knobs[:] = np.stack(actions_to_columns(limited), axis=1)
                elif ok.any():
                    knobs[ok] = np.stack(actions_to_columns(limited[ok]), axis=1)
            except Exception as e:
                failed = True
                ok[:] = False
                self._note_error(f"policy {policy.policy_version}: {type(e).__name__}: {e}")
        ood = policy.ood_guard if policy is not None and self.ood_guard else None
        outside = np.zeros(n, dtype=bool)
        if ood is not None and n:
            outside = ood.distribution.outside_rows(np.where(np.isfinite(x), x, 0.0)) & finite
            ood.client_out += int(outside.sum())
            ok &= ~outside
        if circuit_open is None:
            circuit_open = not self.breaker.is_closed()
        if circuit_open:
            ok[:] = False
        sources: list[Source] = ["policy"] * n
        reasons: list[str | None] = [None] * n
        fallbacks: dict[int, Decision] = {}
        if not ok.all():
            for i in np.flatnonzero(~ok).tolist():
                try:
                    if not finite[i]:
                        d = self._fallback(x[i], x[i].tolist(), NON_FINITE_INPUT, policy)
                    elif policy is None:
                        d = self._fallback(x[i], x[i].tolist(), missing, None)
                    elif circuit_open:
                        d = self._fallback(x[i], x[i].tolist(), CIRCUIT_OPEN, policy)
                    elif failed:
                        d = self._fallback(x[i], x[i].tolist(), POLICY_ERROR, policy)
                    elif outside[i]:
                        d = self._fallback(x[i], x[i].tolist(), OUT_OF_DISTRIBUTION, policy)
                    else:
                        d = self._fallback(x[i], x[i].tolist(), NON_FINITE_OUTPUT, policy)
                except Exception as e:
                    self._note_error(f"decide_batch row {i}: {type(e).__name__}: {e}")
                    d = self._static(None, POLICY_ERROR, policy)
                fallbacks[i] = d
                knobs[i] = d.knobs.as_tuple()
                sources[i] = d.source
                reasons[i] = d.reason
        tally: dict[tuple[Source, str | None], int] = {}
        if not fallbacks:
            if n:
                tally[("policy", None)] = n
        else:
            for key in zip(sources, reasons):
                tally[key] = tally.get(key, 0) + 1
        for (source, reason), count in tally.items():
            self.recent.record(source, reason, count)
        return BatchDecisions(knobs, sources, reasons, version, fallbacks, tally)

    def describe(self) -> dict:
        """What ``GET /v1/policy`` shows: the policy (or why there is none), guard and breaker."""
        policy, reason = self._active
        return {
            "loaded": policy is not None,
            "policy": policy.describe() if policy is not None else None,
            "missing_reason": None if policy is not None else reason,
            "runtime_spec_version": SPEC_VERSION,
            "max_step": self.max_step,
            "static_knobs": self.static_knobs.as_dict(),
            "breaker": self.breaker.describe(),
            "recent": self.recent.summary(),
            "num_reloads": self.num_reloads,
            "num_failed_reloads": self.num_failed_reloads,
            "lend_guard_hits": self.lend_guard_hits,
            "lend_latch": (policy.lend_latch.describe()
                           if policy is not None and policy.lend_latch is not None else None),
            "slow_guard": self.slow_guard.describe() if self.slow_guard is not None else None,
            "ood_guard": (policy.ood_guard.describe()
                          if policy is not None and policy.ood_guard is not None
                          and self.ood_guard else None),
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
        }
