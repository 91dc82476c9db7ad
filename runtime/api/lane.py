"""A lane of the batch worker: the process that answers large batch bodies beside the server.

:class:`runtime.api.batch_worker.BatchWorker` (the server's side) starts one process per lane,
``python -m runtime.api.lane FD NICE``, and talks to it in frames over a socket pair. This module
is that process's side, and the frame format both sides share. It imports what a batch needs
(the parser, the decider, onnxruntime) and nothing of the server's: no asyncio (and through it
no ``ssl``: 3 MiB of each lane's resident size at import, measured), no FastAPI, and pydantic
only once a body needs its errors named.

Jobs are queued per client and run in turns (:func:`serve`); the worker trims its heap when it
is idle (:class:`runtime.api.heap.HeapTrimmer`).
"""

from __future__ import annotations

import json
import os
import pickle
import select
import socket
import struct
import sys
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Generator, Sequence
from typing import Any

from runtime.api.batch import BatchAnswer, batch_stages
from runtime.api.heap import HeapTrimmer, freeze_start_up_objects, return_large_blocks
from runtime.api.parsing import Body
from runtime.decider.guard import GuardedDecider

FRAME_HEADER = struct.Struct("!QQ")
"""a frame: the lengths of its pickled metadata and of its raw payload, then both"""
MAX_DECIDERS = 8
"""decider copies the worker keeps (one per policy loaded recently)"""
TURN_S = 0.002
"""a client's turn at the worker runs its job's stages for at least this long (or to its end):
a small batch is answered in one turn, however many clients wait, where one stage a turn made a
64-row batch wait a stage of every other waiting client's between each of its own"""


def pack_frame(meta: Any, payload: Body | Sequence[bytes] = b"") -> tuple[bytes, Sequence[Body]]:
    """A frame's head and its payload as the pieces to send (a body as it arrived, in pieces,
    is sent without being joined: on the event loop, joining a 4 MB body was a fresh 4 MB
    mapping faulted in)."""
    pieces = (payload,) if isinstance(payload, (bytes, bytearray)) else payload
    m = pickle.dumps(meta, protocol=pickle.HIGHEST_PROTOCOL)
    return FRAME_HEADER.pack(len(m), sum(map(len, pieces))) + m, pieces


class Frames:
    """Frames off a socket, a receive at a time (the server's end is non-blocking, the worker's
    blocking). A large payload is received straight into its buffer, which is returned as it is
    (a ``bytearray``: copying a 1 MB answer into ``bytes`` held the GIL for the copy, and
    faulted a fresh mapping in where such blocks are mapped on their own)."""

    LARGE = 1 << 16
    """a payload this much larger than what has arrived of it is received into its own buffer
    (and frames are received this much at a time until one is)"""
    RECEIVE = 256 * 1024
    """bytes received at a time into a payload's own buffer at most"""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.meta: Any = None
        self.payload: bytearray | None = None  # a large payload being filled
        self.filled = 0
        self.ready: deque[tuple[Any, Body]] = deque()
        """frames received whole and not yet taken (the worker's end)"""

    def receive(self, sock: socket.socket) -> list[tuple[Any, Body]] | None:
        """One receive; the frames it completes, None at the end of the stream."""
        if self.payload is not None:
            view = memoryview(self.payload)[self.filled:]
            got = sock.recv_into(view, min(len(view), self.RECEIVE))
            if not got:
                return None
            self.filled += got
            if self.filled < len(self.payload):
                return []
            done: list[tuple[Any, Body]] = [(self.meta, self.payload)]
            self.meta, self.payload = None, None
            return done
        chunk = sock.recv(self.LARGE)
        if not chunk:
            return None
        self.buf += chunk
        return self._parse()

    def _parse(self) -> list[tuple[Any, Body]]:
        out: list[tuple[Any, Body]] = []
        buf = self.buf
        while len(buf) >= FRAME_HEADER.size:
            meta_len, payload_len = FRAME_HEADER.unpack_from(buf)
            start = FRAME_HEADER.size + meta_len
            if len(buf) < start:
                break
            have = len(buf) - start
            if have >= payload_len:
                meta = pickle.loads(buf[FRAME_HEADER.size:start])
                out.append((meta, bytes(buf[start:start + payload_len]) if payload_len else b""))
                del buf[:start + payload_len]
                continue
            if payload_len - have >= self.LARGE:
                self.meta = pickle.loads(buf[FRAME_HEADER.size:start])
                self.payload = bytearray(payload_len)
                self.payload[:have] = buf[start:]
                self.filled = have
                buf.clear()
            break
        return out


def _copy(spec: dict) -> GuardedDecider:
    from runtime.decider.breaker import CircuitBreaker
    from runtime.decider.decision import MODEL_MISSING
    from runtime.decider.onnx_policy import OnnxPolicy

    policy = OnnxPolicy(spec["model"], spec["name"]) if spec["model"] is not None else None
    decider = GuardedDecider(policy, pid=spec["pid"], static_knobs=spec["static_knobs"],
                             max_step=spec["max_step"], breaker=CircuitBreaker(trip_after=0))
    if policy is None:
        decider.refuse_start_policy(spec["missing"] or MODEL_MISSING, "")
    return decider


def _job(body: Body, decider: GuardedDecider | None,
         circuit_open: bool) -> Generator[None, None, BatchAnswer]:
    """One batch, yielding between its stages (:func:`runtime.api.batch.batch_stages`)."""
    if decider is None:
        return BatchAnswer(503, b'{"detail":"the batch worker could not copy the policy; '
                                b'retry"}', None)
    return (yield from batch_stages(body, decider, circuit_open))


def _check(path: str, max_bytes: int) -> Generator[None, None, BatchAnswer]:
    """One policy check (:meth:`BatchWorker.check_policy`), a single stage."""
    from runtime.decider.onnx_policy import OnnxPolicy, PolicyLoadError

    try:
        OnnxPolicy.load(path, max_bytes)
    except PolicyLoadError as e:
        return BatchAnswer(422, json.dumps({"reason": e.reason, "message": e.message}).encode(),
                           None)
    return BatchAnswer(200, b"", None)
    yield  # a generator, like the batches' jobs


def serve(sock: socket.socket) -> None:
    """Answer the server's frames until it closes its end. Jobs wait per client; each turn
    (:func:`_turn`) runs the job of the client that has had the least of the worker's time since
    it began waiting (a client that starts waiting starts level with the least served one) for
    :data:`TURN_S` or to its end, so a client's small batch is answered after the turn in
    progress, and clients with large batches share the worker equally."""
    deciders: OrderedDict[tuple, GuardedDecider | None] = OrderedDict()
    queues: dict[str, deque] = {}  # the clients with jobs, and their jobs in order
    served: dict[str, float] = {}  # seconds of stages each of them has had while waiting
    reader = Frames()
    trimmer = HeapTrimmer()
    while True:
        # take every frame that has arrived; wait for one when there is nothing to do
        while not queues or reader.ready or select.select([sock], [], [], 0)[0]:
            if not reader.ready:  # a receive: a frame still arriving holds no turn back
                if not queues and trimmer.grown():  # idle: give the large jobs' pages back
                    wait = trimmer.wait_s()
                    if not wait or not select.select([sock], [], [], wait)[0]:
                        trimmer.trim()
                got = reader.receive(sock)
                if got is None:
                    return  # the server closed its end
                reader.ready.extend(got)
                continue
            meta, payload = reader.ready.popleft()
            if meta[0] == "decider":
                _, key, spec = meta
                deciders.pop(key, None)
                try:
                    deciders[key] = _copy(spec)
                except Exception:
                    traceback.print_exc()
                    deciders[key] = None
                while len(deciders) > MAX_DECIDERS:
                    deciders.popitem(last=False)
            elif meta[0] == "ping":
                head, _ = pack_frame((meta[1], 200, None))
                sock.sendall(head)
            elif meta[0] in ("batch", "check"):
                if meta[0] == "batch":
                    _, job, key, client, circuit_open = meta
                    steps = _job(payload, deciders.get(key), circuit_open)
                else:
                    _, job, client, path, max_bytes = meta
                    steps = _check(path, max_bytes)
                if client not in queues:
                    queues[client] = deque()
                    served[client] = min(served.values(), default=0.0)
                queues[client].append((job, steps))
        client = min(served, key=served.__getitem__)
        jobs = queues[client]
        job, steps = jobs[0]
        answer, seconds = _turn(steps)
        served[client] += seconds
        if answer is not None:
            jobs.popleft()
            head, _ = pack_frame((job, answer.status, answer.stats), answer.body)
            sock.sendall(head)
            sock.sendall(answer.body)
            if not jobs:
                del queues[client], served[client]


def _turn(steps: Generator[None, None, BatchAnswer],
          quantum_s: float = TURN_S) -> tuple[BatchAnswer | None, float]:
    """One client's turn at the worker: stages of its job until the job is done or the turn
    has lasted ``quantum_s``; the job's answer (None while it is not done) and the seconds the
    turn took. A job that raises is answered 500."""
    t0 = time.perf_counter()
    try:
        while True:
            next(steps)
            if time.perf_counter() - t0 >= quantum_s:
                return None, time.perf_counter() - t0
    except StopIteration as done:
        return done.value, time.perf_counter() - t0
    except Exception:
        traceback.print_exc()
        return (BatchAnswer(500, b'{"detail":"internal error in the batch worker"}', None),
                time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    """``FD NICE``: serve the socket on descriptor ``FD`` at ``NICE`` below the server's CPU
    priority (the server passes both)."""
    fd, nice = sys.argv[1:] if argv is None else argv
    return_large_blocks()
    try:
        os.nice(int(nice))
    except OSError:
        pass
    sock = socket.socket(fileno=int(fd))
    freeze_start_up_objects()
    try:
        serve(sock)
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        sock.close()


if __name__ == "__main__":
    main()
