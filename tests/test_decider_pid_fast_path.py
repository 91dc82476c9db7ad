"""The PID fast path (``PidController.action``) against the original field-by-field computation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.decider.pid import (
    PidController,
    PidGains,
    _log_err,
    batch_share_step,
    keeps_chunk_when_bad,
)
from runtime.knobs import DEFAULT_KNOBS, NUM_KNOBS, action_to_knobs, knobs_to_action
from runtime.observation import OBS_DIM, OBSERVATION_NAMES, fields_from_vector, vector_from_fields


def reference_decide(pid: PidController, observation: np.ndarray):
    """The controller as first written: every field through ``fields_from_vector``."""
    f = fields_from_vector(observation)
    g = pid.gains
    u = np.asarray(observation, dtype=np.float64)[-NUM_KNOBS:].copy()
    (e_w, e_w1), (e_c, e_c1), (e_k, e_k1) = pid.errors(f)
    with np.errstate(invalid="ignore"):  # inf - inf on purpose: NaN must come out the same
        u[0] -= g.window_kp * (e_w - e_w1) + g.window_ki * e_w
        u[1] -= g.chunk_kp * (e_c - e_c1) + g.chunk_ki * e_c
        u[2] += g.kv_kp * (e_k - e_k1) + g.kv_ki * e_k
        u[3] += batch_share_step(e_w, e_w1, f["slo_attainment"], g)
    s = np.asarray(knobs_to_action(pid.static))
    u[4] = s[4]
    e_t, e_t1 = (_log_err(f[n], g.tpot_setpoint) for n in ("tpot_p99_ratio", "tpot_p99_ratio_prev"))
    if g.calm_static and max(e_w, e_t, e_w1, e_t1) < 0.0:
        u[0] = s[0]
        if g.calm_static_chunk:
            u[1] = s[1]
    if f["slo_attainment"] < g.bad_attainment:
        u[[0, 2]] = s[[0, 2]]
        if f["ooms"] > 0.5 or not keeps_chunk_when_bad(f["tpot_p99_ratio"], g):
            u[1] = s[1]
    elif f["ooms"] > 0.5:
        u[1:3] = s[1:3]
    low = s - [g.window_box, g.chunk_box, g.kv_box_down, g.share_box, 0.0]
    high = s + [g.window_box, g.chunk_box, g.kv_box_up, 0.0, 0.0]
    u = np.where(np.isnan(u), u, np.minimum(np.maximum(u, low), high))
    return action_to_knobs(np.clip(u, -1.0, 1.0))


def outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except ValueError as e:
        return ("error", str(e))


vector_entries = st.one_of(
    st.floats(-1.0, 1.0, width=32),
    st.floats(-3.0, 3.0, width=32),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, 1.0, -1.0]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(vector_entries, min_size=OBS_DIM, max_size=OBS_DIM),
       st.sampled_from([PidGains(),
                        PidGains(window_kp=0.7, chunk_ki=0.3, kv_kp=2.0, oom_push=0.1,
                                 window_box=2.0, chunk_box=2.0, kv_box_down=0.3,
                                 kv_box_up=2.0, calm_static=False),
                        PidGains(calm_static_chunk=True, unmeasured_tpot_holds_chunk=False,
                                 bad_interval_chunk_by_tpot=False, calm_ttft_holds_growth=False),
                        PidGains(bad_interval_chunk_by_tpot=False)]))
def test_fast_path_matches_the_field_by_field_computation(values, gains):
    pid = PidController(gains)
    obs = np.asarray(values, dtype=np.float32)
    assert outcome(lambda o: pid.decide(o).knobs, obs) == outcome(reference_decide, pid, obs)


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries({n: st.floats(0, 50) for n in OBSERVATION_NAMES[:-NUM_KNOBS]}),
       st.lists(st.floats(-1, 1), min_size=NUM_KNOBS, max_size=NUM_KNOBS))
def test_fast_path_matches_on_observations_built_from_fields(raw, action):
    raw = dict(raw, arrival_rate_change_rps=raw["arrival_rate_change_rps"] - 25.0,
               kv_utilization=raw["kv_utilization"] / 50,
               kv_fragmentation=raw["kv_fragmentation"] / 50,
               slo_attainment=raw["slo_attainment"] / 50,
               kv_utilization_prev=raw["kv_utilization_prev"] / 50,
               batch_deadline_margin=raw["batch_deadline_margin"] / 50,
               cotenant_demand_fraction=raw["cotenant_demand_fraction"] / 50)
    raw.update(action_to_knobs(action).as_dict())
    obs = vector_from_fields(raw)
    pid = PidController()
    assert pid.decide(obs).knobs == reference_decide(pid, obs)


def test_fast_path_refuses_a_wrong_shape_as_before():
    with pytest.raises(ValueError, match=rf"an observation has shape \({OBS_DIM},\), got "
                                         rf"\(1, {OBS_DIM}\)"):
        PidController().decide(np.zeros((1, OBS_DIM), dtype=np.float32))


def test_fast_path_names_a_non_finite_knob():
    obs = vector_from_fields({n: 0.0 for n in OBSERVATION_NAMES[:-NUM_KNOBS]}
                             | DEFAULT_KNOBS.as_dict())
    obs[-NUM_KNOBS + 1] = np.inf
    with pytest.raises(ValueError, match="prefill_chunk_tokens is not finite: inf"):
        PidController().action(obs)


@pytest.mark.parametrize("gains", [PidGains(), PidGains(bad_interval_chunk_by_tpot=False),
                                   PidGains(unmeasured_tpot_holds_chunk=False),
                                   PidGains(calm_ttft_holds_growth=False)])
@pytest.mark.parametrize("ttft,ttft_prev", [(0.4, 0.5), (1.2, 0.4), (0.4, 1.2)])
@pytest.mark.parametrize("tpot,tpot_prev", [(0.0, 0.0), (0.0, 2.0), (1.4, 0.0), (0.2, 0.0),
                                            (1.4, 0.9)])
@pytest.mark.parametrize("attainment,ooms,running", [(1.0, 0.0, 1.0), (0.2, 0.0, 1.0),
                                                     (0.2, 1.0, 1.0), (1.0, 0.0, 0.0)])
def test_fast_path_matches_where_the_chunk_holds(gains, ttft, ttft_prev, tpot, tpot_prev,
                                                attainment, ooms, running):
    # the random vectors above rarely put a ratio at exactly 0 with the chunk inside its box,
    # where the holds and the bad interval's chunk rule show
    fields = {n: 0.0 for n in OBSERVATION_NAMES[:-NUM_KNOBS]} | dict(
        ttft_p99_ratio=ttft, ttft_p99_ratio_prev=ttft_prev, tpot_p99_ratio=tpot,
        tpot_p99_ratio_prev=tpot_prev, slo_attainment=attainment, ooms=ooms,
        running_requests=running)
    obs = vector_from_fields(fields | {**DEFAULT_KNOBS.as_dict(), "prefill_chunk_tokens": 1536})
    pid = PidController(gains)
    assert pid.decide(obs).knobs == reference_decide(pid, obs)
