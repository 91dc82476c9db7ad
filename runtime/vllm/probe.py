"""Timing vLLM's steps on a grid of batch shapes, for the simulator's cost model.

The simulator prices an iteration from its shape (:mod:`runtime.engine.profiling`: prefill
tokens, prefill attention pairs, decode sequences, decode context). To measure vLLM's cost of a
shape, the probe makes vLLM itself run it, through the knob scheduler: requests are set up
untimed to stand where the shape needs them (decodes at their context, a prefill chunk's earlier
context already computed), then the shape's step (or, for decodes, a few consecutive steps) is
timed, with the features vLLM actually scheduled taken from the scheduler's step log. Points are
visited in a fresh random order every pass, so a shared machine's slow drifts spread over all of
them, and every point is repeated; the fit takes each point's median.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from runtime.engine.profiling import GridPoint, Measurement
from runtime.gc_pause import gc_paused
from runtime.knobs import BLOCK_SIZE_TOKENS, KNOB_SPEC_BY_NAME, Knobs
from runtime.vllm.engine import VllmEngine, VllmServer

DECODE_STEPS = 4
"""timed decode steps per set-up of a decode point (contexts c, c+1, ...)"""

_CHUNK = KNOB_SPEC_BY_NAME["prefill_chunk_tokens"]


def _chunk(tokens: int) -> int:
    """A chunk knob of at least ``tokens`` (the knob's step and range)."""
    c = -(-max(tokens, 1) // BLOCK_SIZE_TOKENS) * BLOCK_SIZE_TOKENS
    return int(min(max(c, _CHUNK.low), _CHUNK.high))


class Probe:
    """Runs grid points on a vLLM server, one at a time."""

    def __init__(self, server: VllmServer, seed: int = 0) -> None:
        self.server = server
        self.seed = seed

    def _engine(self, chunk: int) -> VllmEngine:
        eng = self.server.engine(knobs=Knobs(5.0, _chunk(chunk), 0.95), seed=self.seed)
        eng.start_clock()
        return eng

    def _step(self, eng: VllmEngine) -> tuple[tuple[float, ...], float] | None:
        """One vLLM step, timed, once the admission window lets the requests in: (the features
        vLLM scheduled, seconds); None if it ran nothing."""
        sch = eng.scheduler
        deadline = time.perf_counter() + 10.0
        sch.prepare()
        while not sch.runnable():
            if time.perf_counter() > deadline:
                return None
            time.sleep(0.001)
            sch.prepare()
        n = len(sch.bp_steps)
        t0 = time.perf_counter()
        eng.llm_engine.step()
        dt = time.perf_counter() - t0
        if len(sch.bp_steps) == n:
            return None
        return sch.bp_steps[-1].features(), dt

    def _submit_all(self, eng: VllmEngine, prompts: Sequence[int], outputs: Sequence[int]) -> None:
        now = eng.now
        eng.add_requests([now] * len(prompts), prompts, outputs)
        eng._submit(now)

    def run(self, point: GridPoint) -> list[tuple[tuple[float, ...], float]]:
        """Set ``point`` up and time it: one sample (a prefill or mixed step) or
        :data:`DECODE_STEPS` samples (decode steps)."""
        d, c = point.decode_seqs, point.decode_context
        pre_tokens = sum(n for _, n in point.prefills)
        starts = [s for s, _ in point.prefills]
        eng = self._engine(max(d * max(c - 1, 1), max(starts, default=0), 1))
        sch = eng.scheduler
        samples: list[tuple[tuple[float, ...], float]] = []
        try:
            if d:  # decodes at context c: prompts of c - 1, their first token sampled untimed
                self._submit_all(eng, [max(c - 1, 1)] * d,
                                 [DECODE_STEPS + 1 if not point.prefills else 2] * d)
                while sum(r.first_token_s is not None for r in eng.requests) < d:
                    if self._step(eng) is None:
                        raise RuntimeError(f"{point.label()}: the decodes could not be set up")
            if point.prefills:
                if any(starts):  # earlier context computed untimed, one chunk of it each
                    sch.set_knobs(Knobs(5.0, _chunk(max(starts)), 0.95))
                    self._submit_all(eng, [s + n for s, n in point.prefills],
                                     [1] * len(point.prefills))
                    self._step(eng)
                else:
                    self._submit_all(eng, [n for _, n in point.prefills],
                                     [1] * len(point.prefills))
                sch.set_knobs(Knobs(5.0, _chunk(pre_tokens), 0.95))
                got = self._step(eng)
                if got is not None:
                    samples.append(got)
            else:
                for _ in range(DECODE_STEPS):
                    got = self._step(eng)
                    if got is not None:
                        samples.append(got)
        finally:
            eng.abort_all()
        return samples


def measure_vllm(server: VllmServer, points: Sequence[GridPoint], *, repeats: int = 3,
                 warmup: int = 1, seed: int = 0, progress: bool = False
                 ) -> tuple[list[Measurement], list[dict]]:
    """Time every point ``repeats`` times (after ``warmup`` untimed passes), the points in a
    fresh random order each pass. Returns a :class:`Measurement` per point (the features are the
    median of what vLLM scheduled; the times every timed step) and every raw sample."""
    probe = Probe(server, seed)
    rng = np.random.default_rng(seed)
    samples: list[list[tuple[tuple[float, ...], float]]] = [[] for _ in points]
    raw: list[dict] = []
    with gc_paused():
        for k in range(warmup + repeats):
            for i in rng.permutation(len(points)):
                got = probe.run(points[i])
                if k >= warmup:
                    samples[i].extend(got)
                    raw.extend({"point": points[i].label(), "pass": k - warmup,
                                "features": list(f), "seconds": t} for f, t in got)
            if progress:
                print(f"  pass {k + 1}/{warmup + repeats}{' (warm-up)' if k < warmup else ''}",
                      flush=True)
    out = []
    for p, got in zip(points, samples):
        if not got:
            continue
        x = np.median(np.array([f for f, _ in got]), axis=0)
        out.append(Measurement(p, x, [t for _, t in got], int(x[1] + x[3])))
    return out, raw


def memory_model(server: VllmServer):
    """The simulator's memory model of this vLLM: its KV pool is the cap at the top of the ratio
    knob's range, and its activations were reserved at start-up (no iteration runs out of
    memory: one byte a token stands for that)."""
    from runtime.engine.executor import MemoryModel
    from runtime.vllm.model import kv_bytes_per_token, weight_bytes
    from runtime.vllm.scheduler import POOL_RATIO

    kv_per_token = kv_bytes_per_token(server.model_config)
    block_bytes = kv_per_token * int(server.scheduler.block_size)
    free = int(np.ceil(server.pool_blocks * block_bytes / POOL_RATIO))
    weights = weight_bytes(server.model_config)
    return MemoryModel(total_bytes=weights + free, weight_bytes=weights,
                       kv_bytes_per_token=kv_per_token, block_size=int(server.scheduler.block_size),
                       act_fixed_bytes=0, act_bytes_per_token=1)


def measure_cap_changes(server: VllmServer, repeats: int = 5) -> dict:
    """What a change of the KV cap costs vLLM here (withholding or giving back blocks, no
    request holding any): fixed seconds plus seconds per GiB changed (NNLS)."""
    from runtime.engine.executor import GIB
    from runtime.engine.profiling import nnls

    eng = server.engine()
    sch = eng.scheduler
    ratios = [0.95, 0.5, 0.9, 0.7, 0.4, 0.95, 0.6, 0.9] * max(1, repeats // 3)
    rows, times = [], []
    cur = sch.bp_cap
    for r in ratios:
        n = sch.cap_blocks(r)
        if n == cur:
            continue
        t = sch.set_knobs(Knobs(5.0, 2048, r))
        rows.append([1.0, abs(n - cur) * server.kv_block_bytes / GIB])
        times.append(t)
        cur = n
    sch.set_knobs(Knobs(5.0, 2048, 0.95))
    a, y = np.array(rows), np.array(times)
    scale = a.max(axis=0)
    fixed, per_gib = nnls(a / scale, y) / scale
    return {"resize_fixed_s": float(fixed), "resize_per_gib_s": float(per_gib),
            "resize_samples": len(times)}


def spread(ms: Sequence[Measurement]) -> dict:
    """How far repeated timings of one point spread: (p90 - p10) / median, over the points."""
    rel = [(np.percentile(m.times_s, 90) - np.percentile(m.times_s, 10)) / m.median_s
           for m in ms if len(m.times_s) > 1 and m.median_s > 0]
    if not rel:
        return {}
    return {"p10_p90_over_median_median": float(np.median(rel)),
            "p10_p90_over_median_p90": float(np.percentile(rel, 90))}
