"""Families of traffic: synthetic traces whose load, burstiness, diurnal shape and prompt and
output length distributions are drawn afresh every segment from documented ranges.

A policy trained on one trace learns that trace; an operator's traffic is never it. A family is a
distribution over traffic: ``family:NAME`` resolves to an hour of it (seeded), made of segments of
:attr:`Family.segment_s` seconds (120 s, an episode at rate scale 1), each with its own draw of
every parameter below. So an episode sees one draw or the shift between two, and the train split
(the first 40 minutes: 20 draws) and the held-out split (the last 20: 10 other draws) never share
a draw. The families:

``train`` (trained on, beside the Azure traces and ``mixed``):

=====================================  ================================  =====
parameter                              range                             scale
=====================================  ================================  =====
load: prompt tokens arriving per s     1,500 to 15,000                   log
inter-arrival CV (burstiness)          1 to 3                            linear
diurnal amplitude (rate swing)         0 to 0.8                          linear
diurnal period                         60 to 1,200 s                     log
prompt tokens: mean                    150 to 4,000                      log
prompt tokens: p99 / mean              2.5 to 5                          linear
long prompts: share of requests        0 to 0.3                          linear
long prompts: mean                     4,000 to 10,000                   log
long prompts: p99 / mean               1.3 to 1.6                        linear
output tokens: mean                    20 to 400                         log
output tokens: p99 / mean              2 to 4                            linear
=====================================  ================================  =====

Prompts are capped at the default profile's context (16,384 tokens) less the largest output, so
long prompts reach the context; outputs at 1,500 tokens.

Held out of training (only evaluated on):

- ``decode-heavy``: long answers to short prompts (output mean 700 to 1,500 tokens, p99 1.5-2.5x
  the mean, up to 3,000; prompt mean 100 to 800, no long prompts; load 500 to 4,000 prompt
  tokens/s; CV 1 to 2; amplitude 0 to 0.5), outside the training family's outputs;
- ``flash-crowd``: arrivals far burstier than any training draw (CV 4 to 8: most requests come
  in near-simultaneous clumps; prompt mean 300 to 3,000, no long prompts; output mean 50 to 400;
  load 1,000 to 10,000 prompt tokens/s; amplitude 0 to 0.5).

The mean rate of a draw is its load over its mean prompt length. Every draw is from the seed's
generator, so ``family:NAME`` is the same hour on every machine (``family:NAME:SEED`` another).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from env.traces.lengths import LogNormalLengths
from env.traces.synthetic import diurnal
from env.traces.trace import Trace

FAMILY_PREFIX = "family:"
"""how a trace spec names a family: ``family:NAME`` or ``family:NAME:SEED``"""
CONTEXT_TOKENS = 16384
"""the default profile's context: the longest prompt plus output a family's request may have"""


@dataclass(frozen=True)
class Range:
    """A parameter drawn uniformly between ``low`` and ``high`` (on a log scale when ``log``)."""

    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low <= self.high):
            raise ValueError(f"a range needs finite low <= high, got {self.low}, {self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range needs low > 0, got {self.low}")

    def draw(self, rng: np.random.Generator) -> float:
        if self.low == self.high:
            return self.low
        if self.log:
            return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
        return float(rng.uniform(self.low, self.high))


NONE = Range(0.0, 0.0)


@dataclass(frozen=True)
class Family:
    """A distribution over traffic (see the module docstring for the parameters)."""

    name: str
    doc: str
    prompt_token_rate: Range
    """load: prompt tokens arriving per second"""
    cv: Range
    """inter-arrival coefficient of variation at a steady rate (1: Poisson)"""
    amplitude: Range
    """the diurnal swing of the rate, as a share of its mean"""
    period_s: Range
    """seconds per diurnal cycle"""
    prompt_mean: Range
    prompt_p99_ratio: Range
    output_mean: Range
    output_p99_ratio: Range
    output_max: int
    long_share: Range = NONE
    """share of requests whose prompt is drawn from the long-prompt distribution"""
    long_mean: Range = Range(4000.0, 4000.0)
    long_p99_ratio: Range = Range(1.5, 1.5)
    segment_s: float = 120.0
    """seconds of trace per draw"""

    @property
    def prompt_max(self) -> int:
        return CONTEXT_TOKENS - self.output_max

    def segment(self, rng: np.random.Generator, duration_s: float) -> tuple[Trace, dict]:
        """One draw's ``duration_s`` seconds of traffic (from 0), and the draw."""
        p_mean = self.prompt_mean.draw(rng)
        prompt = LogNormalLengths(p_mean, p_mean * self.prompt_p99_ratio.draw(rng),
                                  self.prompt_max)
        o_mean = self.output_mean.draw(rng)
        output = LogNormalLengths(o_mean, o_mean * self.output_p99_ratio.draw(rng),
                                  self.output_max)
        share = self.long_share.draw(rng)
        l_mean = self.long_mean.draw(rng)
        long = LogNormalLengths(l_mean, l_mean * self.long_p99_ratio.draw(rng), self.prompt_max)
        mean_prompt = (1 - share) * p_mean + share * l_mean
        draw = {"prompt_token_rate": self.prompt_token_rate.draw(rng), "cv": self.cv.draw(rng),
                "amplitude": self.amplitude.draw(rng), "period_s": self.period_s.draw(rng),
                "prompt_mean": p_mean, "output_mean": o_mean, "long_share": share,
                "long_mean": l_mean}
        draw["mean_rate"] = draw["prompt_token_rate"] / mean_prompt
        t = diurnal(draw["mean_rate"], duration_s, amplitude=draw["amplitude"],
                    period_s=draw["period_s"], peak_at_s=float(rng.uniform(0, draw["period_s"])),
                    cv=draw["cv"], seed=rng, prompt=prompt, output=output, name=self.name)
        prompts = t.prompt_tokens
        if share > 0 and len(t):
            pick = rng.random(len(t)) < share
            prompts = prompts.copy()
            prompts[pick] = long.sample(rng, int(pick.sum()))
        return Trace(name=self.name, arrival_s=t.arrival_s, prompt_tokens=prompts,
                     output_tokens=t.output_tokens, slo_class=t.slo_class,
                     source=t.source), draw

    def trace(self, seed: int = 0, duration_s: float = 3600.0) -> Trace:
        """``duration_s`` seconds of the family, a fresh draw every :attr:`segment_s`."""
        rng = np.random.default_rng(seed)
        parts = []
        t0 = 0.0
        while t0 < duration_s:
            span = min(self.segment_s, duration_s - t0)
            seg, _ = self.segment(rng, span)
            parts.append((t0, seg))
            t0 += span
        arrival = np.concatenate([t + s.arrival_s for t, s in parts])
        cls = np.concatenate([s.slo_class for _, s in parts])
        return Trace(name=f"family-{self.name}", arrival_s=arrival,
                     prompt_tokens=np.concatenate([s.prompt_tokens for _, s in parts]),
                     output_tokens=np.concatenate([s.output_tokens for _, s in parts]),
                     slo_class=cls.astype(f"<U{max(cls.dtype.itemsize // 4, 1)}"),
                     source=f"family {self.name} (seed {seed}, a draw every "
                            f"{self.segment_s:g} s; env/traces/families.py)")


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("train", "the training family: loads, burstiness, diurnal shapes and lengths around "
           "and beyond the Azure traces', long prompts up to the context included",
           prompt_token_rate=Range(1500.0, 15000.0, log=True), cv=Range(1.0, 3.0),
           amplitude=Range(0.0, 0.8), period_s=Range(60.0, 1200.0, log=True),
           prompt_mean=Range(150.0, 4000.0, log=True), prompt_p99_ratio=Range(2.5, 5.0),
           output_mean=Range(20.0, 400.0, log=True), output_p99_ratio=Range(2.0, 4.0),
           output_max=1500, long_share=Range(0.0, 0.3),
           long_mean=Range(4000.0, 10000.0, log=True), long_p99_ratio=Range(1.3, 1.6)),
    Family("decode-heavy", "held out: long answers to short prompts, outputs beyond the "
           "training family's", prompt_token_rate=Range(500.0, 4000.0, log=True),
           cv=Range(1.0, 2.0), amplitude=Range(0.0, 0.5),
           period_s=Range(60.0, 1200.0, log=True), prompt_mean=Range(100.0, 800.0, log=True),
           prompt_p99_ratio=Range(2.5, 4.0), output_mean=Range(700.0, 1500.0, log=True),
           output_p99_ratio=Range(1.5, 2.5), output_max=3000),
    Family("flash-crowd", "held out: arrivals in clumps far burstier than any training draw",
           prompt_token_rate=Range(1000.0, 10000.0, log=True), cv=Range(4.0, 8.0),
           amplitude=Range(0.0, 0.5), period_s=Range(60.0, 1200.0, log=True),
           prompt_mean=Range(300.0, 3000.0, log=True), prompt_p99_ratio=Range(2.5, 4.0),
           output_mean=Range(50.0, 400.0, log=True), output_p99_ratio=Range(2.0, 4.0),
           output_max=1500),
)}
"""every family, by name"""
TRAINING_FAMILIES = ("train",)
"""the families the shipped recipe trains on; the others are held out"""


def family_trace(spec: str) -> Trace:
    """The trace ``family:NAME`` or ``family:NAME:SEED`` names (seed 0 by default)."""
    rest = spec[len(FAMILY_PREFIX):]
    name, _, seed = rest.partition(":")
    if name not in FAMILIES:
        raise ValueError(f"unknown traffic family {name!r}; expected one of "
                         f"{', '.join(FAMILIES)}")
    try:
        s = int(seed) if seed else 0
    except ValueError:
        raise ValueError(f"{spec!r}: the seed after the family's name must be an integer") \
            from None
    return FAMILIES[name].trace(s)
