"""Server settings: one pydantic-settings object read from ``BATCHPILOT_*`` environment variables.

Every setting, its variable and its default are listed in ``docs/rest.md`` (rendered from this
class by :func:`settings_table`, so the two cannot drift apart).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from runtime.decider.guard import DEFAULT_MAX_STEP
from runtime.decider.policy_set import (
    POLICY_NAME_PATTERN,
    POLICY_SET_FILE,
    WORKLOAD_NAME_PATTERN,
    PolicySet,
)
from runtime.locations import CHECKPOINTS_DIR_ENV, shipped_policy_dir

ENV_PREFIX = "BATCHPILOT_"
OTHER_VARIABLES = frozenset({CHECKPOINTS_DIR_ENV, "BATCHPILOT_TRACES_DIR"})
"""``BATCHPILOT_*`` variables that other parts of the project read (the checkpoint folder, and
the trace folder, which ``env/traces/locations.py`` reads: runtime/ may not import env/); any
other one that is not a setting below is refused, so that a misspelt setting is not silently
ignored."""
OTHER_PREFIXES = ("BATCHPILOT_VLLM_",)
"""prefixes of other components' settings (the controller inside ``vllm serve``, which checks
its own: runtime/vllm/serve/settings.py)"""


class Settings(BaseSettings):
    """The decision service's configuration."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore",
                                      use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """interface to listen on (``python -m runtime.server``); 0.0.0.0 for all"""
    port: int = Field(8000, ge=0, le=65535)
    """TCP port to listen on"""
    policy_dir: Path = Field(default_factory=shipped_policy_dir)
    """the policy folder: the start-up policy and every reload are read from it, nowhere else"""
    policy_file: str = Field("policy.onnx", pattern=POLICY_NAME_PATTERN + "|^$")
    """the policy loaded at start-up, a file name inside ``policy_dir``; empty for PID alone"""
    workload: str = Field("", pattern=WORKLOAD_NAME_PATTERN + "|^$")
    """the workload this deployment serves (e.g. ``azure-code``): when set, the start-up policy
    is the one ``policy_dir``'s policy set (``policies.json``) names for it, or the set's default
    when it names none (``policy_file`` is then not read)"""
    reload_token: SecretStr | None = None
    """bearer token that ``POST /v1/policy/reload`` requires; unset disables reload (403)"""
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    """larger request bodies are refused with 413 (a full batch of 4096 observations is ~3 MB)"""
    max_step: float = Field(DEFAULT_MAX_STEP, gt=0.0)
    """slew rate: the most a knob may move per decision, in action units (the range is 2 wide)"""
    max_decide_body_bytes: int = Field(16 * 1024, ge=1024)
    """larger ``POST /v1/decide`` bodies are refused with 413 (one observation is ~700 bytes)"""
    header_timeout_s: float = Field(10.0, gt=0.0)
    """a connection's request line and headers must arrive within this; else it is closed"""
    body_timeout_s: float = Field(10.0, gt=0.0)
    """a request's body must arrive within this after its headers; else 408 and the connection
    is closed"""
    keep_alive_timeout_s: int = Field(5, ge=1)
    """an idle keep-alive connection is closed after this"""
    max_concurrency: int = Field(256, ge=1)
    """open connections (and requests in progress) at most; beyond it new requests get 503"""
    require_policy: bool = False
    """``GET /readyz`` answers 503 while no policy is loaded (else PID alone counts as ready)"""
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    """server log level"""
    access_log: bool = False
    """log every request (off by default: at thousands of requests per second it costs more
    than the decisions)"""

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_case_level(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _no_unknown_variables(self) -> Settings:
        known = {ENV_PREFIX + name.upper() for name in type(self).model_fields} | OTHER_VARIABLES
        for variable in sorted(os.environ):
            if variable.upper().startswith(ENV_PREFIX) and variable.upper() not in known \
                    and not variable.upper().startswith(OTHER_PREFIXES):
                close = difflib.get_close_matches(variable.upper(), sorted(known), n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                raise ValueError(f"unknown setting {variable}{hint} (the settings are listed in "
                                 "docs/rest.md)")
        return self

    @property
    def policy_path(self) -> Path | None:
        return self.policy_dir / self.policy_file if self.policy_file else None

    def start_policy_path(self) -> Path | None:
        """The start-up policy's path, resolved; ValueError when it leads out of the policy
        folder (a symlink), as a reload would refuse it."""
        if self.workload:
            try:
                chosen = PolicySet.load(self.policy_dir / POLICY_SET_FILE).file_for(self.workload)
            except ValueError as e:
                raise ValueError(f"workload {self.workload!r}: {e}") from None
            return resolve_in_folder(self.policy_dir, chosen.name)
        if not self.policy_file:
            return None
        return resolve_in_folder(self.policy_dir, self.policy_file)


def resolve_in_folder(folder: Path, name: str) -> Path:
    """``folder / name`` with symlinks resolved; ValueError when that leaves ``folder`` or
    cannot be resolved (a symlink loop)."""
    try:
        root = folder.resolve()
        path = (root / name).resolve()
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop (Python < 3.13)
        raise ValueError(f"{name!r} cannot be resolved: {e}".replace(str(folder), "")) from None
    if path.parent != root:
        raise ValueError(f"{name!r} resolves outside the policy folder")
    return path


def settings_table() -> str:
    """The settings as a markdown table (environment variable, default, meaning)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default
        if name == "policy_dir":
            default = f"checkpoints/shipped (see {CHECKPOINTS_DIR_ENV})"
        elif isinstance(default, bool):
            default = str(default).lower()
        elif default is None:
            default = "unset"
        rows.append(f"| `{ENV_PREFIX}{name.upper()}` | `{default}` | "
                    f"{' '.join((field.description or '').split())} |")
    return "\n".join(rows)
