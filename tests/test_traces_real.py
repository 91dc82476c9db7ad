"""The real Azure 2023 traces in traces_dir() (``../shared/traces`` or $BATCHPILOT_TRACES_DIR):
the readers reproduce the figures ``../shared/traces/README.md`` publishes. Skipped, with the
reason, where the files are absent."""

from __future__ import annotations

import time

import numpy as np
import pytest

from env.traces.azure import read_azure
from env.traces.load import load_trace
from env.traces.locations import azure_trace_path, traces_dir
from env.traces.trace import Trace
from env.traces.transforms import TRAIN_SPLIT_S, split

# kind: (rows, span s, mean rate /s, inter-arrival CV, peak 1 s / mean, prompt mean, prompt p99,
#        output mean, output p99), as the README tabulates them (span and means more precisely)
PUBLISHED = {
    "conv": (19_366, 3501.7, 5.53, 1.09, 3.4, 1154.7, 4142, 211.1, 601),
    "code": (8_819, 3435.9, 2.57, 13.15, 28.0, 2047.8, 7436, 27.9, 251),
}


def real_path(kind: str):
    try:
        return azure_trace_path(kind)
    except FileNotFoundError:
        pytest.skip(f"Azure {kind} trace not found in {traces_dir()}; set BATCHPILOT_TRACES_DIR "
                    "or run scripts/download_traces.py")


_loaded: dict[str, tuple[Trace, float]] = {}


def load_once(kind: str) -> tuple[Trace, float]:
    """The trace and the seconds its first read took (each file is read once per session)."""
    if kind not in _loaded:
        path = real_path(kind)
        start = time.perf_counter()
        trace = read_azure(path)
        _loaded[kind] = (trace, time.perf_counter() - start)
    return _loaded[kind]


@pytest.mark.parametrize("kind", sorted(PUBLISHED))
def test_real_trace_has_published_rows_span_and_lengths(kind):
    trace, _ = load_once(kind)
    rows, span_s, _, _, _, prompt_mean, prompt_p99, output_mean, output_p99 = PUBLISHED[kind]
    assert len(trace) == rows
    assert trace.skipped == {}
    assert trace.arrival_s[0] == 0.0
    assert trace.duration_s == pytest.approx(span_s, abs=0.1)
    assert trace.prompt_tokens.mean() == pytest.approx(prompt_mean, abs=0.05)
    assert trace.output_tokens.mean() == pytest.approx(output_mean, abs=0.05)
    assert np.percentile(trace.prompt_tokens, 99) == pytest.approx(prompt_p99, abs=0.5)
    assert np.percentile(trace.output_tokens, 99) == pytest.approx(output_p99, abs=0.5)


@pytest.mark.parametrize("kind", sorted(PUBLISHED))
def test_real_trace_has_published_rate_burstiness_and_peak(kind):
    trace = load_once(kind)[0]
    stats = trace.stats()
    _, _, rate, cv, peak, *_ = PUBLISHED[kind]
    assert stats["mean_rate"] == pytest.approx(rate, abs=0.005)
    assert stats["interarrival_cv"] == pytest.approx(cv, abs=0.005)
    assert stats["peak_1s_over_mean"] == pytest.approx(peak, rel=0.02)  # published to 2 digits
    assert trace.peak_requests_in(1.0) == {"conv": 19, "code": 72}[kind]


def test_conv_trace_reads_in_well_under_a_second():
    assert load_once("conv")[1] < 0.5


def test_load_trace_detects_the_azure_format():
    trace = load_trace(real_path("code"), slo_class="batch")
    assert len(trace) == 8_819 and set(trace.slo_class.tolist()) == {"batch"}


def test_conv_trace_splits_into_40_minutes_of_training_and_the_rest_for_evaluation():
    trace, _ = load_once("conv")
    train, evaluation = split(trace, "train"), split(trace, "eval")
    assert len(train) + len(evaluation) == len(trace)
    assert train.arrival_s[-1] < TRAIN_SPLIT_S
    assert evaluation.arrival_s[0] >= 0 and evaluation.arrival_s[0] < 1.0
    assert evaluation.arrival_s[-1] == pytest.approx(trace.arrival_s[-1] - TRAIN_SPLIT_S)


def test_the_named_mixed_workload_is_the_conversation_trace_plus_three_batch_drops():
    real_path("conv")
    from env.traces.resolve import resolve_trace

    trace = resolve_trace("mixed")
    classes = trace.slo_class.tolist()
    assert (classes.count("interactive"), classes.count("batch")) == (19_366, 2_400)
    assert trace.name == "mixed-AzureLLMInferenceTrace_conv"
