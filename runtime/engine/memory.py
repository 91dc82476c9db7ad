"""The engine's memory accounting: the activation workspace the knobs leave an iteration, and the
GiB-seconds the KV pool holds and the co-tenant is lent (:mod:`runtime.engine.cotenant`)."""

from __future__ import annotations

from runtime.engine.executor import GIB
from runtime.engine.state import EngineState
from runtime.knobs import Knobs


class MemoryMixin(EngineState):
    """:class:`~runtime.engine.engine.Engine`'s activation limit and memory integrals."""

    def _activation_limit(self, knobs: Knobs) -> int:
        """The most tokens an iteration's activations fit in the workspace these knobs leave."""
        m = self.memory
        workspace = m.workspace_bytes(knobs.kv_cache_ratio)
        return (workspace - m.act_fixed_bytes) // m.act_bytes_per_token

    def _account_memory(self) -> None:
        """Integrate the KV pool's GiB-seconds and the co-tenant's demand up to now."""
        t0, now = self._mem_t, self.now
        if now <= t0:
            return
        self._mem_t = now
        kv_gib = self.pool.num_blocks * self.memory.kv_block_bytes / GIB
        iv = self._interval
        iv.kv_gib_s += kv_gib * (now - t0)
        self.kv_gib_s += kv_gib * (now - t0)
        if self._cotenant is not None:
            m = self.memory
            lendable = (m.free_after_weights - self.pool.num_blocks * m.kv_block_bytes
                        - m.activation_bytes(self.knobs.prefill_chunk_tokens
                                             + self.config.max_num_seqs))
            served, demanded = self._cotenant.integrate(t0, now, lendable / GIB)
            iv.cotenant_served_gib_s += served
            iv.cotenant_demand_gib_s += demanded
            self.cotenant_served_gib_s += served
            self.cotenant_demand_gib_s += demanded
