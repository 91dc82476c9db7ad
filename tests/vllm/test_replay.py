"""vLLM under the interval loop: a replayed window of a real trace conserves every request, a
faulty controller leaves vLLM serving on the static knobs, and the Gymnasium environment runs on
vLLM. Modules of env/ are imported inside the tests: this venv has no training stack, and the
suite's collection rule skips files that import it at their top."""

from __future__ import annotations

import time

import numpy as np
import pytest

from runtime.decider.failsafe import CONTROLLER_FAULT, FailSafe
from runtime.decider.pid import PidController
from runtime.engine.config import EngineConfig
from runtime.engine.slo import SloTarget
from runtime.knobs import DEFAULT_KNOBS
from runtime.session import run_engine
from runtime.vllm.engine import VllmPacer

SLO = {"interactive": SloTarget(2.0, 0.5), "batch": SloTarget(3600.0, 1.0, 3600.0)}


def window(seconds: float = 4.0, scale: float = 0.5):
    """The first seconds of azure-conv's held-out split, as real requests, at a load the tiny
    model on a shared CPU takes, with every tenth request of the batch class."""
    from env.traces import rate_scale, split, time_window
    from env.traces.resolve import resolve_trace

    w = time_window(rate_scale(split(resolve_trace("azure-conv"), "eval"), scale), 0, seconds)
    classes = ["batch" if i % 10 == 9 else "interactive" for i in range(len(w))]
    return w, classes


def test_a_replayed_trace_window_conserves_every_request(vllm_server):
    w, classes = window()
    eng = vllm_server.engine(EngineConfig(slo_classes=dict(SLO)), DEFAULT_KNOBS)
    eng.add_requests(w.arrival_s, w.prompt_tokens, w.output_tokens, classes)
    res = run_engine(eng, VllmPacer(), FailSafe(PidController()), interval_s=0.25)
    s = res.summary
    assert s.requests == len(w) > 5
    assert s.finished + s.rejected + s.rejected_by_reason.get("aborted", 0) == s.requests
    counts = eng.check_conservation()
    assert sum(row["requests"] for row in counts.values()) == len(w)
    assert all(row["in_flight"] == 0 for row in counts.values())
    assert counts["batch"]["requests"] == classes.count("batch")
    assert res.decisions > 0 and res.realtime
    assert res.sources == {"pid": res.decisions}
    # the intervals are the simulator's records: the observation is built from them
    assert sum(r.stats.arrivals for r in res.intervals) == len(w)
    assert sum(r.stats.finished for r in res.intervals) == s.finished
    assert not eng.llm_engine.has_unfinished_requests()


class Broken:
    """A controller that raises, then answers garbage, then knobs out of range, in turn."""

    name = "broken"

    def __init__(self) -> None:
        self.calls = 0

    def decide(self, observation):
        self.calls += 1
        kind = self.calls % 3
        if kind == 0:
            raise RuntimeError("the controller fell over")
        if kind == 1:
            return {"knobs": "garbage"}
        d = PidController().decide(observation)
        object.__setattr__(d.knobs, "kv_cache_ratio", float("nan"))  # past the constructor
        return d

    def reset(self) -> None:
        pass


def test_a_faulty_controller_leaves_vllm_serving_on_the_static_knobs(vllm_server):
    w, classes = window(3.0)
    eng = vllm_server.engine(EngineConfig(slo_classes=dict(SLO)), DEFAULT_KNOBS)
    eng.add_requests(w.arrival_s, w.prompt_tokens, w.output_tokens, classes)
    safe = FailSafe(Broken())
    res = run_engine(eng, VllmPacer(), safe, interval_s=0.25)
    assert res.summary.finished + res.summary.rejected == len(w)
    assert res.sources == {"static": res.decisions}
    assert all(r.knobs == DEFAULT_KNOBS and r.reason == CONTROLLER_FAULT for r in res.intervals)
    assert set(safe.faults) == {"RuntimeError", "not a Decision", "knobs out of range"}
    assert eng.knobs == DEFAULT_KNOBS


def test_the_environment_runs_on_vllm(vllm_server):
    import gymnasium
    from gymnasium.utils.env_checker import check_env

    import env  # noqa: F401 - registers batchpilot/Serving-v0

    e = gymnasium.make("batchpilot/Serving-v0", trace="azure-conv", split="eval",
                       executor="vllm", vllm_server=vllm_server, episode_s=4.0,
                       rate_scale_range=(0.5, 0.5)).unwrapped
    check_env(e, skip_render_check=True)
    obs, info = e.reset(seed=3)
    steps, truncated, total = 0, False, 0.0
    while not truncated:
        obs, reward, terminated, truncated, info = e.step(e.action_space.sample())
        assert e.observation_space.contains(obs) and np.isfinite(reward) and not terminated
        total += reward
        steps += 1
    assert steps >= 2  # until the window's last arrival, in 0.25-s intervals of wall clock
    summary = info["episode_summary"]
    assert summary["requests"] == summary["finished"] + summary["rejected"] + \
        summary["rejected_by_reason"].get("aborted", 0)
    e.close()


def test_leftovers_vllm_never_lets_go_of_are_reported_in_bounded_time(vllm_server, monkeypatch):
    import runtime.vllm.engine as vllm_engine

    monkeypatch.setattr(vllm_engine, "ABORT_DRAIN_S", 0.5)
    monkeypatch.setattr(vllm_server.llm_engine, "has_unfinished_requests", lambda: True)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="start a new VllmServer"):
        vllm_server.abort_leftovers()
    assert time.monotonic() - t0 < 30.0
