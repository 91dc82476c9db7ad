"""Recording an executor's iterations, for fidelity checks and in-situ calibration."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime.engine.executor import Batch, DecodeCost, Executor, IterationResult


@dataclass(frozen=True, slots=True)
class IterationRecord:
    """One executed iteration: the batch aggregates and the executor's own measured time."""

    prefill_tokens: int
    prefill_attn_pairs: int
    decode_seqs: int
    decode_ctx_tokens: int
    prefill_chunks: int
    duration_s: float
    oom: bool


BatchShape = tuple[tuple[int, ...], tuple[tuple[int, int], ...]]
"""an iteration's batch as numbers: the decodes' contexts, and the prefill chunks as
``(computed tokens before the chunk, chunk tokens)``; enough to rebuild a batch of the same
work (:func:`runtime.engine.profiling.make_batch` over synthetic requests)"""


class RecordingExecutor:
    """Wraps an executor and records every iteration (for fidelity checks).

    :param inner: the executor to record
    :param keep_shapes: also keep every iteration's :data:`BatchShape` in ``shapes`` (parallel
        to ``records``), so that the same batches can be timed again later
    """

    def __init__(self, inner: Executor, keep_shapes: bool = False) -> None:
        self.inner = inner
        self.memory = inner.memory
        self.max_model_len = inner.max_model_len
        self.records: list[IterationRecord] = []
        self.keep_shapes = keep_shapes
        self.shapes: list[BatchShape] = []

    def execute(self, batch: Batch, kv_cache_ratio: float) -> IterationResult:
        if self.keep_shapes:  # before the iteration: the engine advances the requests after it
            self.shapes.append((tuple(r.num_computed_tokens + 1 for r in batch.decodes),
                                tuple((r.num_computed_tokens, n) for r, n in batch.prefills)))
        res = self.inner.execute(batch, kv_cache_ratio)
        self.records.append(IterationRecord(batch.prefill_tokens, batch.prefill_attn_pairs,
                                            len(batch.decodes), batch.decode_ctx_tokens,
                                            len(batch.prefills), res.duration_s, res.oom))
        return res

    def resize_kv(self, num_blocks: int, moves: dict[int, int]) -> float:
        return self.inner.resize_kv(num_blocks, moves)

    def decode_cost(self) -> DecodeCost | None:
        return self.inner.decode_cost()


def record_features(records: list[IterationRecord], lags: list[float] | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Cost-model feature rows (see :mod:`runtime.engine.profiling`) and times of the iterations
    that ran (OOM refusals left out). With ``lags`` (one per record, from a wall-clock replay)
    the time is the iteration's latency as the engine lived it: the executor's measurement plus
    the scheduler's work before it."""
    if lags is not None and len(lags) != len(records):
        raise ValueError(f"{len(lags)} lags for {len(records)} records")
    rows, times = [], []
    for i, r in enumerate(records):
        if r.oom:
            continue
        rows.append([1.0, r.prefill_tokens, r.prefill_attn_pairs, r.decode_seqs,
                     r.decode_ctx_tokens])
        times.append(r.duration_s + (lags[i] if lags is not None else 0.0))
    return (np.array(rows, dtype=np.float64).reshape(-1, 5),
            np.array(times, dtype=np.float64))
