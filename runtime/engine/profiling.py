"""Measuring an executor and fitting the cost model to it (any executor; no torch here).

``scripts/profile_executor.py`` drives this against the torch executor: it times iterations on a
grid of prefill chunks (tokens x earlier context), decode batches (sequences x context) and mixes
of both, fits :class:`runtime.engine.profile.CostModel` by non-negative least squares on relative
error, and reports the fit error on points held out of the fit.

Why non-negative least squares on relative error: every coefficient is a time per unit of work and
must not be negative (an unconstrained fit happily trades a negative prefill term against a large
constant); and iteration times span three decades over the grid, so absolute least squares would
fit the largest prefills and ignore the decode steps that make up most iterations. Every row is
divided by its time, so that the fit minimises squared relative error.

Relative to which time: the fitted one. Dividing by the measured time weights every row by
1 / measured^2, which favours the fast measurements of a batch over its slow ones: with the
timing noise of a shared host (single iterations spread +-10-20%, with a long right tail from
preemptions and cold caches) that fit lands several percent below both the median and the mean
of the times it was fitted to (measured in situ on the CPU tiny shape: -7% to -9% at the
median). So the fit starts from the measured-time weights and then re-weights by its own
predictions until they settle (iteratively reweighted least squares with variance proportional
to the mean squared, the gamma family's): the fitted time of a batch is then the mean of its
measurements. On low-noise data (medians of repeats) both weightings agree.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from runtime.engine.block_pool import BlockPool
from runtime.engine.executor import Batch, Executor
from runtime.engine.profile import CostModel
from runtime.engine.request import Request, Status
from runtime.gc_pause import gc_paused

FEATURES = ("const", "prefill_tokens", "prefill_attn_pairs", "decode_seqs", "decode_ctx_tokens")
"""the cost model's terms, in the order of :class:`CostModel`'s fields"""


def make_batch(decodes: Sequence[Request], prefills: Sequence[tuple[Request, int]]) -> Batch:
    """A batch with its aggregates computed as the engine's scheduler computes them (requests as
    they stand before the iteration)."""
    b = Batch(decodes=list(decodes), prefills=list(prefills))
    b.decode_ctx_tokens = sum(r.num_computed_tokens + 1 for r in decodes)
    b.prefill_tokens = sum(n for _, n in prefills)
    b.prefill_attn_pairs = sum(n * r.num_computed_tokens + n * (n + 1) // 2 for r, n in prefills)
    return b


def batch_features(batch: Batch) -> np.ndarray:
    return np.array([1.0, batch.prefill_tokens, batch.prefill_attn_pairs, len(batch.decodes),
                     batch.decode_ctx_tokens], dtype=np.float64)


class SyntheticRequests:
    """Requests standing at a chosen point of their life, with KV blocks from a pool, for timing
    an executor outside the engine.

    :param num_blocks: the blocks the executor holds (ids ``0 .. num_blocks-1``)
    :param block_size: tokens per block
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self._next_id = 0

    def _new(self, prompt: int, computed: int, outputs: int, reserve: int) -> Request:
        r = Request(self._next_id, 0.0, prompt, max(2, outputs + 1), "synthetic", 1.0, 1.0)
        self._next_id += 1
        blocks = self.pool.allocate(-(-reserve // self.block_size))
        if blocks is None:
            raise ValueError(f"{-(-reserve // self.block_size)} blocks needed for {reserve} "
                             f"tokens, {self.pool.num_free} free of {self.pool.num_blocks}")
        r.block_ids = blocks
        r.num_computed_tokens = computed
        r.num_output_tokens = outputs
        r.status = Status.RUNNING
        return r

    def decode(self, context: int) -> Request:
        """A request about to decode the token that makes its context ``context`` tokens."""
        if context < 2:
            raise ValueError(f"a decode needs a context of at least 2 tokens, got {context}")
        return self._new(context - 1, context - 1, 1, context)

    def prefill(self, start: int, n: int) -> tuple[Request, int]:
        """A request whose next chunk is ``n`` prompt tokens after ``start`` computed ones."""
        return self._new(start + n, start, 0, start + n), n

    def release(self, batch: Batch) -> None:
        for r in batch.decodes:
            self.pool.free(r.block_ids)
        for r, _ in batch.prefills:
            self.pool.free(r.block_ids)


@dataclass(frozen=True)
class GridPoint:
    """One batch shape: decodes at one context, and prefill chunks ``(start, tokens)``."""

    decode_seqs: int = 0
    decode_context: int = 0
    prefills: tuple[tuple[int, int], ...] = ()
    kind: str = ""

    def label(self) -> str:
        parts = []
        if self.decode_seqs:
            parts.append(f"{self.decode_seqs}x decode @{self.decode_context}")
        parts += [f"prefill {n} @{s}" for s, n in self.prefills]
        return " + ".join(parts)


@dataclass
class Measurement:
    point: GridPoint
    features: np.ndarray
    times_s: list[float]
    num_tokens: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)


def default_grid(max_context: int, num_blocks: int, block_size: int, *,
                 prefill_tokens: Sequence[int], prefill_starts: Sequence[int],
                 decode_seqs: Sequence[int], decode_contexts: Sequence[int],
                 mixed_chunks: Sequence[int] = (), multi_chunks: int = 4) -> list[GridPoint]:
    """Prefill chunks (tokens x earlier context, and the same tokens cut into ``multi_chunks``
    requests), decode batches (sequences x context) and mixes (decode batches with a fresh chunk),
    keeping only the shapes the KV pool and ``max_context`` allow."""
    pts: list[GridPoint] = []

    def blocks(p: GridPoint) -> int:
        b = p.decode_seqs * -(-p.decode_context // block_size)
        return b + sum(-(-(s + n) // block_size) for s, n in p.prefills)

    for n in prefill_tokens:
        for s in prefill_starts:
            if s + n <= max_context:
                pts.append(GridPoint(prefills=((s, n),), kind="prefill"))
        if multi_chunks > 1 and n >= multi_chunks * 16:
            pts.append(GridPoint(prefills=((0, n // multi_chunks),) * multi_chunks, kind="prefill"))
    for d in decode_seqs:
        for c in decode_contexts:
            if c <= max_context:
                pts.append(GridPoint(decode_seqs=d, decode_context=c, kind="decode"))
    for d in decode_seqs[1::2]:
        for c in decode_contexts[::2]:
            for n in mixed_chunks:
                pts.append(GridPoint(decode_seqs=d, decode_context=c, prefills=((0, n),),
                                     kind="mixed"))
    return [p for p in pts if blocks(p) <= num_blocks]


def measure(executor: Executor, points: Sequence[GridPoint], num_blocks: int, block_size: int,
            kv_cache_ratio: float, *, repeats: int = 5, warmup: int = 1, seed: int = 0,
            progress: bool = False) -> tuple[list[Measurement], list[str]]:
    """Time every point ``repeats`` times after ``warmup`` untimed passes (the same batch each
    time: KV values do not change timing). Each pass visits the points in a fresh random order,
    so that slow drifts of a shared machine (another tenant, clock changes) spread over all
    points instead of biasing a run of neighbours. Returns the measurements and a note for each
    point skipped because the executor reported it out of memory."""
    synth = SyntheticRequests(num_blocks, block_size)
    batches = []
    for p in points:
        batch = make_batch([synth.decode(p.decode_context) for _ in range(p.decode_seqs)],
                           [synth.prefill(s, n) for s, n in p.prefills])
        batches.append(batch)
        synth.release(batch)  # blocks are shared between points: only one runs at a time
    times: list[list[float]] = [[] for _ in points]
    oom = [False] * len(points)
    rng = np.random.default_rng(seed)
    with gc_paused():
        _passes(executor, batches, times, oom, kv_cache_ratio, warmup, repeats, rng, progress)
    out = [Measurement(p, batch_features(b), t, b.num_tokens)
           for p, b, t, o in zip(points, batches, times, oom) if not o]
    skipped = [f"{p.label()}: out of memory" for p, o in zip(points, oom) if o]
    return out, skipped


def _passes(executor: Executor, batches: list[Batch], times: list[list[float]], oom: list[bool],
            kv_cache_ratio: float, warmup: int, repeats: int, rng: np.random.Generator,
            progress: bool) -> None:
    points = batches
    for k in range(warmup + repeats):
        for i in rng.permutation(len(points)):
            if oom[i]:
                continue
            res = executor.execute(batches[i], kv_cache_ratio)
            if res.oom:
                oom[i] = True
            elif k >= warmup:
                times[i].append(res.duration_s)
        if progress:
            print(f"  pass {k + 1}/{warmup + repeats}{' (warm-up)' if k < warmup else ''}",
                  flush=True)


# ---------------------------------------------------------------------- fitting
def nnls(a: np.ndarray, b: np.ndarray, tol: float = 1e-12, max_iter: int = 200) -> np.ndarray:
    """Non-negative least squares, ``argmin ||a x - b|| s.t. x >= 0`` (Lawson and Hanson's
    active-set method: add the most promising coefficient, solve unconstrained on the active
    set, step back to the boundary whenever a coefficient would go negative)."""
    m, n = a.shape
    x = np.zeros(n)
    active = np.zeros(n, dtype=bool)
    for _ in range(max_iter):
        w = a.T @ (b - a @ x)
        if active.all() or w[~active].max() <= tol:
            break
        j = int(np.argmax(np.where(active, -np.inf, w)))
        active[j] = True
        while True:
            z = np.zeros(n)
            z[active] = np.linalg.lstsq(a[:, active], b, rcond=None)[0]
            if (z[active] > tol).all():
                x = z
                break
            neg = active & (z <= tol)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            active &= x > tol
            x[~active] = 0.0
            if not active.any():
                break
    return x


def fit_cost_model(features: np.ndarray, times_s: np.ndarray,
                   weights: np.ndarray | None = None, max_iter: int = 20) -> CostModel:
    """Fit the cost model's five coefficients (all >= 0) minimising (weighted) squared error
    relative to the fitted times (see the module docstring: measured-time weights, then up to
    ``max_iter`` re-weightings by the fit's own predictions). ``features`` rows are
    ``[1, prefill tokens, attention pairs, decode seqs, decode context tokens]``."""
    if features.shape[0] < features.shape[1]:
        raise ValueError(f"{features.shape[0]} measurements cannot fit {features.shape[1]} "
                         "coefficients")
    w = np.sqrt(np.asarray(weights, dtype=np.float64)) if weights is not None else 1.0
    coef = _nnls_relative(features, times_s, times_s, w)
    for _ in range(max_iter):
        fitted = features @ coef
        if (fitted <= 0).any():  # a row whose features the fit prices at 0: keep its weight
            fitted = np.where(fitted > 0, fitted, times_s)
        new = _nnls_relative(features, times_s, fitted, w)
        done = np.allclose(new, coef, rtol=1e-6, atol=0.0)
        coef = new
        if done:
            break
    return CostModel(*(float(c) for c in coef))


def _nnls_relative(features: np.ndarray, times_s: np.ndarray, scale_s: np.ndarray,
                   w: np.ndarray | float) -> np.ndarray:
    """NNLS of ``features @ coef ~ times_s`` with every row divided by ``scale_s``."""
    a = features / scale_s[:, None] * (w[:, None] if isinstance(w, np.ndarray) else w)
    b = times_s / scale_s * w
    col = np.abs(a).max(axis=0)
    col[col == 0] = 1.0  # a feature absent from the data keeps coefficient 0
    return nnls(a / col, b) / col


def balanced_weights(*group_sizes: int) -> np.ndarray:
    """Row weights giving each group (e.g. grid points, replay iterations) the same total."""
    return np.concatenate([np.full(n, 1.0 / n) for n in group_sizes if n])


def predict(cost: CostModel, features: np.ndarray) -> np.ndarray:
    coef = np.array([cost.const_s, cost.prefill_token_s, cost.prefill_attn_pair_s,
                     cost.decode_seq_s, cost.decode_ctx_token_s])
    return features @ coef


def relative_errors(cost: CostModel, features: np.ndarray, times_s: np.ndarray) -> np.ndarray:
    return np.abs(predict(cost, features) - times_s) / times_s


@dataclass
class FitReport:
    cost: CostModel
    """fitted on all points"""
    heldout_median: float
    heldout_p90: float
    train_median: float
    train_p90: float
    num_points: int
    num_heldout: int
    by_kind: dict[str, dict[str, float]] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"heldout_rel_err_median": self.heldout_median,
                "heldout_rel_err_p90": self.heldout_p90,
                "all_points_rel_err_median": self.train_median,
                "all_points_rel_err_p90": self.train_p90, "points": self.num_points,
                "heldout_points": self.num_heldout, "rel_err_by_kind": self.by_kind,
                "method": "NNLS on relative error (Lawson-Hanson); held-out error from a fit "
                          "on the other points, coefficients refit on all points"}


def fit_with_holdout(measurements: Sequence[Measurement], heldout_share: float = 0.25,
                     seed: int = 0) -> FitReport:
    """Hold out a random share of the points, fit on the rest and report their error; then refit
    on all points for the coefficients to ship."""
    x = np.stack([m.features for m in measurements])
    y = np.array([m.median_s for m in measurements])
    rng = np.random.default_rng(seed)
    idx = rng.permutation(len(y))
    k = max(1, int(round(heldout_share * len(y))))
    test, train = idx[:k], idx[k:]
    held = relative_errors(fit_cost_model(x[train], y[train]), x[test], y[test])
    cost = fit_cost_model(x, y)
    err = relative_errors(cost, x, y)
    kinds: dict[str, dict[str, float]] = {}
    for kind in sorted({m.point.kind for m in measurements}):
        sel = np.array([m.point.kind == kind for m in measurements])
        kinds[kind] = {"median": float(np.median(err[sel])),
                       "p90": float(np.percentile(err[sel], 90)), "points": int(sel.sum())}
    return FitReport(cost, float(np.median(held)), float(np.percentile(held, 90)),
                     float(np.median(err)), float(np.percentile(err, 90)), len(y), k, kinds)
