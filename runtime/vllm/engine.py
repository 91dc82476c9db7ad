"""A live vLLM engine under the interval loop: ``VllmServer`` starts vLLM in-process with the
knob scheduler, and ``VllmEngine`` drives it through a window of requests in wall-clock time as a
:class:`runtime.session.ServingEngine`, so the replays, the arena, the environment and the
fidelity check run on vLLM through the same :class:`runtime.session.Session` as on the simulator.

vLLM's ``LLMEngine`` is stepped here, one ``step()`` at a time, while the wall clock says there
is work: requests are handed to vLLM (prompts as token ids, ``ignore_eos`` with the trace's output
length as ``max_tokens``) when the clock reaches their arrival, and when nothing can run the loop
sleeps until the next arrival, admission window or deadline. The engine's clock ``now`` is wall
seconds since the run started; the scheduler (:mod:`runtime.vllm.scheduler`) applies the knobs
and keeps the accounting on the same clock.

One vLLM engine serves many runs (starting one takes tens of seconds): :meth:`VllmServer.engine`
makes a fresh ``VllmEngine`` (fresh accounting, clock and knobs) on the running vLLM once the
previous run has ended.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime.engine.config import MAX_ARRIVAL_S, EngineConfig
from runtime.engine.executor import Executor
from runtime.engine.metrics import IntervalStats, RunSummary
from runtime.engine.request import RejectReason, Request, Status
from runtime.knobs import DEFAULT_KNOBS, Knobs
from runtime.vllm import SCHEDULER_CLS
from runtime.vllm.model import has_weights, kv_bytes_per_token, read_config
from runtime.vllm.versions import check_vllm_version

FIRST_TOKEN_ID = 3
"""prompt token ids are drawn from ``[FIRST_TOKEN_ID, vocab)`` (below it: Llama's special ids)"""
ABORT_DRAIN_S = 120.0
"""wall seconds vLLM gets to let go of the requests an earlier run left (a fresh engine aborts
them first); past it the server is reported broken rather than stepped for ever"""


@dataclass
class VllmSettings:
    """How vLLM is started: its start-up flags (those the knobs cannot change at run time)."""

    model: str
    """the model folder: a Hugging Face config (with weights, or served with dummy weights)"""
    max_num_batched_tokens: int = 8192
    """vLLM's start-up token budget: the largest step; a chunk above it (less the step's decodes)
    is capped"""
    max_num_seqs: int = 256
    """vLLM's most running sequences (the batch share caps batch work at a share of it)"""
    max_model_len: int | None = None
    """the most tokens a request may have (default: the model's positions)"""
    kv_cache_gib: float | None = 0.25
    """the KV pool vLLM allocates at start-up, GiB (the cap at the top of the ratio knob's
    range); None: vLLM sizes it from ``gpu_memory_utilization``"""
    gpu_memory_utilization: float = 0.1
    """vLLM's share of device memory (on the CPU backend: of host memory for KV) when
    ``kv_cache_gib`` is None"""
    block_size: int = 32
    """KV block size in tokens (vLLM's CPU attention needs a multiple of 32)"""
    seed: int = 0
    """vLLM's seed (dummy weights, sampling)"""
    dtype: str = "auto"
    """weights' dtype (auto: the config's)"""
    enforce_eager: bool = True
    """no graph capture or compilation (the default: on the CPU the compiled graph costs about
    20 s more at start, measured here, for a tiny model; give False on a GPU)"""
    extra: dict[str, Any] = field(default_factory=dict)
    """further ``LLM(...)`` arguments"""


class VllmServer:
    """vLLM running in this process with the knob scheduler (start with :meth:`start`).

    :param llm: a ``vllm.LLM`` built with ``scheduler_cls=SCHEDULER_CLS``
    :param settings: how it was started
    """

    def __init__(self, llm: Any, settings: VllmSettings, startup_s: float = 0.0) -> None:
        from runtime.vllm.scheduler import KnobSchedulerMixin

        self.llm = llm
        self.settings = settings
        self.startup_s = startup_s
        """seconds ``LLM(...)`` took"""
        self.llm_engine = llm.llm_engine
        self.scheduler = self.llm_engine.engine_core.engine_core.scheduler
        if not isinstance(self.scheduler, KnobSchedulerMixin):
            raise TypeError(f"vLLM runs {type(self.scheduler).__name__}, not batchpilot's "
                            f"scheduler: build the LLM with scheduler_cls={SCHEDULER_CLS!r}")
        config = read_config(settings.model)
        self.vocab_size = int(config["vocab_size"])
        self.model_config = config
        self.max_model_len = int(self.llm_engine.model_config.max_model_len)
        self.kv_block_bytes = kv_bytes_per_token(config) * int(self.scheduler.block_size)
        self.version = check_vllm_version()
        self._busy = False

    def __deepcopy__(self, memo: dict) -> VllmServer:
        return self  # a running vLLM is shared, never copied (gymnasium copies its env kwargs)

    @classmethod
    def start(cls, settings: VllmSettings) -> VllmServer:
        """Start vLLM in this process (tens of seconds on the CPU). Raises
        :class:`runtime.vllm.VllmVersionError` on an untested vLLM."""
        # the scheduler must live in this process for the loop to reach it
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        check_vllm_version()
        from vllm import LLM

        config = read_config(settings.model)
        dummy = not has_weights(settings.model)
        kwargs: dict[str, Any] = dict(
            model=str(settings.model), load_format="dummy" if dummy else "auto",
            skip_tokenizer_init=True, scheduler_cls=SCHEDULER_CLS,
            scheduling_policy="priority", enable_prefix_caching=False, async_scheduling=False,
            block_size=settings.block_size, max_num_batched_tokens=settings.max_num_batched_tokens,
            max_num_seqs=settings.max_num_seqs, seed=settings.seed, dtype=settings.dtype,
            enforce_eager=settings.enforce_eager,
            max_model_len=(settings.max_model_len if settings.max_model_len is not None
                           else int(config.get("max_position_embeddings", 4096))))
        if settings.kv_cache_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(settings.kv_cache_gib * 1024 ** 3)
        else:
            kwargs["gpu_memory_utilization"] = settings.gpu_memory_utilization
        kwargs.update(settings.extra)
        t0 = time.perf_counter()
        llm = LLM(**kwargs)
        server = cls(llm, settings, time.perf_counter() - t0)
        server.warm_up()
        return server

    def warm_up(self) -> float:
        """Run a few prefills and decodes of assorted sizes, so that the first compiled shapes
        and allocations are paid before a run's clock starts; returns the seconds it took."""
        t0 = time.perf_counter()
        eng = self.engine()
        sizes = [16, 700]
        eng.add_requests([0.0] * len(sizes), sizes, [8] * len(sizes))
        t = 0.0
        while eng.has_work():
            t += 0.1
            eng.run_until(t)
        return time.perf_counter() - t0

    def engine(self, config: EngineConfig | None = None, knobs: Knobs = DEFAULT_KNOBS, *,
               seed: int = 0, record_steps: bool = False,
               hold_window: bool = True) -> VllmEngine:
        """A fresh engine for one run on this vLLM (what an earlier run left is aborted)."""
        return VllmEngine(self, config, knobs, seed=seed, record_steps=record_steps,
                          hold_window=hold_window)

    def abort_leftovers(self) -> int:
        """Abort what an earlier run left in vLLM (a run cut short by an error), stepping vLLM
        until it has let go of every request; returns how many. They are counted in that run's
        accounting, as aborted."""
        ids = list(self.scheduler.bp_meta)
        if ids:
            self.llm_engine.abort_request(ids, internal=True)
        deadline = time.monotonic() + ABORT_DRAIN_S
        while self.llm_engine.has_unfinished_requests() or self.scheduler.bp_emit:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"vLLM still holds requests {ABORT_DRAIN_S:g} s after {len(ids)} were "
                    "aborted (an earlier run failed inside a step and left it inconsistent): "
                    "start a new VllmServer")
            self.llm_engine.step()
        return len(ids)

    @property
    def pool_blocks(self) -> int:
        """The KV blocks vLLM allocated at start-up (less its null block)."""
        return int(self.scheduler.bp_pool_blocks)


@dataclass(frozen=True, slots=True)
class StepTiming:
    """One vLLM step as the loop lived it."""

    features: tuple[float, float, float, float, float]
    """the cost model's feature row (see :mod:`runtime.engine.profiling`)"""
    step_s: float
    """wall seconds of ``LLMEngine.step()``"""
    lived_s: float
    """wall seconds from the end of the step before (when the loop did not sleep in between):
    the step plus the loop's own work before it, the iteration as the engine lived it"""


class VllmEngine:
    """One run of requests on a running vLLM, in wall-clock time (a
    :class:`runtime.session.ServingEngine`; pace it with :class:`VllmPacer`).

    :param server: the vLLM to run on
    :param config: SLO classes, admission policy and levers (``max_num_seqs`` is vLLM's own)
    :param knobs: the knobs to start with
    :param seed: seed of the prompts' token ids
    :param record_steps: keep every step's features and times in :attr:`steps`
    :param hold_window: False releases the batch window: requests enter vLLM's queue as they
        arrive, as without batchpilot (the simulator always holds it)
    """

    def __init__(self, server: VllmServer, config: EngineConfig | None = None,
                 knobs: Knobs = DEFAULT_KNOBS, *, seed: int = 0,
                 record_steps: bool = False, hold_window: bool = True) -> None:
        if server.scheduler.bp_meta or server.llm_engine.has_unfinished_requests():
            server.abort_leftovers()
        self.server = server
        self.config = config if config is not None else EngineConfig()
        self.scheduler = server.scheduler
        self.llm_engine = server.llm_engine
        self.max_model_len = server.max_model_len
        self._t0: float | None = None
        self.scheduler.configure(self.config, knobs, clock=self._clock,
                                 kv_block_bytes=server.kv_block_bytes, hold_window=hold_window)
        self.ledger = self.scheduler.ledger
        self._pending: list[Request] = []
        self._next = 0
        self._submitted_s = 0.0  # requests arriving up to here have been handed to vLLM
        self._rng = np.random.default_rng(seed)
        self._params: dict[int, Any] = {}
        self.record_steps = record_steps
        self.steps: list[StepTiming] = []
        self._last_step_end: float | None = None
        self.num_sleeps = 0
        self.control_s = 0.0  # wall seconds of interval closes and knob changes
        self.step_s = 0.0  # wall seconds inside LLMEngine.step()
        self._overhead0 = float(self.scheduler.bp_overhead_s)
        self.endings: dict[str, tuple[str, Any]] = {}
        """vLLM's own view of every request it ended: (finish reason, stop reason) by id"""

    # ------------------------------------------------------------------ the clock
    def _clock(self) -> float:
        return 0.0 if self._t0 is None else time.perf_counter() - self._t0

    @property
    def now(self) -> float:
        """Wall seconds since the run started (0 before)."""
        return self._clock()

    def start_clock(self) -> None:
        """Start the run's clock now (the pacer does, at the loop's first interval)."""
        if self._t0 is None:
            self._t0 = time.perf_counter()

    # ------------------------------------------------------------------ requests
    def add_requests(self, arrival_s: Sequence[float], prompt_tokens: Sequence[int],
                     output_tokens: Sequence[int], slo_class: Sequence[str] | None = None) -> None:
        """Queue requests arriving at the given times (sorted, not before the arrivals already
        handed to vLLM), as the simulator's engine takes them."""
        n = len(arrival_s)
        if not (len(prompt_tokens) == n and len(output_tokens) == n
                and (slo_class is None or len(slo_class) == n)):
            raise ValueError("arrival_s, prompt_tokens, output_tokens and slo_class must have "
                             "the same length")
        last = (self._pending[-1].arrival_s if len(self._pending) > self._next
                else self._submitted_s)
        for i in range(n):
            t = float(arrival_s[i])
            if not (t >= last and t <= MAX_ARRIVAL_S):
                raise ValueError(f"request {i}: arrival {t} is before {last} or past "
                                 f"{MAX_ARRIVAL_S:g} s (arrivals must be sorted)")
            last = t
            self._pending.append(self.ledger.new_request(
                t, int(prompt_tokens[i]), int(output_tokens[i]),
                None if slo_class is None else str(slo_class[i])))

    @property
    def requests(self) -> list[Request]:
        """Every request that has arrived (the ledger's records)."""
        return self.ledger.requests

    def _submit(self, now: float) -> None:
        """Hand vLLM the requests that have arrived by ``now``."""
        from vllm import SamplingParams

        pending = self._pending
        self._submitted_s = max(self._submitted_s, now)
        while self._next < len(pending) and pending[self._next].arrival_s <= now:
            r = pending[self._next]
            self._next += 1
            if r.prompt_tokens < 1 or r.output_tokens < 1:
                self.ledger.now = now
                self.ledger.rejected(r, RejectReason.INVALID)
                continue
            if r.prompt_tokens + r.output_tokens > self.max_model_len:
                self.ledger.now = now
                self.ledger.rejected(r, RejectReason.EXCEEDS_MAX_MODEL_LEN)
                continue
            ids = self._rng.integers(FIRST_TOKEN_ID, self.server.vocab_size,
                                     size=r.prompt_tokens).tolist()
            params = SamplingParams(max_tokens=r.output_tokens, ignore_eos=True,
                                    detokenize=False, temperature=0.0)
            self.scheduler.expect(r)
            self.llm_engine.add_request(str(r.req_id), {"prompt_token_ids": ids}, params)

    # ------------------------------------------------------------------ driving
    def run_until(self, t: float) -> None:
        """Step vLLM while there is work and ``now < t``; sleep while nothing can run."""
        self.start_clock()
        sch = self.scheduler
        while True:
            now = self.now
            self._submit(now)
            if now >= t:
                return
            sch.prepare()
            if sch.runnable():
                steps = len(sch.bp_steps)
                t0 = time.perf_counter()
                outputs = self.llm_engine.step()
                t1 = time.perf_counter()
                self.step_s += t1 - t0
                for out in outputs:
                    if out.finished:
                        c = out.outputs[0] if out.outputs else None
                        self.endings[out.request_id] = (
                            str(c.finish_reason) if c is not None else "?",
                            c.stop_reason if c is not None else None)
                ran = len(sch.bp_steps) > steps
                if ran and self.record_steps and sch.bp_last_step is not None:
                    start = self._last_step_end if self._last_step_end is not None else t0
                    self.steps.append(StepTiming(sch.bp_last_step.features(), t1 - t0, t1 - start))
                self._last_step_end = t1
                if ran or sch.bp_emit:
                    continue
                # nothing could be scheduled (batch work with no share, say): only an event or
                # a new decision changes that
            wake = min(t, self.next_event_s())
            self._last_step_end = None
            delay = wake - self.now
            self.num_sleeps += 1
            time.sleep(max(delay, 2e-4) if math.isfinite(delay) else 2e-4)

    def next_arrival_s(self) -> float:
        return self._pending[self._next].arrival_s if self._next < len(self._pending) else math.inf

    def next_event_s(self) -> float:
        """The next arrival, admission window or deadline the admission policy acts on."""
        return min(self.next_arrival_s(), self.scheduler.next_event_s())

    def has_work(self) -> bool:
        return self._next < len(self._pending) or bool(self.scheduler.bp_meta) \
            or bool(self.scheduler.bp_emit)

    def is_idle(self) -> bool:
        sch = self.scheduler
        return not sch.running and not sch.waiting and not sch._bp_num_held()

    @property
    def running(self) -> list[Any]:
        return list(self.scheduler.running)

    @property
    def waiting_batch(self) -> list[Any]:
        sch = self.scheduler
        return [*sch.bp_held_batch, *(r for r in sch.waiting if r.priority > 0)]

    @property
    def knobs(self) -> Knobs:
        return self.scheduler.knobs

    def set_knobs(self, knobs: Knobs) -> float:
        t0 = time.perf_counter()
        try:
            return float(self.scheduler.set_knobs(knobs))
        finally:
            self.control_s += time.perf_counter() - t0

    @property
    def admission(self) -> str:
        """The admission policy in force (``fcfs``, ``shed`` or ``late_to_back``)."""
        return self.scheduler.ledger.policy.value

    def set_admission(self, admission: str, slack: float | None = None) -> None:
        """Change the admission policy (a deployment setting: best static chooses it)."""
        self.scheduler.set_admission(admission, slack)

    def collect_interval(self) -> IntervalStats:
        t0 = time.perf_counter()
        try:
            return self.scheduler.collect_interval()
        finally:
            self.control_s += time.perf_counter() - t0

    def controller_cost(self, decide_s: float = 0.0) -> dict[str, float]:
        """What the controller costs this run beside vLLM's own work, from one run: the steps'
        wall time ``S`` (the scheduler's own work ``O_in`` inside it), the intervals' closing
        and knob changes ``O_out`` outside the steps, and ``decide_s`` (the decisions' time).
        ``ratio`` is (S + O_out + decide) / (S - O_in): the run's vLLM time with the adapter and
        the decider over plain vLLM's for the same steps."""
        step_s = self.step_s
        inner = float(self.scheduler.bp_overhead_s) - self._overhead0
        outer = self.control_s + decide_s
        plain = step_s - inner
        return {"step_s": step_s, "in_scheduler_s": inner, "outside_steps_s": outer,
                "ratio": (step_s + outer) / plain if plain > 0 else math.nan}

    def abort_all(self) -> int:
        """End every request in flight (submitted or not yet arrived) as aborted."""
        n = 0
        self.ledger.now = self.now
        for r in self._pending[self._next:]:
            self.ledger.rejected(r, RejectReason.ABORTED)
            n += 1
        self._next = len(self._pending)
        return n + self.server.abort_leftovers()

    def summary(self) -> RunSummary:
        return self.scheduler.summary()

    def check_conservation(self) -> dict[str, dict[str, int]]:
        """Every request that arrived, by class: ``requests``, ``finished``, ``rejected`` by
        reason, ``in_flight``; raises AssertionError when requests != finished + rejected +
        in flight."""
        out: dict[str, dict[str, int]] = {}
        for r in self.ledger.requests:
            row = out.setdefault(r.slo_class, {"requests": 0, "finished": 0, "in_flight": 0})
            row["requests"] += 1
            if r.status == Status.FINISHED:
                row["finished"] += 1
            elif r.status == Status.REJECTED:
                assert r.reject_reason is not None
                key = f"rejected_{r.reject_reason.value}"
                row[key] = row.get(key, 0) + 1
            else:
                row["in_flight"] += 1
        for cls, row in out.items():
            ended = row["finished"] + row["in_flight"] + sum(
                v for k, v in row.items() if k.startswith("rejected_"))
            assert ended == row["requests"], f"class {cls}: {row}"
        return out


class VllmPacer:
    """The pacer of a :class:`VllmEngine`: the engine keeps the wall clock itself (vLLM's steps
    take the time they take), so advancing is running it."""

    realtime = True

    def executor(self, inner: Executor) -> Executor:
        raise TypeError("a vLLM engine runs its own model: it is not built on an executor")

    def start(self, engine: Any) -> None:
        engine.start_clock()

    def advance(self, engine: Any, t_s: float) -> None:
        engine.run_until(t_s)

    def lag_summary(self) -> dict[str, float]:
        return {}
