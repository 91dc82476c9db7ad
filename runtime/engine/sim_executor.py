"""The simulated executor: iteration times from a profile's cost model, OOMs from its memory."""

from __future__ import annotations

from runtime.engine.executor import GIB, Batch, DecodeCost, IterationResult
from runtime.engine.profile import Profile


class SimulatedExecutor:
    def __init__(self, profile: Profile | None = None) -> None:
        self.profile = profile if profile is not None else Profile.load()
        self.memory = self.profile.memory
        self.max_model_len = self.profile.max_model_len
        self._cost = self.profile.cost
        self._num_blocks: int | None = None

    def execute(self, batch: Batch, kv_cache_ratio: float) -> IterationResult:
        if not self.memory.fits(batch.num_tokens, kv_cache_ratio):
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

    def decode_cost(self) -> DecodeCost:
        return self._cost.as_decode_cost()
