"""Large batch bodies answered in processes of their own, scheduled fairly between clients.

Parsing, deciding and answering a 4,096-row batch takes tens of milliseconds of CPU, and most
of it holds Python's GIL (the JSON parser builds Python objects): on the server's event loop, or
on a thread beside it, two clients posting such batches back to back raised every other
client's p99 twentyfold. So batch bodies over :data:`runtime.api.routes.decide.INLINE_BODY_BYTES`
go to a worker process: the event loop only moves bytes. There are two such workers, lanes:
one for bodies up to :data:`SMALL_LANE_BYTES`, at the server's CPU priority by default
(:data:`SMALL_LANE_NICE`, ``BATCHPILOT_BATCH_WORKER_SMALL_NICE``), and one for larger bodies and
reloads' policy checks, at a lower priority (nice :data:`WORKER_NICE` by default,
``BATCHPILOT_BATCH_WORKER_NICE``), so that the operating system gives its CPU to the loop first
and a small batch never waits behind a large one (see :class:`BatchWorker`).

Each worker keeps a copy of the server's decider (the policy's bytes, the PID, the static knobs,
the slew rate), sent once for each policy the server has loaded; a reload sends the new one
before any batch that should see it, so each batch runs wholly on one policy. Jobs are queued
per client (connection) and run in turns of a couple of milliseconds (stages: a slice of the
parse, of the decisions or of the answer, up to :data:`runtime.api.lane.TURN_S`), the next turn
always the waiting client's that has had the least of the worker's time (fair queuing): a
client's small batch is answered whole in one turn after the turn in progress, never behind
a queue of the others' large ones, and clients with large batches share the worker equally.
The worker answers with the bytes of the HTTP answer and what the batch did to the decider
(:class:`runtime.api.batch.BatchStats`), which the server applies to its own.

The server process talks to each over a socket pair, read and written by callbacks of the
serving event loop (see :class:`BatchWorker`); the route awaits a future. A worker that dies fails
the batches in flight with :class:`WorkerUnavailable` (the route answers 503) and is started
again for the next one. It exits when the server does (end of file on its socket). The
processes' side, and the frames both sides send, are :mod:`runtime.api.lane`.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from runtime.api.batch import BatchAnswer
from runtime.api.lane import MAX_DECIDERS, Frames, pack_frame
from runtime.api.parsing import Body
from runtime.decider.guard import GuardedDecider

WORKER_NICE = 10
"""how much lower the large lane's CPU priority is than the server's, by default"""
SMALL_LANE_NICE = 0
"""how much lower the small lane's CPU priority is than the server's, by default: the same. Its
jobs are bounded (bodies up to :data:`SMALL_LANE_BYTES`, queued fairly), and at nice 10 a small
batch waited for a CPU behind every busy process: under hostile clients that kept the event loop
and their own CPU busy (380k-key bodies, 96 MB headers), a 64-row batch's p99 was 28-43 ms at
nice 10 and 14-17 ms at nice 0, the single decisions' p99 2.7-2.9 ms against 2.0-3.0 ms"""


SMALL_LANE_BYTES = 256 * 1024
"""batch bodies up to this size (about 350 observations) go to the small lane's worker, larger
ones to the large lane's (see :class:`BatchWorker`)"""
LANES = ("small", "large")


class WorkerUnavailable(RuntimeError):
    """The worker died or could not start; the batches in flight are lost (the route answers
    503, and the next batch starts a new worker)."""


def _pieces(head: bytes, payload: Sequence[Body]) -> deque[memoryview]:
    return deque([memoryview(head), *(memoryview(piece) for piece in payload if piece)])


def decider_spec(decider: GuardedDecider) -> tuple[tuple, Callable[[], dict]]:
    """A key naming the decider's current state, and a function building what a copy needs."""
    policy, missing = decider.active
    key = (id(decider), id(policy), policy.sha256 if policy is not None else None, missing,
           decider.max_step, decider.static_knobs)

    def spec() -> dict:
        return {"model": policy.model_bytes if policy is not None else None,
                "name": policy.path.name if policy is not None and policy.path else None,
                "missing": missing, "pid": decider.pid, "static_knobs": decider.static_knobs,
                "max_step": decider.max_step}

    return key, spec


WRITE_BYTES = 256 * 1024
"""bytes sent to a lane in one of the event loop's callbacks at most: a 4 MB body goes in
slices that each take tens of microseconds, other clients' answers between them"""


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _Generation:
    """One worker process, what is in flight with it, and the event loop that does its I/O."""

    def __init__(self, nice: int, loop: asyncio.AbstractEventLoop) -> None:
        parent, child = socket.socketpair()
        parent.setblocking(False)
        self.sock = parent
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "runtime.api.lane", str(child.fileno()),
                 str(nice)],
                pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL)
        finally:
            child.close()
        self.pending: dict[int, Future] = {}
        self.specs: OrderedDict[tuple, None] = OrderedDict()
        """the decider copies the worker holds: the same keys, evicted in the same order"""
        self.control: deque[deque[memoryview]] = deque()
        """frames to send before any client's (decider copies, pings), in order"""
        self.outbox: OrderedDict[str, deque[deque[memoryview]]] = OrderedDict()
        """each client's frames still to send, in order; the clients take turns, a whole frame
        each (these and :attr:`control` are changed under the worker's lock)"""
        self.sending: deque[memoryview] = deque()
        """what is left of the frame being sent"""
        self.frames = Frames()
        self.loop = loop
        """the loop whose callbacks send and receive (changed only on that loop's thread)"""
        self.registered = False
        """the socket's reader is added to :attr:`loop`"""
        self.writing = False
        """and its writer too (while there is what the socket would not take)"""
        self.dead = False

    def next_frame(self) -> deque[memoryview] | None:
        """The frame to send next: a control frame, else the first of the next client's in
        turn (called with the worker's lock held)."""
        if self.control:
            return self.control.popleft()
        if not self.outbox:
            return None
        client, frames = self.outbox.popitem(last=False)
        frame = frames.popleft()
        if frames:
            self.outbox[client] = frames  # its next frame after every other client's
        return frame

    def has_more(self) -> bool:
        return bool(self.sending or self.control or self.outbox)

    def clear(self) -> None:
        self.control.clear()
        self.outbox.clear()
        self.sending.clear()


class BatchWorker:
    """The server side: :meth:`submit` a body, await the future's :class:`BatchAnswer`.

    Two processes (lanes): bodies up to :data:`SMALL_LANE_BYTES` go to one, larger bodies and
    policy checks to the other, at a lower priority. The worker reads its frames in order off
    one socket and all of its CPU is a process's share, so in one process a small batch waited
    behind the large frames sent before it (each read whole before its turn) and behind their
    turns: under two clients posting 3 MB bodies back to back, a 64-row batch waited up to 33 ms
    there, where it takes 0.4 ms. In a lane of their own, small bodies wait only for each
    other, fairly, and the operating system shares the CPU between the two lanes.

    The lanes' sockets are read and written by callbacks of one event loop, at most
    :data:`WRITE_BYTES` a callback: the serving loop once :meth:`attach` is called on it (the
    server's start-up does), else a loop of the worker's own on a thread. On the serving loop no
    thread of the server needs Python's GIL besides the loop's: with a sender and a receiver
    thread, a thread that woke on another CPU held the loop back whenever the loop had to hand
    it the GIL (Python's switch interval) and the thread then waited for that CPU, behind
    whatever ran there (under clients posting 256 KB batches back to back, a single decision's
    p99 3.0-3.8 ms; with those threads on the loop's CPU, 2.5-2.9 ms).

    :param nice: how much lower the large lane's CPU priority is than this process's
    :param small_nice: the same for the small lane
    """

    def __init__(self, nice: int = WORKER_NICE, small_nice: int = SMALL_LANE_NICE) -> None:
        self.nice = nice
        self.small_nice = small_nice
        self._lock = threading.Lock()
        self._gens: dict[str, _Generation | None] = dict.fromkeys(LANES)
        self._ids = itertools.count()
        self._attached: asyncio.AbstractEventLoop | None = None
        self._own: asyncio.AbstractEventLoop | None = None
        self.io_thread: threading.Thread | None = None
        """the thread of the worker's own loop, None until a lane's I/O needs it (never, while
        served: see :meth:`attach`)"""

    # -- which loop does the I/O
    def attach(self) -> None:
        """Do the lanes' I/O on the running event loop from now on (until :meth:`detach`);
        while another loop is attached, nothing changes."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._attached is not None:
                return
            self._attached = loop
            gens = self._live()
        for gen in gens:
            self._move(gen, loop)

    def detach(self) -> None:
        """Hand the I/O the running loop does back to the worker's own loop (the serving loop
        is about to stop)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._attached is not loop:
                return
            self._attached = None
            own = self._own_loop()
            gens = self._live()
        for gen in gens:
            self._move(gen, own)

    def _own_loop(self) -> asyncio.AbstractEventLoop:
        """The worker's own loop, on a thread started the first time it is needed (called with
        the lock held)."""
        if self._own is None:
            self._own = asyncio.new_event_loop()
            self.io_thread = threading.Thread(target=self._own.run_forever, daemon=True,
                                              name="batchpilot-worker-io")
            self.io_thread.start()
        return self._own

    def _live(self) -> list[_Generation]:
        return [g for g in self._gens.values() if g is not None and not g.dead]

    def _on(self, gen: _Generation, callback: Callable[[_Generation], None]) -> None:
        """Run ``callback(gen)`` on the loop that does ``gen``'s I/O: now when that is the
        running one, else soon (a generation whose loop is closed is lost)."""
        loop = gen.loop
        if _running_loop() is loop:
            callback(gen)
            return
        try:
            loop.call_soon_threadsafe(callback, gen)
        except RuntimeError:  # closed: nothing will ever send or receive for it
            self._lost(gen)

    def _move(self, gen: _Generation, new: asyncio.AbstractEventLoop) -> None:
        def release(g: _Generation) -> None:
            self._unregister(g)
            g.loop = new
            self._on(g, self._kick)

        self._on(gen, release)

    def _kick(self, gen: _Generation) -> None:
        """On ``gen``'s loop: its reader added if it is not yet, and what it has to send sent
        (a generation that moved meanwhile is kicked on its new loop)."""
        if gen.dead:
            return
        if _running_loop() is not gen.loop:
            self._on(gen, self._kick)
            return
        if not gen.registered:
            gen.loop.add_reader(gen.sock.fileno(), self._read, gen)
            gen.registered = True
        self._write(gen)

    def _unregister(self, gen: _Generation) -> None:
        if gen.registered:
            try:
                gen.loop.remove_reader(gen.sock.fileno())
                if gen.writing:
                    gen.loop.remove_writer(gen.sock.fileno())
            except RuntimeError:  # a closed loop holds no callback any more
                pass
            gen.registered = gen.writing = False

    # -- the lanes
    def start(self) -> None:
        """Start the processes now (else the first batches do): each takes about a second to
        import what it needs."""
        with self._lock:
            gens = [self._generation(lane) for lane in LANES]
        for gen in gens:
            self._on(gen, self._kick)

    def wait_ready(self, timeout_s: float = 60.0) -> bool:
        """Start the processes if need be and wait until both answer (False: not within
        ``timeout_s``). Not on the loop that does the I/O (see :meth:`attach`)."""
        futures = [self._enqueue(lane, None, lambda job: pack_frame(("ping", job)))
                   for lane in LANES]
        deadline = time.monotonic() + timeout_s
        try:
            for future in futures:
                future.result(timeout=max(deadline - time.monotonic(), 0.0))
            return True
        except (TimeoutError, WorkerUnavailable):
            return False

    def process(self, lane: str) -> subprocess.Popen | None:
        """The process of a lane (``small`` or ``large``), None before it starts."""
        gen = self._gens[lane]
        return gen.proc if gen is not None else None

    def _generation(self, lane: str) -> _Generation:
        gen = self._gens[lane]
        if gen is None or gen.dead:
            gen = _Generation(self.small_nice if lane == "small" else self.nice,
                              self._attached or self._own_loop())
            self._gens[lane] = gen
        return gen

    def submit(self, decider: GuardedDecider, client: str, body: bytes | Sequence[bytes],
               circuit_open: bool) -> Future:
        """Queue ``body`` (whole, or in the pieces it arrived in) for the worker of its lane;
        the future resolves to its :class:`BatchAnswer`, or fails with
        :class:`WorkerUnavailable`."""
        key, spec = decider_spec(decider)
        size = len(body) if isinstance(body, (bytes, bytearray)) else sum(map(len, body))
        return self._enqueue("small" if size <= SMALL_LANE_BYTES else "large", client,
                             lambda job: pack_frame(("batch", job, key, client, circuit_open),
                                                    body),
                             (key, spec))

    def check_policy(self, client: str, path: str, max_bytes: int) -> Future:
        """Have the worker load the policy at ``path`` as a reload would and drop it: the future
        resolves to a :class:`BatchAnswer` whose status is 200 (it loads) or 422 with the
        refusal's ``reason`` and ``message`` as its JSON body, or fails with
        :class:`WorkerUnavailable`. A reload checks its file here first, so that refusing a file
        (reading it, onnxruntime parsing it: tens of milliseconds of CPU) costs the worker's
        lower-priority CPU, in the large lane, queued fairly with the large batches, and never
        the event loop's."""
        return self._enqueue("large", client,
                             lambda job: pack_frame(("check", job, client, path, max_bytes)))

    def _enqueue(self, lane: str, client: str | None,
                 frame: Callable[[int], tuple[bytes, Sequence[Body]]],
                 decider: tuple[tuple, Callable[[], dict]] | None = None) -> Future:
        """Send the frame ``frame(job)`` makes to the worker of ``lane`` in ``client``'s turn
        (None: before any client's), preceded by the decider's copy (``(key, spec)``) when
        that worker does not hold it yet; the future resolves to the job's answer. The
        clients' frames are sent in turns, so that a client's batch waits at most for one frame
        of each other client's to be sent, never for all the large bodies queued before it."""
        future: Future = Future()
        with self._lock:
            try:
                gen = self._generation(lane)
            except OSError as e:
                future.set_exception(WorkerUnavailable(f"the batch worker cannot start: {e}"))
                return future
            if decider is not None and decider[0] not in gen.specs:
                key, spec = decider
                gen.specs[key] = None
                while len(gen.specs) > MAX_DECIDERS:
                    gen.specs.popitem(last=False)
                gen.control.append(_pieces(*pack_frame(("decider", key, spec()))))
            job = next(self._ids)
            gen.pending[job] = future
            pieces = _pieces(*frame(job))
            if client is None:
                gen.control.append(pieces)
            else:
                gen.outbox.setdefault(client, deque()).append(pieces)
        self._on(gen, self._kick)
        return future

    def _write(self, gen: _Generation) -> None:
        """Send what the socket takes of the frames to send, up to :data:`WRITE_BYTES`; the
        writer stays added while anything is left."""
        if gen.dead or not gen.registered:
            return  # _kick writes once the socket is the loop's
        budget = WRITE_BYTES
        try:
            while budget > 0:
                if not gen.sending:
                    with self._lock:
                        frame = gen.next_frame()
                    if frame is None:
                        break
                    gen.sending = frame
                piece = gen.sending[0]
                sent = gen.sock.send(piece[:budget])
                budget -= sent
                if sent == len(piece):
                    gen.sending.popleft()
                else:
                    gen.sending[0] = piece[sent:]
        except BlockingIOError:
            pass
        except OSError:
            self._lost(gen)
            return
        with self._lock:
            more = gen.has_more()
        if more and not gen.writing:
            gen.loop.add_writer(gen.sock.fileno(), self._write, gen)
            gen.writing = True
        elif not more and gen.writing:
            gen.loop.remove_writer(gen.sock.fileno())
            gen.writing = False

    def _read(self, gen: _Generation) -> None:
        """One receive off the socket, and the answers it completes."""
        try:
            frames = gen.frames.receive(gen.sock)
        except BlockingIOError:
            return
        except (OSError, pickle.UnpicklingError, EOFError, ValueError):
            frames = None
        if frames is None:
            self._lost(gen)
            return
        for (job, status, stats), body in frames:
            future = gen.pending.pop(job, None)
            if future is not None and not future.cancelled():
                future.set_result(BatchAnswer(status, body, stats))

    def _lost(self, gen: _Generation) -> None:
        with self._lock:
            if gen.dead:
                return
            gen.dead = True
            pending, gen.pending = gen.pending, {}
            gen.clear()

        def close(g: _Generation) -> None:
            self._unregister(g)
            g.sock.close()

        if _running_loop() is gen.loop:
            close(gen)
        else:
            try:
                gen.loop.call_soon_threadsafe(close, gen)
            except RuntimeError:  # the loop is closed, and with it its callbacks
                gen.sock.close()
        for future in pending.values():
            if not future.done():
                future.set_exception(WorkerUnavailable("the batch worker exited; retry"))
        if gen.proc.poll() is None:
            gen.proc.kill()
        # reaped off the loop: a killed process takes a moment to exit
        threading.Thread(target=gen.proc.wait, daemon=True).start()

    def close(self) -> None:
        """Stop the workers (each exits at the end of file on its socket)."""
        with self._lock:
            gens = self._live()
            self._gens = dict.fromkeys(LANES)
        for gen in gens:
            try:
                gen.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for gen in gens:
            try:
                gen.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                gen.proc.kill()
                gen.proc.wait()
        with self._lock:
            own, thread = self._own, self.io_thread
            self._own = self.io_thread = None
        if own is not None and thread is not None:
            own.call_soon_threadsafe(own.stop)
            thread.join(timeout=5)
            if not thread.is_alive():
                own.close()


_SHARED: BatchWorker | None = None
_SHARED_LOCK = threading.Lock()


def shared_worker(nice: int = WORKER_NICE, small_nice: int = SMALL_LANE_NICE) -> BatchWorker:
    """The process's worker (one for every app in it, at the ``nice`` and ``small_nice`` of the
    first that asks), stopped at exit."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = BatchWorker(nice, small_nice)
            atexit.register(_SHARED.close)
        return _SHARED
