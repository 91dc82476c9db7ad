"""The PID fallback against the static default on the held-out Azure code window (1328 requests
at 0.28x, where the static default is at its capacity at 99% attainment), under fcfs and under
shed at slack 0.5: it meets more requests than the static default. So did the rules before
2026-12-07 (the chunk back to static when calm and in every bad interval, a TPOT not measured
read as calm, the chunk grown while TTFT was calm), by fewer, and without their calm return
(the gains before that) they met fewer. Skipped where the trace is absent."""

from __future__ import annotations

import pytest

from agents.arena import summary_at
from agents.registry import EvalSpec, make_controller
from env.traces.locations import azure_trace_path, traces_dir
from runtime.decider.pid import PidController, PidGains
from runtime.engine.engine import EngineConfig

SCALE = 0.28


@pytest.mark.parametrize("admission,slack", [("fcfs", 1.0), ("shed", 0.5)])
def test_the_pid_meets_more_requests_than_static_where_drifting_while_calm_met_fewer(
        admission, slack):
    try:
        azure_trace_path("code")
    except FileNotFoundError:
        pytest.skip(f"Azure code trace not found in {traces_dir()}")
    config = EngineConfig(admission=admission, admission_slack=slack)
    spec = EvalSpec("azure-code", "eval", None, config=config)
    static = config.start_knobs(spec.static_knobs)
    before = dict(calm_static_chunk=True, unmeasured_tpot_holds_chunk=False,
                  bad_interval_chunk_by_tpot=False, calm_ttft_holds_growth=False)
    met = {}
    for name, controller in (("static", make_controller("static", spec)),
                             ("pid", PidController(static=static)),
                             ("before", PidController(PidGains(**before), static=static)),
                             ("drift", PidController(PidGains(calm_static=False, **before),
                                                     static=static))):
        s = summary_at(spec, controller, SCALE)
        assert s["requests"] == 1328
        met[name] = round(s["slo_attainment"] * s["requests"])
    assert met == {"static": 1314, "pid": 1328, "before": 1315, "drift": 1312}
