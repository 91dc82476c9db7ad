"""Profiles of today's models and accelerators: derived by name, their context, their figures."""

from __future__ import annotations

import math

import numpy as np
import pytest

from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.executor import GIB
from runtime.engine.profile import Profile, default_profile_path
from runtime.engine.request import RejectReason
from runtime.engine.roofline import (
    ACCELERATORS,
    ALLREDUCE_LATENCY_S,
    EFFICIENCY,
    MODELS,
    ProfileChoice,
    derive,
    parse_profile_name,
)
from runtime.engine.sim_executor import SimulatedExecutor
from runtime.knobs import Knobs


def test_llama31_8b_on_h100_at_40_gib_has_gqa_kv_and_a_128k_context():
    p = Profile.load("h100-llama3.1-8b-40gib-roofline")
    assert p.kind == "roofline" and p.max_model_len == 131072
    assert p.memory.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    # (40 GiB - 8.03e9 * 2 bytes) * 0.9 / (16 tokens * 128 KiB)
    assert p.memory.num_kv_blocks(0.9) == math.floor(0.9 * (40 * GIB - 16.06e9) / 2097152) \
        == 11539
    h100 = ACCELERATORS["h100"]
    assert p.cost.const_s == pytest.approx(16.06e9 / (3.35e12 * 0.8) + 0.3e-3)
    matmul = 8.03e9 - 128256 * 4096
    assert p.cost.prefill_token_s == pytest.approx(2 * matmul / (h100.bf16_flops * 0.6))
    assert p.cost.decode_ctx_token_s == pytest.approx(131072 / (3.35e12 * 0.7))


def test_every_model_derives_on_every_accelerator_with_its_names_round_trip():
    for model, shape in MODELS.items():
        for accel in ACCELERATORS:
            p = derive(model, accel, 40.0)
            assert parse_profile_name(p.name) == (model, accel, 40.0, shape.default_tp)
            assert p.max_model_len == shape.max_model_len
            assert p.derivation["efficiency"]["gemm"] == EFFICIENCY["gemm"]


def test_a_profile_file_of_the_same_name_wins_over_the_derivation():
    assert Profile.load("h200-llama2-7b-40gib-roofline") == Profile.load(default_profile_path())


def test_an_unknown_profile_name_is_refused_naming_the_catalogue():
    with pytest.raises(FileNotFoundError, match=r"'h100-gpt5-40gib-roofline' is neither a file "
                       r"nor a profile name; names are ACCELERATOR-MODEL-40gib-roofline"):
        Profile.load("h100-gpt5-40gib-roofline")


def test_tensor_parallel_splits_the_work_and_pays_two_all_reduces_per_layer():
    one = derive("llama3.1-70b", "h100", 80 * 1e9 / GIB, tp=2)
    four = derive("llama3.1-70b", "h100", 40.0, tp=4)
    assert four.name == "h100x4-llama3.1-70b-40gib-roofline"
    assert four.memory.total_bytes == 4 * 40 * GIB
    comm = 2 * 80 * 2 * 3 / 4 * 8192 * 2 / (450e9 * 0.7)
    compute = 2 * (70.6e9 - 128256 * 8192) / (4 * 989e12 * 0.6)
    assert four.cost.prefill_token_s == pytest.approx(compute + comm)
    assert four.cost.const_s == pytest.approx(
        141.2e9 / (4 * 3.35e12 * 0.8) + 0.3e-3 + 2 * 80 * ALLREDUCE_LATENCY_S["NVLink 4"])
    assert one.cost.const_s > four.cost.const_s


def test_configurations_that_cannot_run_are_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"Llama-3.1-70B's 131.5 GiB of weights do not fit in "
                                         r"tp=1 x 40 GiB"):
        derive("llama3.1-70b", "h100", 40.0, tp=1)
    with pytest.raises(ValueError, match=r"tp=16 must be 1, 2, 4 or 8 and divide"):
        derive("llama3.1-8b", "h100", 40.0, tp=16)
    with pytest.raises(ValueError, match=r"memory_gib=50 must lie in \(0, 44.7\] GiB, the "
                                         r"memory of one NVIDIA L40S"):
        derive("llama3.1-8b", "l40s", 50.0)


def test_profile_choice_names_the_catalogue_profile_or_passes_a_path_through():
    assert ProfileChoice(model="llama3.1-8b", accelerator="h100").spec() == \
        "h100-llama3.1-8b-40gib-roofline"
    assert ProfileChoice(model="llama3.1-70b", accelerator="a100", memory_gib=60).spec() == \
        "a100x4-llama3.1-70b-60gib-roofline"
    assert ProfileChoice(profile="x.json").spec() == "x.json"
    assert ProfileChoice().spec() is None
    with pytest.raises(ValueError, match="model and accelerator go together"):
        ProfileChoice(model="llama3.1-8b").spec()


def test_key_figures_price_a_decode_step_at_batch_1_and_64_with_4k_context():
    p = Profile.load("h100-llama3.1-8b-40gib-roofline")
    f = p.key_figures()
    c = p.cost
    assert f["decode_step_ms_b64"] == pytest.approx(
        1e3 * (c.const_s + 64 * (c.decode_seq_s + 4096 * c.decode_ctx_token_s)))
    assert f["kv_blocks"] == {0.4: 5128, 0.9: 11539, 0.95: 12180}
    assert f["source"] == "derived: datasheet x efficiency"


def test_the_engine_serves_the_profiles_context_unless_configured_otherwise():
    ex = SimulatedExecutor(Profile.load("h100-llama3.1-8b-40gib-roofline"))
    engine = Engine(ex, Knobs(5.0, 16384, 0.9))
    engine.add_requests([0.0, 0.0], [131072 - 16, 131072], [16, 1])
    while engine.has_work():
        engine.run_until(engine.now + 60.0)
    first, second = engine.requests
    assert first.reject_reason is None and first.finish_s is not None
    assert second.reject_reason == RejectReason.EXCEEDS_MAX_MODEL_LEN
    capped = Engine(ex, Knobs(5.0, 2048, 0.9), EngineConfig(max_model_len=4096))
    assert capped.max_model_len == 4096


def test_a_profile_file_without_a_context_keeps_the_one_it_always_had():
    data = Profile.load().to_json()
    assert "max_model_len" not in data  # 16384, the default, is left out of the JSON
    assert Profile.from_json(data).max_model_len == 16384
    assert Profile.load("checkpoints/profiles/cpu-tiny-measured.json").max_model_len == 4096


@pytest.mark.parametrize("model", list(MODELS))
def test_the_scaled_down_cpu_shape_keeps_the_attention_layout(model):
    torch_model = pytest.importorskip("runtime.engine.torch_model")
    full, cpu = torch_model.SHAPES[model], torch_model.SHAPES[model + "-cpu"]
    shape = MODELS[model]
    assert (full.num_heads, full.num_kv_heads, full.hidden_size) == \
        (shape.heads, shape.kv_heads, shape.hidden)
    assert (cpu.num_heads, cpu.num_kv_heads, cpu.rope_theta) == \
        (full.num_heads, full.num_kv_heads, full.rope_theta)
    assert full.max_position == shape.max_model_len and cpu.max_position == 4096
    assert full.num_params == pytest.approx(shape.params, rel=2e-3)


@pytest.mark.parametrize("model", ["llama3.1-8b", "qwen2.5-7b", "llama3.1-70b"])
def test_the_torch_executor_runs_a_scaled_down_shape_through_the_engine(model):
    pytest.importorskip("torch")
    from runtime.engine.torch_executor import TorchExecutor

    ex = TorchExecutor.for_shape(model + "-cpu", device="cpu", budget_gib=0.25,
                                 max_model_len=1024, keep_logits=True)
    assert ex.max_model_len == 1024 and ex.cfg.num_kv_heads == MODELS[model].kv_heads
    engine = Engine(ex, Knobs(5.0, 64, 0.4), EngineConfig(fast_path=False))
    engine.add_requests(np.zeros(3), [40, 70, 9], [3, 2, 4])
    while engine.has_work():
        engine.run_until(engine.now + 1.0)
    assert [r.reject_reason for r in engine.requests] == [None, None, None]
    assert all(np.isfinite(ex.last_logits[r.req_id].float().numpy()).all()
               for r in engine.requests)


def test_list_profiles_prints_the_key_figures_of_the_chosen_ones():
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "scripts/list_profiles.py", "--model", "llama3.1-8b",
                          "--accelerator", "h100", "--json"], cwd=root, capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=str(root)), timeout=60)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert rows[0]["name"] == "h100-llama3.1-8b-40gib-roofline"
    assert rows[0]["kv_blocks"] == {"0.4": 5128, "0.9": 11539, "0.95": 12180}
    assert rows[0]["source"] == "derived: datasheet x efficiency"
    assert [r["name"] for r in rows[1:]] == ["cpu-tiny-0.25gib-measured", "cpu-vllm-tiny-measured",
                                             "h200-llama2-7b-40gib-roofline"]
