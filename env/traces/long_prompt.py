"""A conversation trace with long prompts: the Azure conversation trace's arrivals and outputs,
its prompts redrawn from a long-tailed distribution up to the default profile's context.

None of the project's traces resembles it (the conversation trace's prompts average 1,155 tokens
with a p99 of 4,142): it is traffic held out of every training run, for the question whether a
policy stays no worse than the static default on traffic unlike anything it saw. Prompts are
log-normal with mean :data:`LONG_PROMPT`'s 4,500 tokens and p99 15,000, capped at 15,384 (the
16,384-token context less the trace's longest output, 1,000), drawn from the seed.
"""

from __future__ import annotations

import numpy as np

from env.traces.lengths import LogNormalLengths
from env.traces.trace import Trace

LONG_PROMPT = LogNormalLengths(mean=4500.0, p99=15000.0, max_tokens=15384)
"""the redrawn prompts' distribution"""
LONG_CONV = "azure-conv-long"
"""the alias that names the conversation trace with long prompts"""


def long_prompts(trace: Trace, *, seed: int = 0,
                 prompt: LogNormalLengths = LONG_PROMPT) -> Trace:
    """``trace`` with every prompt redrawn from ``prompt`` (arrivals, outputs, classes kept)."""
    rng = np.random.default_rng(seed)
    return Trace(name=f"{trace.name}-long", arrival_s=trace.arrival_s,
                 prompt_tokens=prompt.sample(rng, len(trace)),
                 output_tokens=trace.output_tokens, slo_class=trace.slo_class,
                 source=f"long_prompts({trace.source}, prompt={prompt}, seed={seed})",
                 skipped=dict(trace.skipped))
