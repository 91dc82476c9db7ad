"""The API through a real uvicorn server on 127.0.0.1, and ``python -m runtime.server``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from runtime.api.settings import Settings
from runtime.server import create_app
from tests.conftest import raw_fields

REPO = Path(__file__).resolve().parents[1]
TOKEN = "uvicorn-test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout_s: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.05)
    raise TimeoutError(f"{url}/healthz did not answer within {timeout_s} s")


@pytest.fixture()
def server_url(policy_dir) -> Iterator[str]:
    """uvicorn in a thread, on a free port; stopped cleanly at the end."""
    settings = Settings(policy_dir=policy_dir, reload_token=TOKEN, breaker_trip_after=0)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        assert not thread.is_alive(), "uvicorn did not shut down"


def test_decide_batch_and_policy_over_a_real_socket(server_url):
    with httpx.Client(base_url=server_url) as client:
        one = client.post("/v1/decide", json=raw_fields())
        assert one.status_code == 200 and one.json()["source"] == "policy"
        many = client.post("/v1/decide/batch", json={"observations": [raw_fields()] * 256})
        assert many.status_code == 200 and len(many.json()["decisions"]) == 256
        assert many.json()["decisions"][0] == one.json()
        assert client.get("/v1/policy").json()["policy"]["policy_version"] == "test-1"
        bad = client.post("/v1/decide", json=dict(raw_fields(), nonsense=1.0))
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "nonsense"]
        big = client.post("/v1/decide/batch", content=b" " * (5 * 1024 * 1024),
                          headers={"content-type": "application/json"})
        assert big.status_code == 413


def test_no_request_fails_across_reloads(server_url):
    """Four keep-alive clients decide without pause while the policy is reloaded back and forth;
    every answer is a 200 from the policy, of one version or the other."""
    stop = threading.Event()
    failures: list[str] = []
    versions: dict[str, int] = {}
    lock = threading.Lock()

    def hammer(batch: bool) -> None:
        with httpx.Client(base_url=server_url, timeout=10) as client:
            while not stop.is_set():
                if batch:
                    r = client.post("/v1/decide/batch", json={"observations": [raw_fields()] * 16})
                    answers = r.json()["decisions"] if r.status_code == 200 else []
                else:
                    r = client.post("/v1/decide", json=raw_fields())
                    answers = [r.json()] if r.status_code == 200 else []
                with lock:
                    if r.status_code != 200:
                        failures.append(f"{r.status_code}: {r.text[:200]}")
                    for a in answers:
                        if a["source"] != "policy":
                            failures.append(f"{a['source']}: {a['reason']}")
                        versions[a["policy_version"]] = versions.get(a["policy_version"], 0) + 1

    threads = [threading.Thread(target=hammer, args=(k == 0,)) for k in range(4)]
    for t in threads:
        t.start()
    try:
        with httpx.Client(base_url=server_url, timeout=30,
                          headers={"Authorization": f"Bearer {TOKEN}"}) as admin:
            for k in range(6):
                time.sleep(0.1)
                name = "policy-v2.onnx" if k % 2 == 0 else "policy.onnx"
                assert admin.post("/v1/policy/reload", json={"name": name}).status_code == 200
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == []
    assert versions.get("test-1", 0) > 0 and versions.get("test-2", 0) > 0


def test_python_m_runtime_server_starts_with_the_configured_policy_or_pid_alone(policy_dir,
                                                                               tmp_path_factory):
    for folder, source in [(policy_dir, "policy"), (tmp_path_factory.mktemp("none"), "pid")]:
        port = free_port()
        env = dict(os.environ, PYTHONPATH=str(REPO), BATCHPILOT_PORT=str(port),
                   BATCHPILOT_POLICY_DIR=str(folder), BATCHPILOT_LOG_LEVEL="warning")
        proc = subprocess.Popen([sys.executable, "-m", "runtime.server"], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, proc=proc)
            assert httpx.get(url + "/readyz").json()["source"] == source
            assert httpx.post(url + "/v1/decide", json=raw_fields()).json()["source"] == source
        finally:
            proc.terminate()
            out, _ = proc.communicate(timeout=10)
        # uvicorn shuts down gracefully, then re-raises the signal: -SIGTERM is a clean exit
        assert proc.returncode in (0, -signal.SIGTERM), out.decode()[-2000:]
        assert b"Traceback" not in out, out.decode()[-2000:]
