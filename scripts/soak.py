"""Soak the REST server under good and hostile clients, all on loopback, and report what the good
clients saw.

    python scripts/soak.py --duration-s 600 --json                  # every attack, mixed
    python scripts/soak.py --each --rounds 3 --segment-s 15 --json  # one attack at a time

Starts ``python -m runtime.server`` on a free loopback port (the shipped policy, a reload token,
a policy folder that also holds the files the reload attacks name), then runs good clients for
the whole run and hostile clients in alternate segments: after a warm-up, ``--segment-s``
without them, ``--segment-s`` with them, and so on, so that both conditions see the same noise
of a shared machine. A good client sends single decisions at ``--good-rate`` a second on a
keep-alive connection (0: back to back), every tenth request a batch of ``--good-batch-rows``
(64). Each hostile client cycles through the attacks (``--attacks``; with ``--each``, every
segment with hostile clients runs one attack, each attack ``--rounds`` times, in turn), the
worst inputs found by probing the server:

- ``empty_rows``: 4,096 empty rows to ``/v1/decide/batch`` (16 KB; 81,920 validation errors
  before the first hardening); ``string_rows``: 4,096 rows of 29 string values (2 MB);
  ``extra_keys``: one observation with 380k unknown keys (4 MB); ``text_plain``: a batch as
  ``text/plain``; ``repeated_key``: an observation with ``ooms`` twice;
- ``at_cap``: valid 4,096-row batches of ~4 MB, back to back; ``lane_cap``: valid batches
  just under the batch worker's small lane's limit (256 KB, about 270 rows), and
  ``inline_cap``: just under the limit of those answered on the event loop (64 KB, 67 rows);
- ``big_header``: one header of up to 96 MB in 64 KB writes, then a valid body;
  ``many_headers``: 5,000 header lines; ``pipelined``: five good requests, ``GARBAGE`` and five
  more in one write;
- ``slow``: connections that send half their head, or a tenth of their body, and stop (at most
  ``--max-open`` of each per client, left for the server's timeouts to close); ``silent``:
  ``--silent`` connections that send nothing, opened again as the server closes them;
- ``reload_huge``: reloads of a 200 MB sparse file; ``reload_limit``: of a file one byte under
  the size limit; ``reload_outside``: of a symlink out of the folder (all with the token);
  ``reload_no_token``: a 4 MB body and a malformed one without it.

Every count is bounded: the clients, the open connections, the run's duration. ``--pin`` puts
the server's event loop and the good clients on the first CPU and the hostile clients on the
last (where the machine has two or more), so that the hostile clients' own CPU competes with
neither, as if they ran elsewhere (the batch worker keeps every CPU; ``--pin-worker`` puts it
beside the hostile clients, as on a machine with a core to spare for it). On the loop's CPU the
good clients still wait for it while it serves the hostile clients: ``--good-nice -5`` raises
their priority over the server's processes, so that their latency is the server's answer and not
their own wait for a CPU, as for clients on other machines. A nice is not enough on a kernel
whose scheduler lets the running task finish its time slice before a woken one runs (EEVDF's
run-to-parity, checked at the scheduler tick: 4 ms here): a good client woken by its answer
waited for the busy loop's slice to end, and its p99 under attack sat at 4.05-4.07 ms whatever
the attack and whatever its nice. ``--good-realtime`` runs the good clients under ``SCHED_FIFO``
(they are light: 100 requests a second), so that they run the moment their answer arrives, as
on a machine of their own. Reports the
good clients' decision latency (p50, p99) without and with the hostile clients and their ratio
(per attack with ``--each``, with the spread over rounds), every good answer that was not a 200
(5xx counted apart), the hostile answers by status, and the server's memory (its process and
its batch worker's two, their resident sizes summed, and their proportional set sizes, which
count shared pages once): the slope after the warm-up (a least-squares line through one sample
a second) in MiB per minute, the slope from the end of the first segment in which every attack
ran (the processes' heaps grow to their working set at the first large bodies: a step, which
the slope from the warm-up reads as growth), the largest of the summed samples (``max``) and
each process's own peak summed (``peak``, an upper bound on the peak of the sum: the processes
need not peak at one moment), and the resident pages of the three counted once, each shared
page once and not once a process (``unique``: the resident size they would have as one process;
counted every 5 s, where the page map is readable).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path

import numpy as np

from runtime.api.batch_worker import SMALL_LANE_BYTES
from runtime.api.routes.decide import INLINE_BODY_BYTES
from runtime.locations import shipped_policy_dir
from runtime.observation import OBSERVATION_NAMES, example_fields

REPO = Path(__file__).resolve().parents[1]
"""the checkout whose server is soaked (run the script with PYTHONPATH set to it)"""

OBSERVATION = example_fields()
JSON = {"content-type": "application/json"}
TOKEN = "soak-reload-token"
CAP_BYTES = 4 * 2**20
"""the server's default ``BATCHPILOT_MAX_BODY_BYTES``: the at-cap batches stay under it"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status_field(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for process {pid}")


def server_processes(pid: int) -> list[int]:
    """The server and its children (the batch worker's lanes), whichever of its threads started
    them (the lanes start from a thread of the server's: listing only the main thread's children
    left them out of the figures before 2026-12-04)."""
    return [pid, *children(pid)]


def _pss(pid: int) -> int:
    """A process's proportional set size in bytes (its shared pages divided among the processes
    that map them), or its resident size where ``smaps_rollup`` is not readable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return _status_field(pid, "VmRSS")


PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
PFN_MASK = np.uint64((1 << 55) - 1)
"""a ``/proc/PID/pagemap`` entry's bits 0-54: the page's frame number, where bit 63 says it is
resident (the kernel reads the frame number as 0 to a reader without ``CAP_SYS_ADMIN``)"""
UNIQUE_EVERY_S = 5.0
"""seconds between two counts of :func:`unique_resident_bytes` in a soak (one reads every mapped
page's entry of the three processes: 35-40 ms of the soak's CPU for two processes of 90 MiB,
measured; a count a second would take CPU from the clients being measured, and with ``--pin``
they run on the hostile clients' CPU)"""


def unique_resident_bytes(pids: list[int]) -> int | None:
    """The resident bytes of ``pids`` together, each physical page counted once: the resident
    size the processes would have as one (summed resident sizes count every shared page, the
    libraries each maps, once in each process). From each process's page map, whose frame
    numbers only a privileged reader sees: None where they read as 0."""
    frames = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as maps, \
                    open(f"/proc/{pid}/pagemap", "rb", buffering=0) as pagemap:
                for line in maps:
                    lo, hi = (int(x, 16) for x in line.split(None, 1)[0].split("-"))
                    if hi > 1 << 47:  # [vsyscall], outside the user address space
                        continue
                    pagemap.seek(lo // PAGE_BYTES * 8)
                    entries = np.frombuffer(pagemap.read((hi - lo) // PAGE_BYTES * 8), np.uint64)
                    frames.append(entries[(entries >> np.uint64(63)) == 1] & PFN_MASK)
        except OSError:
            continue  # a child that exited between the listing and the read
    resident = np.concatenate(frames) if frames else np.empty(0, np.uint64)
    if not resident.size or not resident.any():
        return None
    return int(np.unique(resident).size) * PAGE_BYTES


def rss_bytes(pid: int) -> tuple[int, int, int, int]:
    """Resident, peak resident and proportional bytes of the server and its children, each
    summed (resident sizes count the pages they share once in every process), and how many
    processes that is."""
    rss = peak = pss = n = 0
    for p in server_processes(pid):
        try:
            rss += _status_field(p, "VmRSS")
            peak += _status_field(p, "VmHWM")
            pss += _pss(p)
            n += 1
        except (OSError, RuntimeError):
            pass  # a child that exited between the listing and the read
    return rss, peak, pss, n


def process_peaks(pid: int) -> dict[str, float]:
    """Each of the server's processes' own peak resident size (``VmHWM``) in MiB, by role: the
    server, and each batch worker lane by its nice over the server's (the lanes differ in
    nothing else a reader outside them can see). Which process holds the memory the summed
    figures count."""
    peaks: dict[str, float] = {}
    server_nice = None
    for p in server_processes(pid):  # the server first
        try:
            hwm = _status_field(p, "VmHWM") / 2**20
            nice = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[16])
        except (OSError, RuntimeError, ValueError, IndexError):
            continue  # a child that exited between the listing and the read
        if p == pid:
            server_nice, role = nice, "server"
        else:
            role = f"batch worker (nice {nice - (server_nice or 0)})"
        while role in peaks:
            role += "'"
        peaks[role] = hwm
    return peaks


def _pin(cpus: set[int] | None) -> None:
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


# ------------------------------------------------------------------------------------ clients
def good_client(port: int, segment: mp.Value, stop: mp.Event, rate: float,
                cpus: set[int] | None, out: mp.Queue, nice: int = 0,
                batch_rows: int = 64, realtime: bool = False) -> None:
    """Decide one observation after another at ``rate`` a second (0: back to back), every tenth
    request a batch of ``batch_rows``; latencies by segment (single decisions and batches
    apart), statuses counted. ``nice``: added to the client's CPU priority (negative: ahead of
    the server's processes; see ``--good-nice``). ``realtime``: the client runs under
    ``SCHED_FIFO`` (see ``--good-realtime``)."""
    _pin(cpus)
    if nice:
        os.nice(nice)
    if realtime:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
    one = json.dumps(OBSERVATION).encode()
    batch = json.dumps({"observations": [OBSERVATION] * batch_rows}).encode()
    latencies: dict[int, array] = {}
    batch_latencies: dict[int, array] = {}
    statuses: dict[int, int] = {}
    errors: dict[str, int] = {}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    k = 0
    t_start = time.perf_counter()
    while not stop.is_set():
        k += 1
        if rate > 0:
            delay = t_start + k / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
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
        if status == 200:
            target = batch_latencies if is_batch else latencies
            target.setdefault(segment.value, array("d")).append(elapsed)
    statuses.update({f"0 ({name})": n for name, n in errors.items()})
    out.put(("good", {s: a.tobytes() for s, a in latencies.items()},
             {s: a.tobytes() for s, a in batch_latencies.items()}, statuses))


def _read_status(s: socket.socket) -> int:
    try:
        head = s.recv(64)
    except OSError:
        return 0
    return int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0


def _send(port: int, payload: bytes | list[bytes]) -> int:
    """One request on a fresh connection (a list: written piece by piece, until the server
    stops reading); the first answer's status (0 when there was none)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            try:
                for piece in ([payload] if isinstance(payload, bytes) else payload):
                    s.sendall(piece)
            except OSError:
                pass  # refused before the whole request was sent (413, 431): read the answer
            return _read_status(s)
    except OSError:
        return 0


def _request(path: str, body: bytes, content_type: bytes = b"application/json",
             extra: bytes = b"") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: soak\r\nContent-Length: {len(body)}\r\n".encode()
            + b"Content-Type: " + content_type + b"\r\nConnection: close\r\n" + extra + b"\r\n"
            + body)


def _at_cap_batch(cap: int = CAP_BYTES, num_rows: int = 4096) -> bytes:
    """A valid batch of ``num_rows`` rows of full-precision values, just under ``cap`` bytes
    (by default the body limit)."""
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(num_rows):
        row = {k: float(v) * (1 + float(rng.uniform(0, 1e-3))) for k, v in OBSERVATION.items()}
        for k in ("kv_utilization", "kv_fragmentation", "slo_attainment", "kv_utilization_prev",
                  "batch_deadline_margin", "cotenant_demand_fraction", "kv_cache_ratio",
                  "batch_share"):
            row[k] = min(row[k], OBSERVATION[k])
        for k in ("batch_window_ms", "prefill_chunk_tokens", "admission_slack"):
            row[k] = OBSERVATION[k]
        rows.append(row)
    body = json.dumps({"observations": rows}).encode()
    if len(body) > cap:  # trim the digits until it fits
        body = json.dumps({"observations": [{k: round(v, 12) for k, v in r.items()}
                                            for r in rows]}).encode()
    while len(body) > cap:  # then the rows
        rows.pop()
        body = json.dumps({"observations": rows}).encode()
    return body


def _big_header() -> list[bytes]:
    body = json.dumps(OBSERVATION).encode()
    return ([b"POST /v1/decide HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
             b"Content-Length: %d\r\nX-Big: " % len(body)]
            + [b"a" * 65536] * (96 * 16) + [b"\r\n\r\n" + body])


def _reload(body: bytes, token: bool = True) -> bytes:
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode() if token else b""
    return _request("/v1/policy/reload", body, extra=auth)


def attack_requests() -> dict[str, bytes | list[bytes]]:
    """The hostile requests by name (the connection attacks, ``slow`` and ``silent``, are the
    clients' own)."""
    strings = json.dumps({"observations": [dict.fromkeys(OBSERVATION_NAMES, "x")] * 4096})
    one = json.dumps(OBSERVATION).encode()
    good = (b"POST /v1/decide HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(one) + one)
    return {
        "empty_rows": _request("/v1/decide/batch",
                               json.dumps({"observations": [{}] * 4096}).encode()),
        "string_rows": _request("/v1/decide/batch", strings.encode()),
        "extra_keys": _request("/v1/decide",
                               json.dumps({f"x{i}": 0 for i in range(380_000)}).encode()),
        "text_plain": _request("/v1/decide/batch",
                               json.dumps({"observations": [OBSERVATION]}).encode(), b"text/plain"),
        "repeated_key": _request("/v1/decide", one[:-1] + b', "ooms": 3}'),
        "at_cap": _request("/v1/decide/batch", _at_cap_batch()),
        "lane_cap": _request("/v1/decide/batch", _at_cap_batch(SMALL_LANE_BYTES, 400)),
        "inline_cap": _request("/v1/decide/batch", _at_cap_batch(INLINE_BODY_BYTES, 120)),
        "big_header": _big_header(),
        "many_headers": (b"GET /healthz HTTP/1.1\r\nHost: soak\r\n"
                         + b"".join(b"X-%d: 1\r\n" % i for i in range(5000)) + b"\r\n"),
        "pipelined": good * 5 + b"GARBAGE\r\n\r\n" + good * 5,
        "reload_huge": _reload(b'{"name": "huge.onnx"}'),
        "reload_limit": _reload(b'{"name": "limit.onnx"}'),
        "reload_outside": _reload(b'{"name": "outside.onnx"}'),
        "reload_no_token": [_reload(b"x" * CAP_BYTES, token=False)[:-CAP_BYTES],
                            b"x" * CAP_BYTES],
    }


CONNECTION_ATTACKS = ("slow", "silent")
ATTACKS = ("empty_rows", "string_rows", "extra_keys", "text_plain", "repeated_key", "at_cap",
           "lane_cap", "inline_cap", "big_header", "many_headers", "pipelined", "reload_huge",
           "reload_limit", "reload_outside", "reload_no_token", "slow", "silent")
"""every attack's name"""


def hostile_client(port: int, active: mp.Value, stop: mp.Event, max_open: int, silent: int,
                   attack_names: tuple[str, ...], cpus: set[int] | None,
                   out: mp.Queue, nice: int = 0) -> None:
    """While ``active`` holds an index into ``attack_names`` (-2: all of them in turn; -1:
    none), run those attacks; statuses counted by attack. ``nice``: added to the client's CPU
    priority (see ``--hostile-nice``)."""
    _pin(cpus)
    if nice:
        os.nice(nice)
    requests = attack_requests()
    statuses: dict[str, dict[int, int]] = {}
    times: dict[str, array] = {}
    slow: list[socket.socket] = []
    idle: list[socket.socket] = []
    k = 0
    while not stop.is_set():
        which = active.value
        if which == -1:
            for s in slow + idle:
                s.close()
            slow.clear()
            idle.clear()
            time.sleep(0.05)
            continue
        names = attack_names if which == -2 else (attack_names[which],)
        if "silent" not in names and idle:
            for s in idle:
                s.close()
            idle.clear()
        k += 1
        name = names[k % len(names)]
        if name == "slow":  # a slow connection, up to max_open
            slow = [s for s in slow if _still_open(s)]
            if len(slow) < max_open:
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=5)
                    s.sendall(_request("/v1/decide", b"x" * 900)[:60] if k % 2 else
                              _request("/v1/decide", b"{" * 900)[:-800])
                    slow.append(s)
                except OSError:
                    pass
            time.sleep(0.02 if len(names) > 1 else 0.1)
            continue
        if name == "silent":  # keep `silent` connections open that have sent nothing
            idle = [s for s in idle if _still_open(s)]
            while len(idle) < silent:
                try:
                    idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
                except OSError:
                    break
            time.sleep(0.02 if len(names) > 1 else 0.2)
            continue
        t0 = time.perf_counter()
        status = _send(port, requests[name])
        times.setdefault(name, array("d")).append(time.perf_counter() - t0)
        by_status = statuses.setdefault(name, {})
        by_status[status] = by_status.get(status, 0) + 1
    for s in slow + idle:
        s.close()
    out.put(("hostile", {n: a.tobytes() for n, a in times.items()}, None, statuses))


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
def limit_file(size: int) -> bytes:
    """``size`` bytes whose top-level protobuf fields are an ONNX model's (a version, and a
    graph field over the rest, all zeros): the cheap check of a policy file lets it through, and
    onnxruntime has to copy and parse it to refuse it, the costliest refusal a reload can get."""
    head = b"\x08\x07\x3a"  # ir_version 7; field 7 (the graph), length-delimited
    length = size - len(head) - 4
    varint = bytes([(length >> s) & 0x7F | (0x80 if k < 3 else 0)
                    for k, s in enumerate((0, 7, 14, 21))])
    return head + varint + b"\0" * length


def _policy_folder(folder: Path) -> None:
    """The shipped policy, and the files the reload attacks name: a 200 MB sparse file, one
    a byte under the default size limit that passes the cheap check (:func:`limit_file`), and
    a symlink out of the folder."""
    from runtime.decider.onnx_policy import DEFAULT_MAX_POLICY_BYTES

    shutil.copy(shipped_policy_dir() / "policy.onnx", folder / "policy.onnx")
    with open(folder / "huge.onnx", "wb") as f:
        f.truncate(200 * 2**20)
    (folder / "limit.onnx").write_bytes(limit_file(DEFAULT_MAX_POLICY_BYTES - 1))
    outside = folder.parent / "outside-target.onnx"
    shutil.copy(shipped_policy_dir() / "policy.onnx", outside)
    (folder / "outside.onnx").symlink_to(outside)


def soak(duration_s: float, warmup_s: float, segment_s: float, good: int, hostile: int,
         max_open: int, attacks: tuple[str, ...] = ATTACKS, each: bool = False,
         good_rate: float = 100.0, silent: int = 260, pin: bool = False,
         rounds: int = 1, repo: Path = REPO, pin_worker: bool = False,
         good_nice: int = 0, hostile_nice: int = 0, good_batch_rows: int = 64,
         good_realtime: bool = False) -> dict:
    if each:  # every attack its rounds, each between two segments without hostile clients
        duration_s = max(duration_s, each_duration(warmup_s, segment_s, len(attacks), rounds))
    port = free_port()
    tmp = tempfile.TemporaryDirectory(prefix="batchpilot-soak-")
    folder = Path(tmp.name) / "policies"
    folder.mkdir()
    _policy_folder(folder)
    env = dict(os.environ, PYTHONPATH=str(repo), BATCHPILOT_PORT=str(port),
               BATCHPILOT_HOST="127.0.0.1", BATCHPILOT_LOG_LEVEL="warning",
               BATCHPILOT_POLICY_DIR=str(folder), BATCHPILOT_RELOAD_TOKEN=TOKEN)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pinned = pin and len(cpus) >= 2
    # hostile clients away from the server's loop; good clients beside it (they and the loop
    # take turns, and they must not wait for the CPU behind the hostile clients' own work)
    server_cpus, hostile_cpus = ({cpus[0]}, {cpus[-1]}) if pinned else (None, None)
    # the server's log goes to a file: a pipe nobody reads fills up and blocks the server
    log = tempfile.TemporaryFile(mode="w+b")
    server = subprocess.Popen([sys.executable, "-m", "runtime.server"], cwd=repo, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    load_start = os.getloadavg()[0]
    try:
        _wait_healthy(port, server)
        if server_cpus:  # the event loop's thread (the main one); the worker keeps every CPU
            os.sched_setaffinity(server.pid, server_cpus)
            if pin_worker:  # unless it goes beside the hostile clients
                for child in children(server.pid):
                    os.sched_setaffinity(child, hostile_cpus)
        segment = mp.Value("i", -1)
        active = mp.Value("i", -1)
        stop, out = mp.Event(), mp.Queue()
        procs = [mp.Process(target=good_client,
                            args=(port, segment, stop, good_rate, server_cpus, out,
                                  good_nice, good_batch_rows, good_realtime))
                 for _ in range(good)]
        procs += [mp.Process(target=hostile_client,
                             args=(port, active, stop, max_open, silent, attacks, hostile_cpus,
                                   out, hostile_nice))
                  for _ in range(hostile)]
        for p in procs:
            p.start()
        # this process's own sampling beside the hostile clients: the page counts (35-40 ms of
        # CPU each for two 90-MiB processes, measured; the server has three) on the loop's CPU
        # raised the loop's lag p99 from 7.5 to 25 ms (ten minutes)
        _pin(hostile_cpus)
        t0 = time.monotonic()
        memory: list[tuple[float, int, int, int]] = []
        lag: list[tuple[int, list[tuple[float, float]]]] = []  # the loop-lag histogram a second
        unique: list[tuple[float, int]] = []  # (s, bytes) every UNIQUE_EVERY_S
        peak = 0
        hostile_segments: dict[int, int] = {}  # segment index -> attack index (-2: all)
        while (t := time.monotonic() - t0) < duration_s:
            index = -1 if t < warmup_s else int((t - warmup_s) // segment_s)
            on = index >= 0 and index % 2 == 1
            if index != segment.value:
                segment.value = index
                if on:
                    hostile_segments[index] = (index // 2) % len(attacks) if each else -2
                active.value = hostile_segments[index] if on else -1
            if t >= warmup_s:
                rss, hwm, pss, n = rss_bytes(server.pid)
                memory.append((t, rss, pss, n))
                peak = max(peak, hwm)
                if not unique or t - unique[-1][0] >= UNIQUE_EVERY_S:
                    u = unique_resident_bytes(server_processes(server.pid))
                    if u is not None:
                        unique.append((t, u))
                buckets = loop_lag_buckets(port)
                if buckets is not None:
                    lag.append((index, buckets))
            time.sleep(1.0)
        stop.set()
        active.value = -1
        results = [out.get(timeout=120) for _ in procs]
        peaks = process_peaks(server.pid)
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
        tmp.cleanup()
    log.seek(0)
    text = log.read().decode(errors="replace")
    log.close()
    # the memory the attacks first bring in (each worker's heap grows to its working set at the
    # first large bodies) is a step, not a leak: the slope is also taken from the end of the
    # first segment in which every attack ran
    settled_s = warmup_s + 2 * segment_s * (len(attacks) if each else 1)
    report = _report(results, hostile_segments, attacks, each, memory, peak, settled_s, lag)
    report["memory_mib"]["peak_by_process"] = peaks
    ut = np.array([t for t, _ in unique])
    u = np.array([b for _, b in unique]) / 2**20
    report["memory_mib"]["unique"] = None if not len(u) else {
        "after_warmup": float(u[0]), "end": float(u[-1]), "max": float(u.max()),
        "samples": len(u), "every_s": UNIQUE_EVERY_S,
        "settled_slope_mib_per_min": _slope(ut[ut >= settled_s], u[ut >= settled_s])}
    return {"repo": str(repo), "duration_s": duration_s, "warmup_s": warmup_s,
            "segment_s": segment_s,
            "good_clients": good, "hostile_clients": hostile, "good_rate": good_rate,
            "good_batch_rows": good_batch_rows,
            "good_nice": good_nice, "hostile_nice": hostile_nice,
            "good_realtime": good_realtime,
            "pinned": ({"server_loop_and_good_clients": sorted(server_cpus or ()),
                        "hostile_clients": sorted(hostile_cpus or ()),
                        "batch_worker": sorted(hostile_cpus or ()) if pin_worker else "any"}
                       if pinned else None),
            "machine": {"cpus": len(cpus), "load_avg_1m_start": load_start,
                        "load_avg_1m_end": os.getloadavg()[0]},
            **report, "attacks": list(attacks), "each": each,
            "server_log_errors": sum(1 for line in text.splitlines()
                                     if line.startswith(("ERROR", "Traceback")))}


def each_duration(warmup_s: float, segment_s: float, num_attacks: int, rounds: int) -> float:
    """The run that gives each of ``num_attacks`` attacks ``rounds`` segments of its own."""
    return warmup_s + (2 * num_attacks * rounds + 1) * segment_s


def _tail(log) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")[-2000:]


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (its batch worker), from /proc."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _wait_healthy(port: int, server: subprocess.Popen, timeout_s: float = 90.0) -> None:
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


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) * 1e3 if len(a) else float("nan")


def _summary(without: np.ndarray, with_hostile: np.ndarray) -> dict:
    p99_without, p99_with = _pct(without, 99), _pct(with_hostile, 99)
    return {"decisions": {"without_hostile": len(without), "with_hostile": len(with_hostile)},
            "p50_ms": {"without_hostile": _pct(without, 50),
                       "with_hostile": _pct(with_hostile, 50)},
            "p99_ms": {"without_hostile": p99_without, "with_hostile": p99_with},
            "p99_ratio": p99_with / p99_without if p99_without > 0 else float("nan")}


def _slope(t: np.ndarray, mib: np.ndarray) -> float:
    """MiB per minute: a least-squares line through samples at ``t`` seconds (nan under 3)."""
    return float(np.polyfit(t / 60.0, mib, 1)[0]) if len(t) > 2 else float("nan")


LAG_METRIC = "batchpilot_event_loop_lag_seconds_bucket"


def loop_lag_buckets(port: int) -> list[tuple[float, float]] | None:
    """The server's event-loop lag histogram from ``/metrics``: (upper bound in seconds,
    cumulative count) per bucket; None when it cannot be read."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
    except OSError:
        return None
    out = []
    for line in text.splitlines():
        if line.startswith(LAG_METRIC + '{le="'):
            bound, count = line[len(LAG_METRIC) + 5:].split('"} ')
            out.append((float(bound), float(count)))
    return out or None


def _lag_p99_ms(lag: list[tuple[int, list[tuple[float, float]]]], segs) -> float | None:
    """The loop lag's p99 over segments ``segs``, in ms, as the upper bound of the histogram
    bucket it falls in (the counts added between two samples of one segment)."""
    segs = set(segs)
    added: np.ndarray | None = None
    bounds = None
    for (i, a), (j, b) in zip(lag, lag[1:], strict=False):
        if i == j and i in segs and len(a) == len(b):
            d = np.array([y for _, y in b]) - np.array([y for _, y in a])
            added = d if added is None else added + d
            bounds = [x for x, _ in b]
    if added is None or bounds is None or added[-1] <= 0:
        return None
    k = int(np.searchsorted(added, 0.99 * added[-1]))
    return bounds[min(k, len(bounds) - 1)] * 1e3


def _report(results: list, hostile_segments: dict[int, int], attacks: tuple[str, ...],
            each: bool, memory: list[tuple[float, int, int, int]], peak: int,
            settled_s: float = 0.0,
            lag: list[tuple[int, list[tuple[float, float]]]] | None = None) -> dict:
    singles: dict[int, list] = {}
    batches: dict[int, list] = {}
    good_status: dict[int | str, int] = {}
    hostile_status: dict[str, dict[str, int]] = {}
    hostile_times: dict[str, list[float]] = {}
    for kind, latencies, batch_latencies, statuses in results:
        if kind == "good":
            for s, n in statuses.items():
                good_status[s] = good_status.get(s, 0) + n
            for target, raw in ((singles, latencies), (batches, batch_latencies)):
                for seg, b in raw.items():
                    if seg >= 0:  # not the warm-up
                        a = array("d")
                        a.frombytes(b)
                        target.setdefault(seg, []).extend(a)
        else:
            for attack, by_status in statuses.items():
                merged = hostile_status.setdefault(attack, {})
                for s, n in by_status.items():
                    merged[str(s)] = merged.get(str(s), 0) + n
            for attack, b in latencies.items():
                a = array("d")
                a.frombytes(b)
                hostile_times.setdefault(attack, []).extend(a)

    def pooled(target: dict[int, list], segs) -> np.ndarray:
        return np.array([x for s in segs for x in target.get(s, [])])

    off = [s for s in set(singles) | set(batches) if s not in hostile_segments]
    on = list(hostile_segments)
    lag = lag or []
    out: dict = {"good": _summary(pooled(singles, off), pooled(singles, on)),
                 "good_batches": _summary(pooled(batches, off), pooled(batches, on)),
                 "loop_lag_p99_ms": {"without_hostile": _lag_p99_ms(lag, off),
                                     "with_hostile": _lag_p99_ms(lag, on)}}
    if each:
        per_attack = {}
        for a, name in enumerate(attacks):
            segs = [s for s, which in hostile_segments.items() if which == a]
            rounds, batch_rounds = [], []
            for s in segs:  # against the segments without hostile clients either side
                near = [x for x in (s - 1, s + 1) if x in singles and x not in hostile_segments]
                rounds.append(_summary(pooled(singles, near), pooled(singles, [s]))["p99_ratio"])
                batch_rounds.append(
                    _summary(pooled(batches, near), pooled(batches, [s]))["p99_ratio"])
            per_attack[name] = {**_summary(pooled(singles, off), pooled(singles, segs)),
                                "p99_ratio_by_round": rounds,
                                "batches": _summary(pooled(batches, off), pooled(batches, segs)),
                                "batches_p99_ratio_by_round": batch_rounds,
                                "loop_lag_p99_ms": _lag_p99_ms(lag, segs),
                                "hostile_status": hostile_status.get(name, {})}
        out["per_attack"] = per_attack
    t = np.array([m[0] for m in memory])
    mib = np.array([m[1] for m in memory]) / 2**20
    pss = np.array([m[2] for m in memory]) / 2**20
    late = t >= settled_s
    slope, pss_slope, settled = _slope(t, mib), _slope(t, pss), _slope(t[late], mib[late])
    out.update({
        "good_status": {str(k): v for k, v in sorted(good_status.items(), key=str)},
        "good_5xx": sum(v for k, v in good_status.items() if isinstance(k, int) and k >= 500),
        "good_not_200": sum(v for k, v in good_status.items() if k != 200),
        "hostile_status": hostile_status,
        "hostile_answer_ms": {  # how long each hostile request took to be answered
            name: {"p50": _pct(np.array(t), 50), "p99": _pct(np.array(t), 99),
                   "max": max(t) * 1e3} for name, t in hostile_times.items() if t},
        "memory_mib": {"after_warmup": float(mib[0]) if len(mib) else None,
                       "end": float(mib[-1]) if len(mib) else None,
                       "max": float(mib.max()) if len(mib) else None,
                       # each process's own peak, summed: they need not fall at one moment,
                       # so this bounds the peak of the sum from above
                       "peak": peak / 2**20,
                       "pss_after_warmup": float(pss[0]) if len(pss) else None,
                       "pss_end": float(pss[-1]) if len(pss) else None,
                       "pss_max": float(pss.max()) if len(pss) else None,
                       "processes": max((m[3] for m in memory), default=0)},
        "memory_slope_mib_per_min": slope,
        "memory_pss_slope_mib_per_min": pss_slope,
        "memory_settled_from_s": settled_s,
        "memory_settled_slope_mib_per_min": settled,
    })
    return out


REALTIME_PRIORITY = 1
"""the good clients' ``SCHED_FIFO`` priority under ``--good-realtime`` (the lowest: above every
ordinary process, below the kernel's own real-time threads)"""


def _realtime_problem() -> str | None:
    """Why a client process could not run under ``SCHED_FIFO`` (None: it can), tried in a child
    process."""
    if not hasattr(os, "SCHED_FIFO"):
        return "this platform has no SCHED_FIFO"
    try:
        subprocess.run([sys.executable, "-c", "import os; os.sched_setscheduler(0, "
                        f"os.SCHED_FIFO, os.sched_param({REALTIME_PRIORITY}))"],
                       check=True, capture_output=True, timeout=30)
    except subprocess.CalledProcessError:
        return "this user may not set a real-time policy (needs root or CAP_SYS_NICE)"
    return None


def _nice_problem(nice: int) -> str | None:
    """Why a client process could not add ``nice`` to its priority (None: it can), tried in a
    child process so that this one keeps its own."""
    if nice == 0:
        return None
    if not -20 <= nice <= 19:
        return "must lie in [-20, 19]"
    try:
        subprocess.run([sys.executable, "-c", f"import os; os.nice({nice})"], check=True,
                       capture_output=True, timeout=30)
    except subprocess.CalledProcessError:
        return "this user may not raise a process's priority (needs root or CAP_SYS_NICE)"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration-s", type=float, default=None,
                    help="the whole run (600; with --each, what the rounds need)")
    ap.add_argument("--warmup-s", type=float, default=30.0,
                    help="good clients alone before measuring (30)")
    ap.add_argument("--segment-s", type=float, default=20.0,
                    help="alternate segments without and with hostile clients (20)")
    ap.add_argument("--good-clients", type=int, default=2)
    ap.add_argument("--good-rate", type=float, default=100.0,
                    help="single decisions a second per good client (100; 0: back to back)")
    ap.add_argument("--good-batch-rows", type=int, default=64,
                    help="rows in the good clients' batches, every tenth request (64: 49 KB, "
                         "answered on the event loop; 128 or more go to the batch worker)")
    ap.add_argument("--hostile-clients", type=int, default=2)
    ap.add_argument("--max-open", type=int, default=8,
                    help="slow connections each hostile client keeps open at most (8)")
    ap.add_argument("--silent", type=int, default=260,
                    help="silent connections each hostile client keeps open (260)")
    ap.add_argument("--attacks", default=",".join(ATTACKS),
                    help=f"the hostile clients' inputs, comma-separated ({','.join(ATTACKS)})")
    ap.add_argument("--each", action="store_true",
                    help="one attack a segment, each --rounds times, reported apart")
    ap.add_argument("--rounds", type=int, default=2, help="segments each attack gets (2)")
    ap.add_argument("--pin", action="store_true",
                    help="the server's event loop and the good clients on the first CPU, the "
                         "hostile clients on the last")
    ap.add_argument("--pin-worker", action="store_true",
                    help="with --pin, the server's batch worker on the hostile clients' CPU (as "
                         "on a machine with a core to spare for it; by default it keeps every "
                         "CPU, and on two it takes the loop's when the hostile clients fill "
                         "theirs)")
    ap.add_argument("--good-nice", type=int, default=0,
                    help="added to the good clients' CPU priority (0; -5 puts them ahead of the "
                         "server's processes, as clients on other machines would never wait for "
                         "the server's CPU; below 0 needs the privilege to raise a priority)")
    ap.add_argument("--good-realtime", action="store_true",
                    help="the good clients under SCHED_FIFO: a good client woken by its answer "
                         "runs at once, where at any nice it waited for the busy event loop on "
                         "its CPU to reach the end of its time slice (up to a scheduler tick, 4 "
                         "ms here), as clients on other machines never do (needs the privilege "
                         "to set a real-time policy)")
    ap.add_argument("--hostile-nice", type=int, default=0,
                    help="added to the hostile clients' CPU priority (0; 19 leaves the server's "
                         "processes, the batch workers at nice 0 and 10 included, every CPU cycle "
                         "they want first: the hostile clients' own CPU use is then no part of the "
                         "figures, but they send less while the server is busy)")
    ap.add_argument("--repo", type=Path, default=REPO,
                    help="the checkout whose server is soaked (this one; another commit's "
                         "worktree to compare)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    attacks = tuple(a.strip() for a in args.attacks.split(",") if a.strip())
    unknown = sorted(set(attacks) - set(ATTACKS))
    if unknown or not attacks:
        print(f"soak: --attacks takes names from {','.join(ATTACKS)}, got {args.attacks!r}",
              file=sys.stderr)
        return 2
    duration = args.duration_s if args.duration_s is not None else 0.0 if args.each else 600.0
    if args.each:
        if args.rounds < 1:
            print("soak: --rounds must be >= 1", file=sys.stderr)
            return 2
        duration = max(duration, each_duration(args.warmup_s, args.segment_s, len(attacks),
                                               args.rounds))
    if duration < args.warmup_s + 2 * args.segment_s:
        print("soak: --duration-s must cover the warm-up and one segment without and one with "
              "the hostile clients", file=sys.stderr)
        return 2
    for flag, nice in (("--good-nice", args.good_nice), ("--hostile-nice", args.hostile_nice)):
        problem = _nice_problem(nice)
        if problem:
            print(f"soak: {flag} {nice}: {problem}", file=sys.stderr)
            return 2
    problem = _realtime_problem() if args.good_realtime else None
    if problem:
        print(f"soak: --good-realtime: {problem}", file=sys.stderr)
        return 2
    if (min(args.good_clients, args.hostile_clients, args.max_open, args.silent) < 0
            or not args.good_clients or args.good_rate < 0
            or not 1 <= args.good_batch_rows <= 4096):
        print("soak: client counts and the rate must be >= 0, with at least one good client, "
              "and --good-batch-rows between 1 and 4096", file=sys.stderr)
        return 2
    r = soak(duration, args.warmup_s, args.segment_s, args.good_clients, args.hostile_clients,
             args.max_open, attacks, args.each, args.good_rate, args.silent, args.pin,
             args.rounds, args.repo.resolve(), args.pin_worker, args.good_nice,
             args.hostile_nice, args.good_batch_rows, args.good_realtime)
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"soak: {r['duration_s']:.0f} s ({r['warmup_s']:.0f} s warm-up, {r['segment_s']:.0f}-s "
          f"segments), {r['good_clients']} good clients at {r['good_rate']:g}/s and "
          f"{r['hostile_clients']} hostile ({'one attack a segment' if r['each'] else 'mixed'}:"
          f" {', '.join(r['attacks'])}); pinned: {r['pinned']}; machine {r['machine']}")
    g = r["good"]
    for key in ("decisions", "p50_ms", "p99_ms"):
        v = g[key]
        print(f"  {key:<10} without hostile {v['without_hostile']:>10.3f}   with hostile "
              f"{v['with_hostile']:>10.3f}")
    print(f"  p99 ratio (with / without): {g['p99_ratio']:.2f}; good batches "
          f"{r['good_batches']['p99_ratio']:.2f}")
    for name, a in r.get("per_attack", {}).items():
        rounds = ", ".join(f"{x:.2f}" for x in a["p99_ratio_by_round"])
        batch_rounds = ", ".join(f"{x:.2f}" for x in a["batches_p99_ratio_by_round"])
        print(f"  {name:<16} p99 {a['p99_ms']['with_hostile']:7.2f} ms, ratio "
              f"{a['p99_ratio']:.2f} (rounds {rounds}); good batches' ratio "
              f"{a['batches']['p99_ratio']:.2f} (rounds {batch_rounds}); answers "
              f"{a['hostile_status']}")
    print(f"  good answers by status: {r['good_status']} (5xx: {r['good_5xx']})")
    if not r["each"]:
        print(f"  hostile answers by status: {r['hostile_status']}")
    slowest = ", ".join(f"{name} {t['max']:.0f}" for name, t in r["hostile_answer_ms"].items())
    print(f"  hostile requests' slowest answers (ms): {slowest}")
    print(f"  server log errors: {r['server_log_errors']}")
    m = r["memory_mib"]
    print(f"  server memory ({m['processes']} processes, resident sizes summed): "
          f"{m['after_warmup']:.1f} MiB after warm-up, {m['end']:.1f} MiB at the end, peak "
          f"{m['peak']:.1f} MiB, slope {r['memory_slope_mib_per_min']:+.3f} MiB/min; "
          f"proportional {m['pss_after_warmup']:.1f} -> {m['pss_end']:.1f} MiB, slope "
          f"{r['memory_pss_slope_mib_per_min']:+.3f} MiB/min; resident slope from "
          f"{r['memory_settled_from_s']:.0f} s, every attack run once: "
          f"{r['memory_settled_slope_mib_per_min']:+.3f} MiB/min")
    peaks = ", ".join(f"{role} {mib:.1f}" for role, mib in m["peak_by_process"].items())
    print(f"  each process's peak resident size (MiB): {peaks}")
    u = m["unique"]
    if u is None:
        print("  resident pages counted once: not readable here (the page map's frame numbers "
              "need a privileged reader)")
    else:
        print(f"  resident pages counted once ({u['samples']} counts, one every "
              f"{u['every_s']:.0f} s): {u['after_warmup']:.1f} MiB after warm-up, "
              f"{u['end']:.1f} at the end, at most {u['max']:.1f} MiB, slope from "
              f"{r['memory_settled_from_s']:.0f} s {u['settled_slope_mib_per_min']:+.3f} "
              "MiB/min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
