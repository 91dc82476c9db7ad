"""Benchmark the decider: in-process decisions against a numpy floor, the REST API on loopback,
the batch route's throughput, and an open-loop load run with a policy reload in the middle.

    python scripts/bench_decider.py            # a table
    python scripts/bench_decider.py --json     # one JSON object
    python scripts/bench_decider.py --load-duration 10   # a shorter load run

The policy is ``checkpoints/shipped/policy.onnx`` when it exists and loads; otherwise a policy
shaped like the real one (OBS_DIM inputs, two tanh layers of 64, NUM_KNOBS outputs) exported as
the tests do (``tests/policy_factory.py``, which needs torch). The output says which.

In-process: the decider, the PID fallback and the floor (the same MLP, its weights read from the
ONNX initializers, evaluated with plain numpy on a 1-D observation) are timed one call at a time
with ``perf_counter_ns``, in interleaved blocks so that all three see the same machine, on one
CPU (the process is pinned) with one BLAS thread. The REST figures come from a real uvicorn
server in a subprocess and an httpx keep-alive client in this one: the client's own time is part
of every figure.
"""

# ruff: noqa: E402  (the BLAS thread count must be set before numpy is imported)
from __future__ import annotations

import os

# one BLAS thread for the numpy floor: set before numpy is imported
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import asyncio
import gc
import importlib.util
import json
import platform
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tyro

REPO = Path(__file__).resolve().parents[1]
"""the source checkout (the synthetic policy's fallback and the server run from it)"""

from runtime.decider.breaker import CircuitBreaker
from runtime.decider.guard import GuardedDecider
from runtime.decider.onnx_policy import SPEC_VERSION_KEY, OnnxPolicy, PolicyLoadError
from runtime.decider.ood_guard import ObservationDistribution
from runtime.knobs import NUM_KNOBS, Knobs
from runtime.locations import shipped_policy_dir
from runtime.observation import (
    OBS_DIM,
    OBSERVATION_FIELDS,
    OBSERVATION_INDEX,
    OBSERVATION_NAMES,
    SPEC_ADAPTERS,
    adapt_vector,
    fields_from_vector,
    vector_from_fields,
)

BATCH_SIZE = 256
GOALS = {  # key: (comparison, bound)
    "ratio_p50": ("<=", 1.2),
    "decide_p99_us": ("<=", 30.0),
    "rest_p99_ms": ("<=", 2.5),
    "batch_decisions_per_s": (">=", 100_000.0),
    "load_errors": ("<=", 0),
    "reload_window_errors": ("<=", 0),
}
"""The decider's own targets: a decision within 1.2x of the same MLP in plain numpy at the
median and 30 us at the 99th percentile, a REST round trip under 2.5 ms at p99, the batch route
at 100,000 decisions a second (256 a request), and no failed request under load or across a
reload."""


# ---------------------------------------------------------------------------------------- setup
def prepare_policies(folder: Path) -> tuple[str, str]:
    """Put the benchmark policy (and a second version for the reload) into ``folder``; returns
    (description, name of the second file)."""
    description = None
    shipped = shipped_policy_dir() / "policy.onnx"
    if shipped.exists():
        try:
            p = OnnxPolicy.load(shipped)
            shutil.copy(shipped, folder / "policy.onnx")
            shutil.copy(shipped, folder / "policy-reload.onnx")
            description = f"shipped: {shipped} ({p.policy_version})"
        except PolicyLoadError as e:
            print(f"warning: the shipped policy was refused ({e}); using a synthetic one",
                  file=sys.stderr)
    if description is None:
        # in a subprocess: the exporter needs torch, and the process measured here should be
        # like the runtime, which never imports it
        code = ("import sys; from pathlib import Path; "
                "from tests.policy_factory import make_mlp, write_policy; f = Path(sys.argv[1]); "
                "write_policy(f / 'policy.onnx', make_mlp(seed=0), policy_version='bench-1'); "
                "write_policy(f / 'policy-reload.onnx', make_mlp(seed=1), "
                "policy_version='bench-2')")
        subprocess.run([sys.executable, "-c", code, str(folder)], cwd=REPO, check=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
        description = (f"synthetic: {OBS_DIM}-64-64-{NUM_KNOBS} tanh MLP exported by "
                       "tests/policy_factory.py (no shipped policy)")
    return description, "policy-reload.onnx"


def observation_pool(n: int, seed: int = 0,
                     distribution: ObservationDistribution | None = None
                     ) -> list[dict[str, float]]:
    """Varied, plausible named observations with SLO attainment above the breaker's target;
    with ``distribution`` (the policy's out-of-distribution guard), the fields it checks drawn
    inside its ranges, so that the policy decides them (outside, the PID would, and the figures
    would time the fallback)."""
    rng = np.random.default_rng(seed)
    inside = _inside_ranges(distribution) if distribution is not None else ()
    pool = []
    for _ in range(n):
        knobs = Knobs.clamped(float(np.exp(rng.uniform(np.log(5), np.log(200)))),
                              float(np.exp(rng.uniform(np.log(64), np.log(16384)))),
                              float(rng.uniform(0.4, 0.95)), float(rng.uniform(0, 1)),
                              float(np.exp(rng.uniform(np.log(0.25), np.log(8)))))
        rate = float(rng.uniform(0, 400))
        f = {
            "arrival_rate_rps": rate, "arrival_rate_change_rps": float(rng.normal(0, 20)),
            "prompt_tokens_mean": float(rng.uniform(50, 4000)),
            "prompt_tokens_std": float(rng.uniform(0, 2000)),
            "waiting_requests": float(rng.integers(0, 200)),
            "waiting_prompt_tokens": float(rng.integers(0, 200_000)),
            "running_requests": float(rng.integers(0, 256)),
            "kv_utilization": float(rng.uniform(0, 1)),
            "kv_fragmentation": float(rng.uniform(0, 0.5)),
            "preemptions": float(rng.integers(0, 3)), "ooms": 0.0,
            "ttft_p99_ratio": float(rng.uniform(0, 2)), "tpot_p99_ratio": float(rng.uniform(0, 2)),
            "slo_attainment": float(rng.uniform(0.95, 1.0)),
            "ttft_p99_ratio_prev": float(rng.uniform(0, 2)),
            "tpot_p99_ratio_prev": float(rng.uniform(0, 2)),
            "kv_utilization_prev": float(rng.uniform(0, 1)),
            "batch_waiting_requests": float(rng.integers(0, 50)),
            "batch_running_requests": float(rng.integers(0, 64)),
            "batch_backlog_tokens": float(rng.integers(0, 2_000_000)),
            "batch_deadline_margin": float(rng.uniform(0, 1)),
            "batch_goodput_tokens_s": float(rng.uniform(0, 20_000)),
            "shed_requests": float(rng.integers(0, 3)),
            "cotenant_demand_fraction": float(rng.uniform(0, 0.5)),
            **knobs.as_dict(),
        }
        if inside:
            v = vector_from_fields(f)
            for i, lo, hi in inside:
                v[i] = rng.uniform(lo, hi)
            back = fields_from_vector(v)
            for i, _, _ in inside:
                name = OBSERVATION_NAMES[i]
                f[name] = back[name]
        pool.append({k: f[k] for k in OBSERVATION_NAMES})
    return pool


def _inside_ranges(distribution: ObservationDistribution) -> list[tuple[int, float, float]]:
    """(vector index, low, high) for each field the guard checks: its range within the field's
    vector span, a little inside both ends so that the round trip through raw values stays in."""
    out = []
    for name, lo, hi in zip(distribution.fields, distribution.low, distribution.high):
        span_lo, span_hi = OBSERVATION_FIELDS[OBSERVATION_INDEX[name]].vector_bounds
        lo, hi = max(lo, span_lo), min(hi, span_hi)
        pad = 0.01 * (hi - lo)
        out.append((OBSERVATION_INDEX[name], lo + pad, hi - pad))
    return out


# ------------------------------------------------------------------------------ the numpy floor
def numpy_floor(path: Path) -> Callable[[np.ndarray], np.ndarray]:
    """The policy's graph as plain numpy calls, for a 1-D observation. Understands the chains the
    exporters write (Gemm/MatMul/Add/Sub/Mul/Div with constant operands, Tanh, Relu, Clip);
    raises ValueError on anything else. A policy of an older spec gets today's vector adapted to
    its spec first, as the runtime feeds it (:data:`runtime.observation.SPEC_ADAPTERS`)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    g = model.graph
    consts = {i.name: numpy_helper.to_array(i).astype(np.float32) for i in g.initializer}
    for node in g.node:
        if node.op_type == "Constant":
            consts[node.output[0]] = numpy_helper.to_array(node.attribute[0].t).astype(np.float32)
    steps: list[Callable[[np.ndarray], np.ndarray]] = []
    spec = {m.key: m.value for m in model.metadata_props}.get(SPEC_VERSION_KEY)
    if spec in SPEC_ADAPTERS:
        steps.append(lambda x, f=SPEC_ADAPTERS[spec]: adapt_vector(x, f))
    current = g.input[0].name
    for node in g.node:
        if node.op_type == "Constant":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        ins = list(node.input)
        if ins[0] != current:
            raise ValueError(f"node {node.name} ({node.op_type}) is not on the single chain")
        op = node.op_type
        if op == "Gemm":
            if attrs.get("transA", 0):
                raise ValueError("Gemm with transA is not supported")
            w = consts[ins[1]] * np.float32(attrs.get("alpha", 1.0))
            w = np.ascontiguousarray(w.T if attrs.get("transB", 0) else w)
            b = (consts[ins[2]] * np.float32(attrs.get("beta", 1.0)) if len(ins) > 2 and ins[2]
                 else np.zeros(w.shape[1], np.float32))
            steps.append(lambda x, w=w, b=b: x @ w + b)
        elif op == "MatMul":
            w = np.ascontiguousarray(consts[ins[1]])
            steps.append(lambda x, w=w: x @ w)
        elif op in ("Add", "Sub", "Mul", "Div"):
            c = consts[ins[1]]
            fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[op]
            steps.append(lambda x, c=c, fn=fn: fn(x, c))
        elif op == "Tanh":
            steps.append(np.tanh)
        elif op == "Relu":
            steps.append(lambda x: np.maximum(x, 0))
        elif op == "Clip":
            lo = float(consts[ins[1]]) if len(ins) > 1 and ins[1] else attrs.get("min", -np.inf)
            hi = float(consts[ins[2]]) if len(ins) > 2 and ins[2] else attrs.get("max", np.inf)
            steps.append(lambda x, lo=lo, hi=hi: np.clip(x, lo, hi))
        elif op == "Identity":
            continue
        else:
            raise ValueError(f"the floor does not evaluate {op} nodes")
        current = node.output[0]

    def evaluate(x: np.ndarray) -> np.ndarray:
        for step in steps:
            x = step(x)
        return x

    return evaluate


def training_distribution(policy_path: Path) -> ObservationDistribution | None:
    """The distribution the policy's out-of-distribution guard checks, if it has one."""
    guard = OnnxPolicy.load(policy_path).ood_guard
    return guard.distribution if guard is not None else None


# ----------------------------------------------------------------------------------- in-process
def percentiles_us(samples_ns: np.ndarray) -> tuple[float, float, float]:
    p50, p99, p999 = np.percentile(samples_ns, [50, 99, 99.9]) / 1e3
    return float(p50), float(p99), float(p999)


def timed_functions(policy_path: Path) -> tuple[dict[str, Callable], list[np.ndarray]]:
    """The three functions timed (the guarded policy, the PID fallback, the numpy floor) and a
    pool of observations inside the policy's training distribution, checked: the floor computes
    the policy's actions, and the policy (not a fallback) decides every observation."""
    policy_decider = GuardedDecider(policy_path, breaker=CircuitBreaker(trip_after=0))
    pool = [vector_from_fields(f)
            for f in observation_pool(1024, distribution=training_distribution(policy_path))]
    pid_decider = GuardedDecider(None)
    floor = numpy_floor(policy_path)
    policy = policy_decider.policy
    worst = max(float(np.max(np.abs(floor(o) - np.asarray(policy.act(o))))) for o in pool[:64])
    if worst > 1e-4:
        raise RuntimeError(f"the numpy floor differs from the ONNX policy by {worst}")
    sources = {policy_decider.decide(o).source for o in pool[:64]}
    if sources != {"policy"}:
        raise RuntimeError(f"the policy decided not every benchmark observation ({sources}): "
                           "the figures would time its fallback")
    assert all(pid_decider.decide(o).source == "pid" for o in pool[:64])
    return {"decide": policy_decider.decide, "pid": pid_decider.decide, "floor": floor}, pool


def bench_in_process(fns: dict[str, Callable], pool: list[np.ndarray], num_calls: int,
                     rounds: int = 30) -> dict:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    per_round = max(1, num_calls // rounds)
    samples = {k: np.empty(per_round * rounds, dtype=np.int64) for k in fns}
    clock = time.perf_counter_ns
    for fn in fns.values():  # warm-up
        for i in range(3000):
            fn(pool[i % 1024])
    for r in range(rounds):
        for name, fn in fns.items():
            out = samples[name]
            base = r * per_round
            gc.collect()
            for i in range(per_round):
                o = pool[i & 1023]
                t0 = clock()
                fn(o)
                out[base + i] = clock() - t0
    # the ratio within each round too: the blocks of a round are ~50 ms apart, so a machine
    # whose speed drifts (other tenants) slows both sides of a round alike
    per_round_ratio = [
        np.median(samples["decide"][r * per_round:(r + 1) * per_round])
        / np.median(samples["floor"][r * per_round:(r + 1) * per_round]) for r in range(rounds)]
    d50, d99, d999 = percentiles_us(samples["decide"])
    p50, p99, p999 = percentiles_us(samples["pid"])
    f50, f99, f999 = percentiles_us(samples["floor"])
    return {"decide_p50_us": d50, "decide_p99_us": d99, "decide_p999_us": d999,
            "floor_p50_us": f50, "floor_p99_us": f99, "floor_p999_us": f999,
            "ratio_p50": d50 / f50,
            "ratio_p50_median_of_rounds": float(np.median(per_round_ratio)),
            "pid_p50_us": p50, "pid_p99_us": p99, "pid_p999_us": p999,
            "in_process_calls": per_round * rounds}


# ---------------------------------------------------------------------------------------- REST
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python -m runtime.server`` in a subprocess on a free port."""

    def __init__(self, policy_dir: Path, token: str, log_path: Path, repo: Path = REPO) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONPATH=str(repo), BATCHPILOT_PORT=str(self.port),
                   BATCHPILOT_POLICY_DIR=str(policy_dir), BATCHPILOT_POLICY_FILE="policy.onnx",
                   BATCHPILOT_RELOAD_TOKEN=token, BATCHPILOT_LOG_LEVEL="warning")
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "runtime.server"], cwd=repo, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}; see "
                                   f"{self.log.name}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the server did not answer /healthz within {timeout_s} s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def bench_rest_latency(url: str, bodies: list[bytes], num_requests: int) -> dict:
    import httpx

    headers = {"content-type": "application/json"}
    lat = np.empty(num_requests, dtype=np.int64)
    with httpx.Client(base_url=url, headers=headers) as client:
        for i in range(300):
            client.post("/v1/decide", content=bodies[i % len(bodies)])
        errors = 0
        for i in range(num_requests):
            t0 = time.perf_counter_ns()
            r = client.post("/v1/decide", content=bodies[i % len(bodies)])
            lat[i] = time.perf_counter_ns() - t0
            errors += r.status_code != 200
    p50, p99 = np.percentile(lat, [50, 99]) / 1e6
    return {"rest_p50_ms": float(p50), "rest_p99_ms": float(p99), "rest_requests": num_requests,
            "rest_errors": errors}


def bench_batch(url: str, bodies: list[bytes], duration_s: float, num_clients: int = 2) -> dict:
    """Decisions per second through the batch route, ``num_clients`` keep-alive connections
    sending back to back (so the server is never idle while a client reads an answer). The
    client is the load run's (prebuilt HTTP/1.1 requests on asyncio streams, :func:`_post`):
    httpx spent about 1.4 ms of CPU on each 256-row request (260 KB out, 63 KB back), a fifth of
    this 2-core machine at the route's rate, which the server's figure was charged for.
    ``batch_client_cpu_ms`` is what the client spent a request."""
    host, port = url.removeprefix("http://").split(":")
    requests = [(b"POST /v1/decide/batch HTTP/1.1\r\nHost: " + host.encode() +
                 b"\r\nContent-Type: application/json\r\nContent-Length: " +
                 str(len(b)).encode() + b"\r\n\r\n" + b) for b in bodies]

    async def run() -> tuple[list[int], list[int], float, float]:
        conns = [_Connections(host, int(port)) for _ in range(num_clients)]
        for r in requests[:5]:
            await _post(conns[0], r)
        done = [0] * num_clients
        errors = [0] * num_clients
        stop_at = time.perf_counter() + duration_s

        async def client(k: int) -> None:
            i = k
            while time.perf_counter() < stop_at:
                status, _ = await _post(conns[k], requests[i % len(requests)])
                if status == 200:
                    done[k] += 1
                else:
                    errors[k] += 1
                i += num_clients

        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(client(k) for k in range(num_clients)))
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        for c in conns:
            c.close()
        return done, errors, elapsed, cpu

    done, errors, elapsed, cpu = asyncio.run(run())
    n = max(1, sum(done))
    return {"batch_decisions_per_s": sum(done) * BATCH_SIZE / elapsed, "batch_size": BATCH_SIZE,
            "batch_requests": sum(done), "batch_errors": sum(errors),
            "batch_request_ms": elapsed / n * 1e3 * num_clients,
            "batch_client_cpu_ms": cpu / n * 1e3}


class _Connections:
    """Keep-alive HTTP/1.1 connections for the load generator: one per request in flight, the
    most recently used reused first, a new one opened when none is free (an open loop does not
    wait for a connection). Connections idle for longer than ``max_idle_s`` are dropped, as
    client pools do, before the server's keep-alive timeout (uvicorn: 5 s) closes them under a
    request."""

    def __init__(self, host: str, port: int, max_idle_s: float = 2.0) -> None:
        self.host, self.port = host, port
        self.max_idle_s = max_idle_s
        self.free: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []
        self.opened = 0

    async def get(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        now = time.perf_counter()
        while self.free:
            reader, writer, last_used = self.free.pop()
            if now - last_used < self.max_idle_s:
                return reader, writer
            writer.close()
        self.opened += 1
        return await asyncio.open_connection(self.host, self.port)

    def put(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.free.append((*conn, time.perf_counter()))

    def close(self) -> None:
        for _, w, _ in self.free:
            w.close()


async def _post(conns: _Connections, request: bytes) -> tuple[int, bytes]:
    conn = await conns.get()
    reader, writer = conn
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    body = await reader.readexactly(length)
    if b"connection: close" in head.lower():
        writer.close()
    else:
        conns.put(conn)
    return status, body


def bench_load(url: str, bodies: list[bytes], token: str, reload_name: str, rate_rps: float,
               duration_s: float) -> dict:
    """Open loop: request i is sent at ``start + i / rate`` whatever happened to the others, and
    its latency counts from then (a server that falls behind is charged for the queueing). A
    reload is posted half-way through. The generator speaks HTTP/1.1 over asyncio streams with
    prebuilt requests (~50 us of client CPU a request, against ~650 us for httpx on this
    machine), so that at 500 requests per second the client does not starve the server of CPU."""
    import httpx

    host, port = url.removeprefix("http://").split(":")
    requests = [(b"POST /v1/decide HTTP/1.1\r\nHost: " + host.encode() +
                 b"\r\nContent-Type: application/json\r\nContent-Length: " +
                 str(len(b)).encode() + b"\r\n\r\n" + b) for b in bodies]
    total = int(rate_rps * duration_s)
    latency = np.full(total, np.nan)
    errors: list[tuple[float, str]] = []
    versions: dict[str, int] = {}
    sources: dict[str, int] = {}
    reload_info: dict = {}

    async def one(conns: _Connections, i: int, due: float, t0: float) -> None:
        try:
            status, body = await asyncio.wait_for(_post(conns, requests[i % len(requests)]), 10.0)
            latency[i] = time.perf_counter() - due
            if status != 200:
                errors.append((due - t0, f"HTTP {status}: {body[:200]!r}"))
                return
            answer = json.loads(body)
            versions[answer["policy_version"]] = versions.get(answer["policy_version"], 0) + 1
            sources[answer["source"]] = sources.get(answer["source"], 0) + 1
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as e:
            latency[i] = time.perf_counter() - due
            errors.append((due - t0, f"{type(e).__name__}: {e}"))

    def reload() -> None:
        t0 = time.perf_counter()
        try:
            r = httpx.post(url + "/v1/policy/reload", json={"name": reload_name},
                           headers={"Authorization": f"Bearer {token}"}, timeout=30)
        except httpx.TransportError as e:  # an overloaded machine: report it, do not stop
            reload_info.update(status=0, t0=t0, t1=time.perf_counter(),
                               version=f"{type(e).__name__}: {e}")
            return
        reload_info.update(status=r.status_code, t0=t0, t1=time.perf_counter(),
                           version=r.json().get("policy", {}).get("policy_version")
                           if r.status_code == 200 else r.text[:200])

    async def run() -> tuple[float, int]:
        conns = _Connections(host, int(port))
        t0 = time.perf_counter() + 0.2
        tasks = []
        reload_task = None
        for i in range(total):
            due = t0 + i / rate_rps
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if reload_task is None and due - t0 >= duration_s / 2:
                reload_task = asyncio.create_task(asyncio.to_thread(reload))
            tasks.append(asyncio.create_task(one(conns, i, due, t0)))
        await asyncio.gather(*tasks)
        if reload_task is not None:
            await reload_task
        conns.close()
        reload_info["start"] = reload_info["t0"] - t0
        reload_info["end"] = reload_info["t1"] - t0
        return time.perf_counter() - t0, conns.opened

    elapsed, opened = asyncio.run(run())
    window = (reload_info["start"] - 1.0, reload_info["end"] + 1.0)
    in_window = [e for t, e in errors if window[0] <= t <= window[1]]
    lat_ms = latency[np.isfinite(latency)] * 1e3
    return {"load_rps": rate_rps, "load_duration_s": duration_s, "load_requests": total,
            "load_achieved_rps": total / elapsed, "load_connections": opened,
            "load_errors": len(errors),
            "load_p50_ms": float(np.percentile(lat_ms, 50)),
            "load_p99_ms": float(np.percentile(lat_ms, 99)),
            "load_max_ms": float(lat_ms.max()),
            "reload_status": reload_info["status"],
            "reload_ms": (reload_info["end"] - reload_info["start"]) * 1e3,
            "reload_at_s": reload_info["start"], "reload_window_errors": len(in_window),
            "load_policy_versions": versions, "load_sources": sources,
            "load_first_errors": [e for _, e in errors[:5]]}


# ---------------------------------------------------------------------------------------- main
def verdicts(result: dict) -> dict[str, bool]:
    out = {}
    for key, (op, bound) in GOALS.items():
        if key in result:
            v = result[key]
            out[key] = v <= bound if op == "<=" else v >= bound
    out["pid_no_slower"] = result["pid_p50_us"] <= result["decide_p50_us"] * 1.05
    return out


@dataclass
class Args:
    json: bool = False
    """print one JSON object"""
    calls: int = 30_000
    """in-process decisions timed per function"""
    rest_requests: int = 3000
    """sequential POST /v1/decide requests timed"""
    batch_duration: float = 5.0
    """seconds of batch-route throughput"""
    load_duration: float = 60.0
    """seconds of the open-loop load run"""
    load_rps: float = 500.0
    """request rate of the load run"""
    no_rest: bool = False
    """in-process figures only"""
    spaced_calls: int = 40
    """calls of each function timed one every ``spaced_gap_s`` (0: none)"""
    spaced_gap_s: float = 0.05
    """seconds between two spaced calls (a server decides once an interval, 0.25 s by
    default; on the project machine 50 ms leave the caches as cold as 250 ms)"""
    repo: Path = REPO
    """the checkout whose server the REST figures are taken from (this one; another commit's
    worktree, to compare two servers with the same client)"""


def bench_spaced(fns: dict[str, Callable], pool: list[np.ndarray], num_calls: int,
                 gap_s: float) -> dict:
    """The same three functions, one call every ``gap_s`` (in turn), as a server deciding once
    an interval calls them: between two decisions the machine runs other work, or sleeps, and
    the next decision finds its code and data out of the caches. The back-to-back figures above
    time a hot loop; these time what one interval's decision costs."""
    for fn in fns.values():  # the first calls' one-time costs
        for i in range(100):
            fn(pool[i])
    samples: dict[str, list[int]] = {k: [] for k in fns}
    clock = time.perf_counter_ns
    for i in range(num_calls):
        for name, fn in fns.items():
            time.sleep(gap_s)
            o = pool[i & 1023]
            t0 = clock()
            fn(o)
            samples[name].append(clock() - t0)
    out: dict = {"spaced_gap_s": gap_s, "spaced_calls": num_calls}
    for name, ns in samples.items():
        us = np.asarray(ns) * 1e-3
        out[f"spaced_{name}_p50_us"] = float(np.percentile(us, 50))
        out[f"spaced_{name}_p90_us"] = float(np.percentile(us, 90))
    return out


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.split("\n\n")[0])
    if importlib.util.find_spec("onnx") is None:
        print("batchpilot bench decider: the numpy floor reads the policy's weights with the "
              "onnx package, which the runtime alone does not install: pip install onnx",
              file=sys.stderr)
        return 2

    result: dict = {"machine": {"cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
                                "python": platform.python_version(),
                                "onnxruntime": __import__("onnxruntime").__version__}}
    with tempfile.TemporaryDirectory(prefix="bench-decider-") as tmp:
        folder = Path(tmp)
        result["policy"], reload_name = prepare_policies(folder)
        fns, pool = timed_functions(folder / "policy.onnx")
        result.update(bench_in_process(fns, pool, args.calls))
        if args.spaced_calls:
            result.update(bench_spaced(fns, pool, args.spaced_calls, args.spaced_gap_s))
        if not args.no_rest:
            if hasattr(os, "sched_setaffinity"):  # the client may use every CPU again
                os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
            token = secrets.token_urlsafe(16)
            pool = observation_pool(4096, seed=1,
                                    distribution=training_distribution(folder / "policy.onnx"))
            single = [json.dumps(o).encode() for o in pool[:1024]]
            batches = [json.dumps({"observations": pool[i:i + BATCH_SIZE]}).encode()
                       for i in range(0, len(pool), BATCH_SIZE)]
            server = Server(folder, token, folder / "server.log", args.repo)
            result["server_repo"] = str(args.repo)
            try:
                server.wait_ready()
                result.update(bench_rest_latency(server.url, single, args.rest_requests))
                result.update(bench_batch(server.url, batches, args.batch_duration))
                result.update(bench_load(server.url, single, token, reload_name, args.load_rps,
                                         args.load_duration))
            finally:
                server.stop()
        result["machine"]["load_avg_1m_end"] = os.getloadavg()[0]
    result["goals_met"] = verdicts(result)

    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"policy: {result['policy']}")
    print(f"machine: {result['machine']}")
    rows = [("in-process decision (policy)", "decide"), ("PID fallback decision", "pid"),
            ("numpy floor (same MLP)", "floor")]
    print(f"\n{'':32s} {'p50 us':>9s} {'p99 us':>9s} {'p99.9 us':>9s}")
    for label, k in rows:
        print(f"{label:32s} {result[k + '_p50_us']:9.1f} {result[k + '_p99_us']:9.1f} "
              f"{result[k + '_p999_us']:9.1f}")
    print(f"p50 ratio to the floor: {result['ratio_p50']:.2f}")
    if "spaced_gap_s" in result:
        print(f"\none call every {result['spaced_gap_s'] * 1e3:.0f} ms, as a server decides "
              f"(cold caches), {result['spaced_calls']} calls each:")
        for label, k in rows:
            print(f"{label:32s} p50 {result[f'spaced_{k}_p50_us']:9.1f} us, "
                  f"p90 {result[f'spaced_{k}_p90_us']:9.1f} us")
    if "rest_p50_ms" in result:
        print(f"\nREST /v1/decide keep-alive: p50 {result['rest_p50_ms']:.3f} ms, "
              f"p99 {result['rest_p99_ms']:.3f} ms")
        print(f"REST /v1/decide/batch ({BATCH_SIZE} a request): "
              f"{result['batch_decisions_per_s']:,.0f} decisions/s")
        print(f"load {result['load_rps']:.0f} req/s for {result['load_duration_s']:.0f} s: "
              f"{result['load_errors']} errors, p50 {result['load_p50_ms']:.2f} ms, "
              f"p99 {result['load_p99_ms']:.2f} ms; reload at {result['reload_at_s']:.1f} s "
              f"-> {result['reload_status']} in {result['reload_ms']:.0f} ms, "
              f"{result['reload_window_errors']} failed requests around it; versions "
              f"{result['load_policy_versions']}")
        for e in result["load_first_errors"]:
            print(f"  load error: {e}")
    print("\ngoals: " + ", ".join(f"{k} {'met' if v else 'MISSED'}"
                                  for k, v in result["goals_met"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
