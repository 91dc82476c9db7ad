"""The vLLM adapter's parts that need no vLLM: the version pin, the import boundary (vLLM only in
its adapter, and only where it is used), the ledger that accounts for vLLM's requests with the
engine's own outcome code, and the fail-safe that keeps a faulty controller from stopping an
engine. The tests on a real vLLM are in tests/vllm/ (make test-vllm)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from runtime.decider.failsafe import CONTROLLER_FAULT, FailSafe
from runtime.decider.pid import PidController
from runtime.engine.config import EngineConfig
from runtime.engine.request import RejectReason, Status
from runtime.engine.slo import SloTarget
from runtime.knobs import DEFAULT_KNOBS
from runtime.observation import OBS_DIM
from runtime.vllm import TESTED_VLLM_VERSIONS, VllmVersionError, check_vllm_version
from runtime.vllm.accounting import Ledger


def test_only_the_tested_vllm_versions_are_accepted():
    assert check_vllm_version("0.32.0") == "0.32.0"
    assert check_vllm_version("0.32.0+cpu") == "0.32.0+cpu"
    with pytest.raises(VllmVersionError, match="0.33.0 is not a version.*0.32.0"):
        check_vllm_version("0.33.0")
    assert TESTED_VLLM_VERSIONS == ("0.32.0",)


def test_runtime_imports_no_vllm_outside_its_adapter():
    code = ("import sys, runtime, runtime.session, runtime.server, runtime.decider.guard, "
            "runtime.vllm, runtime.vllm.accounting, runtime.vllm.model, runtime.vllm.versions; "
            "assert 'vllm' not in sys.modules, 'vllm imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def ledger(admission: str = "fcfs", slack: float = 1.0) -> Ledger:
    config = EngineConfig(slo_classes={"interactive": SloTarget(1.0, 0.1),
                                       "batch": SloTarget(3600.0, 1.0, 3600.0)},
                          admission=admission)
    return Ledger(config, slack, kv_block_bytes=1 << 15)


def test_the_ledger_accounts_with_the_engines_outcome_code():
    lg = ledger()
    a = lg.new_request(0.0, 100, 3)
    b = lg.new_request(0.0, 100, 3, "batch")
    c = lg.new_request(0.1, 100, 3)
    for r in (a, b, c):
        lg.arrive(r)
    lg.set_kv_blocks(100)
    lg.now = 0.2
    lg.admitted(a)
    lg.admitted(b)
    lg.sampled(a, 1)
    lg.preempted(b)
    lg.now = 0.4
    lg.sampled(a, 2)
    lg.finished(a)  # TTFT 0.2 s, TPOT 0.1 s: met
    lg.now = 1.5
    late, expired = lg.due()  # c has no first token past its 1-s target: a certain miss
    assert (late, expired) == ([], [])
    lg.rejected(c, RejectReason.ABORTED)
    s = lg.summary()
    assert (s.requests, s.finished, s.met, s.preemptions) == (3, 1, 1, 1)
    assert s.rejected_by_reason == {"aborted": 1}
    assert s.batch_unfinished == 1 and b.status == Status.WAITING
    iv = lg.close_interval()
    assert (iv.arrivals, iv.finished, iv.met, iv.violations, iv.preemptions) == (3, 1, 1, 1, 1)
    assert iv.kv_gib_s == pytest.approx(100 * (1 << 15) / 2 ** 30 * 1.5)
    lg.admitted(b)  # a batch request finishes through the same outcome code
    lg.sampled(b, 3)
    lg.finished(b)
    s = lg.summary()
    assert (s.finished, s.batch_requests, s.batch_met, s.batch_unfinished) == (2, 1, 1, 0)


def test_the_ledger_names_late_and_expired_requests_under_shed():
    lg = ledger("shed", slack=0.5)
    a = lg.new_request(0.0, 100, 3)
    lg.arrive(a)
    lg.now = 0.6
    late, _ = lg.due()
    assert late == [a]  # waited half its TTFT target
    lg.rejected(a, RejectReason.SHED)
    assert lg.interval.shed == 1 and lg.summary().rejected_by_reason == {"shed": 1}


class Raises:
    name = "raises"

    def decide(self, observation):
        raise ZeroDivisionError


def test_the_failsafe_holds_the_static_knobs_and_counts_faults():
    safe = FailSafe(Raises())
    obs = np.zeros(OBS_DIM, dtype=np.float32)
    for _ in range(3):
        d = safe.decide(obs)
        assert (d.knobs, d.source, d.reason) == (DEFAULT_KNOBS, "static", CONTROLLER_FAULT)
    assert safe.faults == {"ZeroDivisionError": 3}
    ok = FailSafe(PidController()).decide(obs)
    assert ok.source == "pid"
