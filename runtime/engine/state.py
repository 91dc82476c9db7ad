"""The state the parts of the engine share: the attributes :class:`runtime.engine.engine.Engine`
sets up in ``__init__``, declared once here (types only) so that each part (a mixin in its own
module) is type-checked against them."""

from __future__ import annotations

from collections import deque

from runtime.engine.admission import AdmissionPolicy
from runtime.engine.block_pool import BlockPool
from runtime.engine.config import EngineConfig
from runtime.engine.cotenant import CoTenantDemand
from runtime.engine.executor import DecodeCost, Executor, MemoryModel
from runtime.engine.metrics import IntervalStats, SummaryAccumulator
from runtime.engine.profile import CostModel
from runtime.engine.request import Request
from runtime.knobs import Knobs

FIRST_TOKEN = 0  # deadline kinds in the deadline heap: TTFT target passed
FINISH = 1  # TPOT-allowed finish (interactive) or completion deadline (batch) passed
LATE = 2  # admission slack passed (deadline-aware admission)


class EngineState:
    """The engine's attributes (see ``Engine.__init__`` for what each holds)."""

    executor: Executor
    config: EngineConfig
    memory: MemoryModel
    max_model_len: int
    block_size: int
    knobs: Knobs
    now: float
    pool: BlockPool
    _requests: list[Request]
    _num_added: int
    _ended: SummaryAccumulator
    _pending: list[Request]
    _next_pending: int
    waiting: deque[Request]
    late: deque[Request]
    waiting_batch: deque[Request]
    _waiting_tokens: int
    _batch_waiting_tokens: int
    running: list[Request]
    _num_running_batch: int
    _batch_blocks: int
    _num_prefilling: int
    _admissions: int
    _lazy: bool
    _clock: int
    _ctx: int
    _buckets: list[list[Request]]
    _buckets2: list[list[Request]]
    _deferred: list[Request]
    _ends: list[tuple[int, int, Request]]
    _prefill_list: list[Request]
    _iteration_cost: CostModel | None
    _fit_ratio: float
    _fit_bytes: int
    _policy: AdmissionPolicy
    _slack: float
    _fcfs: bool
    _slack_events: bool
    batch_share: float
    _cotenant: CoTenantDemand | None
    _mem_t: float
    kv_gib_s: float
    cotenant_served_gib_s: float
    cotenant_demand_gib_s: float
    _max_batch_tokens: int
    _chunk_cap: int | None
    _decode_cost: DecodeCost | None
    _deadlines: list[tuple[float, int, int, Request]]
    num_preemptions: int
    num_ooms: int
    num_iterations: int
    num_fast_stretches: int
    _interval: IntervalStats
    _num_dropped: int
