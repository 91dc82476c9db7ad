"""Long-context traffic: TTFT targets that grow with the prompt, quantised arrivals spread within
their step, and spec-1 policies served under the widened observation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from env.traces.resolve import resolve_trace
from runtime.decider.onnx_policy import OnnxPolicy
from runtime.engine.slo import (
    DEFAULT_SLO_CLASSES,
    LONG_CONTEXT_SLO_CLASSES,
    SloTarget,
    parse_slo_classes,
    slo_classes_from_arg,
)
from runtime.knobs import Knobs
from runtime.observation import (
    OBS_DIM,
    OBSERVATION_INDEX,
    SPEC_ADAPTERS,
    SPEC_VERSION,
    adapt_vector,
    vector_from_fields,
)
from tests.conftest import observation
from tests.engine_factory import hand_profile, make_engine

ROOT = Path(__file__).resolve().parents[1]
SPEC1_POLICY = ROOT / "tests" / "fixtures" / "policy-spec1.onnx"
"""the policy shipped under spec 1 (the first build's), kept to test the adapter"""


def test_a_ttft_target_grows_by_its_allowance_per_prompt_token():
    target = SloTarget(ttft_s=1.0, tpot_s=0.05, ttft_per_prompt_token_s=0.15e-3)
    assert target.ttft_target_s(100_000) == pytest.approx(16.0)
    assert DEFAULT_SLO_CLASSES["interactive"].ttft_target_s(100_000) == 1.0


def test_the_engine_gives_each_request_the_target_of_its_prompt_length():
    classes = {"interactive": SloTarget(1.0, 0.05, ttft_per_prompt_token_s=0.01)}
    engine = make_engine(hand_profile(), slo_classes=classes)
    engine.add_requests([0.0, 0.0], [10, 300], [2, 2])
    assert [r.ttft_target_s for r in engine.requests] == [1.1, 4.0]


def test_a_long_prompt_meets_a_growing_target_that_a_fixed_one_misses():
    # 1 ms per prefill token: a 3000-token prompt's first token comes after 3 s of prefill.
    def attainment(classes) -> float:
        engine = make_engine(hand_profile(blocks_at_half=400), chunk=4096, ratio=0.9,
                             slo_classes=classes)
        engine.add_requests([0.0], [3000], [2])
        while engine.has_work():
            engine.run_until(engine.now + 1.0)
        return engine.summary().slo_attainment

    assert attainment(DEFAULT_SLO_CLASSES) == 0.0
    assert attainment({"interactive": SloTarget(1.0, 0.05, ttft_per_prompt_token_s=1.5e-3)}) \
        == 1.0


def test_slo_classes_parse_with_an_optional_allowance_or_by_preset():
    classes = parse_slo_classes("interactive:1+0.00015/tok:0.05,batch:3600:1:3600")
    assert classes == {"interactive": SloTarget(1.0, 0.05, ttft_per_prompt_token_s=0.00015),
                       "batch": SloTarget(3600.0, 1.0, deadline_s=3600.0)}
    assert slo_classes_from_arg("long-context") == LONG_CONTEXT_SLO_CLASSES
    with pytest.raises(ValueError, match=r"SLO class 'interactive': ttft '1\+0.00015': an "
                                         r"allowance is written BASE\+SECONDS/tok"):
        parse_slo_classes("interactive:1+0.00015:0.05")


def write_mooncake(path: Path, timestamps_ms: list[int]) -> Path:
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": 100 + i,
                                        "output_length": 5}) + "\n"
                            for i, t in enumerate(timestamps_ms)))
    return path


QUANTISED_MS = [0] * 6 + [3000] * 4 + [5999] * 5 + [9000] * 3
"""Mooncake's conversation trace in miniature: 3 s steps, one of them a millisecond short"""


def test_the_mooncake_reader_says_when_timestamps_are_quantised(tmp_path):
    trace = resolve_trace(str(write_mooncake(tmp_path / "conv.jsonl", QUANTISED_MS)),
                          spread=False)
    assert trace.timestamp_step_s == 3.0
    assert trace.source.endswith("(timestamps quantised to 3 s steps: 4 instants for 18 "
                                 "requests, at most 6 at one)")
    steady = resolve_trace(str(write_mooncake(tmp_path / "s.jsonl", list(range(0, 1800, 100)))))
    assert steady.timestamp_step_s == 0.0 and "jitter" not in steady.source


def test_resolved_quantised_arrivals_are_spread_within_their_step(tmp_path):
    path = str(write_mooncake(tmp_path / "conv.jsonl", QUANTISED_MS))
    trace = resolve_trace(path)
    assert trace.source.endswith("[jitter 3 s]") and trace.timestamp_step_s == 0.0
    assert len(np.unique(trace.arrival_s)) == 18 and np.all(np.diff(trace.arrival_s) >= 0)
    assert trace.arrival_s.min() >= 0 and trace.arrival_s.max() < 12.0
    # every request stays in the step that follows its timestamp, with its own lengths
    step_of = {100 + i: t / 1000 for i, t in enumerate(QUANTISED_MS)}
    for a, p in zip(trace.arrival_s, trace.prompt_tokens):
        assert step_of[p] <= a < step_of[p] + 3.0
    again = resolve_trace(path)
    np.testing.assert_array_equal(again.arrival_s, trace.arrival_s)


def test_spec_2_and_later_cover_a_128k_token_prompt():
    fields = {"prompt_tokens_mean": 131072.0, "prompt_tokens_std": 0.0}
    v = vector_from_fields({**dict.fromkeys(OBSERVATION_INDEX, 0.0), **fields,
                            "batch_window_ms": 5.0, "prefill_chunk_tokens": 2048.0,
                            "kv_cache_ratio": 0.9})
    assert v[OBSERVATION_INDEX["prompt_tokens_mean"]] == 1.0
    assert SPEC_VERSION.startswith("batchpilot-spec/3+")


def test_a_spec_1_policy_gets_the_vector_spec_1_built():
    # the spec-1 and spec-2 digests are those their policies were exported with
    assert list(SPEC_ADAPTERS) == ["batchpilot-spec/2+fa1b6ac553c6",
                                   "batchpilot-spec/1+ec2379fcdc3d"]
    adapter = SPEC_ADAPTERS["batchpilot-spec/1+ec2379fcdc3d"]
    i = OBSERVATION_INDEX["prompt_tokens_mean"]
    assert (adapter.obs_dim, adapter.num_actions) == (20, 3)
    vec = np.zeros(OBS_DIM, dtype=np.float32)
    for x, spec1 in ((30_000.0, math.log1p(30_000) / math.log1p(65536)), (100_000.0, 1.0)):
        vec[i] = math.log1p(x) / math.log1p(131072)
        # the prompt field keeps its place (index 2) among spec 1's 20 fields
        assert adapt_vector(vec, adapter)[i] == pytest.approx(spec1, abs=1e-6)
    # spec 1 and 2 see the 17 measured fields of spec 2 and the first three knobs, in order
    full = observation(Knobs(30.0, 1024, 0.7, 0.2, 3.0))
    old = adapt_vector(full, SPEC_ADAPTERS["batchpilot-spec/2+fa1b6ac553c6"])
    np.testing.assert_array_equal(old, np.concatenate([full[:17], full[-5:-2]]))
    policy = OnnxPolicy.load(SPEC1_POLICY)
    assert policy.spec_version == adapter.version
    assert policy.num_actions == 3 and np.isfinite(policy.act(vec)).all()


def test_the_mooncake_alias_reads_from_the_traces_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHPILOT_TRACES_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"download-traces --kind mooncake"):
        resolve_trace("mooncake")
    (tmp_path / "mooncake-fast25").mkdir()
    write_mooncake(tmp_path / "mooncake-fast25" / "synthetic_trace.jsonl", [0, 250, 700])
    assert len(resolve_trace("mooncake")) == 3


def test_mooncake_runs_end_to_end_with_only_the_requests_past_128k_refused():
    from env.replay import replay
    from env.traces.locations import mooncake_trace_path
    from runtime.engine.profile import Profile
    from runtime.knobs import DEFAULT_KNOBS

    try:
        trace = resolve_trace(str(mooncake_trace_path()))
    except FileNotFoundError as e:
        pytest.skip(str(e))
    assert len(trace) == 3993 and trace.timestamp_step_s == 0.0
    assert int((trace.prompt_tokens + trace.output_tokens > 131072).sum()) == 10
    s = replay(trace, DEFAULT_KNOBS, profile=Profile.load("h100-llama3.1-8b-40gib-roofline"),
               ).summary
    assert (s.finished, s.rejected, s.rejected_by_reason) == \
        (3983, 10, {"exceeds_max_model_len": 10})
