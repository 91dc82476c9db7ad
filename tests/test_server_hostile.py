"""The inputs a careless or hostile client sent when the server was probed: each ends within a
second with a clear answer, and leaves good clients served. A real uvicorn server on loopback,
under both HTTP parsers where the parser is what is probed."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time

import httpx
import pytest

from runtime.api.settings import Settings, SettingsError, load_settings
from runtime.server import create_app
from tests.conftest import raw_fields
from tests.test_server_uvicorn import REPO, TOKEN, closed_within, connect, serving

IMPLEMENTATIONS = ["httptools", "h11"]
BODY = json.dumps(raw_fields()).encode()
GOOD = (b"POST /v1/decide HTTP/1.1\r\nHost: t\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(BODY) + BODY)


def statuses(data: bytes) -> list[int]:
    """The status of every answer in ``data``, in order."""
    return [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", data)]


def good_request_works(url: str) -> None:
    r = httpx.post(url + "/v1/decide", json=raw_fields(), timeout=5)
    assert r.status_code == 200 and r.json()["source"] == "policy"


# ------------------------------------------------------------------------------------ headers
@pytest.mark.parametrize("http", IMPLEMENTATIONS)
def test_a_huge_header_sent_in_pieces_gets_431_at_once(policy_dir, http):
    """One header of many megabytes in 64 KB writes (no limit before: 96 MB took 10 s of the
    event loop): refused once the limit is passed, whatever follows."""
    with serving(Settings(policy_dir=policy_dir, http=http)) as url:
        sock = connect(url)
        t0 = time.monotonic()
        sent = 0
        try:
            sock.sendall(b"POST /v1/decide HTTP/1.1\r\nHost: t\r\nX-Big: ")
            for _ in range(32 * 16):  # up to 32 MB, until the server closes
                sock.sendall(b"a" * 65536)
                sent += 65536
        except OSError:
            pass
        closed, data = closed_within(sock, 2.0)
        assert time.monotonic() - t0 < 1.0
        assert closed and statuses(data) == [431], data[:200]
        assert b"BATCHPILOT_MAX_HEADER_BYTES" in data
        assert sent < 8 * 2**20  # the server stopped reading long before
        good_request_works(url)


@pytest.mark.parametrize("http", IMPLEMENTATIONS)
def test_more_header_lines_than_the_limit_get_431(policy_dir, http):
    def head(lines: int) -> bytes:
        return (b"GET /healthz HTTP/1.1\r\nHost: t\r\n"
                + b"".join(b"X-%d: 1\r\n" % i for i in range(lines - 1)) + b"\r\n")

    with serving(Settings(policy_dir=policy_dir, http=http, max_headers=50)) as url:
        for lines, status in [(50, 200), (51, 431), (5000, 431)]:
            sock = connect(url)
            sock.sendall(head(lines))
            _, data = closed_within(sock, 1.0)
            assert statuses(data) == [status], (lines, data[:200])
            sock.close()


@pytest.mark.parametrize("http", IMPLEMENTATIONS)
def test_a_request_line_longer_than_the_limit_gets_431(policy_dir, http):
    with serving(Settings(policy_dir=policy_dir, http=http, max_header_bytes=4096)) as url:
        sock = connect(url)
        sock.sendall(b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: t\r\n\r\n")
        closed, data = closed_within(sock, 2.0)
        assert closed and statuses(data) == [431]
        good_request_works(url)


# ---------------------------------------------------------------------------- idle connections
@pytest.mark.parametrize("http", IMPLEMENTATIONS)
def test_silent_connections_leave_good_clients_served(policy_dir, http):
    """260 connections that send nothing used to fill the 256 places of the concurrency limit:
    every good request got 503 until the header timeout closed them."""
    with serving(Settings(policy_dir=policy_dir, http=http)) as url:
        silent = [connect(url) for _ in range(260)]
        time.sleep(0.3)
        with httpx.Client(base_url=url, timeout=5) as client:
            times = []
            for _ in range(20):
                t0 = time.perf_counter()
                assert client.post("/v1/decide", json=raw_fields()).status_code == 200
                times.append(time.perf_counter() - t0)
        assert sorted(times)[10] < 0.05, sorted(times)
        for s in silent:
            s.close()


def test_past_the_connection_cap_the_connection_idle_longest_is_closed(policy_dir):
    with serving(Settings(policy_dir=policy_dir, max_connections=16)) as url:
        silent = [connect(url) for _ in range(16)]  # the first is the oldest without a request
        time.sleep(0.2)
        with httpx.Client(base_url=url, timeout=5) as client:  # the 17th connection
            for _ in range(5):
                assert client.post("/v1/decide", json=raw_fields()).status_code == 200
            more = [connect(url) for _ in range(8)]  # each closes an older silent one
            time.sleep(0.2)
            # the good client's connection had a request a moment ago: it stays open
            assert client.post("/v1/decide", json=raw_fields()).status_code == 200
        closed = [closed_within(s, 0.2)[0] for s in silent]
        assert closed[:9] == [True] * 9, closed
        for s in silent + more:
            s.close()


def test_past_the_connection_cap_with_every_connection_busy_a_new_one_gets_503(policy_dir):
    release = threading.Event()
    app = create_app(Settings(policy_dir=policy_dir, max_connections=16))

    @app.post("/test/hold")
    async def hold() -> dict:
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 10)
        return {}

    hold_request = b"POST /test/hold HTTP/1.1\r\nHost: t\r\ncontent-length: 0\r\n\r\n"
    with serving(Settings(policy_dir=policy_dir, max_connections=16), app=app) as url:
        held = [connect(url) for _ in range(16)]
        for s in held:
            s.sendall(hold_request)  # a complete request each, held in progress
        time.sleep(0.5)
        try:
            sock = connect(url)
            closed, data = closed_within(sock, 2.0)
            assert closed and statuses(data) == [503], data[:200]
            assert b"BATCHPILOT_MAX_CONNECTIONS" in data
        finally:
            release.set()
        assert [statuses(closed_within(s, 5.0)[1][:20]) for s in held] == [[200]] * 16
        for s in held:
            s.close()
        good_request_works(url)


# ---------------------------------------------------------------------------------- pipelining
@pytest.mark.parametrize("http", IMPLEMENTATIONS)
@pytest.mark.parametrize("bad, status", [
    (b"GARBAGE\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: t\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", 431),
    (b"POST /v1/policy/reload HTTP/1.1\r\nHost: t\r\ncontent-length: 4194304\r\n\r\n"
     + b"x" * 1000, 413)])
def test_answers_to_requests_before_a_malformed_one_are_sent(policy_dir, http, bad, status):
    """Five good requests, a malformed one and five more in one write: the five get their
    answers, then the refusal, then the connection closes (one 400 used to be all)."""
    with serving(Settings(policy_dir=policy_dir, http=http)) as url:
        sock = connect(url)
        t0 = time.monotonic()
        sock.sendall(GOOD * 5 + bad + GOOD * 5)
        closed, data = closed_within(sock, 2.0)
        assert time.monotonic() - t0 < 1.0
        assert closed and statuses(data) == [200] * 5 + [status], data[-300:]


# ---------------------------------------------------------------------------- settings, secrets
def _run_server(env: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHPILOT_")} | env
    return subprocess.run([sys.executable, "-m", "runtime.server"], cwd=REPO, timeout=60,
                          env=dict(env, PYTHONPATH=str(REPO)), capture_output=True, text=True)


def test_a_misspelt_setting_is_named_without_printing_the_token():
    """The misspelling used to end in a traceback whose ``input_value`` printed every setting,
    the reload token included."""
    out = _run_server({"BATCHPILOT_PROT": "8001", "BATCHPILOT_RELOAD_TOKEN": "hunter2-secret"})
    assert out.returncode == 2
    text = out.stdout + out.stderr
    assert "hunter2-secret" not in text and "Traceback" not in text
    assert ("unknown setting BATCHPILOT_PROT; did you mean BATCHPILOT_PORT?" in out.stderr), text


def test_a_refused_value_names_the_variable_not_the_field():
    out = _run_server({"BATCHPILOT_BODY_TIMEOUT_S": "inf", "BATCHPILOT_RELOAD_TOKEN": "s3cr3t"})
    assert out.returncode == 2 and "Traceback" not in out.stderr and "s3cr3t" not in out.stderr
    assert "BATCHPILOT_BODY_TIMEOUT_S: Input should be a finite number (got 'inf')" in out.stderr


@pytest.mark.parametrize("variable, value", [
    ("BATCHPILOT_MAX_STEP", "inf"), ("BATCHPILOT_MAX_STEP", "nan"), ("BATCHPILOT_MAX_STEP", "3"),
    ("BATCHPILOT_BODY_TIMEOUT_S", "inf"), ("BATCHPILOT_HEADER_TIMEOUT_S", "1e9"),
    ("BATCHPILOT_HEADER_TIMEOUT_S", "0"), ("BATCHPILOT_KEEP_ALIVE_TIMEOUT_S", "100000"),
    ("BATCHPILOT_MAX_BODY_BYTES", "1e12"), ("BATCHPILOT_MAX_CONCURRENCY", "1000000"),
    ("BATCHPILOT_MAX_HEADER_BYTES", "0"), ("BATCHPILOT_MAX_CONNECTIONS", "10000000"),
    ("BATCHPILOT_MAX_POLICY_BYTES", "1e15"), ("BATCHPILOT_HTTP", "uvloop"),
])
def test_a_setting_that_would_switch_a_protection_off_is_refused(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as e:
        load_settings()
    assert str(e.value).startswith(f"{variable}: "), str(e.value)


def test_a_secret_value_is_never_in_a_settings_error(monkeypatch):
    monkeypatch.setenv("BATCHPILOT_RELOAD_TOKEN", "t0p-s3cret")
    monkeypatch.setenv("BATCHPILOT_MAX_STEP", "inf")
    with pytest.raises(SettingsError) as e:
        load_settings()
    assert "t0p-s3cret" not in str(e.value) and "BATCHPILOT_MAX_STEP" in str(e.value)


# ------------------------------------------------------------------------------------- reloads
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_a_policy_over_the_size_limit_is_refused_before_it_is_read(policy_dir):
    with open(policy_dir / "huge.onnx", "wb") as f:  # 300 MB, sparse: nothing to read but zeros
        f.truncate(300 * 2**20)
    with serving(Settings(policy_dir=policy_dir, reload_token=TOKEN)) as url:
        t0 = time.perf_counter()
        r = httpx.post(url + "/v1/policy/reload", json={"name": "huge.onnx"}, headers=AUTH)
        assert time.perf_counter() - t0 < 0.5
        assert r.status_code == 422
        assert r.json()["detail"]["message"] == (
            f"cannot read huge.onnx: huge.onnx has {300 * 2**20} bytes, more than the "
            f"{8 * 2**20} a policy may have (BATCHPILOT_MAX_POLICY_BYTES)")
    small = Settings(policy_dir=policy_dir, max_policy_bytes=4096)
    assert small.max_policy_bytes == 4096
    with serving(small.model_copy(update={"reload_token": TOKEN})) as url:  # 30 KB: too big
        assert httpx.get(url + "/v1/policy").json()["missing_reason"] == "model corrupt"


def test_every_refused_reload_is_counted_and_reported_alike(policy_dir, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside") / "evil.onnx"
    outside.write_bytes((policy_dir / "policy-v2.onnx").read_bytes())
    (policy_dir / "link.onnx").symlink_to(outside)
    with serving(Settings(policy_dir=policy_dir, reload_token=TOKEN)) as url:
        refused = [({"name": "link.onnx"}, 400, "outside policy folder"),
                   ({"name": "../x.onnx"}, 422, "invalid request"),
                   ({"name": "absent.onnx"}, 404, "model missing")]
        for k, (body, status, outcome) in enumerate(refused, start=1):
            r = httpx.post(url + "/v1/policy/reload", json=body, headers=AUTH)
            assert r.status_code == status
            info = httpx.get(url + "/v1/policy").json()
            assert info["num_failed_reloads"] == k and info["last_error"], info
            metrics = httpx.get(url + "/metrics").text
            assert f'batchpilot_reloads_total{{outcome="{outcome}"}} 1.0' in metrics
            if k == 1:
                assert "'link.onnx' resolves outside the policy folder" in info["last_error"]


def test_no_answer_shows_the_policy_folder(tmp_path):
    folder = tmp_path / "my pol"  # a space: the old path filter stopped at it
    folder.mkdir()
    (folder / "corrupt.onnx").write_bytes(b"not a model")
    (folder / "a.onnx").symlink_to(folder / "b.onnx")
    (folder / "b.onnx").symlink_to(folder / "a.onnx")
    settings = Settings(policy_dir=folder, policy_file="corrupt.onnx", reload_token=TOKEN)
    with serving(settings) as url:
        texts = [httpx.get(url + "/v1/policy").text]
        texts.append(httpx.post(url + "/v1/policy/reload", json={"name": "a.onnx"},
                                headers=AUTH).text)
        texts.append(httpx.get(url + "/v1/policy").text)
        texts.append(httpx.post(url + "/v1/policy/reload", json={"name": "corrupt.onnx"},
                                headers=AUTH).text)
        texts.append(httpx.get(url + "/metrics").text)
    assert "corrupt.onnx" in texts[0] and "'a.onnx' cannot be resolved" in texts[1]
    for text in texts:
        assert "my pol" not in text and str(tmp_path) not in text, text[:300]


def test_a_reload_without_the_token_is_refused_before_its_body_is_read(policy_dir):
    with serving(Settings(policy_dir=policy_dir, reload_token=TOKEN)) as url:
        r = httpx.post(url + "/v1/policy/reload", content=b'{"name": ',
                       headers={"content-type": "application/json"})
        assert r.status_code == 401  # not 422: the body is not looked at
        t0 = time.perf_counter()
        r = httpx.post(url + "/v1/policy/reload", content=b"x" * 4 * 2**20)
        assert r.status_code == 413 and time.perf_counter() - t0 < 1.0
        r = httpx.post(url + "/v1/policy/reload", content=b'{"name": ', headers=AUTH)
        assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"


@pytest.mark.parametrize("http", IMPLEMENTATIONS)
def test_a_body_declared_over_its_limit_is_refused_before_the_app_sees_the_request(policy_dir,
                                                                                  http):
    """The protocol answers a Content-Length over its path's limit as the head completes: the
    app is never called (no task, no read of the body that follows), and a %-encoded path gets
    its route's limit, as in the app."""
    settings = Settings(policy_dir=policy_dir, reload_token=TOKEN, http=http)
    inner = create_app(settings)
    calls: list[str] = []

    async def app(scope, receive, send):
        if scope["type"] == "http":
            calls.append(scope["path"])
        await inner(scope, receive, send)

    with serving(settings, app) as url:
        calls.clear()
        for path in (b"/v1/policy/reload", b"/v1/policy/%72eload?x=1", b"/v1/decide/batch"):
            sock = connect(url)
            length = 2048 if b"policy" in path else 64 * 2**20
            try:
                sock.sendall(b"POST %s HTTP/1.1\r\nHost: t\r\ncontent-length: %d\r\n\r\n"
                             % (path, length) + b"x" * 2**20)
            except OSError:
                pass  # refused before the whole of it was sent
            closed, data = closed_within(sock, 2.0)
            assert closed and statuses(data) == [413], data
            assert b"request body of %d bytes exceeds the limit" % length in data
        assert calls == []
        small = httpx.post(url + "/v1/policy/reload", content=b"x" * 100)
        assert small.status_code == 401 and calls == ["/v1/policy/reload"]


# --------------------------------------------------------------------------- the parser's word
def _post(url: str, path: str, text: str) -> httpx.Response:
    return httpx.post(url + path, content=text.encode(),
                      headers={"content-type": "application/json"}, timeout=10)


def test_a_repeated_key_is_refused_at_every_size(policy_dir):
    """A key given twice used to be taken (its last value) in a small body and refused only in
    a large one."""
    one = json.dumps(raw_fields())
    twice = one[:-1] + ', "ooms": 3}'  # "ooms" again
    with serving(Settings(policy_dir=policy_dir)) as url:
        for pad in (0, 9000):
            r = _post(url, "/v1/decide", twice + " " * pad)
            assert r.status_code == 422, r.text[:300]
            assert r.json()["detail"][0]["type"] in ("duplicate_key", "invalid_shape")
        r = _post(url, "/v1/decide", twice)
        assert r.json()["detail"] == [{"loc": ["body", "ooms"], "type": "duplicate_key",
                                       "msg": "Duplicate key: each field may be given once in "
                                              "an observation"}]
        # in a batch, an optional field twice in one row and not in the next passes the counts
        row = dict(raw_fields())
        del row["shed_requests"]
        doubled = json.dumps(row)[:-1] + ', "shed_requests": 1, "shed_requests": 2}'
        for n in (2, 400):  # small and large bodies (the latter answered by the worker)
            text = '{"observations": [' + ", ".join([json.dumps(row)] * (n - 2)
                                                    + [doubled, json.dumps(row)]) + "]}"
            r = _post(url, "/v1/decide/batch", text)
            assert r.status_code == 422, r.text[:300]
            assert r.json()["detail"] == [{
                "loc": ["body", "observations", n - 2, "shed_requests"], "type": "duplicate_key",
                "msg": "Duplicate key: each field may be given once in an observation"}]


@pytest.mark.parametrize("value, kind", [
    (True, "float_type"), (False, "float_type"), (None, "float_type"), ("12", "float_type"),
    ({"a": 1}, "float_type"), ([1], "float_type"), (10**400, "float_type"),
    (float("nan"), "finite_number"), (-1.0, "greater_than_equal"), (10**30, None)])
def test_the_batch_array_checks_refuse_what_the_schema_refuses(policy_dir, value, kind):
    """The batch route checks its rows on one array; whatever a row holds, its answer is the
    schema's (a large body that cannot be valid is refused whole, by its byte counts)."""
    with serving(Settings(policy_dir=policy_dir)) as url:
        for n in (3, 400):
            rows = [raw_fields() for _ in range(n)]
            rows[n - 2]["waiting_requests"] = value
            r = _post(url, "/v1/decide/batch", json.dumps({"observations": rows}))
            if kind is None:  # 1e30 requests is clipped, as in training
                assert r.status_code == 200 and len(r.json()["decisions"]) == n
                continue
            assert r.status_code == 422, r.text[:300]
            first = r.json()["detail"][0]
            if first["loc"] == ["body"]:
                assert n == 400 and first["type"] == "invalid_shape", first
            else:
                assert first["loc"] == ["body", "observations", n - 2, "waiting_requests"]
                assert first["type"] == kind, first


def test_worker_answers_equal_inline_answers(policy_dir):
    """A batch over the inline limit (answered by the worker process) is the same answer the
    event loop gives, row for row, with its decisions counted in this process."""
    rows = [raw_fields(arrival_rate_rps=float(i)) for i in range(300)]
    with serving(Settings(policy_dir=policy_dir, batch_worker=False)) as url:
        inline = _post(url, "/v1/decide/batch", json.dumps({"observations": rows}))
    with serving(Settings(policy_dir=policy_dir)) as url:
        worker = _post(url, "/v1/decide/batch", json.dumps({"observations": rows}))
        info = httpx.get(url + "/v1/policy").json()
        metrics = httpx.get(url + "/metrics").text
    assert inline.status_code == worker.status_code == 200
    assert inline.content == worker.content
    assert info["recent"]["by_source"]["policy"] == 300
    assert 'batchpilot_decisions_total{route="batch",source="policy"} 300.0' in metrics


def test_a_connection_cap_the_open_file_limit_cannot_hold_stops_the_start_naming_it():
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHPILOT_")}
    out = subprocess.run([sys.executable, "-m", "runtime.server"], cwd=REPO, timeout=60,
                         env=dict(env, PYTHONPATH=str(REPO), BATCHPILOT_MAX_CONNECTIONS="1000"),
                         capture_output=True, text=True, preexec_fn=low_limit)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert ("BATCHPILOT_MAX_CONNECTIONS: 1000 connections need 1064 open files, and this "
            "process may open at most 256 (ulimit -n)") in out.stderr


@pytest.mark.parametrize("http", IMPLEMENTATIONS)
def test_an_upgrade_request_is_answered_as_plain_http(policy_dir, http):
    with serving(Settings(policy_dir=policy_dir, http=http)) as url:
        sock = connect(url)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\n"
                     b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        _, data = closed_within(sock, 1.0)
        assert statuses(data) == [200], data[:200]


@pytest.mark.parametrize("http", IMPLEMENTATIONS)
def test_empty_lines_after_an_answer_do_not_hold_a_connection_open(policy_dir, http):
    """Blank lines between requests are skipped by the parser without starting a head; they
    must not keep a connection open past the header timeout (they cancel the keep-alive one)."""
    with serving(Settings(policy_dir=policy_dir, http=http, header_timeout_s=0.5,
                          keep_alive_timeout_s=1)) as url:
        sock = connect(url)
        sock.sendall(GOOD)
        t0 = time.monotonic()
        closed = False
        for _ in range(30):
            try:
                sock.sendall(b"\r\n")
            except OSError:
                closed = True
                break
            closed, _ = closed_within(sock, 0.1)
            if closed:
                break
        assert closed and time.monotonic() - t0 < 2.0


def test_the_loop_lag_watch_sees_a_blocked_loop():
    """A callback that holds the loop 30 ms shows as a lag of about that much."""
    from runtime.api.metrics import watch_loop_lag

    lags: list[float] = []

    async def main() -> None:
        watch = asyncio.create_task(watch_loop_lag(lags.append, period_s=0.005))
        await asyncio.sleep(0.05)
        asyncio.get_running_loop().call_soon(time.sleep, 0.03)
        await asyncio.sleep(0.05)
        watch.cancel()

    asyncio.run(main())
    assert len(lags) >= 5 and min(lags) >= 0.0
    assert 0.02 <= max(lags) < 0.2, lags


def test_the_server_reports_its_event_loop_lag(policy_dir):
    with serving(Settings(policy_dir=policy_dir)) as url:
        time.sleep(0.3)
        text = httpx.get(url + "/metrics", timeout=10).text
    count = re.search(r"^batchpilot_event_loop_lag_seconds_count ([0-9.e+]+)$", text, re.M)
    assert count is not None and float(count.group(1)) >= 5, text[-2000:]
