"""One way every command names a trace: ``synthetic``, ``azure-conv``, ``azure-code``, ``mixed``,
``mixed:<another spec>`` or a path."""

from __future__ import annotations

from env.traces.families import FAMILIES, FAMILY_PREFIX, family_trace
from env.traces.load import load_trace
from env.traces.locations import azure_trace_path, mooncake_trace_path
from env.traces.long_prompt import LONG_CONV, long_prompts
from env.traces.mixed import mixed
from env.traces.synthetic import default_trace
from env.traces.trace import Trace
from env.traces.transforms import spread_quantised

TRACE_ALIASES = {
    "synthetic": "the embedded default (a synthetic stand-in for the Azure conversation trace)",
    "azure-conv": "the Azure LLM inference 2023 conversation trace (../shared/traces)",
    "azure-code": "the Azure LLM inference 2023 code trace (../shared/traces)",
    "mooncake": "Mooncake's synthetic long-context trace, FAST 2025 (../shared/traces)",
    "mixed": "azure-conv as interactive traffic plus batch jobs in drops (env/traces/mixed.py); "
             "mixed:SPEC puts the drops on another trace",
    LONG_CONV: "azure-conv's arrivals and outputs with long prompts, up to the context "
               "(env/traces/long_prompt.py)",
    **{f"{FAMILY_PREFIX}{name}": f"an hour of the {name} traffic family: {f.doc} "
       "(env/traces/families.py)" for name, f in FAMILIES.items()},
}
MIXED_PREFIX = "mixed:"


def resolve_trace(spec: str, *, seed: int = 0, spread: bool = True) -> Trace:
    """The trace a command-line argument names.

    :param spec: an alias of :data:`TRACE_ALIASES` or a path to a trace file of any format
    :param seed: the seed of the synthetic trace, of the mixed workload's batch drops and of
        the spread
    :param spread: spread arrivals whose timestamps the file quantised (Mooncake's 3 s steps)
        uniformly within their step (:func:`env.traces.transforms.spread_quantised`); the
        arena, the environment and every command read traces through here, so all replay the
        same spread arrivals. A trace whose timestamps are not quantised is unchanged.
    """
    if spec == "mixed":
        return mixed(resolve_trace("azure-conv"), seed=seed)
    if spec.startswith(MIXED_PREFIX):
        return mixed(resolve_trace(spec[len(MIXED_PREFIX):], seed=seed), seed=seed)
    if spec == "synthetic":
        return default_trace(seed=seed)
    if spec.startswith(FAMILY_PREFIX):
        return family_trace(spec)
    if spec == LONG_CONV:
        return long_prompts(resolve_trace("azure-conv", seed=seed), seed=seed)
    if spec in ("azure-conv", "azure-code"):
        trace = load_trace(azure_trace_path(spec.split("-", 1)[1]))
    elif spec == "mooncake":
        trace = load_trace(mooncake_trace_path())
    else:
        trace = load_trace(spec)
    return spread_quantised(trace, seed) if spread else trace


def trace_label(spec: str) -> str:
    """A short name for tables: the alias, or the file name without its extension."""
    if spec in TRACE_ALIASES:
        return spec.replace(":", "-")
    if spec.startswith(FAMILY_PREFIX):
        return spec.replace(":", "-")
    if spec.startswith(MIXED_PREFIX):
        return "mixed-" + trace_label(spec[len(MIXED_PREFIX):])
    from pathlib import Path

    return Path(spec).stem
