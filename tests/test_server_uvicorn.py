"""The API through a real uvicorn server on 127.0.0.1, and ``python -m runtime.server``."""

from __future__ import annotations

import asyncio
import contextlib
import json
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
from runtime.server import create_app, uvicorn_config
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


@contextlib.contextmanager
def serving(settings: Settings, app=None) -> Iterator[str]:
    """uvicorn in a thread, on a free port, configured as ``python -m runtime.server`` is
    (serving ``app``, or the app of ``settings``); stopped cleanly at the end."""
    settings = settings.model_copy(update={"port": free_port(), "log_level": "warning"})
    server = uvicorn.Server(uvicorn_config(settings, app))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{settings.port}"
    try:
        wait_healthy(url)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        assert not thread.is_alive(), "uvicorn did not shut down"


@pytest.fixture()
def server_url(policy_dir) -> Iterator[str]:
    with serving(Settings(policy_dir=policy_dir, reload_token=TOKEN)) as url:
        yield url


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


def test_the_serving_loop_moves_the_lanes_bytes_and_hands_them_back_when_it_stops(policy_dir):
    """Served, the lanes' sockets are the event loop's to read and write: a batch for each lane
    is answered with no thread of the server besides the loop's touching them (the worker's own
    I/O thread is never started). Once the server stops, the same worker still answers, its
    sockets handed to a loop of its own."""
    from runtime.api.batch_worker import SMALL_LANE_BYTES, BatchWorker
    from runtime.decider.breaker import CircuitBreaker
    from runtime.decider.guard import GuardedDecider
    from tests.conftest import FIXTURES

    worker = BatchWorker()
    small = {"observations": [raw_fields()] * 200}
    large = {"observations": [raw_fields()] * 1000}
    assert 64 * 1024 < len(json.dumps(small)) <= SMALL_LANE_BYTES < len(json.dumps(large))
    try:
        app = create_app(Settings(policy_dir=policy_dir), worker=worker)
        with serving(Settings(policy_dir=policy_dir), app) as url:
            with httpx.Client(base_url=url, timeout=30) as client:
                for body, rows in ((small, 200), (large, 1000)):
                    answer = client.post("/v1/decide/batch", json=body)
                    assert answer.status_code == 200 and len(answer.json()["decisions"]) == rows
            assert worker.process("small") is not None and worker.process("large") is not None
            assert worker.io_thread is None
        d = GuardedDecider(FIXTURES / "policy-test-1.onnx", breaker=CircuitBreaker(trip_after=0))
        after = worker.submit(d, "a", json.dumps(large).encode(), False).result(timeout=30)
        assert after.status == 200 and worker.io_thread is not None
    finally:
        worker.close()


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


# ---------------------------------------------------------------- timeouts and the concurrency
def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """(whether the server closed the connection within ``seconds``, what it sent first)."""
    sock.settimeout(seconds)
    data = b""
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < seconds:
            chunk = sock.recv(65536)
            if not chunk:
                return True, data
            data += chunk
    except TimeoutError:
        return False, data
    except ConnectionResetError:
        return True, data
    return False, data


REQUEST = (b"POST /v1/decide HTTP/1.1\r\nHost: t\r\ncontent-type: application/json\r\n")


def test_partial_headers_and_silent_connections_are_closed_after_the_header_timeout(policy_dir):
    with serving(Settings(policy_dir=policy_dir, header_timeout_s=0.3)) as url:
        silent, partial = connect(url), connect(url)
        partial.sendall(REQUEST)  # and never the blank line that ends the headers
        t0 = time.monotonic()
        assert closed_within(silent, 2.0) == (True, b"")
        assert closed_within(partial, 2.0) == (True, b"")
        assert time.monotonic() - t0 < 1.5
        assert httpx.post(url + "/v1/decide", json=raw_fields()).status_code == 200


def test_a_body_that_never_finishes_gets_408_and_the_connection_closes(policy_dir):
    with serving(Settings(policy_dir=policy_dir, body_timeout_s=0.3)) as url:
        sock = connect(url)
        sock.sendall(REQUEST + b"content-length: 1000\r\n\r\n" + b'{"arrival_rate_rps": 1')
        closed, data = closed_within(sock, 2.0)
        assert closed and data.startswith(b"HTTP/1.1 408 ")
        assert b"the request body did not arrive within 0.3 s" in data


def test_an_idle_keep_alive_connection_is_closed_after_its_timeout(policy_dir):
    body = json.dumps(raw_fields()).encode()
    with serving(Settings(policy_dir=policy_dir, keep_alive_timeout_s=1)) as url:
        sock = connect(url)
        sock.sendall(REQUEST + f"content-length: {len(body)}\r\n\r\n".encode() + body)
        closed, data = closed_within(sock, 3.0)
        assert closed and data.startswith(b"HTTP/1.1 200 ")


def test_requests_in_progress_past_the_limit_get_503_and_silent_connections_do_not_count(
        policy_dir):
    """Two requests held in progress fill a limit of two: the next complete request gets 503.
    Silent connections, half-sent heads and trickling bodies hold no place: with them open and
    nothing in progress, a good request is answered."""
    release = threading.Event()
    app = create_app(Settings(policy_dir=policy_dir, max_concurrency=2))

    @app.post("/test/hold")
    async def hold() -> dict:
        await asyncio.to_thread(release.wait, 10)
        return {}

    with serving(Settings(policy_dir=policy_dir, max_concurrency=2), app=app) as url:
        idle = [connect(url) for _ in range(20)]
        for k, s in enumerate(idle[10:]):
            s.sendall(REQUEST if k % 2 else REQUEST + b"content-length: 900\r\n\r\n{")
        time.sleep(0.2)
        assert httpx.post(url + "/v1/decide", json=raw_fields()).status_code == 200
        held = [threading.Thread(target=httpx.post, args=(url + "/test/hold",),
                                 kwargs={"timeout": 10}) for _ in range(2)]
        for t in held:
            t.start()
        time.sleep(0.5)
        try:
            r = httpx.post(url + "/v1/decide", json=raw_fields())
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert "BATCHPILOT_MAX_CONCURRENCY" in r.json()["detail"]
        finally:
            release.set()
            for t in held:
                t.join()
        assert httpx.post(url + "/v1/decide", json=raw_fields()).status_code == 200
        for s in idle:
            s.close()


def test_slow_clients_do_not_hold_up_a_good_one(policy_dir):
    """Twenty connections trickling headers and twenty trickling bodies: a good client's
    decisions still come back in milliseconds."""
    with serving(Settings(policy_dir=policy_dir)) as url:
        slow = [connect(url) for _ in range(40)]
        for k, s in enumerate(slow):
            s.sendall(REQUEST if k % 2 else REQUEST + b"content-length: 900\r\n\r\n{")
        with httpx.Client(base_url=url) as client:
            client.post("/v1/decide", json=raw_fields())
            times = []
            for _ in range(50):
                t0 = time.perf_counter()
                assert client.post("/v1/decide", json=raw_fields()).status_code == 200
                times.append(time.perf_counter() - t0)
        for s in slow:
            s.close()
        assert sorted(times)[25] < 0.05, sorted(times)
