"""Executor profiles: the cost model and memory model of one model shape on one accelerator.

A profile is a JSON file. Measured profiles come from ``scripts/profile_executor.py`` (the torch
executor on real hardware); a roofline profile is derived from datasheet figures by
:mod:`runtime.engine.roofline` (by name, e.g. ``h100-llama3.1-8b-40gib-roofline``, wherever a
path is taken) and says so in its ``kind`` and ``derivation`` fields.

This module knows no catalogue: a source of derived profiles registers itself in
:data:`PROFILE_SOURCES` (the roofline catalogue does, and ``runtime/engine/__init__.py`` imports
it, so every import of the engine has it), and :meth:`Profile.load` asks each for a name no file
answers. So the catalogue imports this module and not the other way round.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runtime.engine.executor import Batch, DecodeCost, MemoryModel
from runtime.locations import profiles_dir

DEFAULT_PROFILE_NAME = "h200-llama2-7b-40gib-roofline.json"
"""the profile the engine uses when none is named, a file in :func:`profiles_dir`"""
PROFILE_KINDS = ("roofline", "measured")
DEFAULT_MAX_MODEL_LEN = 16384
"""the context of a profile file that does not give one (every file before profiles had one)"""


@dataclass(frozen=True)
class ProfileSource:
    """Profiles derived by name rather than read from a file (:data:`PROFILE_SOURCES`)."""

    derive: Callable[[str], Profile | None]
    """the profile of a name, or None when the name is not this source's"""
    names: str
    """how this source's names read, for the error on a name nobody knows"""


PROFILE_SOURCES: list[ProfileSource] = []
"""the sources :meth:`Profile.load` asks, in order, for a name that is not a file (the roofline
catalogue, :mod:`runtime.engine.roofline`, registers itself on import)"""


@dataclass(frozen=True, slots=True)
class CostModel:
    """Iteration time = const + prefill_token * prefill tokens + prefill_attn_pair * attention
    (query, key) pairs of the prefill chunks + decode_seq * decoding sequences
    + decode_ctx_token * context tokens the decodes attend to."""

    const_s: float
    prefill_token_s: float
    prefill_attn_pair_s: float
    decode_seq_s: float
    decode_ctx_token_s: float

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"cost.{name} must be a finite number >= 0, got {value}")

    def iteration_s(self, batch: Batch) -> float:
        return (self.const_s + self.prefill_token_s * batch.prefill_tokens
                + self.prefill_attn_pair_s * batch.prefill_attn_pairs
                + self.decode_seq_s * len(batch.decodes)
                + self.decode_ctx_token_s * batch.decode_ctx_tokens)

    def as_decode_cost(self) -> DecodeCost:
        return DecodeCost(self.const_s, self.decode_seq_s, self.decode_ctx_token_s)


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    kind: str
    """"roofline" (derived from datasheet figures) or "measured" (fitted to executor timings)"""
    memory: MemoryModel
    cost: CostModel
    oom_penalty_s: float
    """time lost by an iteration that runs out of activation memory before it is retried"""
    resize_fixed_s: float
    """time of any change of the KV pool size (drain, allocator calls)"""
    resize_per_gib_s: float
    """additional time per GiB allocated or released"""
    block_copy_s: float
    """time to copy one KV block (compaction when the pool shrinks)"""
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    """the model's context: the most tokens (prompt + output) one request may have"""
    hardware: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    derivation: dict[str, Any] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in PROFILE_KINDS:
            raise ValueError(f"profile kind must be one of {PROFILE_KINDS}, got {self.kind!r}")
        for name in ("oom_penalty_s", "resize_fixed_s", "resize_per_gib_s", "block_copy_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v}")
        if not (isinstance(self.max_model_len, int) and self.max_model_len >= 2):
            raise ValueError(f"max_model_len must be an integer >= 2, got {self.max_model_len!r}")

    def key_figures(self, context_tokens: int = 4096) -> dict[str, Any]:
        """The figures a person compares profiles by: KV bytes per token, KV blocks at the
        ratio knob's low, 0.9 and high ends, the decode step at batch 1 and 64 with
        ``context_tokens`` of context each, and the prefill cost per token."""
        c, m = self.cost, self.memory

        def step_ms(batch: int) -> float:
            return 1e3 * (c.const_s + batch * (c.decode_seq_s
                                               + context_tokens * c.decode_ctx_token_s))

        return {
            "name": self.name, "kind": self.kind, "max_model_len": self.max_model_len,
            "kv_bytes_per_token": m.kv_bytes_per_token,
            "kv_blocks": {r: m.num_kv_blocks(r) for r in (0.4, 0.9, 0.95)},
            "decode_step_ms_b1": step_ms(1), "decode_step_ms_b64": step_ms(64),
            "decode_context_tokens": context_tokens,
            "prefill_us_per_token": 1e6 * c.prefill_token_s,
            "source": ("derived: datasheet x efficiency"
                       if self.kind == "roofline" else "measured: " + str(
                           self.hardware.get("device", self.hardware.get("accelerator", "?")))),
        }

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        if d["max_model_len"] == DEFAULT_MAX_MODEL_LEN:
            # a file that gives the default context and one from before profiles had one are
            # the same profile (and results cached under its JSON keep their keys)
            del d["max_model_len"]
        return {"format": "batchpilot-profile/1", **d}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "<dict>") -> Profile:
        def need(obj: dict, key: str, where: str):
            if not isinstance(obj, dict) or key not in obj:
                raise ValueError(f"{source}: missing field {where}{key}")
            return obj[key]

        try:
            if data.get("format") != "batchpilot-profile/1":
                raise ValueError(f"field format is {data.get('format')!r}, "
                                 "expected 'batchpilot-profile/1'")
            mem = need(data, "memory", "")
            memory = MemoryModel(**{k: int(need(mem, k, "memory."))
                                    for k in MemoryModel.__dataclass_fields__})
            cost_d = need(data, "cost", "")
            cost = CostModel(**{k: float(need(cost_d, k, "cost."))
                                for k in CostModel.__dataclass_fields__})
            return cls(
                name=str(need(data, "name", "")), kind=str(need(data, "kind", "")),
                memory=memory, cost=cost,
                oom_penalty_s=float(need(data, "oom_penalty_s", "")),
                resize_fixed_s=float(need(data, "resize_fixed_s", "")),
                resize_per_gib_s=float(need(data, "resize_per_gib_s", "")),
                block_copy_s=float(need(data, "block_copy_s", "")),
                max_model_len=int(data.get("max_model_len", DEFAULT_MAX_MODEL_LEN)),
                hardware=dict(data.get("hardware", {})), model=dict(data.get("model", {})),
                derivation=dict(data.get("derivation", {})), fit=dict(data.get("fit", {})),
            )
        except (TypeError, ValueError) as e:
            msg = str(e)
            raise ValueError(msg if msg.startswith(source) else f"{source}: {msg}") from None

    @classmethod
    def load(cls, path: str | Path | None = None) -> Profile:
        """Load a profile file, or a profile by name: a file ``<name>.json`` in
        :func:`runtime.locations.profiles_dir`, else a roofline profile derived from the
        catalogue of :mod:`runtime.engine.roofline` (``h100-llama3.1-8b-40gib-roofline``).
        None is the shipped default (the roofline H200 Llama-2-7B profile)."""
        path = Path(path) if path is not None else default_profile_path()
        if not path.exists() and "/" not in str(path) and path.suffix != ".json":
            named = profiles_dir() / f"{path}.json"
            if named.exists():
                path = named
            else:
                for source in PROFILE_SOURCES:
                    derived = source.derive(str(path))
                    if derived is not None:
                        return derived
                names = " or ".join(s.names for s in PROFILE_SOURCES) or "none derived"
                raise FileNotFoundError(
                    f"profile {str(path)!r} is neither a file nor a profile name; names are "
                    f"{names}, or a file in {profiles_dir()}")
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"profile file not found: {path}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}): "
                             f"{e.msg}") from None
        return cls.from_json(data, source=str(path))


def default_profile_path() -> Path:
    """The default profile's path (found through :mod:`runtime.locations`)."""
    return profiles_dir() / DEFAULT_PROFILE_NAME
