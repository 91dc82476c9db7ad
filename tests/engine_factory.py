"""Small engines whose numbers can be checked by hand."""

from __future__ import annotations

import numpy as np

from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.executor import MemoryModel
from runtime.engine.profile import CostModel, Profile
from runtime.engine.sim_executor import SimulatedExecutor
from runtime.knobs import Knobs

BLOCK_BYTES = 16 * 1024  # 16 tokens x 1 KiB


def hand_profile(*, blocks_at_half: int = 100, const_s: float = 0.010,
                 prefill_token_s: float = 0.001, decode_seq_s: float = 0.0,
                 decode_ctx_token_s: float = 0.0, prefill_attn_pair_s: float = 0.0,
                 act_bytes_per_token: int = 64, oom_penalty_s: float = 0.05,
                 resize_fixed_s: float = 0.0) -> Profile:
    """A profile with round numbers: ``blocks_at_half`` KV blocks of 16 tokens at ratio 0.5."""
    free = 2 * blocks_at_half * BLOCK_BYTES
    memory = MemoryModel(total_bytes=free + 1000, weight_bytes=1000, kv_bytes_per_token=1024,
                         block_size=16, act_fixed_bytes=0,
                         act_bytes_per_token=act_bytes_per_token)
    cost = CostModel(const_s=const_s, prefill_token_s=prefill_token_s,
                     prefill_attn_pair_s=prefill_attn_pair_s, decode_seq_s=decode_seq_s,
                     decode_ctx_token_s=decode_ctx_token_s)
    return Profile(name="hand", kind="measured", memory=memory, cost=cost,
                   oom_penalty_s=oom_penalty_s, resize_fixed_s=resize_fixed_s,
                   resize_per_gib_s=0.0, block_copy_s=0.0)


def make_engine(profile: Profile | None = None, *, window_ms: float = 5.0, chunk: int = 2048,
                ratio: float = 0.5, fast_path: bool = True, **config) -> Engine:
    profile = profile if profile is not None else hand_profile()
    return Engine(SimulatedExecutor(profile), Knobs(window_ms, chunk, ratio),
                  EngineConfig(fast_path=fast_path, **config))


def random_workload(seed: int, n: int, rate: float, prompt_mean: float = 300,
                    output_mean: float = 60) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    prompts = np.maximum(1, rng.lognormal(np.log(prompt_mean), 0.8, n).astype(np.int64))
    outputs = np.maximum(1, rng.lognormal(np.log(output_mean), 0.8, n).astype(np.int64))
    return arrivals, prompts, outputs
