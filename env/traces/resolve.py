"""One way every command names a trace: ``synthetic``, ``azure-conv``, ``azure-code``, ``mixed``,
``mixed:<another spec>`` or a path."""

from __future__ import annotations

from env.traces.load import load_trace
from env.traces.locations import azure_trace_path
from env.traces.mixed import mixed
from env.traces.synthetic import default_trace
from env.traces.trace import Trace

TRACE_ALIASES = {
    "synthetic": "the embedded default (a synthetic stand-in for the Azure conversation trace)",
    "azure-conv": "the Azure LLM inference 2023 conversation trace (../shared/traces)",
    "azure-code": "the Azure LLM inference 2023 code trace (../shared/traces)",
    "mixed": "azure-conv as interactive traffic plus batch jobs in drops (env/traces/mixed.py); "
             "mixed:SPEC puts the drops on another trace",
}
MIXED_PREFIX = "mixed:"


def resolve_trace(spec: str, *, seed: int = 0) -> Trace:
    """The trace a command-line argument names.

    :param spec: an alias of :data:`TRACE_ALIASES` or a path to a trace file of any format
    :param seed: the seed of the synthetic trace and of the mixed workload's batch drops
    """
    if spec == "mixed":
        return mixed(resolve_trace("azure-conv"), seed=seed)
    if spec.startswith(MIXED_PREFIX):
        return mixed(resolve_trace(spec[len(MIXED_PREFIX):], seed=seed), seed=seed)
    if spec == "synthetic":
        return default_trace(seed=seed)
    if spec in ("azure-conv", "azure-code"):
        return load_trace(azure_trace_path(spec.split("-", 1)[1]))
    return load_trace(spec)


def trace_label(spec: str) -> str:
    """A short name for tables: the alias, or the file name without its extension."""
    if spec in TRACE_ALIASES:
        return spec
    if spec.startswith(MIXED_PREFIX):
        return "mixed-" + trace_label(spec[len(MIXED_PREFIX):])
    from pathlib import Path

    return Path(spec).stem
