"""The simulated executor: iteration times from a profile's cost model, OOMs from its memory."""

from __future__ import annotations

import copy

from runtime.engine.executor import GIB, Batch, DecodeCost, IterationResult
from runtime.engine.profile import CostModel, Profile


class SimulatedExecutor:
    def __init__(self, profile: Profile | None = None) -> None:
        self.profile = profile if profile is not None else Profile.load()
        self.memory = self.profile.memory
        self.max_model_len = self.profile.max_model_len
        self._cost = self.profile.cost
        self._num_blocks: int | None = None
        self._fit_ratio: float | None = None
        self._fit_bytes = 0
        """MemoryModel.workspace_bytes(_fit_ratio), the activation room at the last ratio seen"""

    def execute(self, batch: Batch, kv_cache_ratio: float) -> IterationResult:
        m = self.memory
        if kv_cache_ratio != self._fit_ratio:  # MemoryModel.fits, its workspace taken once a ratio
            self._fit_ratio = kv_cache_ratio
            self._fit_bytes = m.workspace_bytes(kv_cache_ratio)
        if m.act_fixed_bytes + m.act_bytes_per_token * (batch.prefill_tokens + len(batch.decodes)) \
                > self._fit_bytes:
            return IterationResult(self.profile.oom_penalty_s, oom=True)
        return IterationResult(self._cost.iteration_s(batch))

    def resize_kv(self, num_blocks: int, moves: dict[int, int]) -> float:
        old = self._num_blocks
        self._num_blocks = num_blocks
        if old is None or old == num_blocks:
            return 0.0
        delta_gib = abs(num_blocks - old) * self.memory.kv_block_bytes / GIB
        p = self.profile
        return p.resize_fixed_s + p.resize_per_gib_s * delta_gib + p.block_copy_s * len(moves)

    def fork(self) -> SimulatedExecutor:
        """An independent executor with the same profile and pool size (for a forked engine)."""
        return copy.copy(self)

    def decode_cost(self) -> DecodeCost:
        return self._cost.as_decode_cost()

    def closed_form(self) -> CostModel | None:
        """The cost model every iteration's time is, when :meth:`execute` is this class's own
        (a subclass that overrides it, to count or change iterations, gets None): then the
        engine may time an iteration from its batch's aggregates, term by term as
        :meth:`CostModel.iteration_s`, with the same out-of-memory test, without building the
        batch (:mod:`runtime.engine.closed_form`)."""
        return self._cost if type(self).execute is SimulatedExecutor.execute else None
