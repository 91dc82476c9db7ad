"""A request as the engine sees it, from arrival to finished or rejected."""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from typing import Any


class Status(enum.IntEnum):
    PENDING = 0  # known to the engine, arrival time not reached yet
    WAITING = 1  # arrived (or preempted) and waiting for admission
    RUNNING = 2  # admitted: holds KV blocks and is scheduled every iteration
    FINISHED = 3
    REJECTED = 4


class RejectReason(enum.StrEnum):
    EXCEEDS_MAX_MODEL_LEN = "exceeds_max_model_len"
    """prompt + output tokens exceed the engine's max_model_len"""
    EXCEEDS_KV_CAPACITY = "exceeds_kv_capacity"
    """the request alone needs more KV blocks than the pool holds at the current ratio"""
    INVALID = "invalid"
    """non-positive prompt or output length"""
    ABORTED = "aborted"
    """still in flight when the run was cut off (end of an episode or shutdown)"""
    SHED = "shed"
    """dropped by deadline-aware admission: an interactive request whose first token could no
    longer come in time (a miss; to a client, HTTP 429 with Retry-After)"""
    EXPIRED = "expired"
    """a batch request whose completion deadline passed before it was (re)admitted (a miss)"""


def slot_copier(slots: tuple[str, ...], own: tuple[str, ...]) -> Callable[[Any], Any]:
    """A function that copies an object of a class with ``slots``: a new object of its type with
    every slot assigned, the lists named in ``own`` copied (a fresh list each). Its code is
    written out from ``slots`` once, when the class is defined, so a slot added later cannot be
    left out, and it runs as fast as one spelled out by hand (8-10x cheaper than ``copy.copy``:
    the fork's hot path clones every request in flight, and its interval stats)."""
    unknown = sorted(set(own) - set(slots))
    if unknown:
        raise ValueError(f"own names {unknown}, which are not slots of {slots}")
    body = "".join(f"\n    c.{s} = self.{s}{'[:]' if s in own else ''}" for s in slots)
    namespace: dict[str, Any] = {"new": object.__new__, "__name__": __name__}
    exec(f"def clone(self):\n    c = new(type(self)){body}\n    return c\n", namespace)
    fn: Callable[[Any], Any] = namespace["clone"]
    return fn


class Request:
    """Token accounting follows vLLM v1: ``num_computed_tokens`` catches up to ``num_tokens``.

    ``num_tokens`` is the prompt plus the output tokens sampled so far; an iteration that brings
    ``num_computed_tokens`` up to ``num_tokens`` samples one more token. A preempted request
    drops its KV and recomputes all its tokens when it is admitted again.
    """

    __slots__ = (
        "req_id", "arrival_s", "prompt_tokens", "output_tokens", "slo_class", "ttft_target_s",
        "tpot_target_s", "status", "num_computed_tokens", "num_output_tokens", "block_ids",
        "first_token_s", "finish_s", "num_preemptions", "reject_reason", "violation_counted",
        "admitted_s", "deadline_s", "is_batch", "is_late", "order", "synced_at",
    )

    def __init__(self, req_id: int, arrival_s: float, prompt_tokens: int, output_tokens: int,
                 slo_class: str, ttft_target_s: float, tpot_target_s: float,
                 deadline_s: float | None = None) -> None:
        self.req_id = req_id
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.slo_class = slo_class
        self.ttft_target_s = ttft_target_s
        self.tpot_target_s = tpot_target_s
        self.status = Status.PENDING
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.block_ids: list[int] = []
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.num_preemptions = 0
        self.reject_reason: RejectReason | None = None
        # Set once the request's SLO miss became certain and was counted, so it is counted once.
        self.violation_counted = False
        self.admitted_s: float | None = None
        # A batch request is judged by its completion deadline (absolute seconds), not TTFT/TPOT.
        self.is_batch = deadline_s is not None
        self.deadline_s = arrival_s + deadline_s if deadline_s is not None else math.inf
        self.is_late = False  # moved behind the on-time requests (admission late_to_back)
        # Its place in the engine's running order, set at each admission: the admission's
        # sequence number, batch requests after every interactive one.
        self.order = 0
        # While it decodes under the engine's lazy decode clock: the clock's value when its
        # token counts were last brought up to date (they lag the clock by the difference,
        # between run_until calls too); -1 when it is off the clock and its counts are exact
        # (see runtime.engine.decode_clock).
        self.synced_at = -1

    clone = slot_copier(__slots__, own=("block_ids",))
    """An independent copy (its own block table), for forking an engine: written out from
    ``__slots__`` (see :func:`slot_copier`), so a slot added later is copied too."""

    def __deepcopy__(self, memo: dict) -> Request:
        c = memo[id(self)] = self.clone()
        return c

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.num_output_tokens

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        if self.finish_s is None or self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)

    def meets_slo(self) -> bool:
        """Finished within both targets (a one-token output is judged on TTFT alone); a batch
        request: finished by its deadline."""
        if self.status != Status.FINISHED:
            return False
        assert self.finish_s is not None and self.first_token_s is not None  # finished
        if self.is_batch:
            return self.finish_s <= self.deadline_s
        if self.first_token_s - self.arrival_s > self.ttft_target_s:
            return False
        tpot = self.tpot_s
        return tpot is None or tpot <= self.tpot_target_s

    def __repr__(self) -> str:
        return (f"Request(id={self.req_id}, status={self.status.name}, "
                f"arrival={self.arrival_s:.3f}, prompt={self.prompt_tokens}, "
                f"output={self.num_output_tokens}/{self.output_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={len(self.block_ids)})")

