"""Small ONNX policies that follow the contract in ``runtime/decider/onnx_policy.py``, exported
from torch MLPs, for the tests and for ``scripts/bench_decider.py`` when no shipped policy exists.

The legacy (TorchScript) exporter is used because it exports one of these in ~0.1 s, against
~7 s for the first ``dynamo=True`` export in a process; both give the same Gemm/Tanh/Clip graph.
"""

from __future__ import annotations

import dataclasses
import io
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import torch

from runtime.knobs import DEFAULT_KNOBS, NUM_KNOBS, knobs_to_action
from runtime.observation import OBS_DIM, SPEC_ADAPTERS, SPEC_VERSION

OPSET = 17
SPEC2 = SPEC_ADAPTERS[next(v for v in SPEC_ADAPTERS if v.startswith("batchpilot-spec/2+"))]
"""the spec-2 adapter: 20 inputs, 3 outputs (what ``policy-spec2.onnx`` was exported for)"""


def make_spec2_mlp(seed: int = 0) -> torch.nn.Sequential:
    """The torch MLP of ``policy-spec2.onnx``: spec 2's shape."""
    return make_mlp(obs_dim=SPEC2.obs_dim, num_actions=SPEC2.num_actions, seed=seed)


class _ActionPath(torch.nn.Module):
    """The exported graph: MLP, then clip to [-1, 1]; ``nan_above`` makes the action NaN for
    observations whose first entry exceeds it (a model that misbehaves on some inputs only)."""

    def __init__(self, mlp: torch.nn.Module, nan_above: float | None) -> None:
        super().__init__()
        self.mlp = mlp
        self.nan_above = nan_above

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        action = torch.clamp(self.mlp(obs), -1.0, 1.0)
        if self.nan_above is not None:
            # sqrt of a negative number is NaN, and NaN * 0 stays NaN
            action = action + torch.sqrt(self.nan_above - obs[:, :1]) * 0.0
        return action


def make_mlp(obs_dim: int = OBS_DIM, hidden: Sequence[int] = (64, 64), seed: int = 0,
             num_actions: int = NUM_KNOBS) -> torch.nn.Sequential:
    """A tanh MLP shaped like the PPO policy's action path."""
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    width = obs_dim
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.Tanh()]
        width = h
    layers.append(torch.nn.Linear(width, num_actions))
    return torch.nn.Sequential(*layers).eval()


def export_policy_bytes(mlp: torch.nn.Module | None = None, *, obs_dim: int = OBS_DIM,
                        spec_version: str | None = SPEC_VERSION,
                        policy_version: str | None = "test-1",
                        metadata: dict[str, str] | None = None, nan_above: float | None = None,
                        input_name: str = "obs", output_name: str = "action",
                        dynamic_batch: bool = True) -> bytes:
    """An ONNX policy as bytes. ``spec_version=None`` or ``policy_version=None`` leave that
    metadata out; the other arguments break the contract on purpose for the refusal tests."""
    mlp = mlp if mlp is not None else make_mlp(obs_dim)
    buf = io.BytesIO()
    axes = {input_name: {0: "batch"}, output_name: {0: "batch"}} if dynamic_batch else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        torch.onnx.export(_ActionPath(mlp, nan_above), (torch.zeros(1, obs_dim),), buf,
                          input_names=[input_name], output_names=[output_name],
                          dynamic_axes=axes, opset_version=OPSET, dynamo=False)
    model = onnx.load_from_string(buf.getvalue())
    props = dict(metadata or {})
    if spec_version is not None:
        props["batchpilot.spec_version"] = spec_version
    if policy_version is not None:
        props["batchpilot.policy_version"] = policy_version
    onnx.helper.set_model_props(model, props)
    return model.SerializeToString()


def write_policy(path: Path | str, mlp: torch.nn.Module | None = None, **kwargs) -> Path:
    """Export a policy (see :func:`export_policy_bytes`) to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(export_policy_bytes(mlp, **kwargs))
    return path


def _const(name: str, value, dtype: int | None = None, dims=None) -> onnx.NodeProto:
    from onnx import TensorProto, helper

    arr = np.asarray(value)
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name + "_v", TensorProto.FLOAT if dtype is None else dtype,
        list(arr.shape) if dims is None else dims, arr.flatten().tolist()))


def _serving_trigger(trigger_kv_cache_ratio: float) -> list[onnx.NodeProto]:
    """Nodes computing ``zero`` (the action: zeros ``[batch, NUM_KNOBS]``) and ``k`` (an int64
    scalar: 1 when a row's ``kv_cache_ratio`` knob field is exactly that of
    ``trigger_kv_cache_ratio``, else 0). No warm-up observation has that value (they are the
    range's ends, its middle and uniform draws); serving at the static default's 0.9 does."""
    from onnx import TensorProto, helper

    kv_index = OBS_DIM - NUM_KNOBS + 2
    trigger = float(np.float32(knobs_to_action(
        dataclasses.replace(DEFAULT_KNOBS, kv_cache_ratio=trigger_kv_cache_ratio))[2]))
    return [
        _const("w", np.zeros((OBS_DIM, NUM_KNOBS), dtype=np.float32)),
        helper.make_node("MatMul", ["obs", "w"], ["zero"]),
        _const("idx", [kv_index], TensorProto.INT64),
        helper.make_node("Gather", ["obs", "idx"], ["kv"], axis=1),
        _const("trigger", [trigger]),
        helper.make_node("Sub", ["kv", "trigger"], ["d"]),
        helper.make_node("Abs", ["d"], ["ad"]),
        _const("eps", [1e-7]),
        helper.make_node("Less", ["ad", "eps"], ["hit"]),
        helper.make_node("Cast", ["hit"], ["hit_i"], to=TensorProto.INT64),
        helper.make_node("ReduceMax", ["hit_i"], ["k"], keepdims=0),
    ]


def _serving_fault_model(nodes: list[onnx.NodeProto], name: str, policy_version: str) -> bytes:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", OBS_DIM])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", NUM_KNOBS])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    helper.set_model_props(model, {"batchpilot.spec_version": SPEC_VERSION,
                                   "batchpilot.policy_version": policy_version})
    onnx.checker.check_model(model)
    return model.SerializeToString()


def raising_policy_bytes(trigger_kv_cache_ratio: float = DEFAULT_KNOBS.kv_cache_ratio,
                         policy_version: str = "raises-in-serving") -> bytes:
    """A policy that loads and warms up cleanly but raises in onnxruntime on the observations
    it meets in serving (:func:`_serving_trigger`). The action is 0 (finite, in range); on a
    triggering row the graph reshapes it to a shape it cannot take, and onnxruntime raises.
    A model's bug that only real traffic shows, for the fault tests of the embedded runtime."""
    from onnx import TensorProto, helper

    nodes = _serving_trigger(trigger_kv_cache_ratio) + [
        _const("five", NUM_KNOBS, TensorProto.INT64, dims=[]),
        helper.make_node("Add", ["five", "k"], ["width"]),
        _const("minus_one", [-1], TensorProto.INT64),
        _const("zero_axis", [0], TensorProto.INT64),
        helper.make_node("Unsqueeze", ["width", "zero_axis"], ["width1"]),
        helper.make_node("Concat", ["minus_one", "width1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["zero", "shape"], ["action"]),
    ]
    return _serving_fault_model(nodes, "raises_in_serving", policy_version)


def slow_policy_bytes(trigger_kv_cache_ratio: float = DEFAULT_KNOBS.kv_cache_ratio,
                      rows: int = 2000, width: int = 512, products: int = 8,
                      policy_version: str = "slow-in-serving") -> bytes:
    """A policy that loads and warms up in microseconds but takes tens of milliseconds a
    decision on the observations it meets in serving (:func:`_serving_trigger`): a triggering
    row makes the graph multiply a ``rows`` x ``width`` tensor of ones by a ``width`` x
    ``width`` one ``products`` times over (8 GFLOP by default), whose sum times 0 is added to
    the action of 0; another row multiplies one row. A policy that answers, slowly, for the
    decision time limit of the embedded runtime. Its action is the static default's, so
    that the knobs it decides keep the observations it meets slow."""
    from onnx import TensorProto, helper

    ones = helper.make_tensor("one_f", TensorProto.FLOAT, [1], [1.0])
    nodes = _serving_trigger(trigger_kv_cache_ratio) + [
        _const("rows", rows, TensorProto.INT64, dims=[]),
        helper.make_node("Mul", ["rows", "k"], ["n0"]),
        _const("one", 1, TensorProto.INT64, dims=[]),
        helper.make_node("Add", ["n0", "one"], ["n"]),
        _const("axis0", [0], TensorProto.INT64),
        helper.make_node("Unsqueeze", ["n", "axis0"], ["n1"]),
        _const("width", [width], TensorProto.INT64),
        helper.make_node("Concat", ["n1", "width"], ["shape"], axis=0),
        helper.make_node("ConstantOfShape", ["shape"], ["left"], value=ones),
        _const("square", [width, width], TensorProto.INT64),
        helper.make_node("ConstantOfShape", ["square"], ["right"], value=ones),
        *(helper.make_node("MatMul", ["left" if i == 0 else f"product{i - 1}", "right"],
                           [f"product{i}"]) for i in range(products)),
        helper.make_node("ReduceSum", [f"product{products - 1}"], ["total"], keepdims=0),
        _const("nought", 0.0),
        helper.make_node("Mul", ["total", "nought"], ["nothing"]),
        helper.make_node("Add", ["zero", "nothing"], ["still"]),
        _const("static", np.asarray([knobs_to_action(DEFAULT_KNOBS)], dtype=np.float32)),
        helper.make_node("Add", ["still", "static"], ["action"]),
    ]
    return _serving_fault_model(nodes, "slow_in_serving", policy_version)


def _write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def write_fixtures(folder: Path) -> list[Path]:
    """The committed test policies (``tests/fixtures/``), as ``tests/conftest.py`` reads them."""
    return [write_policy(folder / "policy-test-1.onnx", make_mlp(seed=0), policy_version="test-1",
                         metadata={"batchpilot.trained_on": "synthetic-poisson"}),
            write_policy(folder / "policy-test-2.onnx", make_mlp(seed=1), policy_version="test-2"),
            write_policy(folder / "policy-old-spec.onnx", make_mlp(seed=0),
                         spec_version="batchpilot-spec/0+000000000000"),
            # finite for a zero observation, NaN past half the first field's range
            write_policy(folder / "policy-nan-mid.onnx", make_mlp(seed=0), nan_above=0.5,
                         policy_version="nan-mid"),
            # loads and warms up, then raises on the static default's KV ratio (serving)
            _write_bytes(folder / "policy-raises-in-serving.onnx", raising_policy_bytes()),
            # loads and warms up fast, then takes milliseconds a decision on the static KV ratio
            _write_bytes(folder / "policy-slow-in-serving.onnx", slow_policy_bytes()),
            # a policy of the older spec 2 (20 inputs, 3 outputs), served through its adapter
            write_policy(folder / "policy-spec2.onnx", make_spec2_mlp(seed=0),
                         obs_dim=SPEC2.obs_dim, spec_version=SPEC2.version,
                         policy_version="spec2-test")]


if __name__ == "__main__":
    for written in write_fixtures(Path(__file__).resolve().parent / "fixtures"):
        print(f"wrote {written}")
