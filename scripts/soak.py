"""Soak the REST server under good and hostile clients, all on loopback, and report what the good
clients saw.

    python scripts/soak.py --duration-s 600 --json

Starts ``python -m runtime.server`` on a free loopback port (the shipped policy, default
settings), then runs good clients (``POST /v1/decide`` one after another on a keep-alive
connection, every tenth request a 64-row batch) for the whole run, and hostile clients in
alternate segments: after a warm-up, ``--segment-s`` without them, ``--segment-s`` with them,
and so on, so that both conditions see the same noise of a shared machine. Each hostile client
cycles through the worst inputs found by probing the server:

- 4,096 empty rows to ``/v1/decide/batch`` (16 KB; 81,920 validation errors before hardening);
- 4,096 rows of 20 string values to ``/v1/decide/batch`` (2 MB);
- one observation with 380k unknown keys to ``/v1/decide`` (4 MB);
- a batch as ``text/plain``;
- a connection that sends half its headers and stops, and one that sends a tenth of its body
  and stops (at most ``--max-open`` of each per client, left for the server's timeouts to close).

Every count is bounded: the clients, the open slow connections, the run's duration. Reports the
good clients' decision latency (p50, p99) without and with the hostile clients and their ratio,
every good answer that was not a 200 (5xx counted apart), the hostile answers by status, and the
server's resident memory: its slope after the warm-up (a least-squares line through one sample a
second) in MiB per minute.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path

import numpy as np

from runtime.observation import OBSERVATION_NAMES, example_fields

REPO = Path(__file__).resolve().parents[1]
"""the checkout whose server is soaked (run the script with PYTHONPATH set to it)"""

OBSERVATION = example_fields()
JSON = {"content-type": "application/json"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


# ------------------------------------------------------------------------------------ clients
def good_client(port: int, segment: mp.Value, stop: mp.Event, out: mp.Queue) -> None:
    """Decide one observation after another; latencies by segment, statuses counted."""
    one = json.dumps(OBSERVATION).encode()
    batch = json.dumps({"observations": [OBSERVATION] * 64}).encode()
    latencies: dict[int, array] = {}
    statuses: dict[int, int] = {}
    errors: dict[str, int] = {}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    k = 0
    while not stop.is_set():
        k += 1
        is_batch = k % 10 == 0
        t0 = time.perf_counter()
        try:
            conn.request("POST", "/v1/decide/batch" if is_batch else "/v1/decide",
                         body=batch if is_batch else one, headers=JSON)
            r = conn.getresponse()
            r.read()
            status = r.status
        except (OSError, http.client.HTTPException) as e:
            status = 0  # a connection error
            errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        elapsed = time.perf_counter() - t0
        statuses[status] = statuses.get(status, 0) + 1
        if not is_batch and status == 200:
            latencies.setdefault(segment.value, array("d")).append(elapsed)
    statuses.update({f"0 ({name})": n for name, n in errors.items()})
    out.put(("good", {s: a.tobytes() for s, a in latencies.items()}, statuses))


def _send(port: int, payload: bytes) -> int:
    """One request on a fresh connection; the status (0 when there was none)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            try:
                s.sendall(payload)
            except OSError:
                pass  # refused before the whole body was sent (413): read the answer
            head = s.recv(64)
        return int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0
    except OSError:
        return 0


def _request(path: str, body: bytes, content_type: bytes = b"application/json") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: soak\r\nContent-Length: {len(body)}\r\n".encode()
            + b"Content-Type: " + content_type + b"\r\nConnection: close\r\n\r\n" + body)


def attack_requests() -> dict[str, bytes]:
    """The hostile requests by name."""
    strings = json.dumps({"observations": [dict.fromkeys(OBSERVATION_NAMES, "x")] * 4096})
    return {
        "empty_rows": _request("/v1/decide/batch",
                               json.dumps({"observations": [{}] * 4096}).encode()),
        "string_rows": _request("/v1/decide/batch", strings.encode()),
        "extra_keys": _request("/v1/decide",
                               json.dumps({f"x{i}": 0 for i in range(380_000)}).encode()),
        "text_plain": _request("/v1/decide/batch",
                               json.dumps({"observations": [OBSERVATION]}).encode(), b"text/plain"),
    }


ATTACKS = ("empty_rows", "string_rows", "extra_keys", "text_plain", "slow")
"""every attack's name (``slow``: the half-sent headers and bodies)"""


def hostile_client(port: int, active: mp.Event, stop: mp.Event, max_open: int,
                   attack_names: tuple[str, ...], out: mp.Queue) -> None:
    """Cycle through the chosen attacks while ``active``; statuses counted."""
    requests = attack_requests()
    attacks = [requests[a] for a in attack_names if a != "slow"]
    with_slow = "slow" in attack_names
    statuses: dict[int, int] = {}
    slow: list[socket.socket] = []
    k = 0
    while not stop.is_set():
        if not active.is_set():
            for s in slow:
                s.close()
            slow.clear()
            time.sleep(0.05)
            continue
        k += 1
        if with_slow and (k % 5 == 0 or not attacks):  # a slow connection, up to max_open
            slow = [s for s in slow if _still_open(s)]
            if len(slow) < max_open:
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=5)
                    s.sendall(_request("/v1/decide", b"x" * 900)[:60] if k % 10 else
                              _request("/v1/decide", b"{" * 900)[:-800])
                    slow.append(s)
                except OSError:
                    pass
            if not attacks:
                time.sleep(0.1)
            continue
        status = _send(port, attacks[k % len(attacks)])
        statuses[status] = statuses.get(status, 0) + 1
    for s in slow:
        s.close()
    out.put(("hostile", None, statuses))


def _still_open(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        s.setblocking(True)


# ------------------------------------------------------------------------------------ the run
def soak(duration_s: float, warmup_s: float, segment_s: float, good: int, hostile: int,
         max_open: int, attacks: tuple[str, ...] = ATTACKS) -> dict:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), BATCHPILOT_PORT=str(port),
               BATCHPILOT_HOST="127.0.0.1", BATCHPILOT_LOG_LEVEL="warning")
    # the server's log goes to a file: a pipe nobody reads fills up and blocks the server
    log = tempfile.TemporaryFile(mode="w+b")
    server = subprocess.Popen([sys.executable, "-m", "runtime.server"], cwd=REPO, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(port, server)
        segment = mp.Value("i", -1)
        active, stop, out = mp.Event(), mp.Event(), mp.Queue()
        procs = [mp.Process(target=good_client, args=(port, segment, stop, out))
                 for _ in range(good)]
        procs += [mp.Process(target=hostile_client,
                             args=(port, active, stop, max_open, attacks, out))
                  for _ in range(hostile)]
        for p in procs:
            p.start()
        t0 = time.monotonic()
        memory: list[tuple[float, int]] = []
        hostile_segments: list[int] = []
        while (t := time.monotonic() - t0) < duration_s:
            index = -1 if t < warmup_s else int((t - warmup_s) // segment_s)
            on = index >= 0 and index % 2 == 1
            if index != segment.value:
                segment.value = index
                if on:
                    hostile_segments.append(index)
                (active.set if on else active.clear)()
            if t >= warmup_s:
                memory.append((t, rss_bytes(server.pid)))
            time.sleep(1.0)
        stop.set()
        results = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=30)
        if server.poll() is not None:
            raise RuntimeError(f"the server died: {_tail(log)}")
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
    log.seek(0)
    text = log.read().decode(errors="replace")
    log.close()
    report = _report(results, hostile_segments, memory, duration_s, warmup_s, segment_s, good,
                     hostile)
    return {**report, "attacks": list(attacks),
            "server_log_errors": sum(1 for line in text.splitlines()
                                     if line.startswith(("ERROR", "Traceback")))}


def _tail(log) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")[-2000:]


def _wait_healthy(port: int, server: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"the server did not answer /healthz within {timeout_s} s")


def _report(results: list, hostile_segments: list[int], memory: list[tuple[float, int]],
            duration_s: float, warmup_s: float, segment_s: float, good: int,
            hostile: int) -> dict:
    without, with_hostile = array("d"), array("d")
    good_status: dict[int, int] = {}
    hostile_status: dict[int, int] = {}
    for kind, latencies, statuses in results:
        target = good_status if kind == "good" else hostile_status
        for s, n in statuses.items():
            target[s] = target.get(s, 0) + n
        for seg, raw in (latencies or {}).items():
            if seg < 0:
                continue  # the warm-up
            a = array("d")
            a.frombytes(raw)
            (with_hostile if seg in hostile_segments else without).extend(a)

    def pct(a: array, q: float) -> float:
        return float(np.percentile(np.asarray(a), q)) * 1e3 if len(a) else float("nan")

    t = np.array([m[0] for m in memory])
    mib = np.array([m[1] for m in memory]) / 2**20
    slope = float(np.polyfit(t / 60.0, mib, 1)[0]) if len(t) > 2 else float("nan")
    p99_without, p99_with = pct(without, 99), pct(with_hostile, 99)
    return {
        "duration_s": duration_s, "warmup_s": warmup_s, "segment_s": segment_s,
        "good_clients": good, "hostile_clients": hostile,
        "good_decisions": {"without_hostile": len(without), "with_hostile": len(with_hostile)},
        "good_p50_ms": {"without_hostile": pct(without, 50), "with_hostile": pct(with_hostile, 50)},
        "good_p99_ms": {"without_hostile": p99_without, "with_hostile": p99_with},
        "good_p99_ratio": p99_with / p99_without if p99_without > 0 else float("nan"),
        "good_status": {str(k): v for k, v in sorted(good_status.items(), key=str)},
        "good_5xx": sum(v for k, v in good_status.items() if isinstance(k, int) and k >= 500),
        "good_not_200": sum(v for k, v in good_status.items() if k != 200),
        "hostile_status": {str(k): v for k, v in sorted(hostile_status.items())},
        "memory_mib": {"after_warmup": float(mib[0]) if len(mib) else None,
                       "end": float(mib[-1]) if len(mib) else None},
        "memory_slope_mib_per_min": slope,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration-s", type=float, default=600.0, help="the whole run (600)")
    ap.add_argument("--warmup-s", type=float, default=30.0,
                    help="good clients alone before measuring (30)")
    ap.add_argument("--segment-s", type=float, default=20.0,
                    help="alternate segments without and with hostile clients (20)")
    ap.add_argument("--good-clients", type=int, default=2)
    ap.add_argument("--hostile-clients", type=int, default=2)
    ap.add_argument("--max-open", type=int, default=8,
                    help="slow connections each hostile client keeps open at most (8)")
    ap.add_argument("--attacks", default=",".join(ATTACKS),
                    help=f"the hostile clients' inputs, comma-separated ({','.join(ATTACKS)})")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    attacks = tuple(a.strip() for a in args.attacks.split(",") if a.strip())
    unknown = sorted(set(attacks) - set(ATTACKS))
    if unknown or not attacks:
        print(f"soak: --attacks takes names from {','.join(ATTACKS)}, got {args.attacks!r}",
              file=sys.stderr)
        return 2
    if args.duration_s < args.warmup_s + 2 * args.segment_s:
        print("soak: --duration-s must cover the warm-up and one segment without and one with "
              "the hostile clients", file=sys.stderr)
        return 2
    if min(args.good_clients, args.hostile_clients, args.max_open) < 0 or not args.good_clients:
        print("soak: client counts must be >= 0, with at least one good client", file=sys.stderr)
        return 2
    r = soak(args.duration_s, args.warmup_s, args.segment_s, args.good_clients,
             args.hostile_clients, args.max_open, attacks)
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"soak: {r['duration_s']:.0f} s ({r['warmup_s']:.0f} s warm-up, {r['segment_s']:.0f}-s "
          f"segments), {r['good_clients']} good and {r['hostile_clients']} hostile clients "
          f"({', '.join(r['attacks'])})")
    for key in ("good_decisions", "good_p50_ms", "good_p99_ms"):
        v = r[key]
        print(f"  {key:<16} without hostile {v['without_hostile']:>10.3f}   with hostile "
              f"{v['with_hostile']:>10.3f}")
    print(f"  p99 ratio (with / without): {r['good_p99_ratio']:.2f}")
    print(f"  good answers by status: {r['good_status']} (5xx: {r['good_5xx']})")
    print(f"  hostile answers by status: {r['hostile_status']}")
    print(f"  server log errors: {r['server_log_errors']}")
    print(f"  server memory: {r['memory_mib']['after_warmup']:.1f} MiB after warm-up, "
          f"{r['memory_mib']['end']:.1f} MiB at the end, slope "
          f"{r['memory_slope_mib_per_min']:+.3f} MiB/min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
