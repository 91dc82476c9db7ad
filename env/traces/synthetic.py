"""Synthetic traces: Poisson, bursty (gamma renewal), on/off, diurnal and ramped arrivals, with
log-normal lengths, and the embedded default trace that stands in for the Azure conversation
trace when no trace file is at hand.

Every generator takes ``seed``, an int or a numpy ``Generator``, and is deterministic given it;
arrivals are in seconds from 0 (the process starts at 0, so the first request comes a gap
later), in ``[0, duration_s)``. The trace's ``source`` names the generator and its parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from env.traces.lengths import LogNormalLengths
from env.traces.trace import Trace
from runtime.engine.slo import DEFAULT_SLO_CLASS

Seed = int | np.random.Generator
"""an int seed (reproducible from the trace's source) or a numpy Generator to draw from"""

AZURE_CONV_PROMPT = LogNormalLengths(mean=1155.0, p99=4142.0, max_tokens=14050)
"""prompt tokens of the Azure 2023 conversation trace: mean, p99 and largest"""
AZURE_CONV_OUTPUT = LogNormalLengths(mean=211.0, p99=601.0, max_tokens=1000)
"""output tokens of the Azure 2023 conversation trace: mean, p99 and largest"""

AZURE_CONV_TARGETS: dict[str, float] = {
    "mean_rate": 5.53,
    "interarrival_cv": 1.09,
    "peak_1s_over_mean": 3.4,
    "prompt_mean": 1155.0,
    "prompt_p99": 4142.0,
    "output_mean": 211.0,
    "output_p99": 601.0,
}
"""the Azure 2023 conversation trace's published figures (``../shared/traces/README.md``), keyed
as :meth:`Trace.stats` names them; :func:`default_trace` is measured against these"""

DEFAULT_AMPLITUDE = 0.4
"""the default trace's rate swings +-40% around its mean over the hour: the Azure conversation
trace's per-minute rate runs from 3.2/s (first minute) through 8.5/s (minute 32) to 3.7/s"""


def poisson(rate: float, duration_s: float, *, seed: Seed = 0,
            prompt: LogNormalLengths = AZURE_CONV_PROMPT,
            output: LogNormalLengths = AZURE_CONV_OUTPUT, batch_fraction: float = 0.0,
            slo_class: str = DEFAULT_SLO_CLASS, name: str = "poisson") -> Trace:
    """Poisson arrivals at ``rate`` requests/s for ``duration_s`` seconds (inter-arrival CV 1).

    :param prompt: prompt token lengths.
    :param output: output token lengths.
    :param batch_fraction: the share of requests, drawn independently, in the ``batch`` SLO
        class; the rest are in ``slo_class``.
    """
    return _generate("poisson", {"rate": rate, "duration_s": duration_s}, seed, prompt, output,
                     batch_fraction, slo_class, name,
                     lambda rng: _renewal(rng, rate, duration_s, shape=1.0))


def bursty(rate: float, duration_s: float, cv: float, *, seed: Seed = 0,
           prompt: LogNormalLengths = AZURE_CONV_PROMPT,
           output: LogNormalLengths = AZURE_CONV_OUTPUT, batch_fraction: float = 0.0,
           slo_class: str = DEFAULT_SLO_CLASS, name: str = "bursty") -> Trace:
    """A gamma renewal process: inter-arrival gaps with mean ``1 / rate`` seconds and
    coefficient of variation ``cv`` (gamma shape ``1 / cv^2``; cv 1 is Poisson, above 1 is
    burstier: many short gaps and a few long ones). Other parameters as :func:`poisson`."""
    _check_positive(cv=cv)
    return _generate("bursty", {"rate": rate, "duration_s": duration_s, "cv": cv}, seed, prompt,
                     output, batch_fraction, slo_class, name,
                     lambda rng: _renewal(rng, rate, duration_s, shape=1.0 / cv**2))


def on_off(rate_on: float, duration_s: float, *, mean_on_s: float, mean_off_s: float,
           rate_off: float = 0.0, seed: Seed = 0, prompt: LogNormalLengths = AZURE_CONV_PROMPT,
           output: LogNormalLengths = AZURE_CONV_OUTPUT, batch_fraction: float = 0.0,
           slo_class: str = DEFAULT_SLO_CLASS, name: str = "on_off") -> Trace:
    """On/off modulated Poisson arrivals (a two-state MMPP): ``rate_on`` requests/s during on
    periods and ``rate_off`` during off periods, whose lengths are exponential with means
    ``mean_on_s`` and ``mean_off_s`` seconds; it starts with an on period. The long-run rate is
    ``(rate_on mean_on_s + rate_off mean_off_s) / (mean_on_s + mean_off_s)``. Other parameters
    as :func:`poisson`."""
    _check_positive(rate_on=rate_on, mean_on_s=mean_on_s, mean_off_s=mean_off_s)
    if not (math.isfinite(rate_off) and rate_off >= 0):
        raise ValueError(f"rate_off must be a finite number >= 0, got {rate_off}")
    params = {"rate_on": rate_on, "rate_off": rate_off, "mean_on_s": mean_on_s,
              "mean_off_s": mean_off_s, "duration_s": duration_s}
    return _generate("on_off", params, seed, prompt, output, batch_fraction, slo_class, name,
                     lambda rng: _on_off_arrivals(rng, rate_on, rate_off, mean_on_s, mean_off_s,
                                                  duration_s))


def diurnal(mean_rate: float, duration_s: float, *, amplitude: float, period_s: float,
            peak_at_s: float | None = None, cv: float = 1.0, seed: Seed = 0,
            prompt: LogNormalLengths = AZURE_CONV_PROMPT,
            output: LogNormalLengths = AZURE_CONV_OUTPUT, batch_fraction: float = 0.0,
            slo_class: str = DEFAULT_SLO_CLASS, name: str = "diurnal") -> Trace:
    """Arrivals whose rate follows a sinusoid,
    ``mean_rate (1 + amplitude cos(2 pi (t - peak_at_s) / period_s))`` requests/s.

    :param amplitude: in [0, 1]; the rate swings between (1 -+ amplitude) mean_rate.
    :param period_s: seconds per cycle (86400 for a day; the default trace uses an hour).
    :param peak_at_s: when the rate peaks, in seconds; by default half a period in, so that the
        trace starts at its quietest.
    :param cv: the inter-arrival CV at a steady rate: a gamma renewal process (shape 1 / cv^2)
        is run in operational time and mapped through the inverse of the cumulative rate, so
        cv 1 gives exactly the non-homogeneous Poisson process that thinning would give, and
        other values keep their burstiness at every rate (thinning would dilute it towards 1).
    Other parameters as :func:`poisson`.
    """
    _check_positive(mean_rate=mean_rate, period_s=period_s, cv=cv)
    if not 0 <= amplitude <= 1:
        raise ValueError(f"amplitude must be in [0, 1], got {amplitude}")
    peak = period_s / 2 if peak_at_s is None else peak_at_s
    omega = 2 * math.pi / period_s

    def cumulative(t: np.ndarray) -> np.ndarray:
        return mean_rate * (t + amplitude / omega * (np.sin(omega * (t - peak))
                                                     + math.sin(omega * peak)))

    params = {"mean_rate": mean_rate, "duration_s": duration_s, "amplitude": amplitude,
              "period_s": period_s, "peak_at_s": peak, "cv": cv}
    return _generate("diurnal", params, seed, prompt, output, batch_fraction, slo_class, name,
                     lambda rng: _time_changed(rng, cumulative, duration_s,
                                               min(1.0, period_s / 256), 1.0 / cv**2))


def ramp(rate_start: float, rate_end: float, duration_s: float, *, cv: float = 1.0,
         seed: Seed = 0, prompt: LogNormalLengths = AZURE_CONV_PROMPT,
         output: LogNormalLengths = AZURE_CONV_OUTPUT, batch_fraction: float = 0.0,
         slo_class: str = DEFAULT_SLO_CLASS, name: str = "ramp") -> Trace:
    """Arrivals whose rate goes linearly from ``rate_start`` to ``rate_end`` requests/s over
    ``duration_s`` seconds (a load ramp); ``cv`` as in :func:`diurnal`. Other parameters as
    :func:`poisson`."""
    _check_positive(cv=cv)
    if not (rate_start >= 0 and rate_end >= 0 and rate_start + rate_end > 0
            and math.isfinite(rate_start + rate_end)):
        raise ValueError(f"ramp rates must be finite, >= 0 and not both 0, got "
                         f"rate_start={rate_start}, rate_end={rate_end}")

    def cumulative(t: np.ndarray) -> np.ndarray:
        return rate_start * t + (rate_end - rate_start) * t * t / (2 * duration_s)

    params = {"rate_start": rate_start, "rate_end": rate_end, "duration_s": duration_s, "cv": cv}
    return _generate("ramp", params, seed, prompt, output, batch_fraction, slo_class, name,
                     lambda rng: _time_changed(rng, cumulative, duration_s,
                                               min(1.0, duration_s / 4096), 1.0 / cv**2))


def default_trace(seed: int = 0, duration_s: float = 3600.0) -> Trace:
    """The embedded default: a synthetic stand-in for the Azure 2023 conversation trace.

    Poisson arrivals whose rate swings +-40% (:data:`DEFAULT_AMPLITUDE`) around 5.53/s in an
    hourly sinusoid, quietest at the start of each hour and busiest half-way, as the real
    trace is (its per-minute rate runs 3.2/s, 8.5/s at minute 32, then 3.7/s; within a minute
    its inter-arrival CV is 1.02, i.e. Poisson); the slow swing is what lifts the inter-arrival
    CV above 1 and the 1-s peak above a steady Poisson's (3.1 times the mean, averaged over
    20 seeds). Lengths are log-normal with the
    trace's mean and p99, clipped to its largest (14,050 prompt and 1,000 output tokens).

    Measured with :meth:`Trace.stats` against :data:`AZURE_CONV_TARGETS`, one hour:

    =====================  ======  ======  =============================
    figure                 target  seed 0  seeds 0-19: mean (min to max)
    =====================  ======  ======  =============================
    mean rate, requests/s  5.53    5.57    5.54 (5.44 to 5.63)
    inter-arrival CV       1.09    1.10    1.08 (1.07 to 1.10)
    peak 1 s / mean        3.4     3.59    3.59 (3.20 to 3.82)
    prompt tokens, mean    1155    1160    1153 (1146 to 1163)
    prompt tokens, p99     4142    4266    4125 (3986 to 4266)
    output tokens, mean    211     210     211 (209 to 212)
    output tokens, p99     601     606     602 (586 to 630)
    =====================  ======  ======  =============================

    The peak is the largest count of an hour, so it varies most between seeds; it runs about
    5% above the target on average (a smaller swing would lower it, and the CV with it).
    Generates an hour (about 20,000 requests) in about 5 ms.
    """
    trace = diurnal(AZURE_CONV_TARGETS["mean_rate"], duration_s, amplitude=DEFAULT_AMPLITUDE,
                    period_s=3600.0, seed=seed, name="default")
    return Trace(name=trace.name, arrival_s=trace.arrival_s, prompt_tokens=trace.prompt_tokens,
                 output_tokens=trace.output_tokens, slo_class=trace.slo_class,
                 source=f"default_trace(seed={seed}, duration_s={duration_s:g}) = {trace.source}")


def _generate(kind: str, params: dict[str, float], seed: Seed, prompt: LogNormalLengths,
              output: LogNormalLengths, batch_fraction: float, slo_class: str, name: str,
              arrivals: Callable[[np.random.Generator], np.ndarray]) -> Trace:
    """Draw arrivals, then lengths and classes, in that order, from one generator."""
    _check_positive(duration_s=params["duration_s"])
    for key in ("rate", "mean_rate"):
        if key in params:
            _check_positive(**{key: params[key]})
    if not 0 <= batch_fraction <= 1:
        raise ValueError(f"batch_fraction must be in [0, 1], got {batch_fraction}")
    rng = np.random.default_rng(seed)
    arrival_s = arrivals(rng)
    num = len(arrival_s)
    prompt_tokens = prompt.sample(rng, num)
    output_tokens = output.sample(rng, num)
    slo_classes = np.full(num, slo_class, dtype=f"<U{max(len(slo_class), len('batch'))}")
    if batch_fraction > 0:
        slo_classes[rng.random(num) < batch_fraction] = "batch"
    described = ", ".join(f"{key}={value:g}" for key, value in params.items())
    seed_text = seed if isinstance(seed, int) else "a Generator"
    source = (f"{kind}({described}, prompt={prompt}, output={output}, "
              f"batch_fraction={batch_fraction:g}, seed={seed_text})")
    return Trace(name=name, arrival_s=arrival_s, prompt_tokens=prompt_tokens,
                 output_tokens=output_tokens, slo_class=slo_classes, source=source)


def _renewal(rng: np.random.Generator, rate: float, duration_s: float,
             shape: float) -> np.ndarray:
    """Arrival times in [0, duration_s) of a renewal process with gamma gaps of mean 1 / rate."""
    expected = rate * duration_s
    arrival_s = np.empty(0)
    last = 0.0
    while last < duration_s:  # almost always once: the first draw has 5 sigma to spare
        num = int(expected + 5 * math.sqrt(expected / shape) + 16)
        gaps = rng.gamma(shape, 1.0 / (rate * shape), size=num)
        more = last + np.cumsum(gaps)
        arrival_s = np.concatenate([arrival_s, more])
        last = float(more[-1])
    return arrival_s[arrival_s < duration_s]


def _time_changed(rng: np.random.Generator, cumulative: Callable[[np.ndarray], np.ndarray],
                  duration_s: float, step_s: float, shape: float) -> np.ndarray:
    """A unit-rate gamma renewal process mapped through the inverse of ``cumulative`` (the
    expected number of requests by time t), found by interpolation on a ``step_s`` grid."""
    grid = np.linspace(0.0, duration_s, math.ceil(duration_s / step_s) + 1)
    expected = cumulative(grid)
    operational = _renewal(rng, 1.0, float(expected[-1]), shape)
    return np.interp(operational, expected, grid)


def _on_off_arrivals(rng: np.random.Generator, rate_on: float, rate_off: float,
                     mean_on_s: float, mean_off_s: float, duration_s: float) -> np.ndarray:
    """Arrival times in [0, duration_s) of on/off modulated Poisson arrivals."""
    num_cycles = int(duration_s / (mean_on_s + mean_off_s) * 1.5) + 8
    lengths = np.empty(0)
    while lengths.sum() < duration_s:
        cycle = np.column_stack([rng.exponential(mean_on_s, num_cycles),
                                 rng.exponential(mean_off_s, num_cycles)]).ravel()
        lengths = np.concatenate([lengths, cycle])
    starts = np.concatenate([[0.0], np.cumsum(lengths)[:-1]])
    inside = starts < duration_s
    starts, lengths = starts[inside], np.minimum(lengths[inside], duration_s - starts[inside])
    rates = np.where(np.arange(len(starts)) % 2 == 0, rate_on, rate_off)
    counts = rng.poisson(rates * lengths)
    arrival_s = np.repeat(starts, counts) + rng.random(counts.sum()) * np.repeat(lengths, counts)
    return np.sort(arrival_s)


def _check_positive(**values: float) -> None:
    for key, value in values.items():
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{key} must be a finite number > 0, got {value}")
