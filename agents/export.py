"""Export a trained PPO policy to ONNX: the action path only, ready for the runtime decider.

The graph computes, for a float32 ``obs`` of shape ``[batch, OBS_DIM]``, the actions
``[batch, NUM_KNOBS]``::

    x = clip((obs - mean) / sqrt(var + eps), -clip_obs, clip_obs)     # VecNormalize, folded in
    action = clip(action_net(mlp_extractor.forward_actor(x)), -1, 1)   # SB3's deterministic action

and nothing else (no value head, no sampling). Weights live inside the file, the opset is fixed,
and the metadata carries the spec version the runtime checks before it trusts the model. The
export compares the ONNX actions on thousands of observations, many far outside the training
range, with the float32 torch module it was exported from (the same arithmetic: a graph that
computes something else fails by far more than ``graph_atol``) and with the torch policy as it
trained (``model.predict(..., deterministic=True)`` on VecNormalize's float64 normalisation,
within ``atol``), and refuses to write a model that fails either.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from runtime.knobs import NUM_KNOBS
from runtime.observation import OBS_DIM, OBS_HIGH, OBS_LOW, SPEC_VERSION

OPSET = 18
INPUT_NAME = "obs"
OUTPUT_NAME = "action"
ALLOWED_OPS = {"Sub", "Div", "Mul", "Add", "Sqrt", "Clip", "Gemm", "MatMul", "Tanh", "Relu",
               "Max", "Min", "Constant", "Identity", "Reshape", "Flatten", "Cast"}


class ActionPath(nn.Module):
    """The deterministic action of an SB3 ``ActorCriticPolicy`` with VecNormalize folded in."""

    def __init__(self, policy, obs_mean: np.ndarray | None, obs_var: np.ndarray | None,
                 clip_obs: float = 10.0, epsilon: float = 1e-8) -> None:
        super().__init__()
        self.features_extractor = policy.pi_features_extractor
        self.mlp_extractor = policy.mlp_extractor
        self.action_net = policy.action_net
        mean = np.zeros(OBS_DIM) if obs_mean is None else obs_mean
        scale = np.ones(OBS_DIM) if obs_var is None else np.sqrt(obs_var + epsilon)
        self.register_buffer("obs_mean", torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer("obs_scale", torch.as_tensor(scale, dtype=torch.float32))
        self.clip_obs = float(clip_obs) if obs_mean is not None else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = (obs - self.obs_mean) / self.obs_scale
        if self.clip_obs is not None:
            x = torch.clamp(x, -self.clip_obs, self.clip_obs)
        features = self.features_extractor(x)
        latent = self.mlp_extractor.forward_actor(features)
        return torch.clamp(self.action_net(latent), -1.0, 1.0)


@dataclass(frozen=True)
class ExportReport:
    path: Path
    max_abs_diff: float
    """the largest action difference from the torch policy as it trained"""
    num_checked: int
    operators: dict[str, int]
    bytes: int
    graph_abs_diff: float = 0.0
    """the largest action difference from the float32 torch module the graph was exported from"""

    def as_dict(self) -> dict:
        return {"path": str(self.path), "max_abs_diff": self.max_abs_diff,
                "graph_abs_diff": self.graph_abs_diff, "num_checked": self.num_checked,
                "operators": self.operators, "bytes": self.bytes}


class ExportParityError(RuntimeError):
    pass


@contextlib.contextmanager
def _quiet_exporter():
    """The dynamo exporter logs a warning per missing torchvision op and a deprecation warning
    from torch internals on every export; none concerns an MLP."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        logger.setLevel(level)


def parity_observations(n: int = 4096, seed: int = 0) -> np.ndarray:
    """Observations to check the export on: inside the spec's bounds, at its corners, and far
    outside (x100) where the folded clipping must agree with the torch path."""
    rng = np.random.default_rng(seed)
    lo, hi = OBS_LOW.astype(np.float64), OBS_HIGH.astype(np.float64)
    inside = rng.uniform(lo, hi, (n // 2, OBS_DIM))
    corners = np.where(rng.random((n // 4, OBS_DIM)) < 0.5, lo, hi)
    outside = rng.normal(0, 100, (n - n // 2 - n // 4, OBS_DIM))
    return np.concatenate([inside, corners, outside]).astype(np.float32)


def torch_actions(model, vecnormalize, obs: np.ndarray) -> np.ndarray:
    """The actions SB3 would take (VecNormalize'd observations, deterministic, clipped)."""
    x = vecnormalize.normalize_obs(obs) if vecnormalize is not None else obs
    actions, _ = model.predict(x, deterministic=True)
    return np.asarray(actions, dtype=np.float32)


def module_actions(module: torch.nn.Module, obs: np.ndarray) -> np.ndarray:
    """The actions of the module the graph is exported from, in float32 as the graph computes
    them."""
    with torch.no_grad():
        return module(torch.as_tensor(obs, dtype=torch.float32)).numpy()


def stamp_metadata(path: str | Path, metadata: dict[str, str]) -> None:
    """Add or replace metadata entries of an exported model in place (weights untouched, so the
    parity check still holds); written through a temporary file and an atomic rename."""
    import onnx

    path = Path(path)
    proto = onnx.load(str(path))
    props = {p.key: p.value for p in proto.metadata_props}
    props.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()})
    del proto.metadata_props[:]
    for k, v in props.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = k, v
    tmp = path.with_suffix(".tmp.onnx")
    onnx.save(proto, str(tmp))
    os.replace(tmp, path)


def graph_operators(path: str | Path) -> dict[str, int]:
    import onnx

    counts: dict[str, int] = {}
    for node in onnx.load(str(path)).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def export_policy(model, vecnormalize, path: str | Path, *, policy_version: str,
                  metadata: dict[str, str] | None = None, atol: float = 1e-3,
                  graph_atol: float = 1e-5, num_checks: int = 4096) -> ExportReport:
    """Write ``model``'s action path to ``path`` as ONNX after checking it against torch.

    :param model: a stable-baselines3 PPO (or any on-policy algorithm with an ActorCriticPolicy)
    :param vecnormalize: the VecNormalize wrapper it was trained with, or None
    :param policy_version: a name for this policy (shown by the decider and the REST API)
    :param metadata: more ``key -> value`` strings to store (traces, date, evaluation summary)
    :param atol: the largest action difference accepted between ONNX and the torch policy as
        it trained, in action units (each knob's range is 2). The graph normalises in float32
        where SB3's VecNormalize does in float64, and where an observation's value lies near the
        field's training mean the float32 subtraction loses digits (a relative error of 2e-5 in
        the normalised value), which a steep network amplifies: a code policy cloned from the
        oracle (2026-12-07) gave 1.0e-4 at the spec's corners (every field at a bound at once),
        1.6e-6 inside the bounds and 2.4e-7 far outside. 1e-3 moves a log-scaled knob by at most
        0.28% of its value (3 tokens of a 1,024-token chunk) and the KV ratio by 2.8e-4; a
        normalisation or a layer exported wrong misses by orders of magnitude more
    :param graph_atol: the largest difference accepted between ONNX and the float32 torch
        module the graph was exported from: the same operations in the same precision, only the
        kernels' order of summation differs (4.8e-7 on that policy)
    """
    import onnx
    import onnxruntime as ort

    path = Path(path)
    policy = model.policy
    norm = vecnormalize if (vecnormalize is not None and vecnormalize.norm_obs) else None
    module = ActionPath(policy,
                        None if norm is None else norm.obs_rms.mean,
                        None if norm is None else norm.obs_rms.var,
                        clip_obs=10.0 if norm is None else norm.clip_obs,
                        epsilon=1e-8 if norm is None else norm.epsilon).eval()
    dummy = torch.zeros(2, OBS_DIM, dtype=torch.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=path.parent)
    os.close(fd)
    try:
        with torch.no_grad(), _quiet_exporter():
            torch.onnx.export(module, (dummy,), tmp, input_names=[INPUT_NAME],
                              output_names=[OUTPUT_NAME], opset_version=OPSET,
                              dynamic_shapes={"obs": {0: torch.export.Dim("batch", min=1,
                                                                          max=65536)}},
                              external_data=False, dynamo=True, verbose=False)
        proto = onnx.load(tmp)
        meta = {"batchpilot.spec_version": SPEC_VERSION,
                "batchpilot.policy_version": policy_version,
                "batchpilot.exported_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "batchpilot.obs_dim": str(OBS_DIM),
                **(metadata or {})}
        del proto.metadata_props[:]
        for k, v in meta.items():
            entry = proto.metadata_props.add()
            entry.key, entry.value = k, v if isinstance(v, str) else json.dumps(v)
        onnx.checker.check_model(proto)
        onnx.save(proto, tmp)

        obs = parity_observations(num_checks)
        expected = torch_actions(model, norm, obs)
        own = module_actions(module, obs)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        sess = ort.InferenceSession(tmp, opts, providers=["CPUExecutionProvider"])
        got = sess.run([OUTPUT_NAME], {INPUT_NAME: obs})[0]
        if got.shape != (len(obs), NUM_KNOBS):
            raise ExportParityError(f"the exported policy answers shape {list(got.shape)}, "
                                    f"expected [{len(obs)}, {NUM_KNOBS}] (one action per knob)")
        graph_diff = float(np.max(np.abs(got - own)))
        if not np.isfinite(graph_diff) or graph_diff > graph_atol:
            raise ExportParityError(f"the exported graph's actions differ from the torch module it "
                                    f"was exported from by {graph_diff:.3g} (> {graph_atol:g}) "
                                    f"on {len(obs)} observations; not written")
        diff = float(np.max(np.abs(got - expected)))
        if not np.isfinite(diff) or diff > atol:
            raise ExportParityError(f"ONNX actions differ from the torch policy by {diff:.3g} "
                                    f"(> {atol:g}) on {len(obs)} observations; not written")
        ops = graph_operators(tmp)
        unexpected = set(ops) - ALLOWED_OPS
        if unexpected:
            raise ExportParityError(f"the exported graph holds unexpected operators "
                                    f"{sorted(unexpected)}; expected only the MLP, the "
                                    "normalisation and the clip")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return ExportReport(path, diff, len(obs), ops, path.stat().st_size, graph_diff)


def distribution_metadata(observations: np.ndarray | None) -> dict[str, str]:
    """The out-of-distribution guard's metadata for a policy trained on ``observations`` (raw
    vectors), or nothing (with a note on stderr) when there are too few to measure."""
    import sys

    from runtime.decider.ood_guard import MIN_SAMPLES, OOD_KEY, ObservationDistribution

    if observations is None or len(observations) < MIN_SAMPLES:
        n = 0 if observations is None else len(observations)
        print(f"export: {n} training observations, fewer than {MIN_SAMPLES}: the policy carries "
              "no training distribution, so the decider runs it without an "
              "out-of-distribution guard", file=sys.stderr)
        return {}
    return {OOD_KEY: ObservationDistribution.measure(observations).metadata()}


class ObservationTap:
    """A controller that keeps every observation another one is asked to decide on."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.observations: list[np.ndarray] = []

    def reset(self) -> None:
        self.inner.reset()

    def decide(self, observation: np.ndarray):
        self.observations.append(np.array(observation, dtype=np.float32))
        return self.inner.decide(observation)


def replayed_observations(policy: str | Path, trace_ranges: list[tuple[str, tuple]], *,
                          config, profile: str | None = None, windows: int = 16,
                          episode_s: float = 120.0, interval_s: float = 0.25,
                          seed: int = 0) -> np.ndarray:
    """The observations ``policy`` meets on the training windows of ``trace_ranges`` (each
    trace's train split, ``windows`` episodes drawn as training's window pool draws them from
    ``seed``), deciding every interval itself (without an out-of-distribution guard): for a
    policy exported without its training distribution, the distribution it was trained on, as
    near as replays of its training traffic can give it."""
    from agents.arena import run_episode
    from agents.policy_controller import PolicyController
    from env.traces import split
    from env.traces.resolve import resolve_trace
    from env.windows import WindowPool, cut_window
    from runtime.engine.profile import Profile

    tap = ObservationTap(PolicyController(policy, ood_guard=False))
    prof = Profile.load(profile)
    for trace, scale_range in trace_ranges:
        train = split(resolve_trace(trace), "train")
        pool = WindowPool.draw(train, windows, episode_s, scale_range, seed)
        for start, scale in zip(pool.starts, pool.scales):
            run_episode(cut_window(train, start, scale, episode_s), tap, interval_s=interval_s,
                        profile=prof, config=config, tally=False)
    return np.stack(tap.observations) if tap.observations else np.empty((0, OBS_DIM))


def export_best(cfg, run_dir: Path, run_name: str, traces: list[str],
                trace_ranges: list[tuple[str, tuple]],
                observations: np.ndarray | None = None):
    """The best model to ``policy.onnx`` (checked against torch), with ``model.zip`` and
    ``vecnormalize.pkl`` beside it; ``observations``: the raw observations of training, whose
    distribution the policy carries for the decider's out-of-distribution guard."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from agents.training import make_env_thunks

    best_model = PPO.load(run_dir / "best_model.zip", device="cpu")
    best_norm = VecNormalize.load(str(run_dir / "best_vecnormalize.pkl"),
                                  DummyVecEnv(make_env_thunks(cfg, trace_ranges, 1)))
    best_norm.training = False
    shutil.copy(run_dir / "best_model.zip", run_dir / "model.zip")
    shutil.copy(run_dir / "best_vecnormalize.pkl", run_dir / "vecnormalize.pkl")
    onnx_path = run_dir / "policy.onnx"
    export = export_policy(best_model, best_norm, onnx_path, policy_version=run_name,
                           metadata={"batchpilot.trained_on": ",".join(traces),
                                     "batchpilot.preset": cfg.preset,
                                     **distribution_metadata(observations)})
    print(f"exported {onnx_path} ({export.bytes:,} bytes): ONNX vs torch max |diff| "
          f"{export.max_abs_diff:.2g} on {export.num_checked} observations (vs the float32 "
          f"module exported {export.graph_abs_diff:.2g}); operators {export.operators}")
    return onnx_path, export
