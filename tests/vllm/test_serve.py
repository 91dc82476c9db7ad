"""batchpilot inside a real ``vllm serve`` (CPU, the tiny dummy-weight model): one server for the
whole module, started with ``batchpilot vllm-serve`` and a corrupt start-up policy, every check
driven through it in order (the PID on the corrupt policy, a reload under load, a policy file
replaced by garbage and then by a good one, a policy that raises in serving, deadline-aware
shedding and its answer, the metrics, the side port's refusals), and stopped at the end, also
when a check fails (its process group: the API server and vLLM's engine core)."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import FIXTURES

TOKEN = "serve-test-token"
SLO = "interactive:60:10,tight:0.1:10,batch:3600:1:3600"
"""the server's classes: ``interactive`` (the default) too lenient to shed at the tests' loads,
``tight`` (0.1 s to the first token) shed as soon as it queues behind a prefill (on a fast
machine, ten prompts of 1,200-1,600 tokens prefill in 0.26 s: at 0.2 s they were late by tens
of milliseconds, in a step already running, and none was shed)"""
INTERVAL_S = 0.25
START_TIMEOUT_S = 900.0
"""the shared 2-core machines start vLLM in 1-3 minutes when busy"""
WAIT_S = 60.0
"""how long a check waits for the server to show something (a busy machine's steps are slow)"""


@dataclass
class Served:
    server: object
    model: Path
    policies: Path
    startup: dict

    def url(self, path: str) -> str:
        return self.server.side_url + path  # type: ignore[attr-defined]

    def state(self) -> dict:
        with urllib.request.urlopen(self.url("/v1/state"), timeout=10) as r:
            return json.load(r)

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url("/metrics"), timeout=10) as r:
            return r.read().decode()

    def post(self, path: str, body: dict | bytes, token: str | None = TOKEN) -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(self.url(path), data=data, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def wait(self, what, timeout_s: float = WAIT_S, every_s: float = 0.05):
        """Poll the state until ``what(state)`` is true; returns that state."""
        deadline = time.time() + timeout_s
        while True:
            s = self.state()
            if what(s):
                return s
            assert time.time() < deadline, (f"the server did not show it within {timeout_s} s: "
                                            f"{s}\n{self.server.log_tail()}")
            time.sleep(every_s)

    def load(self, n: int, *, every_s: float = 0.25, prompt=(64, 256), output=(8, 24),
             slo_class: str = "interactive", seed: int = 0, max_s: float = 300.0) -> dict:
        """A load test through the completions API: ``n`` requests ``every_s`` apart."""
        import numpy as np

        from runtime.vllm.serve.loadtest import LoadTest
        from runtime.vllm.serve.settings import slo_classes

        rng = np.random.default_rng(seed)
        test = LoadTest(self.server.url, str(self.model), slo_classes(SLO),  # type: ignore
                        max_s=max_s, seed=seed)
        return test.run([i * every_s for i in range(n)],
                        rng.integers(*prompt, size=n).tolist(),
                        rng.integers(*output, size=n).tolist(), [slo_class] * n)


def no_failed_request(summary: dict) -> None:
    assert summary["conserved"], summary
    assert summary["errors"] == summary["status_5xx"] == summary["cut"] == 0, summary
    assert summary["refused"] == summary["ended"] == 0, summary


@pytest.fixture(scope="module")
def served():
    from runtime.vllm.model import write_tiny_model
    from runtime.vllm.serve.process import ServeProcess, TinyServeFlags

    # a folder of its own rather than pytest's: on a shared machine another session's pytest
    # prunes old numbered folders, and this one lives for minutes
    folder = tempfile.TemporaryDirectory(prefix="batchpilot-vllm-serve-")
    root = Path(folder.name)
    model = write_tiny_model(root / "tiny-llama")
    policies = root / "policies"
    policies.mkdir()
    (policies / "policy.onnx").write_bytes(b"not an ONNX model\n" * 50)  # corrupt at start
    for name in ("policy-test-1.onnx", "policy-test-2.onnx", "policy-raises-in-serving.onnx",
                 "policy-slow-in-serving.onnx"):
        shutil.copy(FIXTURES / name, policies / name)
    settings = {"POLICY_DIR": str(policies), "POLICY_FILE": "policy.onnx", "SLO": SLO,
                "ADMISSION": "shed", "INTERVAL_S": str(INTERVAL_S), "RELOAD_TOKEN": TOKEN,
                "RELOAD_POLL_S": "0.5", "TIMELINE_S": "2", "BREAKER_TRIP_AFTER": "0"}
    server = ServeProcess.start(model, settings=settings, log_path=root / "server.log",
                                flags=TinyServeFlags(kv_cache_gib=1 / 32),
                                timeout_s=START_TIMEOUT_S)
    try:
        yield Served(server, model, policies, {"ready_s": server.ready_s,
                                               "started": server.started})
    finally:
        server.stop()
        folder.cleanup()
        assert server.proc.poll() is not None


def test_it_starts_on_the_pid_when_the_policy_is_corrupt(served):
    s = served.wait(lambda s: s["last_decision"] is not None)
    assert s["controller"] == "policy" and s["admission"] == "shed"
    assert not s["policy"]["loaded"] and s["policy"]["missing_reason"] == "model corrupt"
    assert (s["last_decision"]["source"], s["last_decision"]["reason"]) == ("pid",
                                                                            "model corrupt")
    assert s["idle_ticks"] > 0  # it decides while vLLM is idle too
    text = served.metrics()
    assert 'batchpilot_vllm_last_decision{reason="model corrupt",source="pid"} 1.0' in text
    assert 'batchpilot_vllm_policy_loaded{policy_version=""} 0.0' in text
    print(f"\nstart-up: vLLM answered {served.startup['ready_s']:.0f} s after the launch, "
          f"first decision {s['first_decision_unix'] - served.startup['started']:.0f} s after it")
    no_failed_request(summary := served.load(3))
    assert summary["completed"] == 3


def test_a_policy_reloaded_under_load_decides_with_no_failed_request(served):
    result: dict = {}
    load = threading.Thread(target=lambda: result.update(served.load(24)))
    load.start()
    try:
        served.wait(lambda s: s["requests"]["in_engine"] > 0 or s["requests"]["arrivals"] > 3)
        status, body = served.post("/v1/policy/reload", {"name": "policy-test-1.onnx"})
        assert status == 200 and body["ok"] and body["policy_version"] == "test-1", body
    finally:
        load.join()
    no_failed_request(result)
    assert result["completed"] == result["sent"] == 24
    s = served.wait(lambda s: s["last_decision"]["source"] == "policy")
    assert s["last_decision"]["policy_version"] == "test-1" and s["policy"]["loaded"]
    assert s["reloads"] == {"ok": 1}
    assert s["decisions"]["policy"] > 0


def test_a_policy_file_replaced_by_garbage_keeps_the_old_policy(served):
    live = served.policies / "policy-test-1.onnx"
    result: dict = {}
    load = threading.Thread(target=lambda: result.update(served.load(12, seed=1)))
    load.start()
    try:
        tmp = live.with_suffix(".tmp")
        tmp.write_bytes(os.urandom(2000))
        os.replace(tmp, live)  # replaced, as deployments replace files
        s = served.wait(lambda s: s["reloads"].get("model corrupt", 0) >= 1)
        assert s["policy"]["version"] == "test-1"  # the old policy stays
        ticks = s["ticks"]
        s = served.wait(lambda s: s["ticks"] >= ticks + 2)
        assert s["last_decision"]["source"] == "policy"
        assert s["last_decision"]["policy_version"] == "test-1"
        tmp.write_bytes((FIXTURES / "policy-test-2.onnx").read_bytes())
        os.replace(tmp, live)  # and a good file is picked up
        s = served.wait(lambda s: s["policy"]["version"] == "test-2")
    finally:
        load.join()
    no_failed_request(result)
    s = served.wait(lambda s: s["last_decision"]["policy_version"] == "test-2")
    assert s["last_decision"]["source"] == "policy"


def on_static_knobs_load(served, name: str, version: str) -> None:
    """Hold the static knobs, then load the policy ``name`` (of ``version``): switched on, it
    meets its first observations on the static knobs, where the fault fixtures misbehave."""
    status, _ = served.post("/v1/controller", {"controller": "static"})
    assert status == 200
    served.wait(lambda s: s["controller"] == "static" and s["knobs"] == s["static_knobs"])
    status, body = served.post("/v1/policy/reload", {"name": name})
    assert status == 200 and body["policy_version"] == version, body


def test_a_policy_slower_than_the_decision_limit_hands_over_to_the_pid(served):
    """Three decisions over the limit (5 ms; this policy takes tens of milliseconds on the
    static knobs) in a row, and the PID decides in its place, without running it."""
    on_static_knobs_load(served, "policy-slow-in-serving.onnx", "slow-in-serving")
    result: dict = {}
    load = threading.Thread(target=lambda: result.update(served.load(12, seed=3)))
    load.start()
    try:
        status, _ = served.post("/v1/controller", {"controller": "policy"})
        assert status == 200
        s = served.wait(lambda s: s["fallbacks"].get("policy slow", 0) >= 1)
        slow = s["policy"]["slow_guard"]
        assert slow["handed_over"] and slow["num_handovers"] >= 1, slow
        assert slow["slow_decisions"] >= 3 and slow["slowest_s"] > slow["limit_s"] == 0.005
        text = served.metrics()
        assert re.search(r"^batchpilot_vllm_policy_slow 1\.0$", text, re.M), text[-2000:]
        counted = re.search(r"^batchpilot_vllm_slow_decisions_total (\S+)$", text, re.M)
        assert counted is not None and float(counted.group(1)) >= 3
        assert re.search(r'batchpilot_vllm_fallbacks_total\{reason="policy slow"\} [1-9]', text)
    finally:
        load.join()
    no_failed_request(result)
    status, body = served.post("/v1/policy/reload", {"name": "policy-test-2.onnx"})
    assert status == 200 and body["policy_version"] == "test-2"
    s = served.wait(lambda s: s["last_decision"]["policy_version"] == "test-2"
                    and s["last_decision"]["source"] == "policy")
    assert not s["policy"]["slow_guard"]["handed_over"]


def test_the_token_budget_vllm_applies_is_shown(served):
    s = served.state()
    budget = s["token_budget"]
    assert budget["chunk"] == min(s["knobs"]["prefill_chunk_tokens"], budget["startup"])
    text = served.metrics()
    shown = re.search(r"^batchpilot_vllm_token_budget (\S+)$", text, re.M)
    assert shown is not None and 0 < float(shown.group(1)) <= budget["startup"]
    assert re.search(r"^batchpilot_vllm_chunk_capped_total \d", text, re.M)


def test_a_policy_that_raises_in_serving_falls_back_within_an_interval(served):
    on_static_knobs_load(served, "policy-raises-in-serving.onnx", "raises-in-serving")
    result: dict = {}
    load = threading.Thread(target=lambda: result.update(served.load(12, seed=2)))
    load.start()
    try:
        ticks = served.state()["ticks"]
        status, _ = served.post("/v1/controller", {"controller": "policy"})
        assert status == 200
        # the switch is applied by the next interval, whose decision falls back at once
        s = served.wait(lambda s: s["ticks"] >= ticks + 2)
        assert s["controller"] == "policy"
        text = served.metrics()
        fallbacks = re.search(r'batchpilot_vllm_fallbacks_total\{reason="policy error"\} (\S+)',
                              text)
        assert fallbacks is not None and float(fallbacks.group(1)) >= 1
        assert s["fallbacks"].get("policy error", 0) >= 1
        assert s["decisions"]["pid"] > 0
    finally:
        load.join()
    no_failed_request(result)
    status, body = served.post("/v1/policy/reload", {"name": "policy-test-2.onnx"})
    assert status == 200 and body["policy_version"] == "test-2"


def test_a_late_request_is_shed_with_the_documented_answer(served):
    assert served.post("/v1/controller", {"controller": "static"})[0] == 200  # slack 1
    before = served.wait(lambda s: s["controller"] == "static")["requests"][
        "rejected_by_reason"].get("shed", 0)
    answers: list = []

    def plain(i: int) -> None:  # a non-streaming request: the reason is in the answer
        body = {"model": str(served.model), "prompt": [7 + (i + j) % 3000 for j in range(1200)],
                "max_tokens": 4, "ignore_eos": True, "vllm_xargs": {"slo_class": "tight"}}
        req = urllib.request.Request(served.server.url + "/v1/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              "X-Request-Id": f"shed-probe-{i}"})
        with urllib.request.urlopen(req, timeout=300) as r:
            answers.append((r.status, json.load(r)))

    probes = [threading.Thread(target=plain, args=(i,)) for i in range(2)]
    for p in probes:
        p.start()
    summary = served.load(12, every_s=0.02, prompt=(1200, 1600), output=(4, 8),
                          slo_class="tight", seed=3)
    for p in probes:
        p.join()
    assert summary["conserved"] and summary["errors"] == summary["status_5xx"] == 0, summary
    assert summary["shed"] >= 1, summary
    assert summary["by_class"]["tight"]["shed"] == summary["shed"]
    for status, answer in answers:
        assert status == 200
        choice = answer["choices"][0]
        assert choice["finish_reason"] in ("abort", "length"), answer
        if choice["finish_reason"] == "abort":
            assert choice["stop_reason"] == "batchpilot:shed"
    shed_plain = sum(a["choices"][0]["finish_reason"] == "abort" for _, a in answers)
    assert shed_plain + summary["shed"] >= 2
    # the server counts every one of them, and its log names them
    s = served.wait(lambda s: s["requests"]["rejected_by_reason"].get("shed", 0) - before
                    >= summary["shed"] + shed_plain and s["requests"]["in_engine"] == 0)
    assert s["requests"]["rejected_by_reason"]["shed"] - before == summary["shed"] + shed_plain
    named = re.compile(r"shed \d+ requests? \(late for the first token.*(bp-load-|shed-probe-)")
    deadline = time.time() + 10
    while not named.search(served.server.log_path.read_text()):
        assert time.time() < deadline, "the log names no shed request"
        time.sleep(0.2)
    assert served.post("/v1/controller", {"controller": "policy"})[0] == 200
    served.wait(lambda s: s["controller"] == "policy")


def test_the_metrics_show_what_it_did(served):
    time.sleep(3 * INTERVAL_S)  # every interval with a request in it has closed
    s = served.wait(lambda s: s["requests"]["in_engine"] == 0)
    text = served.metrics()

    def value(line: str) -> float:
        m = re.search("^" + re.escape(line) + r" (\S+)$", text, re.M)
        assert m is not None, f"{line} not in the metrics:\n{text}"
        return float(m.group(1))

    for name, v in s["knobs"].items():
        assert value(f'batchpilot_vllm_knob{{knob="{name}"}}') == pytest.approx(v)
    assert value('batchpilot_vllm_controller{controller="policy"}') == 1.0
    assert value('batchpilot_vllm_policy_loaded{policy_version="test-2"}') == 1.0
    assert value('batchpilot_vllm_decisions_total{source="policy"}') > 0
    assert value('batchpilot_vllm_decisions_total{source="pid"}') > 0
    assert value('batchpilot_vllm_fallbacks_total{reason="model corrupt"}') > 0
    # test-1, test-2 (a file replaced), the slow one and test-2 back, the raising one and
    # test-2 back
    assert value('batchpilot_vllm_policy_reloads_total{outcome="ok"}') == 6
    assert value('batchpilot_vllm_policy_reloads_total{outcome="model corrupt"}') >= 1
    assert value('batchpilot_vllm_rejected_total{reason="shed"}') >= 1
    pool = value('batchpilot_vllm_kv_blocks{state="pool"}')
    cap = value('batchpilot_vllm_kv_blocks{state="cap"}')
    assert 0 < cap <= pool and value('batchpilot_vllm_kv_blocks{state="withheld"}') == pool - cap
    assert value("batchpilot_vllm_passthrough") == 0.0
    assert value("batchpilot_vllm_window_held") == 1.0 and s["window_held"] is True
    assert value('batchpilot_vllm_decision_seconds_bucket{le="+Inf"}') >= s["ticks"] > 0
    # every request that entered ended, finished or rejected with a reason
    r = s["requests"]
    assert r["arrivals"] == r["finished"] + r["rejected"] == value(
        'batchpilot_vllm_requests_total{outcome="arrivals"}')
    assert r["rejected"] == sum(r["rejected_by_reason"].values())
    assert not s["faults"], s["faults"]
    # the knob timeline in the log, at a readable rate
    log = served.server.log_path.read_text()
    lines = re.findall(r"timeline t=([\d.]+)s", log)
    assert len(lines) >= 3
    times = [float(t) for t in lines]
    # a line every 2 s, and one when who decides changed, never more than one a second
    assert len(times) <= times[-1] - times[0] + 2


def test_the_side_port_refuses_what_it_must(served):
    assert served.post("/v1/policy/reload", {}, token=None)[0] == 401
    assert served.post("/v1/policy/reload", {}, token="wrong")[0] == 401
    assert served.post("/v1/controller", {"controller": "chaos"})[0] == 422
    assert served.post("/v1/controller", {"knobs": {"kv_cache_ratio": 7}})[0] == 422
    assert served.post("/v1/controller", {"surprise": 1})[0] == 422
    assert served.post("/v1/policy/reload", {"name": "../policy.onnx"})[0] == 422
    assert served.post("/v1/policy/reload", b"{" * 10)[0] == 400
    assert served.post("/v1/policy/reload", b" " * 5000)[0] == 413
    status, body = served.post("/v1/policy/reload", {"name": "missing.onnx"})
    assert status == 422 and body["policy_version"] == "test-2"  # the old policy stays
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(served.url("/nowhere"), timeout=10)
    assert e.value.code == 404
    s = served.state()
    assert s["policy"]["version"] == "test-2" and s["controller"] == "policy"
