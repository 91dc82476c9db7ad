"""scripts/fidelity.py --save-profile: the in-situ calibration written as a profile the arena and
training load (the vLLM replays that produce the steps are tested in tests/vllm)."""

from __future__ import annotations

import dataclasses

import numpy as np

from runtime.engine.profile import CostModel, Profile
from runtime.engine.profiling import predict
from runtime.locations import profiles_dir
from runtime.vllm import PROFILE_NAME
from scripts.fidelity import Args, save_in_situ


def test_the_in_situ_profile_is_fitted_to_every_calibration_replay_and_loads(tmp_path):
    base = Profile.load(profiles_dir() / PROFILE_NAME)
    truth = CostModel(const_s=3e-3, prefill_token_s=1.4e-5, prefill_attn_pair_s=5e-9,
                      decode_seq_s=7e-5, decode_ctx_token_s=1.5e-7)
    rng = np.random.default_rng(0)
    replays = []
    for _ in range(2):  # the features of vLLM's steps: prefill tokens, pairs, decodes, context
        n = 400
        prefill = rng.integers(0, 2048, n) * (rng.random(n) < 0.4)
        decodes = rng.integers(1, 64, n)
        pairs = prefill * rng.integers(0, 4000, n) + prefill * (prefill + 1) / 2
        x = np.column_stack([np.ones(n), prefill, pairs, decodes,
                             decodes * rng.integers(100, 2000, n)]).astype(np.float64)
        y = predict(truth, x) * rng.uniform(0.97, 1.03, n)  # the host's noise
        replays.append((x, y))
    path = tmp_path / "insitu.json"
    args = Args(engine="vllm", rate=15.0, calibrate_seconds=20.0)
    saved = save_in_situ(base, replays, args, "0.32.0", path)
    assert saved["steps"] == 800 and saved["replays"] == 2 and saved["path"] == str(path)
    loaded = Profile.load(path)
    assert loaded.kind == "measured" and loaded.name == "insitu"
    assert loaded.fit["in_situ"]["engine"] == "vllm 0.32.0"
    assert loaded.memory == base.memory  # only the cost model is calibrated
    fitted = dataclasses.asdict(loaded.cost)
    for name, value in dataclasses.asdict(truth).items():
        assert abs(fitted[name] - value) <= 0.15 * value, (name, fitted[name], value)
    assert saved["fit_rel_err_median"] < 0.03
