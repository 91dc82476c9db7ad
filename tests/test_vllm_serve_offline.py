"""batchpilot's serving settings, its vLLM command line and the load test's limits, without vLLM:
a bad setting is named before vLLM starts, the command line carries what the scheduler needs and
refuses what contradicts it, and the load test refuses any target but this machine."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from runtime.engine.slo import DEFAULT_SLO_CLASSES, SloTarget
from runtime.knobs import DEFAULT_KNOBS
from runtime.vllm.serve import SERVE_SCHEDULER_CLS
from runtime.vllm.serve.launch import main as launch_main
from runtime.vllm.serve.launch import vllm_argv
from runtime.vllm.serve.loadtest import LoadTest, LoadTestError, check_loopback
from runtime.vllm.serve.settings import (
    SETTINGS_FILE_VARIABLE,
    ServeSettings,
    ServeSettingsError,
    settings_table,
)

P = "BATCHPILOT_VLLM_"


def test_the_defaults_are_the_static_default_and_the_shipped_policy():
    s = ServeSettings.from_environment({})
    assert s.static_knobs() == DEFAULT_KNOBS
    assert s.controller == "policy" and s.interval_s == 0.25 and s.admission == "fcfs"
    assert s.hold_window
    assert not ServeSettings.from_environment({P + "HOLD_WINDOW": "false"}).hold_window
    assert s.start_policy_path() is not None and s.start_policy_path().name == "policy.onnx"
    config = s.engine_config()
    assert config.slo_classes == DEFAULT_SLO_CLASSES and not config.keep_requests


def test_every_bad_setting_is_named():
    with pytest.raises(ServeSettingsError) as e:
        ServeSettings.from_environment({P + "INTERVAL_S": "0", P + "STATIC_KV_CACHE_RATIO": "2",
                                        P + "CONTROLLER": "chaos", P + "SLO": "x:y"})
    message = str(e.value)
    for variable in ("INTERVAL_S", "STATIC_KV_CACHE_RATIO", "CONTROLLER", "SLO"):
        assert P + variable in message
    with pytest.raises(ServeSettingsError, match="did you mean BATCHPILOT_VLLM_CONTROLLER"):
        ServeSettings.from_environment({P + "CONTROLER": "pid"})
    with pytest.raises(ServeSettingsError, match="STATIC_PREFILL_CHUNK_TOKENS"):
        ServeSettings.from_environment({P + "STATIC_PREFILL_CHUNK_TOKENS": "lots"})
    with pytest.raises(ServeSettingsError, match="POLICY_FILE"):
        ServeSettings.from_environment({P + "POLICY_FILE": "../elsewhere.onnx"})
    with pytest.raises(ServeSettingsError, match="HOLD_WINDOW"):
        ServeSettings.from_environment({P + "HOLD_WINDOW": "sometimes"})


def test_a_settings_file_is_read_and_a_variable_wins_over_it(tmp_path):
    path = tmp_path / "batchpilot.json"
    path.write_text(json.dumps({"controller": "pid", "interval_s": 0.5,
                                "slo": "interactive:2:0.2,batch:3600:1:3600"}))
    s = ServeSettings.from_environment({SETTINGS_FILE_VARIABLE: str(path),
                                        P + "INTERVAL_S": "1.0"})
    assert (s.controller, s.interval_s) == ("pid", 1.0)
    assert s.engine_config().slo_classes["interactive"] == SloTarget(2.0, 0.2)
    path.write_text(json.dumps({"interval_s": -1, "controllr": "pid"}))
    with pytest.raises(ServeSettingsError, match="unknown field 'controllr'; did you mean "
                                                 "'controller'"):
        ServeSettings.from_environment({SETTINGS_FILE_VARIABLE: str(path)})
    path.write_text(json.dumps({"interval_s": -1}))
    with pytest.raises(ServeSettingsError, match=r"batchpilot.json: field 'interval_s'"):
        ServeSettings.from_environment({SETTINGS_FILE_VARIABLE: str(path)})
    with pytest.raises(ServeSettingsError, match="no such file"):
        ServeSettings.from_environment({SETTINGS_FILE_VARIABLE: str(tmp_path / "nope.json")})


def test_slo_classes_scaled_to_the_vllm_profile():
    classes = ServeSettings.from_environment({P + "SLO": "profile"}).engine_config().slo_classes
    assert set(classes) == {"interactive", "batch"} and classes["interactive"].tpot_s > 0.05
    with pytest.raises(ServeSettingsError, match="SLO"):
        ServeSettings.from_environment({P + "SLO": "profile:/no/such/profile.json"})


def test_the_settings_table_lists_every_variable():
    table = settings_table()
    for name in ServeSettings.model_fields:
        assert f"`{P}{name.upper()}`" in table
    assert SETTINGS_FILE_VARIABLE in table


def test_the_serve_docs_quote_the_current_settings_table():
    import re
    from pathlib import Path

    doc = Path(__file__).resolve().parents[1] / "docs" / "vllm-serve.md"
    marker = "<!-- vllm-serve-settings:{} -->"
    found = re.search(re.escape(marker.format("start")) + r"\n(.*?)\n"
                      + re.escape(marker.format("end")), doc.read_text(), re.S)
    assert found, "docs/vllm-serve.md has no vllm-serve-settings block"
    assert found.group(1) == settings_table(), (
        "docs/vllm-serve.md's settings are stale: paste the output of "
        "runtime.vllm.serve.settings.settings_table()")


def test_the_vllm_command_line_carries_the_scheduler_and_refuses_contradictions():
    argv = vllm_argv(["/models/tiny", "--port", "9000"])
    assert argv[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[2:4] == ["--model", "/models/tiny"]
    i = argv.index("--scheduler-cls")
    assert argv[i + 1] == SERVE_SCHEDULER_CLS
    assert "--no-async-scheduling" in argv
    assert argv[argv.index("--scheduling-policy") + 1] == "priority"
    for bad in (["m", "--scheduling-policy", "fcfs"], ["m", "--scheduler-cls", "x.Y"],
                ["m", "--async-scheduling"], ["--port", "1"]):
        with pytest.raises(ValueError):
            vllm_argv(bad)


def test_the_command_stops_on_a_bad_setting_before_vllm_starts(monkeypatch, capsys):
    monkeypatch.setenv(P + "INTERVAL_S", "-3")
    assert launch_main(["/models/tiny"]) == 2
    assert "BATCHPILOT_VLLM_INTERVAL_S" in capsys.readouterr().err


def test_the_load_test_targets_loopback_only():
    assert check_loopback("http://127.0.0.1:8000") == ("127.0.0.1", 8000)
    assert check_loopback("http://localhost:8000")[1] == 8000
    for url in ("http://10.1.2.3:8000", "https://127.0.0.1:8000", "ftp://localhost",
                "http://192.0.2.1"):
        with pytest.raises(LoadTestError):
            LoadTest(url, "m", dict(DEFAULT_SLO_CLASSES))
    with pytest.raises(LoadTestError, match="max_requests"):
        LoadTest("http://127.0.0.1:1", "m", dict(DEFAULT_SLO_CLASSES), max_requests=0)


class _FakeCompletions(BaseHTTPRequestHandler):
    """An OpenAI completions stream of ``max_tokens`` chunks; a request whose ``prompt`` starts
    with id 3 ends before any token (as vLLM streams a shed one), id 4 gets a 503."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["prompt"][0] == 4:
            self.send_response(503)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"busy")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

        n = 0 if body["prompt"][0] == 3 else body["max_tokens"]
        for i in range(n):
            finish = "length" if i == n - 1 else None
            chunk(b"data: " + json.dumps({"choices": [{"token_ids": [9], "finish_reason": finish,
                                                       "stop_reason": None}]}).encode() + b"\n\n")
        chunk(b"data: [DONE]\n\n")
        chunk(b"")


def test_the_load_test_counts_every_request_once():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeCompletions)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        test = LoadTest(f"http://127.0.0.1:{server.server_address[1]}", "m",
                        {"interactive": SloTarget(5.0, 1.0)}, max_s=30, vocab_size=5)
        # prompts of one token: the seeded ids decide each request's fate (3 shed, 4 refused)
        import numpy as np

        rng = np.random.default_rng(0)  # the draws the test makes, in its order
        ids = [int(rng.integers(3, 5, size=1)[0]) for _ in range(6)]
        assert 3 in ids and 4 in ids
        out = test.run([0.0] * 6, [1] * 6, [3] * 6)
        assert out["sent"] == 6 and out["conserved"]
        assert out["shed"] == ids.count(3) and out["errors"] == out["status_5xx"] == ids.count(4)
        assert out["completed"] == 6 - ids.count(3) - ids.count(4)
        assert out["by_class"]["interactive"]["met"] == out["completed"]
    finally:
        server.shutdown()

