"""Synthetic generators: their statistics over long traces, determinism, and the default trace.

Tolerances are about four standard errors of each figure for the trace lengths used, and the
seeds are fixed, so the tests are deterministic."""

from __future__ import annotations

import math
import re
import time

import numpy as np
import pytest

from env.traces.lengths import Z_99, LogNormalLengths, lognormal_params
from env.traces.synthetic import (
    AZURE_CONV_TARGETS,
    bursty,
    default_trace,
    diurnal,
    on_off,
    poisson,
    ramp,
)

SHORT = LogNormalLengths(mean=100.0, p99=400.0, max_tokens=2000)


def test_lognormal_params_reproduce_mean_and_p99():
    mu, sigma = lognormal_params(1155.0, 4142.0)
    assert math.exp(mu + sigma**2 / 2) == pytest.approx(1155.0)
    assert math.exp(mu + Z_99 * sigma) == pytest.approx(4142.0)


def test_lognormal_params_refuse_a_p99_too_far_above_the_mean():
    with pytest.raises(ValueError, match=r"^no log-normal has mean 10\.0 and p99 200\.0: p99 may "
                                         r"be at most 14\.97 times the mean, got 20\.00$"):
        lognormal_params(10.0, 200.0)


def test_lognormal_params_refuse_p99_below_mean():
    with pytest.raises(ValueError, match=r"^log-normal lengths need 0 < mean < p99, got "
                                         r"mean=10\.0, p99=5\.0$"):
        lognormal_params(10.0, 5.0)


def test_sampled_lengths_have_the_mean_and_p99_within_their_bounds():
    lengths = LogNormalLengths(mean=211.0, p99=601.0, max_tokens=1000)
    drawn = lengths.sample(np.random.default_rng(0), 200_000)
    assert drawn.dtype == np.int64 and drawn.min() >= 1 and drawn.max() <= 1000
    assert drawn.mean() == pytest.approx(211.0, rel=0.005)
    assert np.percentile(drawn, 99) == pytest.approx(601.0, rel=0.01)


def test_sampled_lengths_are_clipped_to_max_tokens():
    drawn = LogNormalLengths(mean=100.0, p99=1000.0, max_tokens=150).sample(
        np.random.default_rng(0), 10_000)
    assert drawn.max() == 150


def cv(trace) -> float:
    gaps = np.diff(trace.arrival_s)
    return float(gaps.std() / gaps.mean())


def test_poisson_has_the_rate_and_unit_cv():
    trace = poisson(10.0, 20_000.0, seed=1, prompt=SHORT, output=SHORT)
    assert trace.mean_rate == pytest.approx(10.0, rel=0.01)
    assert cv(trace) == pytest.approx(1.0, abs=0.01)
    assert trace.arrival_s.min() >= 0 and trace.arrival_s.max() < 20_000.0
    assert trace.prompt_tokens.mean() == pytest.approx(100.0, rel=0.01)


@pytest.mark.parametrize("target_cv", [0.5, 2.0, 4.0])
def test_bursty_gaps_have_the_chosen_cv(target_cv):
    trace = bursty(10.0, 20_000.0, target_cv, seed=2, prompt=SHORT, output=SHORT)
    assert trace.mean_rate == pytest.approx(10.0, rel=0.01 * target_cv)
    assert cv(trace) == pytest.approx(target_cv, rel=0.03)


def test_on_off_has_its_long_run_rate_and_is_silent_when_off():
    # 2,000 on/off cycles: the rate's standard error is about 2.2%
    trace = on_off(20.0, 80_000.0, mean_on_s=10.0, mean_off_s=30.0, seed=3, prompt=SHORT,
                   output=SHORT)
    assert trace.mean_rate == pytest.approx(20.0 * 10 / 40, rel=0.09)
    assert cv(trace) > 3  # long silences between bursts
    assert trace.arrival_s.max() < 80_000.0


def test_on_off_off_rate_adds_arrivals():
    trace = on_off(20.0, 80_000.0, mean_on_s=10.0, mean_off_s=30.0, rate_off=2.0, seed=3,
                   prompt=SHORT, output=SHORT)
    assert trace.mean_rate == pytest.approx((20.0 * 10 + 2.0 * 30) / 40, rel=0.07)


def test_diurnal_rate_peaks_and_troughs_as_the_sinusoid_says():
    trace = diurnal(10.0, 36_000.0, amplitude=0.5, period_s=3600.0, seed=4, prompt=SHORT,
                    output=SHORT)
    phase = trace.arrival_s % 3600.0
    # the rate 10 (1 + 0.5 cos(2 pi (t - 1800) / 3600)) averaged over 10 min around trough / peak
    mean_factor = math.sin(math.pi / 6) / (math.pi / 6)
    trough = np.count_nonzero((phase < 300) | (phase >= 3300)) / (10 * 600)
    peak = np.count_nonzero(np.abs(phase - 1800) < 300) / (10 * 600)
    assert trough == pytest.approx(10 * (1 - 0.5 * mean_factor), rel=0.05)
    assert peak == pytest.approx(10 * (1 + 0.5 * mean_factor), rel=0.05)
    assert trace.mean_rate == pytest.approx(10.0, rel=0.01)


def test_diurnal_keeps_its_local_cv():
    trace = diurnal(10.0, 36_000.0, amplitude=0.3, period_s=36_000.0, cv=3.0, seed=5,
                    prompt=SHORT, output=SHORT)
    gaps = np.diff(trace.arrival_s[(trace.arrival_s > 15_000) & (trace.arrival_s < 21_000)])
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.1)


def test_ramp_rate_rises_linearly():
    trace = ramp(2.0, 20.0, 10_000.0, seed=6, prompt=SHORT, output=SHORT)
    first = np.count_nonzero(trace.arrival_s < 1000.0)
    last = np.count_nonzero(trace.arrival_s >= 9000.0)
    assert first == pytest.approx(1000 * (2.0 + 0.9), rel=0.08)  # mean rate over the first 10%
    assert last == pytest.approx(1000 * (20.0 - 0.9), rel=0.05)
    assert len(trace) == pytest.approx(10_000 * 11.0, rel=0.02)


def test_batch_fraction_puts_that_share_in_the_batch_class():
    trace = poisson(10.0, 10_000.0, seed=7, batch_fraction=0.25)
    assert set(trace.slo_class.tolist()) == {"interactive", "batch"}
    assert np.mean(trace.slo_class == "batch") == pytest.approx(0.25, abs=0.01)


def test_without_batch_fraction_every_request_is_in_slo_class():
    trace = poisson(5.0, 100.0, seed=7, slo_class="batch")
    assert set(trace.slo_class.tolist()) == {"batch"}


@pytest.mark.parametrize("make", [
    lambda seed: poisson(5.0, 600.0, seed=seed),
    lambda seed: bursty(5.0, 600.0, 2.0, seed=seed),
    lambda seed: on_off(10.0, 600.0, mean_on_s=5.0, mean_off_s=5.0, seed=seed),
    lambda seed: diurnal(5.0, 600.0, amplitude=0.5, period_s=300.0, seed=seed),
    lambda seed: ramp(1.0, 9.0, 600.0, seed=seed),
], ids=["poisson", "bursty", "on_off", "diurnal", "ramp"])
def test_generators_are_deterministic_given_a_seed(make):
    one, two, other = make(11), make(11), make(12)
    assert one.arrival_s.tolist() == two.arrival_s.tolist()
    assert one.prompt_tokens.tolist() == two.prompt_tokens.tolist()
    assert one.output_tokens.tolist() == two.output_tokens.tolist()
    assert one.source == two.source
    assert one.arrival_s.tolist() != other.arrival_s.tolist()
    assert np.all(np.diff(one.arrival_s) >= 0) and one.arrival_s.max() < 600.0


def test_a_generator_object_is_drawn_from_and_named_in_the_source():
    rng = np.random.default_rng(3)
    trace = poisson(5.0, 60.0, seed=rng, prompt=SHORT, output=SHORT)
    assert trace.source == (
        "poisson(rate=5, duration_s=60, prompt=lognormal(mean=100, p99=400, max=2000), "
        "output=lognormal(mean=100, p99=400, max=2000), batch_fraction=0, seed=a Generator)")
    assert poisson(5.0, 60.0, seed=rng).arrival_s.tolist() != trace.arrival_s.tolist()


@pytest.mark.parametrize("make, message", [
    (lambda: poisson(0.0, 60.0), "rate must be a finite number > 0, got 0.0"),
    (lambda: poisson(1.0, -1.0), "duration_s must be a finite number > 0, got -1.0"),
    (lambda: bursty(1.0, 60.0, 0.0), "cv must be a finite number > 0, got 0.0"),
    (lambda: diurnal(1.0, 60.0, amplitude=1.5, period_s=60.0),
     "amplitude must be in [0, 1], got 1.5"),
    (lambda: on_off(1.0, 60.0, mean_on_s=1.0, mean_off_s=1.0, rate_off=-1.0),
     "rate_off must be a finite number >= 0, got -1.0"),
    (lambda: ramp(0.0, 0.0, 60.0),
     "ramp rates must be finite, >= 0 and not both 0, got rate_start=0.0, rate_end=0.0"),
    (lambda: poisson(1.0, 60.0, batch_fraction=1.5), "batch_fraction must be in [0, 1], got 1.5"),
])
def test_generators_refuse_bad_parameters(make, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        make()


def test_default_trace_is_deterministic_for_a_seed():
    one, two = default_trace(seed=3), default_trace(seed=3)
    assert one.arrival_s.tolist() == two.arrival_s.tolist()
    assert one.prompt_tokens.tolist() == two.prompt_tokens.tolist()
    assert default_trace(seed=4).arrival_s.tolist() != one.arrival_s.tolist()
    assert one.name == "default"
    assert one.source.startswith("default_trace(seed=3, duration_s=3600) = diurnal(mean_rate=5.53")


# the stated tolerances of default_trace(seed=0) to the Azure conversation trace's figures
DEFAULT_TOLERANCES = {
    "mean_rate": 0.02, "interarrival_cv": 0.03, "peak_1s_over_mean": 0.15,
    "prompt_mean": 0.02, "prompt_p99": 0.05, "output_mean": 0.02, "output_p99": 0.05,
}


@pytest.mark.parametrize("figure", sorted(DEFAULT_TOLERANCES))
def test_default_trace_matches_the_azure_conversation_trace(figure):
    stats = default_trace(seed=0).stats()
    assert stats[figure] == pytest.approx(AZURE_CONV_TARGETS[figure],
                                          rel=DEFAULT_TOLERANCES[figure])


def test_default_trace_spans_its_duration():
    trace = default_trace(seed=0, duration_s=600.0)
    assert trace.arrival_s.min() >= 0 and trace.arrival_s.max() < 600.0
    assert trace.duration_s > 590.0


def test_default_trace_generates_an_hour_in_well_under_a_second():
    start = time.perf_counter()
    default_trace(seed=1)
    assert time.perf_counter() - start < 0.25
