"""The mixed workload: interactive traffic plus offline batch jobs arriving in large drops.

Interactive traffic is any trace (by default the Azure 2023 conversation trace). The batch stream
stands for offline jobs (evaluation sweeps, document summarisation, synthetic-data generation) that
a team submits a few times an hour, each a drop of many requests at once, to be done within the
batch class's deadline (:data:`runtime.engine.slo.BATCH_DEADLINE_S`, an hour). Its lengths are
log-normal, chosen (not measured) to look like summarisation over documents: prompts longer than
the conversation trace's and outputs about as long:

=====================  ====  =====  =======
tokens                 mean  p99    largest
=====================  ====  =====  =======
prompt (:data:`BATCH_PROMPT`)  1500  6000   12000
output (:data:`BATCH_OUTPUT`)  250   900    1500
=====================  ====  =====  =======

The default drops, :data:`DEFAULT_DROPS`: 800 requests every 20 minutes starting 5 minutes in,
each drop spread over 1 s. On the conversation trace that is 2,400 batch requests an hour next
to 19,366 interactive ones, about 20% more tokens: room the engine has at 1x (its capacity at
99% attainment is about 1.6x) but not in its peaks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from env.traces.lengths import LogNormalLengths
from env.traces.trace import Trace
from runtime.engine.slo import BATCH_SLO_CLASS, DEFAULT_SLO_CLASS

BATCH_PROMPT = LogNormalLengths(mean=1500.0, p99=6000.0, max_tokens=12000)
"""prompt tokens of a batch job's requests"""
BATCH_OUTPUT = LogNormalLengths(mean=250.0, p99=900.0, max_tokens=1500)
"""output tokens of a batch job's requests"""


@dataclass(frozen=True)
class BatchDrops:
    """When batch jobs arrive and how large they are."""

    every_s: float = 1200.0
    """seconds between drops"""
    first_s: float = 300.0
    """when the first drop lands"""
    size: int = 800
    """requests per drop"""
    spread_s: float = 1.0
    """a drop's requests arrive uniformly over this many seconds"""

    def __post_init__(self) -> None:
        for name in ("every_s", "spread_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"BatchDrops.{name} must be a finite number > 0, got {value}")
        if not (math.isfinite(self.first_s) and self.first_s >= 0):
            raise ValueError(f"BatchDrops.first_s must be finite and >= 0, got {self.first_s}")
        if self.size < 1:
            raise ValueError(f"BatchDrops.size must be >= 1, got {self.size}")


DEFAULT_DROPS = BatchDrops()


def batch_drops(duration_s: float, drops: BatchDrops = DEFAULT_DROPS, *, seed: int = 0,
                prompt: LogNormalLengths = BATCH_PROMPT,
                output: LogNormalLengths = BATCH_OUTPUT) -> Trace:
    """The batch stream: drops landing in ``[0, duration_s)``, every request of class batch."""
    rng = np.random.default_rng(seed)
    starts = np.arange(drops.first_s, duration_s, drops.every_s)
    arrival_s = np.sort((starts[:, None] + rng.random((len(starts), drops.size))
                         * drops.spread_s).ravel())
    n = len(arrival_s)
    return Trace(name="batch_drops", arrival_s=arrival_s, prompt_tokens=prompt.sample(rng, n),
                 output_tokens=output.sample(rng, n),
                 slo_class=np.full(n, BATCH_SLO_CLASS, dtype=f"<U{len(BATCH_SLO_CLASS)}"),
                 source=f"batch_drops(duration_s={duration_s:g}, {drops}, prompt={prompt}, "
                        f"output={output}, seed={seed})")


def merge(a: Trace, b: Trace, name: str) -> Trace:
    """The requests of both traces in one arrival order (``a``'s first on equal times)."""
    arrival_s = np.concatenate([a.arrival_s, b.arrival_s])
    order = np.argsort(arrival_s, kind="stable")
    width = max(a.slo_class.dtype.itemsize, b.slo_class.dtype.itemsize) // 4
    classes = np.concatenate([a.slo_class, b.slo_class]).astype(f"<U{max(width, 1)}")
    skipped = dict(a.skipped)
    for reason, count in b.skipped.items():
        skipped[reason] = skipped.get(reason, 0) + count
    return Trace(name=name, arrival_s=arrival_s[order],
                 prompt_tokens=np.concatenate([a.prompt_tokens, b.prompt_tokens])[order],
                 output_tokens=np.concatenate([a.output_tokens, b.output_tokens])[order],
                 slo_class=classes[order], source=f"merge({a.source}; {b.source})",
                 skipped=skipped)


def mixed(interactive: Trace, drops: BatchDrops = DEFAULT_DROPS, *, seed: int = 0) -> Trace:
    """``interactive`` (every request given the interactive class) plus batch drops over its
    span."""
    n = len(interactive)
    labelled = Trace(name=interactive.name, arrival_s=interactive.arrival_s,
                     prompt_tokens=interactive.prompt_tokens,
                     output_tokens=interactive.output_tokens,
                     slo_class=np.full(n, DEFAULT_SLO_CLASS, dtype=f"<U{len(DEFAULT_SLO_CLASS)}"),
                     source=interactive.source, skipped=dict(interactive.skipped))
    span = float(interactive.arrival_s[-1]) if n else 0.0
    return merge(labelled, batch_drops(span, drops, seed=seed), name=f"mixed-{interactive.name}")
