"""The executor protocol: run one batch, say how long it took; describe the memory it works in."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from runtime.engine.request import Request

GIB = 1024 ** 3


@dataclass(frozen=True, slots=True)
class MemoryModel:
    """The accelerator memory the engine plans with.

    After the weights, ``kv_cache_ratio`` of the rest holds paged KV blocks; what is left is the
    activation workspace. An iteration needs ``act_fixed_bytes + act_bytes_per_token * tokens``
    of workspace; more than there is is an out-of-memory error.
    """

    total_bytes: int
    weight_bytes: int
    kv_bytes_per_token: int
    block_size: int
    act_fixed_bytes: int
    act_bytes_per_token: int

    def __post_init__(self) -> None:
        for name in ("total_bytes", "kv_bytes_per_token", "block_size", "act_bytes_per_token"):
            if getattr(self, name) <= 0:
                raise ValueError(f"memory.{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.weight_bytes < self.total_bytes:
            raise ValueError(f"memory.weight_bytes={self.weight_bytes} must lie in "
                             f"[0, total_bytes={self.total_bytes})")
        if self.act_fixed_bytes < 0:
            raise ValueError(f"memory.act_fixed_bytes must be >= 0, got {self.act_fixed_bytes}")

    @property
    def kv_block_bytes(self) -> int:
        return self.kv_bytes_per_token * self.block_size

    @property
    def free_after_weights(self) -> int:
        return self.total_bytes - self.weight_bytes

    def num_kv_blocks(self, kv_cache_ratio: float) -> int:
        return max(1, math.floor(kv_cache_ratio * self.free_after_weights / self.kv_block_bytes))

    def kv_bytes(self, kv_cache_ratio: float) -> int:
        return self.num_kv_blocks(kv_cache_ratio) * self.kv_block_bytes

    def workspace_bytes(self, kv_cache_ratio: float) -> int:
        return self.free_after_weights - self.kv_bytes(kv_cache_ratio)

    def activation_bytes(self, num_tokens: int) -> int:
        return self.act_fixed_bytes + self.act_bytes_per_token * num_tokens

    def fits(self, num_tokens: int, kv_cache_ratio: float) -> bool:
        return self.activation_bytes(num_tokens) <= self.workspace_bytes(kv_cache_ratio)


@dataclass(slots=True)
class Batch:
    """One engine iteration: the decoding requests (one token each) and the prefill chunks.

    The aggregates are what a cost model needs; the request lists are what a real executor needs
    (a request's KV positions are ``num_computed_tokens .. num_computed_tokens + n - 1`` and its
    block table is ``block_ids``, both as they stand before the iteration).
    """

    decodes: list[Request] = field(default_factory=list)
    prefills: list[tuple[Request, int]] = field(default_factory=list)
    """(request, tokens computed now), first come first served"""
    prefill_tokens: int = 0
    prefill_attn_pairs: int = 0
    """sum over prefill chunks of (query, key) pairs: len*start + len*(len+1)/2"""
    decode_ctx_tokens: int = 0
    """sum over decoding sequences of the context they attend to, the new token included"""

    @property
    def decode_seqs(self) -> int:
        return len(self.decodes)

    @property
    def num_tokens(self) -> int:
        return self.prefill_tokens + len(self.decodes)

    def is_empty(self) -> bool:
        return not (self.decodes or self.prefills)


@dataclass(frozen=True, slots=True)
class IterationResult:
    duration_s: float
    oom: bool = False


@dataclass(frozen=True, slots=True)
class DecodeCost:
    """A decode-only iteration takes ``const_s + per_seq_s * seqs + per_ctx_token_s * ctx``.

    An executor that can promise this lets the engine advance decode-only stretches in closed
    form; a real executor does not, and is stepped one iteration at a time.
    """

    const_s: float
    per_seq_s: float
    per_ctx_token_s: float


@runtime_checkable
class Executor(Protocol):
    memory: MemoryModel
    max_model_len: int
    """the model's context: the engine's limit on prompt + output tokens unless configured"""

    def execute(self, batch: Batch, kv_cache_ratio: float) -> IterationResult:
        """Run one iteration. Running out of memory returns ``oom=True`` with the time it cost."""
        ...

    def resize_kv(self, num_blocks: int, moves: dict[int, int]) -> float:
        """Hold ``num_blocks`` KV blocks from now on, after copying block ``src`` to ``dst`` for
        every item of ``moves``; returns the seconds it took."""
        ...

    def decode_cost(self) -> DecodeCost | None:
        """Closed-form decode cost, or None when iterations must be run one at a time."""
        ...
