"""Start PPO from a trained policy (``train.py --init-from``): a run folder, its ``model.zip``, or
an exported ``policy.onnx`` (the shipped policy is one).

A run folder gives the whole SB3 model (actor, critic, log std) and its ``vecnormalize.pkl``. An
ONNX file holds the action path only: its initializers are named after the policy's parameters
(``mlp_extractor.policy_net.0.weight``, ..., ``action_net.bias``; a bias of zeros is left out by
the exporter and restored as zeros) and the folded observation normalisation (``obs_mean``,
``obs_scale``); those are copied, and the critic stays as PPO initialised it. Either way the
policy must have this spec's inputs and outputs and the same hidden layers, or the load is
refused with both shapes named.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from runtime.observation import SPEC_VERSION


def _copy(model, tensors: dict[str, np.ndarray], source: Path) -> list[str]:
    state = model.policy.state_dict()
    copied = []
    for name, value in tensors.items():
        if name not in state:
            continue
        if tuple(state[name].shape) != tuple(value.shape):
            raise ValueError(f"--init-from {source}: {name} has shape {list(value.shape)}, this "
                             f"policy's has {list(state[name].shape)} (another spec or another "
                             "--net-arch)")
        state[name] = torch.as_tensor(np.array(value), dtype=state[name].dtype)
        copied.append(name)
    model.policy.load_state_dict(state)
    return copied


def load_onnx_weights(model, venv, path: Path) -> dict:
    """Copy an exported policy's actor weights and observation normalisation into ``model`` and
    ``venv``."""
    import onnx
    from onnx import numpy_helper

    proto = onnx.load(str(path))
    props = {p.key: p.value for p in proto.metadata_props}
    spec = props.get("batchpilot.spec_version", "")
    if spec != SPEC_VERSION:
        raise ValueError(f"--init-from {path} was exported under {spec or 'no spec'}; this "
                         f"build trains {SPEC_VERSION}: its inputs and outputs differ")
    tensors = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    # the exporter leaves out a layer's bias when it is all zeros (a Gemm without its third
    # input): such a bias is zero, not "keep this policy's"
    state = model.policy.state_dict()
    for name in list(tensors):
        bias = name.removesuffix(".weight") + ".bias"
        if name.endswith(".weight") and bias not in tensors and bias in state:
            tensors[bias] = np.zeros(tuple(state[bias].shape), dtype=np.float32)
    tensors = {k: tensors[k] for k in state if k in tensors} | {
        k: v for k, v in tensors.items() if k not in state}
    copied = _copy(model, tensors, path)
    if "obs_mean" in tensors and venv is not None and venv.norm_obs:
        venv.obs_rms.mean = tensors["obs_mean"].astype(np.float64)
        venv.obs_rms.var = tensors["obs_scale"].astype(np.float64) ** 2 - venv.epsilon
        venv.obs_rms.count = 1e4  # a trained normaliser: new rollouts move it slowly
        copied += ["obs_mean", "obs_scale"]
    return {"from": str(path), "kind": "onnx", "copied": copied,
            "policy_version": props.get("batchpilot.policy_version", "")}


def load_run(model, venv, path: Path) -> dict:
    """Copy a run's whole policy (``model.zip``) and its normaliser (``vecnormalize.pkl``)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecNormalize

    zip_path = path / "model.zip" if path.is_dir() else path
    norm_path = zip_path.parent / "vecnormalize.pkl"
    if not zip_path.is_file():
        raise FileNotFoundError(f"--init-from {path}: no {zip_path}")
    source = PPO.load(zip_path, device="cpu")
    copied = _copy(model, {k: v.numpy() for k, v in source.policy.state_dict().items()}, zip_path)
    if norm_path.is_file() and venv is not None:
        loaded = VecNormalize.load(str(norm_path), venv.venv)
        venv.obs_rms = loaded.obs_rms
        venv.ret_rms = loaded.ret_rms
        copied += ["vecnormalize"]
    return {"from": str(path), "kind": "run", "copied": copied}


def init_from(model, venv, path: str | Path) -> dict:
    """Start ``model`` (and ``venv``'s normaliser) from ``path``; returns what was copied."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"--init-from {path}: no such file or folder")
    if path.suffix == ".onnx":
        return load_onnx_weights(model, venv, path)
    return load_run(model, venv, path)
