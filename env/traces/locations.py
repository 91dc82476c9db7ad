"""Where the real traces live: ``../shared/traces`` beside the repository, or
``$BATCHPILOT_TRACES_DIR``.

The files are never copied into the repository; ``scripts/download_traces.py`` fetches the Azure
ones from their public source into :func:`traces_dir`.
"""

from __future__ import annotations

import os
from pathlib import Path

TRACES_DIR_ENV = "BATCHPILOT_TRACES_DIR"
"""environment variable that, when set and not empty, names the traces folder"""

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
"""the folder holding ``env/`` (in an installed package, the one holding site-packages' ``env``)"""

AZURE_TRACE_FILES: dict[str, str] = {
    "conv": "azure-llm-2023/AzureLLMInferenceTrace_conv.csv",
    "code": "azure-llm-2023/AzureLLMInferenceTrace_code.csv",
}
"""the Azure LLM inference traces of 2023 (one hour each), by kind, relative to traces_dir()"""
MOONCAKE_TRACE_FILE = "mooncake-fast25/synthetic_trace.jsonl"
"""Mooncake's public synthetic long-context trace (FAST 2025), relative to traces_dir()"""


def traces_dir() -> Path:
    """``$BATCHPILOT_TRACES_DIR`` if set, else ``../shared/traces`` from the repository root.

    The folder need not exist; the functions that open a file in it say what to do if not.
    """
    override = os.environ.get(TRACES_DIR_ENV, "")
    return Path(override) if override else REPOSITORY_ROOT.parent / "shared" / "traces"


def azure_trace_path(kind: str) -> Path:
    """The path of the Azure 2023 ``conv`` or ``code`` trace; FileNotFoundError if absent."""
    if kind not in AZURE_TRACE_FILES:
        raise ValueError(f"unknown Azure trace kind {kind!r}; expected one of "
                         f"{', '.join(AZURE_TRACE_FILES)}")
    path = traces_dir() / AZURE_TRACE_FILES[kind]
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found; run `batchpilot download-traces` to download the Azure "
            f"traces into {traces_dir()}, or set {TRACES_DIR_ENV} to a folder that holds "
            f"{AZURE_TRACE_FILES[kind]}")
    return path


def mooncake_trace_path() -> Path:
    """The path of Mooncake's synthetic trace; FileNotFoundError if absent."""
    path = traces_dir() / MOONCAKE_TRACE_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found; run `batchpilot download-traces --kind mooncake` to "
            f"download it into {traces_dir()}, or set {TRACES_DIR_ENV} to a folder that holds "
            f"{MOONCAKE_TRACE_FILE}")
    return path
