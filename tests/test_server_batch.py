"""The batch route's vectorised path: its answers are pydantic's, byte for byte and error for
error, and the worker process that answers large bodies schedules clients fairly."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np
import pytest
from pydantic import TypeAdapter

from runtime.api import parsing
from runtime.api.batch import answer_batch, decisions_json, defaults_for
from runtime.api.batch_worker import SMALL_LANE_BYTES, BatchWorker, WorkerUnavailable
from runtime.api.heap import TRIM_GROWTH_BYTES, TRIM_INTERVAL_S
from runtime.api.parsing import BodyErrors, _Errors, _validate_rows, parse_batch
from runtime.api.routes.decide import decision_out
from runtime.api.schemas import BatchResponse
from runtime.decider.breaker import CircuitBreaker
from runtime.decider.guard import GuardedDecider
from runtime.decider.onnx_policy import DEFAULT_MAX_POLICY_BYTES
from runtime.knobs import DEFAULT_KNOBS, Knobs
from runtime.observation import OBSERVATION_NAMES, REQUIRED_NAMES, vectors_from_rows
from runtime.steady_cpu import trim_heap
from scripts.soak import limit_file
from tests.conftest import FIXTURES, raw_fields

_RESPONSE = TypeAdapter(BatchResponse)
DEFAULTS = defaults_for(DEFAULT_KNOBS)
OPTIONAL = [n for n in OBSERVATION_NAMES if n not in REQUIRED_NAMES]
BAD_VALUES = [True, None, "1", "1:", -1.0, 2.0, float("nan"), float("inf"), [1], {"a": 1},
              10**400, 1e400]


def reference(rows: list) -> np.ndarray | list:
    """What validating every row with pydantic gives: the array, or the errors."""
    try:
        valid = _validate_rows(rows, ("observations",), _Errors())
    except BodyErrors as e:
        return e.errors
    return np.array([[{**DEFAULTS, **o}[k] for k in OBSERVATION_NAMES] for o in valid],
                    dtype=np.float64).reshape(len(valid), len(OBSERVATION_NAMES))


def random_rows(rng: np.random.Generator, n: int, bad: int) -> list:
    rows = []
    for _ in range(n):
        knobs = Knobs.clamped(float(rng.uniform(5, 200)), float(rng.uniform(64, 16384)),
                              float(rng.uniform(0.4, 0.95)))
        row = raw_fields(knobs, arrival_rate_rps=float(rng.uniform(0, 500)),
                         kv_utilization=float(rng.uniform(0, 1)))
        for name in OPTIONAL:
            if rng.random() < 0.2:
                del row[name]
        if rng.random() < 0.3:  # any key order
            keys = list(row)
            rng.shuffle(keys)
            row = {k: row[k] for k in keys}
        if rng.random() < 0.3:
            row["running_requests"] = int(rng.integers(0, 100))  # an integer
        rows.append(row)
    for _ in range(bad):
        row = rows[int(rng.integers(0, n))]
        kind = rng.integers(0, 4)
        name = OBSERVATION_NAMES[int(rng.integers(0, len(OBSERVATION_NAMES)))]
        if kind == 0:
            row[name] = BAD_VALUES[int(rng.integers(0, len(BAD_VALUES)))]
        elif kind == 1:
            row.pop(name, None)
        elif kind == 2:
            row["unknown_field"] = 1.0
        else:
            rows[int(rng.integers(0, n))] = [] if rng.random() < 0.5 else 3
    return rows


@pytest.mark.parametrize("sliced", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_the_array_path_answers_as_pydantic_does(seed, sliced, monkeypatch):
    """Whole, and cut into slices (small ones here, so that every batch is cut: the worker
    parses large bodies a slice at a time)."""
    if sliced:
        monkeypatch.setattr(parsing, "SLICE_BYTES", 2048)
        monkeypatch.setattr(parsing, "SLICE_ROWS", 7)
    rng = np.random.default_rng(seed)
    n = int(rng.choice([1, 5, 40, 300]))
    rows = random_rows(rng, n, bad=int(rng.integers(0, 3)))
    body = json.dumps({"observations": rows}).encode()
    want = reference(rows)
    try:
        got: np.ndarray | list = parse_batch(body, DEFAULTS)
    except BodyErrors as e:
        got = e.errors
    if isinstance(want, list):
        assert isinstance(got, list), (want[:2], "accepted")
        if got[0]["type"] != "invalid_shape":  # else refused whole by its counts, unparsed
            assert got == want
        else:
            assert len(body) > 8 * 1024
    else:
        assert isinstance(got, np.ndarray), got[:2]
        assert np.array_equal(got, want)


@pytest.mark.parametrize("strings", [["5:"], ["12", "a::"], ["12", ["1::"]]])
def test_string_values_that_keep_the_quote_count_are_refused_as_pydantic_refuses_them(strings):
    """Two quotes a ``:`` is what a body quoting its keys only has, and it sends the values
    straight into the array; string values that keep that count (each holds a ``:``, or another
    value makes up for it) are still refused, with pydantic's errors (a small body: a large one
    is refused unparsed, its commas short of its ``:``)."""
    rng = np.random.default_rng(0)
    rows = random_rows(rng, 5, bad=0)
    for i, value in enumerate(strings):
        rows[3 + i]["running_requests"] = value
    body = json.dumps({"observations": rows}).encode()
    assert parsing._quotes_are_keys(parsing._byte_counts(body, parsing._COUNTED))
    with pytest.raises(BodyErrors) as refused:
        parse_batch(body, DEFAULTS)
    assert refused.value.errors == reference(rows)


def _decider(policy: str = "policy") -> GuardedDecider:
    path = FIXTURES / "policy-test-1.onnx" if policy == "policy" else None
    return GuardedDecider(path, breaker=CircuitBreaker(trip_after=0))


@pytest.mark.parametrize("policy", ["policy", "none"])
def test_the_answer_is_what_pydantic_writes_byte_for_byte(policy):
    """With the policy deciding, the PID (no policy, or a non-finite row) and the static knobs
    (a row the PID cannot read either)."""
    d = _decider(policy)
    rng = np.random.default_rng(7)
    rows = np.array([[{**DEFAULTS, **r}[k] for k in OBSERVATION_NAMES]
                     for r in random_rows(rng, 64, bad=0)])
    x = vectors_from_rows(rows)
    x[3, 0] = np.nan  # the PID decides
    x[5, :] = np.nan  # the static knobs
    columns = d.decide_batch_columns(x)
    want = _RESPONSE.dump_json({"decisions": [decision_out(dd) for dd in d.decide_batch(x)]})
    assert decisions_json(columns) == want
    assert decisions_json(d.decide_batch_columns(x[:0])) == b'{"decisions":[]}'
    sources = {s for s in columns.sources}
    assert sources == ({"policy", "pid", "static"} if policy == "policy" else {"pid", "static"})


def test_a_batch_answer_counts_what_it_decided():
    d = _decider()
    body = json.dumps({"observations": [raw_fields()] * 10}).encode()
    answer = answer_batch(body, d)
    assert answer.status == 200 and answer.stats.tally == {("policy", None): 10}
    assert d.recent.summary()["by_source"]["policy"] == 10
    bad = answer_batch(b'{"observations": [{}]}', d)
    assert bad.status == 422 and bad.stats is None
    assert json.loads(bad.body)["detail"][0]["type"] == "missing"


# ------------------------------------------------------------------------------ the worker
@pytest.fixture(scope="module")
def worker():
    w = BatchWorker()
    assert w.wait_ready()
    yield w
    w.close()


def test_the_worker_answers_as_the_event_loop_does_and_follows_reloads(worker, policy_dir):
    d = GuardedDecider(policy_dir / "policy.onnx", breaker=CircuitBreaker(trip_after=0))
    body = json.dumps({"observations": [raw_fields(arrival_rate_rps=float(i))
                                        for i in range(500)]}).encode()
    answer = worker.submit(d, "a", body, False).result(timeout=30)
    assert answer == answer_batch(body, _decider())._replace(stats=answer.stats)
    d.reload(policy_dir / "policy-v2.onnx")
    after = worker.submit(d, "a", body, False).result(timeout=30)
    assert {x["policy_version"] for x in json.loads(after.body)["decisions"]} == {"test-2"}
    opened = worker.submit(d, "a", body, True).result(timeout=30)  # the server's circuit open
    assert {x["reason"] for x in json.loads(opened.body)["decisions"]} == {"circuit open"}


def test_a_body_handed_over_in_pieces_is_answered_as_the_whole_body(worker):
    """The route hands the worker a large body in the pieces it arrived in, unjoined; a large
    answer comes back as the worker's buffer (a bytearray), equal to the event loop's."""
    body = json.dumps({"observations": [raw_fields(arrival_rate_rps=float(i))
                                        for i in range(700)]}).encode()
    pieces = [body[i:i + 65536] for i in range(0, len(body), 65536)]
    assert len(pieces) > 4
    answer = worker.submit(_decider(), "a", pieces, False).result(timeout=30)
    assert isinstance(answer.body, bytearray) and len(answer.body) > 65536
    assert answer == answer_batch(body, _decider())._replace(stats=answer.stats)


def _queue_and_note(worker, d, jobs: list[tuple[str, str, bytes]]) -> list[str]:
    """Submit ``(name, client, body)`` jobs at once, in order; the names in the order their
    answers came."""
    done: list[str] = []
    lock = threading.Lock()

    def note(name):
        def callback(_):
            with lock:
                done.append(name)
        return callback

    futures = []
    for name, client, body in jobs:
        f = worker.submit(d, client, body, False)
        f.add_done_callback(note(name))
        futures.append(f)
    for f in futures:
        assert f.result(timeout=120).status == 200
    return done


def test_clients_take_turns_at_the_worker(worker):
    """Client A queues six at-cap batches, then B one just over the small lane's limit (both in
    the large lane): B's answer comes before all of A's but the one in progress (the two take
    turns, the least served client next), where a queue would have made it wait for all six."""
    big = json.dumps({"observations": [raw_fields()] * 4096}).encode()
    over = json.dumps({"observations": [raw_fields()] * 500}).encode()
    assert len(over) > SMALL_LANE_BYTES
    done = _queue_and_note(worker, _decider(), [(f"A{k}", "A", big) for k in range(6)]
                           + [("B", "B", over)])
    assert done.index("B") <= 1, done


def test_a_small_batch_does_not_wait_for_the_large_lane(worker, tmp_path):
    """Three policy checks of a file onnxruntime takes milliseconds to refuse (one stage each,
    which no turn can cut) queued, then a 50-row batch from another client: the batch, in the
    small lane's process, is answered before the first check, where in one worker it waited for
    the check in progress."""
    path = tmp_path / "limit.onnx"
    size = 4 * DEFAULT_MAX_POLICY_BYTES  # about 30 ms to refuse: far longer than the batch
    path.write_bytes(limit_file(size))
    small = json.dumps({"observations": [raw_fields()] * 50}).encode()
    assert len(small) <= SMALL_LANE_BYTES
    d = _decider()
    assert worker.submit(d, "B", small, False).result(timeout=60).status == 200  # its copy made
    done: list[str] = []
    checks = [worker.check_policy("A", str(path), size + 1) for _ in range(3)]
    checks[0].add_done_callback(lambda _: done.append("check"))
    batch = worker.submit(d, "B", small, False)
    batch.add_done_callback(lambda _: done.append("batch"))
    assert batch.result(timeout=60).status == 200
    assert {c.result(timeout=60).status for c in checks} == {422}
    assert done == ["batch", "check"]


def test_each_lane_runs_at_its_own_priority():
    w = BatchWorker(nice=7, small_nice=3)
    assert w.wait_ready()
    base = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        for lane, nice in (("small", 3), ("large", 7)):
            proc = w.process(lane)
            assert proc is not None
            assert os.getpriority(os.PRIO_PROCESS, proc.pid) == min(base + nice, 19), lane
    finally:
        w.close()


def test_the_lanes_load_none_of_the_servers_modules(worker):
    """A lane's process maps no asyncio and no ssl (about 3 MiB of each lane's resident size,
    measured), though the server that starts it runs on asyncio."""
    for lane in ("small", "large"):
        proc = worker.process(lane)
        assert proc is not None
        maps = open(f"/proc/{proc.pid}/maps").read()
        assert "_asyncio." not in maps and "_ssl." not in maps, lane
        assert "onnxruntime" in maps, lane  # what it does need is there


def test_a_worker_that_dies_fails_its_batches_and_is_started_again():
    w = BatchWorker()
    assert w.wait_ready()
    d = _decider()
    body = json.dumps({"observations": [raw_fields()] * 4096}).encode()
    future = w.submit(d, "a", body, False)
    w.process("large").kill()  # the process dies under the batch
    with pytest.raises(WorkerUnavailable):
        future.result(timeout=30)
    again = w.submit(d, "a", body, False).result(timeout=60)
    assert again.status == 200
    w.close()


# ------------------------------------------------------------------------- request limits
def test_large_bodies_in_progress_are_bounded_in_bytes():
    """Two large bodies held at once fill a budget of two: the third gets 503 while they are in
    progress, and goes through once they are done (the ASGI middleware alone: it holds under
    any server)."""
    import asyncio

    from runtime.api.request_limits import BodyLimits, RequestLimits

    release = asyncio.Event()
    size = 100_000

    async def app(scope, receive, send):
        body = b""
        more = True
        try:
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
        except Exception as e:  # the 503 raised into the route (FastAPI answers it)
            await send({"type": "http.response.start", "status": e.status_code,
                        "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    limits = RequestLimits(app, BodyLimits(size), max_large_bytes=2 * size)

    async def post() -> int:
        sent = []
        scope = {"type": "http", "path": "/x",
                 "headers": [(b"content-length", str(size).encode())]}
        chunks = [{"type": "http.request", "body": b"x" * (size // 2), "more_body": True},
                  {"type": "http.request", "body": b"x" * (size // 2), "more_body": False}]

        async def receive():
            return chunks.pop(0)

        async def send(message):
            sent.append(message)

        await limits(scope, receive, send)
        return sent[0]["status"]

    async def main():
        held = [asyncio.create_task(post()) for _ in range(2)]
        await asyncio.sleep(0.05)
        third = await post()
        assert limits.large_bytes == 2 * size
        release.set()
        assert await asyncio.gather(*held) == [200, 200]
        assert limits.large_bytes == 0 and limits.in_progress == 0
        return third, await post()

    assert asyncio.run(main()) == (503, 200)


def test_a_large_valid_body_is_parsed_in_slices_that_hold_its_rows(monkeypatch):
    rows = random_rows(np.random.default_rng(3), 300, bad=0)
    body = json.dumps({"observations": rows}, indent=1).encode()  # whitespace everywhere
    counts, problem = parsing._refuse_what_cannot_be_valid(body, 1)
    monkeypatch.setattr(parsing, "SLICE_BYTES", 4096)
    slices = parsing._row_slices(body, counts)
    assert problem is None and slices is not None and len(slices) > 10
    assert [r for s in slices for r in json.loads(parsing._slice(body, s))] == rows
    stages = parsing.batch_rows_stages(body, DEFAULTS)
    steps = 0
    while True:
        try:
            next(stages)
            steps += 1
        except StopIteration as done:
            x = done.value
            break
    assert steps > len(slices) and np.array_equal(x, reference(rows))
    # a key that holds a "}" (not a field name) cuts a slice inside a string: parsed whole
    odd = body.replace(b'"ooms"', b'"oo}ms"', 1)
    counts, _ = parsing._refuse_what_cannot_be_valid(odd, 1)
    assert parsing._row_slices(odd, counts) is None
    with pytest.raises(BodyErrors) as e:
        parse_batch(odd, DEFAULTS)
    assert e.value.errors[0]["loc"] == ("body", "observations", 0, "ooms")


def test_a_turn_runs_a_job_to_its_end_or_for_its_quantum():
    """A small job's stages run in one turn (its batch waits for no other client's stage between
    its own); a long one gives the worker up once the turn has lasted its quantum."""
    from runtime.api.lane import _turn

    def job(stages: int, stage_s: float):
        for _ in range(stages):
            time.sleep(stage_s)
            yield
        return "answer"

    answer, seconds = _turn(job(5, 0.0), quantum_s=1.0)
    assert answer == "answer"
    steps = job(50, 0.01)
    answer, seconds = _turn(steps, quantum_s=0.03)
    assert answer is None and 0.03 <= seconds < 0.5
    assert len(list(steps)) < 48  # it stopped part-way, and resumes where it stopped


def test_a_job_that_raises_is_answered_500():
    from runtime.api.lane import _turn

    def job():
        yield
        raise RuntimeError("boom")

    answer, _ = _turn(job(), quantum_s=1.0)
    assert answer is not None and answer.status == 500


def _rss_anon_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no RssAnon for process {pid}")


@pytest.mark.skipif(not sys.platform.startswith("linux") or not trim_heap(),
                    reason="glibc's malloc_trim and /proc")
def test_the_large_lane_gives_its_heap_back_once_idle(worker):
    """Six 4,096-row batches (half of them refused whole, with pydantic's errors: the largest
    working set) grow the lane's anonymous memory by about 22 MiB; once idle it gives most of it
    back (measured: 37 -> 59 -> 41 MiB; it stayed at 59 without the trimmer)."""
    over = json.dumps({"observations": [raw_fields()] * 500}).encode()
    d = _decider()
    assert worker.submit(d, "a", over, False).result(timeout=60).status == 200
    proc = worker.process("large")
    assert proc is not None
    time.sleep(2 * TRIM_INTERVAL_S)  # any trim due from earlier tests is done
    before = _rss_anon_mib(proc.pid)
    strings = json.dumps({"observations": [dict.fromkeys(raw_fields(), "x")] * 4096}).encode()
    big = json.dumps({"observations": [raw_fields()] * 4096}).encode()
    # the lane trims as soon as it is idle, which may be before this thread reads its size: the
    # growth is the largest size seen while it works
    sizes, done = [], threading.Event()

    def watch():
        while not done.is_set():
            sizes.append(_rss_anon_mib(proc.pid))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        futures = [worker.submit(d, c, b, False) for c in "abc" for b in (strings, big)]
        assert [f.result(timeout=120).status for f in futures] == [422, 200] * 3
    finally:
        done.set()
        watcher.join()
    grown = max(sizes) - before
    assert grown > 2 * TRIM_GROWTH_BYTES / 2**20, grown  # else this measures nothing
    deadline = time.monotonic() + 5 * TRIM_INTERVAL_S
    while _rss_anon_mib(proc.pid) - before > grown / 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _rss_anon_mib(proc.pid) - before <= grown / 2, (before, grown)


def test_a_large_body_is_never_held_parsed_whole():
    """A valid 4 MB batch goes into the array a slice at a time, each slice's rows dropped once
    they are in it: the parse's peak is about the body's size (measured 5.0 MiB for a 3.8 MiB
    body), where parsing every row first held 14 MiB."""
    import tracemalloc

    from scripts.soak import _at_cap_batch

    body = _at_cap_batch()
    tracemalloc.start()
    try:
        x = parse_batch(body, DEFAULTS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert x.shape == (4096, len(OBSERVATION_NAMES))
    assert peak < 2 * len(body), (peak, len(body))


@pytest.mark.parametrize("where", [3, 150, 299])
def test_the_sliced_parse_finds_a_repeated_key_and_too_many_rows_anywhere(where, monkeypatch):
    """Cut into slices of about seven rows, converted as they are parsed: a key given twice in
    any row, and more rows than the limit, are found as when the body is parsed whole."""
    monkeypatch.setattr(parsing, "SLICE_BYTES", 2048)
    monkeypatch.setattr(parsing, "SLICE_ROWS", 7)
    row = dict(raw_fields())
    del row["shed_requests"]
    texts = [json.dumps(row)] * 300
    texts[where] = json.dumps(row)[:-1] + ', "shed_requests": 1, "shed_requests": 2}'
    body = ('{"observations": [' + ", ".join(texts) + "]}").encode()
    with pytest.raises(BodyErrors) as e:
        parse_batch(body, DEFAULTS)
    assert e.value.errors[0]["loc"] == ("body", "observations", where, "shed_requests")
    assert e.value.errors[0]["type"] == "duplicate_key"
    monkeypatch.setattr(parsing, "MAX_BATCH", where)
    fine = ('{"observations": [' + ", ".join([json.dumps(row)] * 300) + "]}").encode()
    with pytest.raises(BodyErrors) as e:
        parse_batch(fine, DEFAULTS)
    assert e.value.errors[0]["type"] == "too_long"
    assert e.value.errors[0]["msg"].endswith("not 300")
