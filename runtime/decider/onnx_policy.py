"""The exported policy: an ONNX model run by onnxruntime on one CPU thread.

The ONNX policy contract
========================
The exporter (``agents/``) writes, and this module accepts, exactly this:

Input
    One input, named ``obs``: ``tensor(float)`` (float32) of shape ``[batch, OBS_DIM]`` with a
    dynamic (symbolic) ``batch`` axis and ``OBS_DIM = len(runtime.observation.OBSERVATION_FIELDS)``
    (29 in spec 3; 20 in specs 1 and 2). It is the vector that
    :func:`runtime.observation.vector_from_fields` and
    :class:`runtime.observation.FeatureBuilder` build, as is: any normalisation the training used
    (e.g. VecNormalize's running mean and variance, and its clip) is folded into the graph.
Output
    One output, named ``action``: ``tensor(float)`` of shape ``[batch, NUM_KNOBS]`` (5 in spec
    3; 3 in specs 1 and 2), the knobs in
    action coordinates in the order of ``runtime.knobs.KNOB_NAMES``, already clipped to
    [-1, 1] in the graph. It is the deterministic action (the policy mean, no sampling). The
    runtime maps it to knobs with :func:`runtime.knobs.action_to_knobs` and nothing else.
Metadata (``ModelProto.metadata_props``)
    ``batchpilot.spec_version``, required: must equal ``runtime.observation.SPEC_VERSION`` or
    name an older spec the runtime still serves (``runtime.observation.SPEC_ADAPTERS``: specs 1
    and 2, 20 inputs and 3 outputs), whose vector it then builds from today's (an index map and
    a factor); its three actions are the first three knobs, the guard takes the others from its
    static knobs.
    ``batchpilot.policy_version``, recommended: a non-empty string naming the weights (e.g.
    ``ppo-20250601-a1b2c3``); when absent the runtime uses ``sha256:<first 12 hex digits of the
    file>``. Any other key is free-form and shown by ``GET /v1/policy``; by convention
    ``batchpilot.trained_on`` (traces), ``batchpilot.exported_at`` (ISO 8601 date) and
    ``batchpilot.eval_summary`` (a one-line evaluation result).
    ``batchpilot.lend_guard``, optional: the policy's lending guard
    (:mod:`runtime.decider.lend_guard`), a JSON object ``{"kv_utilization": u, "kv_cache_ratio":
    r}``; a malformed one refuses the model (``bad model signature``).
    ``batchpilot.obs_distribution``, optional: the observations the policy was trained on, per
    field (:mod:`runtime.decider.ood_guard`); the decider hands control to the PID while the
    live observation stays outside it. A malformed one refuses the model (``bad model
    signature``).
Runtime
    Any opset the installed onnxruntime runs on its CPU execution provider. No external data
    files (export with ``external_data=False``): a policy is one file, read and hashed at once.

A model that breaks the contract is refused with a :class:`PolicyLoadError` whose ``reason`` is
one of ``model missing`` (no such file), ``model corrupt`` (unreadable, not ONNX, or onnxruntime
cannot build a session), ``spec mismatch`` (spec version absent or different) and ``bad model
signature`` (names, types or shapes differ, the batch axis is fixed, or the warm-up output is
not ``[batch, NUM_KNOBS]`` (the policy's spec's) or not finite, for a zero observation or for any of
:func:`spec_range_observations`, drawn across the ranges of the spec). The decider then falls back
to PID.

Speed
=====
One decision is one ``run_with_iobinding`` on a session with one intra-op and one inter-op
thread, sequential execution and the CPU provider, with the input and output bound once to
preallocated arrays: the observation is copied into the bound input and the action read from
the bound output, with no per-call dict or allocation. Measured on the 2-core project machine
(20-64-64-3 tanh MLP, p50): ``session.run`` with a feed dict ~12.5 us, the bound run ~6.2 us,
:meth:`OnnxPolicy.act` with its copy in and out ~8 us. The bound buffers belong to one caller at
a time: a thread that finds them busy runs the (allocating, thread-safe) ``session.run`` instead
of waiting.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

from runtime.decider.decision import BAD_SIGNATURE, MODEL_CORRUPT, MODEL_MISSING, SPEC_MISMATCH
from runtime.decider.lend_guard import LEND_GUARD_KEY, LendGuard, LendLatch
from runtime.decider.ood_guard import OOD_KEY, ObservationDistribution, OodGuard
from runtime.knobs import NUM_KNOBS
from runtime.observation import (
    OBS_DIM,
    OBS_HIGH,
    OBS_LOW,
    SPEC_ADAPTERS,
    SPEC_VERSION,
    adapt_vector,
)

INPUT_NAME = "obs"
OUTPUT_NAME = "action"
SPEC_VERSION_KEY = "batchpilot.spec_version"
POLICY_VERSION_KEY = "batchpilot.policy_version"
PROVIDER = "CPUExecutionProvider"
NUM_WARMUP_RUNS = 200
"""single-row runs at load, so that the first real decision does not pay for lazy
initialisation (the first few runs of a fresh session take 10-100x longer)"""
WARMUP_BATCH_SIZES = (1, 4, 256)
NUM_CHECK_OBSERVATIONS = 512
"""observations drawn across the spec's ranges that a policy must answer finitely to go live"""


def spec_range_observations(n: int = NUM_CHECK_OBSERVATIONS, seed: int = 0) -> np.ndarray:
    """``[n, OBS_DIM]`` float32 observations across the spec's vector ranges: the all-low, the
    all-high and the middle vectors, then uniform draws (seeded, so every load checks the same
    set). A policy is checked on these before it goes live: one that answers NaN somewhere in
    the ranges it will be fed is refused, not reported as serving while the PID decides."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(OBS_LOW, OBS_HIGH, size=(n, OBS_DIM)).astype(np.float32)
    x[0], x[1], x[2] = OBS_LOW, OBS_HIGH, (OBS_LOW + OBS_HIGH) / 2
    return x


class PolicyLoadError(Exception):
    """A policy file was refused.

    :param reason: one of the fallback reasons in :mod:`runtime.decider.decision`
    :param message: what exactly is wrong, with names and numbers
    :param path: the file
    """

    def __init__(self, reason: str, message: str, path: Path | str | None = None) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.path = path


def session_options() -> ort.SessionOptions:
    """One thread, sequential, full graph optimisation, quiet."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3  # errors only: a refused model is reported through PolicyLoadError
    return so


DEFAULT_MAX_POLICY_BYTES = 8 * 1024 * 1024
"""the largest policy file read unless the caller says otherwise (the shipped policy is ~30 KB;
a 29-1024-1024-5 MLP in float32 is ~4.3 MB). A larger file is refused before it is read, so a
huge or sparse file under a policy's name costs a ``stat``, not a read and a parse."""


class _NotAModel(Exception):
    """A file whose top-level fields are not an ONNX model's."""


def _read_regular_file(path: Path, max_bytes: int) -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``max_bytes``. Opened
    without blocking and checked on the open descriptor, so that a FIFO or a device under a
    policy's name is refused at once rather than blocking the reload (and its lock) for ever;
    read at most one byte past the limit, so that a file that grows after the check is refused
    too."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path.name} is not a regular file")
        if info.st_size > max_bytes:
            raise OSError(f"{path.name} has {info.st_size} bytes, more than the {max_bytes} a "
                          "policy may have (BATCHPILOT_MAX_POLICY_BYTES)")
        problem = not_a_model(size=info.st_size, fetch=lambda offset, n: os.pread(fd, n, offset))
        if problem is not None:  # refused from a few bytes of it
            raise _NotAModel(f"{path.name} is not an ONNX model: {problem}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            model = f.read(max_bytes + 1)
        if len(model) > max_bytes:
            raise OSError(f"{path.name} grew past the {max_bytes} bytes a policy may have while "
                          "it was read")
        return model
    finally:
        os.close(fd)


MAX_TOP_LEVEL_FIELDS = 4096
"""an ONNX file has a handful of top-level fields (version, producer, graph, opsets, metadata):
:func:`not_a_model` gives up on more"""
_MODEL_FIELDS = {1: "ir_version", 7: "graph"}
"""the top-level fields of ``ModelProto`` a policy cannot lack"""


def _varint(fetch: Callable[[int, int], bytes], i: int) -> tuple[int, int]:
    value = shift = 0
    head = fetch(i, 10)
    for k, b in enumerate(head):
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i + k + 1
        shift += 7
    raise ValueError(f"a varint at byte {i} runs past the end")


def not_a_model(model: bytes | None = None, *, size: int = 0,
                fetch: Callable[[int, int], bytes] | None = None) -> str | None:
    """Why a file cannot be an ONNX ``ModelProto`` (None when its top level reads as one): its
    top-level protobuf fields are walked, tags and lengths only, and must end at the end of the
    file and include the version and the graph. Given ``model``'s bytes, or a file's ``size``
    and ``fetch(offset, n)`` reading from it (then only the few bytes of the tags are read). A
    file of zeros or of noise is refused in microseconds, without being read, hashed, or copied
    and parsed by onnxruntime on the GIL."""
    if model is not None:
        size = len(model)

        def fetch(offset: int, n: int) -> bytes:
            return model[offset:offset + n]
    assert fetch is not None
    i, seen, n = 0, set(), 0
    try:
        while i < size:
            n += 1
            if n > MAX_TOP_LEVEL_FIELDS:
                return f"more than {MAX_TOP_LEVEL_FIELDS} top-level fields"
            tag, i = _varint(fetch, i)
            field, wire = tag >> 3, tag & 7
            if field == 0:
                return f"byte {i - 1} holds field 0"
            if wire == 0:
                _, i = _varint(fetch, i)
            elif wire == 1:
                i += 8
            elif wire == 2:
                length, i = _varint(fetch, i)
                i += length
            elif wire == 5:
                i += 4
            else:
                return f"field {field} has wire type {wire}"
            seen.add(field)
    except ValueError as e:
        return str(e)
    if i != size:
        return f"its last field runs {i - size} bytes past the end"
    missing = [name for number, name in _MODEL_FIELDS.items() if number not in seen]
    return f"no {' or '.join(missing)}" if missing else None


def _is_fixed(dim: object) -> bool:
    return isinstance(dim, int)


class OnnxPolicy:
    """A loaded, checked and warmed policy. Immutable after construction except for its
    private bound buffers, so the decider can swap one for another atomically.

    :param model: the ONNX file's bytes
    :param path: where they came from (for messages and ``GET /v1/policy``)
    """

    def __init__(self, model: bytes, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.model_bytes = model
        """the file's bytes (the batch worker process builds its own session from them)"""
        problem = not_a_model(model)
        if problem is not None:  # refused before onnxruntime copies and parses the bytes
            raise PolicyLoadError(MODEL_CORRUPT, f"{self._name()} is not an ONNX model: "
                                  f"{problem}", path)
        self.size_bytes = len(model)
        failure: str | None = None
        try:
            session = ort.InferenceSession(model, session_options(), providers=[PROVIDER])
        except Exception as e:  # onnxruntime raises its own classes (InvalidProtobuf, Fail, ...)
            failure = f"{type(e).__name__}: {str(e)[:300]}"
        if failure is not None:  # raised here, not chained to onnxruntime's half-built session
            raise PolicyLoadError(MODEL_CORRUPT, f"onnxruntime cannot load {self._name()}: "
                                  f"{failure}", path)
        providers = session.get_providers()
        if providers[:1] != [PROVIDER]:
            raise PolicyLoadError(MODEL_CORRUPT, f"{self._name()} runs on {providers}, "
                                  f"expected {PROVIDER}", path)
        self.metadata: dict[str, str] = dict(session.get_modelmeta().custom_metadata_map)
        spec = self.metadata.get(SPEC_VERSION_KEY)
        if spec is None:
            raise PolicyLoadError(SPEC_MISMATCH, f"{self._name()} has no {SPEC_VERSION_KEY!r} "
                                  f"metadata (the runtime's spec is {SPEC_VERSION!r})", path)
        if spec != SPEC_VERSION and spec not in SPEC_ADAPTERS:
            raise PolicyLoadError(SPEC_MISMATCH, f"{self._name()} was exported for spec "
                                  f"{spec!r}, the runtime's is {SPEC_VERSION!r}", path)
        self.spec_version = spec
        self._adapter = SPEC_ADAPTERS.get(spec)
        """today's vector to the policy's spec (None: today's spec)"""
        self.obs_dim = self._adapter.obs_dim if self._adapter is not None else OBS_DIM
        """the width of the policy's input (its spec's)"""
        self.num_actions = self._adapter.num_actions if self._adapter is not None else NUM_KNOBS
        """the width of its output: the first ``num_actions`` knobs"""
        # hashed once onnxruntime has taken the file: a refused one is not hashed for nothing
        self.sha256 = hashlib.sha256(model).hexdigest()
        self.policy_version = (self.metadata.get(POLICY_VERSION_KEY)
                               or f"sha256:{self.sha256[:12]}")
        self.lend_guard: LendGuard | None = None
        """the floor on the KV ratio under pressure this policy runs with (None: none)"""
        if LEND_GUARD_KEY in self.metadata:
            try:
                self.lend_guard = LendGuard.from_metadata(self.metadata[LEND_GUARD_KEY])
            except ValueError as e:
                raise PolicyLoadError(BAD_SIGNATURE, f"{self._name()}: {e}", path) from None
        self.lend_latch: LendLatch | None = (
            LendLatch(self.lend_guard) if self.lend_guard is not None
            and self.lend_guard.preemption_hold else None)
        """the embedded runtime's holds of the lending guard (None: the guard holds none); its
        interval state belongs to the decider that runs the policy"""
        self.ood_guard: OodGuard | None = None
        """the out-of-distribution guard of this policy (None: it carries no distribution); its
        interval state belongs to the decider that runs the policy"""
        if OOD_KEY in self.metadata:
            if self._adapter is not None:
                raise PolicyLoadError(BAD_SIGNATURE, f"{self._name()}: {OOD_KEY} is for a "
                                      f"policy of today's spec, not {spec!r}", path)
            try:
                self.ood_guard = OodGuard(ObservationDistribution.from_metadata(
                    self.metadata[OOD_KEY]))
            except ValueError as e:
                raise PolicyLoadError(BAD_SIGNATURE, f"{self._name()}: {e}", path) from None
        self._check_signature(session)
        self._session = session
        self._output_names = [OUTPUT_NAME]
        # The bound single-row path: the observation is copied into _x, the action read from _y.
        self._x = np.zeros((1, self.obs_dim), dtype=np.float32)
        self._y = np.zeros((1, self.num_actions), dtype=np.float32)
        self._binding = session.io_binding()
        self._binding.bind_ortvalue_input(INPUT_NAME, ort.OrtValue.ortvalue_from_numpy(self._x))
        self._binding.bind_ortvalue_output(OUTPUT_NAME, ort.OrtValue.ortvalue_from_numpy(self._y))
        self._run_bound = session.run_with_iobinding
        self._lock = threading.Lock()
        self._warm_up()
        self.loaded_at = time.time()

    @classmethod
    def load(cls, path: Path | str, max_bytes: int = DEFAULT_MAX_POLICY_BYTES) -> OnnxPolicy:
        """Read, check and warm the policy at ``path`` (a file of at most ``max_bytes``); raises
        :class:`PolicyLoadError`, whose message names the file by its name alone (the decider
        shows its errors to clients, who have no business with the server's folders)."""
        path = Path(path)
        try:
            model = _read_regular_file(path, max_bytes)
        except FileNotFoundError:
            raise PolicyLoadError(MODEL_MISSING, f"no policy file at {path.name}", path) from None
        except _NotAModel as e:
            raise PolicyLoadError(MODEL_CORRUPT, str(e), path) from None
        except OSError as e:
            why = e.strerror if e.strerror else str(e)
            raise PolicyLoadError(MODEL_CORRUPT, f"cannot read {path.name}: {why}",
                                  path) from None
        try:
            return cls(model, path)
        except PolicyLoadError as e:
            # raised without what it was raised from: onnxruntime's exception, chained as its
            # context, keeps the half-built session and its copy of the file's bytes alive in
            # a cycle only the cyclic collector frees, and repeated reloads of a large refused
            # file piled them up (16 MB each, 530 MB in 20 s)
            del model
            e.__context__ = e.__cause__ = None
            raise e.with_traceback(None) from None

    def _name(self) -> str:
        return self.path.name if self.path is not None else "the policy"

    def _refuse(self, message: str) -> PolicyLoadError:
        return PolicyLoadError(BAD_SIGNATURE, f"{self._name()}: {message}", self.path)

    def _check_signature(self, session: ort.InferenceSession) -> None:
        inputs, outputs = session.get_inputs(), session.get_outputs()
        if [i.name for i in inputs] != [INPUT_NAME]:
            raise self._refuse(f"inputs are {[i.name for i in inputs]}, expected [{INPUT_NAME!r}]")
        if [o.name for o in outputs] != [OUTPUT_NAME]:
            raise self._refuse(f"outputs are {[o.name for o in outputs]}, "
                               f"expected [{OUTPUT_NAME!r}]")
        for arg, width in ((inputs[0], self.obs_dim), (outputs[0], self.num_actions)):
            if arg.type != "tensor(float)":
                raise self._refuse(f"{arg.name!r} is {arg.type}, expected tensor(float)")
            shape = list(arg.shape)
            if len(shape) != 2:
                raise self._refuse(f"{arg.name!r} has shape {shape}, expected [batch, {width}]")
            if _is_fixed(shape[0]):
                raise self._refuse(f"{arg.name!r} has a fixed batch axis of {shape[0]}; export "
                                   "it with a dynamic batch axis")
            if _is_fixed(shape[1]) and shape[1] != width:
                raise self._refuse(f"{arg.name!r} has shape {shape}, expected [batch, {width}]")

    def _warm_up(self) -> None:
        """Run the bound path and every batch size the decider uses; check shapes and that the
        answer to a zero observation is finite."""
        failure: str | None = None
        try:
            for _ in range(NUM_WARMUP_RUNS):
                self._run_bound(self._binding)
            for n in WARMUP_BATCH_SIZES:
                zeros = np.zeros((n, self.obs_dim), dtype=np.float32)
                y = self._session.run(self._output_names, {INPUT_NAME: zeros})[0]
                if y.shape != (n, self.num_actions):
                    raise self._refuse(f"{OUTPUT_NAME!r} has shape {list(y.shape)} for a batch "
                                       f"of {n}, expected [{n}, {self.num_actions}]")
                if not np.isfinite(y).all():
                    raise self._refuse(f"the action for a zero observation is not finite: "
                                       f"{y[0].tolist()}")
            x = spec_range_observations()
            if self._adapter is not None:  # what a policy of an older spec is fed
                x = adapt_vector(x, self._adapter)
            y = self._session.run(self._output_names, {INPUT_NAME: x})[0]
            bad = np.flatnonzero(~np.isfinite(y).all(axis=1))
            if bad.size:
                raise self._refuse(
                    f"the action is not finite for {bad.size} of {len(x)} observations across "
                    f"the spec's ranges (first: {y[bad[0]].tolist()} for observation "
                    f"{x[bad[0]].tolist()})")
        except PolicyLoadError:
            raise
        except Exception as e:
            failure = f"{type(e).__name__}: {str(e)[:300]}"
        if failure is not None:  # raised here, not chained to onnxruntime's exception
            raise self._refuse(f"warm-up run failed: {failure}")

    # ------------------------------------------------------------------ evaluation
    def act(self, observation: np.ndarray) -> list[float]:
        """The action for one observation vector (shape ``(OBS_DIM,)``), as ``num_actions``
        floats.
        Exceptions from onnxruntime propagate (the decider guards them)."""
        if self._adapter is not None:
            observation = adapt_vector(observation, self._adapter)
        if self._lock.acquire(False):
            try:
                self._x[0] = observation
                self._run_bound(self._binding)
                return self._y[0].tolist()
            finally:
                self._lock.release()
        # another thread holds the bound buffers: take the allocating path rather than wait
        x = np.asarray(observation, dtype=np.float32).reshape(1, self.obs_dim)
        return self._session.run(self._output_names, {INPUT_NAME: x})[0][0].tolist()

    def act_batch(self, observations: np.ndarray) -> np.ndarray:
        """Actions ``[n, num_actions]`` for observations ``[n, OBS_DIM]``, in one run of the
        model."""
        x = np.ascontiguousarray(observations, dtype=np.float32)
        if self._adapter is not None:
            x = adapt_vector(x, self._adapter)
        return self._session.run(self._output_names, {INPUT_NAME: x})[0]

    def describe(self) -> dict:
        """What ``GET /v1/policy`` shows about it (the distribution's ranges left out of the
        metadata: the guard's own entry summarises them)."""
        return {
            "path": str(self.path) if self.path is not None else None,
            "policy_version": self.policy_version,
            "spec_version": self.spec_version,
            "sha256": self.sha256,
            "size_bytes": self.size_bytes,
            "loaded_at": self.loaded_at,
            "providers": self._session.get_providers(),
            "metadata": {k: v for k, v in self.metadata.items() if k != OOD_KEY},
        }
