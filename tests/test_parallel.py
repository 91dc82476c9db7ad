"""The executor for embarrassingly parallel jobs, on local processes (Ray: test_ray.py)."""

from __future__ import annotations

import sys

import pytest

from agents.controllers.best_static import _score
from agents.parallel import RAY_ADDRESS_ENV, JobRunner, import_ray, run_jobs
from env.traces import TraceFormatError
from tests.parallel_jobs import KNOB_SETTINGS, SCALES, grid_jobs, write_small_trace


def test_a_process_pool_gives_the_in_process_results_in_job_order(tmp_path):
    jobs = grid_jobs(write_small_trace(tmp_path))
    pooled = run_jobs(_score, jobs, workers=2, ray=False, progress=False)
    serial = run_jobs(_score, jobs, workers=1, ray=False, progress=False)
    assert pooled == serial
    assert [k for k, _ in pooled] == KNOB_SETTINGS
    assert all(len(att) == len(SCALES) for _, att in pooled)
    assert len({tuple(att) for _, att in pooled}) == len(KNOB_SETTINGS)  # jobs really differ


def test_a_failing_job_raises_its_own_error_in_the_caller(tmp_path):
    missing = str(tmp_path / "no-such-trace.csv")
    with JobRunner(2, ray=False, progress=False) as runner:
        with pytest.raises(FileNotFoundError, match="no-such-trace.csv"):
            runner.map(_score, [(missing, "all", (1.0,), KNOB_SETTINGS[0], None, None)])


def test_the_backend_follows_the_flag_then_RAY_ADDRESS(monkeypatch):
    monkeypatch.delenv(RAY_ADDRESS_ENV, raising=False)
    assert JobRunner(2).backend == "process"
    assert JobRunner(1).backend == "serial"
    assert JobRunner(2, ray=True).backend == "ray"
    monkeypatch.setenv(RAY_ADDRESS_ENV, "ray://head:10001")
    assert JobRunner(2).backend == "ray"
    assert JobRunner(2, ray=False).backend == "process"


def test_workers_below_one_are_refused():
    with pytest.raises(ValueError, match="workers must be at least 1, got 0"):
        JobRunner(0)


def test_without_ray_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"pip install 'batchpilot\[ray\]'"):
        import_ray()


def test_a_bad_trace_in_a_worker_reaches_the_caller_naming_its_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens\n0.5,100,20\n1.0,abc,20\n")
    job = (str(bad), "all", (1.0,), KNOB_SETTINGS[0], None, None)
    with pytest.raises(TraceFormatError, match="bad.csv, line 3, column prompt_tokens"):
        run_jobs(_score, [job], workers=2, ray=False, progress=False)
