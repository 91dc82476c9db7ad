"""The interval loop inside vLLM's engine core: :class:`ServingController`.

vLLM steps the engine itself; the controller decides once an interval (``interval_s`` of vLLM's
clock, the scheduler's), on the interval grid of :class:`runtime.session.Session`, which it runs
as every other caller does: :meth:`Session.step` closes the interval from the scheduler's state
(:meth:`BatchpilotScheduler.collect_interval`), builds the observation with the shared
:class:`runtime.observation.FeatureBuilder`, asks the decider and applies the ``Decision``
through the adapter (:meth:`BatchpilotScheduler.set_knobs`). The engine here is the scheduler
vLLM steps (:class:`ServedEngine`), and the pacer does nothing (:class:`ServedPacer`): vLLM's
own loop has run the engine to the grid point when the controller is called.

Who calls :meth:`ServingController.tick` (the scheduler's lock held):

- while vLLM has requests, the scheduler, at the start of the first ``schedule()`` past a grid
  point: once an interval, not once a step, between steps (the knobs change only there);
- while vLLM is idle (its loop blocks on its input queue), the controller's own thread
  (:class:`Ticker`), at each grid point, so that the intervals, the metrics and the timeline go
  on while nothing is served.

Nothing it does can stop vLLM. The decider is the guarded one (``runtime.decider.guard``: a
policy missing, corrupt, of another spec, non-finite, slow or raising falls back to the PID, or
to the static knobs) behind a :class:`runtime.decider.failsafe.FailSafe`, and a fault anywhere
in the tick (closing the interval, the features, applying the knobs) is caught here: the static
knobs are held, the cause logged once per kind of fault and counted, and the next interval tries
again.

The thread also polls the policy file (``reload_poll_s``): a file replaced (size, time or inode
changed) is reloaded through :meth:`GuardedDecider.reload`, which keeps the old policy on any
refusal. Loading runs on that thread, never on vLLM's; the swap is atomic.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.api.metrics import LATENCY_BUCKETS_S
from runtime.decider.breaker import CircuitBreaker
from runtime.decider.controller import Decider, StaticController
from runtime.decider.decision import MODEL_MISSING
from runtime.decider.failsafe import CONTROLLER_FAULT, FailSafe
from runtime.decider.guard import GuardedDecider
from runtime.decider.onnx_policy import PolicyLoadError
from runtime.decider.pid import PidController
from runtime.engine.executor import Executor
from runtime.engine.metrics import IntervalStats, RunSummary
from runtime.knobs import Knobs
from runtime.session import IntervalRecord, Session
from runtime.vllm.serve.settings import Controller, ServeSettings

log = logging.getLogger("batchpilot.vllm")

HISTORY = 64
"""interval records the session keeps (the timeline and the metrics read the counters, not
these)"""
CONTROLLERS: tuple[Controller, ...] = ("policy", "pid", "static")
TIMELINE_GAP_S = 1.0
"""the timeline writes a line at once when who decides changes, but never two within this"""
SHED_LOG_S = 1.0
"""the log names the requests shed at most once a second, in one line"""
SHED_IDS_LOGGED = 8
"""request ids a line names (the count says how many more)"""


def _log_to_stderr() -> None:
    """vLLM's engine core configures only vLLM's loggers; without a handler of ours the
    timeline's INFO lines would go nowhere."""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(
            f"(batchpilot pid={os.getpid()}) %(levelname)s %(asctime)s %(message)s",
            "%m-%d %H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


class ServedEngine:
    """The :class:`runtime.session.ServingEngine` the loop sees: the scheduler vLLM steps."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    @property
    def now(self) -> float:
        return float(self.scheduler._bp_now())

    @property
    def knobs(self) -> Knobs:
        return self.scheduler.knobs  # type: ignore[no-any-return]

    @property
    def running(self) -> list[Any]:
        return list(self.scheduler.running)

    @property
    def waiting_batch(self) -> list[Any]:
        return list(self.scheduler.bp_held_batch)

    def set_knobs(self, knobs: Knobs) -> float:
        return float(self.scheduler.set_knobs(knobs))

    def collect_interval(self) -> IntervalStats:
        return self.scheduler.collect_interval()  # type: ignore[no-any-return]

    def run_until(self, t: float) -> None:
        pass  # vLLM's own loop runs it

    def has_work(self) -> bool:
        return bool(self.scheduler.requests)

    def is_idle(self) -> bool:
        return not self.scheduler.requests

    def next_arrival_s(self) -> float:
        return math.inf

    def next_event_s(self) -> float:
        return math.inf

    def abort_all(self) -> int:
        return 0

    def summary(self) -> RunSummary:
        return self.scheduler.summary()  # type: ignore[no-any-return]


class ServedPacer:
    """vLLM keeps the time: when the controller is called the grid point has been reached."""

    realtime = True

    def executor(self, inner: Executor) -> Executor:
        raise TypeError("vLLM runs its own model")

    def start(self, engine: Any) -> None:
        pass

    def advance(self, engine: Any, t_s: float) -> None:
        pass

    def lag_summary(self) -> dict[str, float]:
        return {}


@dataclass
class Totals:
    """Counts since the server started, from the closed intervals (what the metrics report)."""

    arrivals: int = 0
    finished: int = 0
    met: int = 0
    violations: int = 0
    rejected: int = 0
    shed: int = 0
    expired: int = 0
    late: int = 0
    preemptions: int = 0
    iterations: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    kv_gib_s: float = 0.0

    def add(self, s: IntervalStats) -> None:
        self.arrivals += s.arrivals
        self.finished += s.finished
        self.met += s.met
        self.violations += s.violations
        self.rejected += s.rejected
        self.shed += s.shed
        self.expired += s.expired
        self.late += s.late
        self.preemptions += s.preemptions
        self.iterations += s.iterations
        self.prefill_tokens += s.prefill_tokens
        self.decode_tokens += s.decode_tokens
        self.kv_gib_s += s.kv_gib_s


class LatencyHistogram:
    """Decision seconds in the REST decider's buckets (no prometheus objects on vLLM's thread:
    the side port renders these at scrape time)."""

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum_s = 0.0

    def observe(self, seconds: float) -> None:
        i = 0
        for i, le in enumerate(self.buckets):  # noqa: B007 - the index is the bucket
            if seconds <= le:
                break
        else:
            i = len(self.buckets)
        self.counts[i] += 1
        self.sum_s += seconds


class ServingController:
    """The controller of one vLLM engine core (see the module docstring).

    :param scheduler: the knob scheduler vLLM steps (``BatchpilotScheduler`` or a subclass)
    :param settings: the validated settings
    """

    def __init__(self, scheduler: Any, settings: ServeSettings) -> None:
        _log_to_stderr()
        self.scheduler = scheduler
        self.settings = settings
        self.static = settings.static_knobs()
        self.engine = ServedEngine(scheduler)
        self.clock: Callable[[], float] = scheduler._bp_now
        self.session = Session(self.engine, interval_s=settings.interval_s, pacer=ServedPacer(),
                               history=HISTORY)
        breaker = CircuitBreaker(target=settings.breaker_target,
                                 trip_after=settings.breaker_trip_after,
                                 cooldown_s=settings.breaker_cooldown_s, clock=self.clock)
        self.policy_path: Path | None = None
        self.pid = PidController(static=self.static)
        # the policy's fallback is the same PID, bound around the served static knobs
        self.guarded = GuardedDecider(None, pid=self.pid, static_knobs=self.static,
                                      max_step=settings.max_step, breaker=breaker,
                                      decision_limit_s=settings.decision_limit_ms * 1e-3)
        try:
            self.policy_path = settings.start_policy_path()
        except ValueError as e:
            self.guarded.refuse_start_policy(MODEL_MISSING, str(e))
            log.warning("no policy, deciding with the PID: %s", e)
        if self.policy_path is not None:
            self._load_start_policy(self.policy_path)
        self.mode: Controller = settings.controller
        self.held = self.static
        self.decider: Decider = self._decider(self.mode, self.held)
        self._pending: tuple[Controller, Knobs, str | None] | None = None
        self.next_tick_s = self.session.next_grid_s()
        # what the metrics and the state report
        self.totals = Totals()
        self.by_source: Counter[str] = Counter()
        self.by_reason: Counter[str] = Counter()
        self.rejected_by_reason: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.reloads: Counter[str] = Counter()
        self.decide_s = LatencyHistogram()
        self.tick_s = LatencyHistogram()
        self.last: IntervalRecord | None = None
        self.last_fault: str | None = None
        self.started_unix = time.time()
        self.first_decision_unix: float | None = None
        self.num_ticks = 0
        self.idle_ticks = 0
        self._watch_sig = self._file_signature()
        self._reload_lock = threading.RLock()  # the file watch holds it across its check
        self._timeline_due = False
        self.recent_shed: deque[str] = deque(maxlen=SHED_IDS_LOGGED)
        self.shed_unlogged = 0
        self.ticker: Ticker | None = None
        self.side: Any = None
        log.info("controller %s every %g s, static knobs %s, %s", self.mode, settings.interval_s,
                 _knobs_text(self.static), self._policy_text())

    # ------------------------------------------------------------------ deciders
    def _load_start_policy(self, path: Path) -> None:
        try:
            self.guarded.reload(path)
            self.guarded.num_reloads = 0  # the start-up load is not a reload
        except PolicyLoadError as e:
            self.guarded.refuse_start_policy(e.reason, str(e))
            self.guarded.num_failed_reloads = 0
            log.warning("no policy, deciding with the PID: %s", e)

    def _decider(self, mode: Controller, held: Knobs) -> Decider:
        if mode == "policy":
            return FailSafe(self.guarded, self.static)
        if mode == "pid":
            return FailSafe(self.pid, self.static)
        return StaticController(held)

    def _policy_text(self) -> str:
        p = self.guarded.policy
        if p is not None:
            return f"policy {p.policy_version}"
        why = self.guarded.last_error or self.guarded.missing_reason
        return f"no policy, the PID decides ({why})"

    def switch(self, mode: Controller, knobs: Knobs | None = None,
               admission: str | None = None) -> None:
        """Hand the decisions to ``mode`` from the next interval on (``knobs``: what ``static``
        holds, default the static knobs; ``admission``: a new admission policy, from the next
        interval on). Called from the side port's thread: applied by the next tick."""
        if mode not in CONTROLLERS:
            raise ValueError(f"controller must be one of {', '.join(CONTROLLERS)}, got {mode!r}")
        self._pending = (mode, knobs if knobs is not None else self.static, admission)

    # ------------------------------------------------------------------ the loop
    def due(self, now: float) -> bool:
        return now >= self.next_tick_s

    def tick(self, idle: bool = False) -> IntervalRecord | None:
        """One interval: close it, observe, decide, apply (the scheduler's lock held). Never
        raises: a fault holds the static knobs."""
        t0 = time.perf_counter()
        record = None
        try:
            self._apply_pending()
            record = self.session.step(self.decider)
        except Exception as e:  # noqa: BLE001 - nothing the controller does may stop vLLM
            self._fault(type(e).__name__, e)
        else:
            self._account(record)
        finally:
            try:
                self.next_tick_s = self.session.next_grid_s()
            except Exception as e:  # noqa: BLE001
                self._fault(type(e).__name__, e)
                self.next_tick_s = self.clock() + self.settings.interval_s
            self.num_ticks += 1
            self.idle_ticks += idle
            self.tick_s.observe(time.perf_counter() - t0)
        return record

    def _apply_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        mode, held, admission = pending
        if admission is not None and admission != self.scheduler.ledger.policy.value:
            self.scheduler.set_admission(admission)
        self.mode, self.held = mode, held
        self.decider = self._decider(mode, held)
        log.info("controller switched to %s%s%s", mode,
                 f" holding {_knobs_text(held)}" if mode == "static" else "",
                 f", admission {admission}" if admission else "")
        self._timeline_due = True

    def _account(self, record: IntervalRecord) -> None:
        previous = self.last
        self.last = record
        if self.first_decision_unix is None:
            self.first_decision_unix = time.time()
        self.totals.add(record.stats)
        self.by_source[record.source] += 1
        if record.reason is not None:
            self.by_reason[record.reason] += 1
        self.decide_s.observe(record.decide_us * 1e-6)
        ended = self.scheduler.ledger._ended  # rejections by reason, taken and dropped
        if ended.reasons:
            self.rejected_by_reason.update(ended.reasons)
            ended.reasons.clear()
        if ended.num > 4096:  # the run summary's per-request arrays: a server's stay bounded
            from runtime.engine.metrics import SummaryAccumulator

            self.scheduler.ledger._ended = SummaryAccumulator()
        if previous is None or (previous.source, previous.reason) != (record.source,
                                                                         record.reason):
            self._timeline_due = True

    def _fault(self, kind: str, detail: object) -> None:
        if not self.faults[kind]:
            log.warning("controller fault (%s: %s); holding the static knobs %s", kind, detail,
                        _knobs_text(self.static))
        self.faults[kind] += 1
        self.last_fault = f"{kind}: {detail}"[:300]
        self.by_source["static"] += 1
        self.by_reason[CONTROLLER_FAULT] += 1
        try:
            if self.scheduler.knobs != self.static:
                self.scheduler.set_knobs(self.static)
        except Exception as e:  # noqa: BLE001
            kind = f"holding static: {type(e).__name__}"
            if not self.faults[kind]:
                log.warning("controller fault (%s: %s)", kind, e)
            self.faults[kind] += 1

    def note_shed(self, request_id: str) -> None:
        """vLLM aborted ``request_id`` for deadline-aware admission (the log names it)."""
        self.recent_shed.append(request_id)
        self.shed_unlogged += 1

    def log_shed(self) -> None:
        n, self.shed_unlogged = self.shed_unlogged, 0
        if n:
            ids = list(self.recent_shed)[-min(n, SHED_IDS_LOGGED):]
            more = f" and {n - len(ids)} more" if n > len(ids) else ""
            log.info("shed %d request%s (late for the first token, admission %s, slack %g "
                     "TTFT targets): %s%s", n, "s" if n > 1 else "", self.scheduler.ledger.policy,
                     self.scheduler.knobs.admission_slack, ", ".join(ids), more)

    # ------------------------------------------------------------------ reloads
    def _file_signature(self) -> tuple[int, int, int] | None:
        path = self.policy_path
        if path is None:
            return None
        try:
            st = path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def check_policy_file(self) -> None:
        """Reload the policy when its file was replaced since the last check. The check holds
        the reload lock: a reload asked for meanwhile (another file) would otherwise leave this
        check comparing the old file's signature with the new one's, and load the new file a
        second time."""
        with self._reload_lock:
            sig = self._file_signature()
            if sig is None or sig == self._watch_sig:
                return
            self._watch_sig = sig
            assert self.policy_path is not None  # a signature needs a path
            self.reload(self.policy_path.name, why="file replaced")

    def reload(self, name: str, why: str = "requested") -> tuple[bool, str]:
        """Load ``name`` from the policy folder and swap it in once it is checked; (ok, what
        happened). A refused policy leaves the old one deciding."""
        from runtime.api.settings import resolve_in_folder

        with self._reload_lock:
            try:
                path = resolve_in_folder(self.settings.policy_dir, name)
            except ValueError as e:
                self.reloads["outside policy folder"] += 1
                return False, str(e)
            kept = self.guarded.policy
            try:
                policy = self.guarded.reload(path)
            except PolicyLoadError as e:
                self.reloads[e.reason] += 1
                old = kept.policy_version if kept is not None else "none (the PID decides)"
                log.warning("policy reload (%s) refused, %s: %s; keeping %s", why, e.reason,
                            e.message, old)
                return False, f"{e.reason}: {e.message}"
            self.reloads["ok"] += 1
            self.policy_path = path
            self._watch_sig = self._file_signature()
            log.info("policy reloaded (%s): %s", why, policy.policy_version)
            self._timeline_due = True
            return True, policy.policy_version

    # ------------------------------------------------------------------ reporting
    def timeline_line(self) -> str:
        """One line of the knob timeline: the knobs in force, who decides, and the counts."""
        sch = self.scheduler
        rec = self.last
        t = self.totals
        src = ", ".join(f"{k} {v}" for k, v in sorted(self.by_source.items())) or "none yet"
        why = ""
        if rec is not None and rec.reason:
            why = f" ({rec.reason})"
        return (f"timeline t={self.clock():.1f}s {self.mode}: {_knobs_text(sch.knobs)}; "
                f"last decided by {rec.source if rec else '-'}{why}; decisions {src}; "
                f"requests {t.arrivals} in, {t.finished} finished, {t.shed} shed, "
                f"{t.rejected} rejected; KV cap {sch.bp_cap}/{sch.bp_pool_blocks} blocks, "
                f"{sch.used_blocks()} used")

    def state(self) -> dict[str, Any]:
        """What ``GET /v1/state`` shows (read from another thread: plain values, copied)."""
        sch = self.scheduler
        rec = self.last
        policy = self.guarded.policy
        return {
            "controller": self.mode,
            "knobs": sch.knobs.as_dict(),
            "static_knobs": self.static.as_dict(),
            "held_knobs": self.held.as_dict() if self.mode == "static" else None,
            "admission": sch.ledger.policy.value,
            "window_held": sch.bp_hold_window,
            "interval_s": self.settings.interval_s,
            "last_decision": None if rec is None else {
                "t_s": rec.end_s, "source": rec.source, "reason": rec.reason,
                "policy_version": rec.policy_version, "decide_us": rec.decide_us},
            "decisions": dict(self.by_source),
            "fallbacks": dict(self.by_reason),
            "faults": dict(self.faults),
            "last_fault": self.last_fault,
            "policy": {"loaded": policy is not None,
                       "version": policy.policy_version if policy is not None else None,
                       "file": self.policy_path.name if self.policy_path is not None else None,
                       "missing_reason": self.guarded.missing_reason,
                       "last_error": _without_folders(self.guarded.last_error),
                       "breaker": self.guarded.breaker.state,
                       "slow_guard": (self.guarded.slow_guard.describe()
                                      if self.guarded.slow_guard is not None else None)},
            "reloads": dict(self.reloads),
            "requests": {**vars(self.totals), "rejected_by_reason": dict(self.rejected_by_reason),
                         "in_engine": len(sch.requests)},
            "kv_blocks": {"pool": sch.bp_pool_blocks, "cap": sch.bp_cap,
                          "withheld": len(sch.bp_withheld), "used": sch.used_blocks()},
            "token_budget": {"chunk": sch.bp_chunk, "startup": sch.bp_startup_budget,
                             "capped_decisions": sch.bp_chunk_capped},
            "passthrough": getattr(sch, "bp_passthrough", None),
            "ticks": self.num_ticks, "idle_ticks": self.idle_ticks,
            "started_unix": self.started_unix, "first_decision_unix": self.first_decision_unix,
        }

    # ------------------------------------------------------------------ threads
    def start(self, lock: Any) -> None:
        """Start the controller's thread (idle ticks, the file watch, the timeline) and the
        side port."""
        from runtime.vllm.serve.side_port import start_side_port

        self.ticker = Ticker(self, lock)
        self.ticker.start()
        if self.settings.metrics_port:
            try:
                self.side = start_side_port(self, self.settings)
            except OSError as e:  # a port in use must not keep vLLM from serving
                log.error("side port %s:%d not served (%s): no batchpilot metrics",
                          self.settings.metrics_host, self.settings.metrics_port, e)
            else:
                log.info("metrics and state on http://%s:%d/metrics",
                         self.settings.metrics_host, self.side.server_address[1])

    def stop(self) -> None:
        if self.ticker is not None:
            self.ticker.stop()
        if self.side is not None:
            self.side.shutdown()
            self.side.server_close()


class Ticker(threading.Thread):
    """The controller's thread: ticks while vLLM is idle, polls the policy file, writes the
    timeline."""

    def __init__(self, controller: ServingController, lock: Any) -> None:
        super().__init__(name="batchpilot-controller", daemon=True)
        self.c = controller
        self.lock = lock
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=5.0)

    def run(self) -> None:
        c = self.c
        s = c.settings
        next_poll = next_line = next_shed_line = time.monotonic()
        last_line = -math.inf
        while not self._stop_event.is_set():
            try:
                wait = max(0.0, c.next_tick_s - c.clock()) + 1e-3
                if self._stop_event.wait(min(wait, 1.0)):
                    return
                with self.lock:
                    if c.due(c.clock()) and not c.scheduler.requests \
                            and not c.scheduler.bp_emit and not c.scheduler.bp_passthrough:
                        c.tick(idle=True)
                now = time.monotonic()
                if s.reload_poll_s and now >= next_poll:
                    next_poll = now + s.reload_poll_s
                    c.check_policy_file()
                if c.shed_unlogged and now >= next_shed_line:
                    next_shed_line = now + SHED_LOG_S
                    c.log_shed()
                if s.timeline_s and (now >= next_line or (
                        c._timeline_due and now >= last_line + TIMELINE_GAP_S)):
                    c._timeline_due = False
                    last_line, next_line = now, now + s.timeline_s
                    log.info("%s", c.timeline_line())
            except Exception as e:  # noqa: BLE001 - the thread must outlive any fault
                c._fault(f"controller thread: {type(e).__name__}", e)
                self._stop_event.wait(1.0)


def _knobs_text(k: Knobs) -> str:
    return (f"window {k.batch_window_ms:g} ms, chunk {k.prefill_chunk_tokens}, "
            f"kv {k.kv_cache_ratio:.2f}, share {k.batch_share:.2f}, "
            f"slack {k.admission_slack:.2f}")


def _without_folders(message: str | None) -> str | None:
    from runtime.api.routes.policy import without_folders

    return without_folders(message)
