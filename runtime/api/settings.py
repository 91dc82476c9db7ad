"""Server settings: one pydantic-settings object read from ``BATCHPILOT_*`` environment variables.

Every setting, its variable and its default are listed in ``docs/rest.md`` (rendered from this
class by :func:`settings_table`, so the two cannot drift apart).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from runtime.decider.guard import DEFAULT_MAX_STEP
from runtime.locations import CHECKPOINTS_DIR_ENV, shipped_policy_dir

ENV_PREFIX = "BATCHPILOT_"
POLICY_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}\.onnx$"
"""A policy file name: no folder part, no leading dot, ends in .onnx (so no path can leave the
policy folder)."""


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
    reload_token: SecretStr | None = None
    """bearer token that ``POST /v1/policy/reload`` requires; unset disables reload (403)"""
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    """larger request bodies are refused with 413 (a full batch of 4096 observations is ~3 MB)"""
    max_step: float = Field(DEFAULT_MAX_STEP, gt=0.0)
    """slew rate: the most a knob may move per decision, in action units (the range is 2 wide)"""
    breaker_target: float = Field(0.9, ge=0.0, le=1.0)
    """interval SLO attainment the policy must hold"""
    breaker_trip_after: int = Field(3, ge=0)
    """consecutive readings below target under the policy that hand control to the PID (0: off)"""
    breaker_cooldown_s: float = Field(30.0, ge=0.0)
    """seconds the PID keeps control before the policy is given a half-open probation"""
    breaker_close_after: int = Field(3, ge=1)
    """consecutive readings at or above target on probation that give the policy control back"""
    require_policy: bool = False
    """``GET /readyz`` answers 503 while no policy is loaded (else PID alone counts as ready)"""
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    """server log level"""
    access_log: bool = False
    """log every request (off by default: at thousands of requests per second it costs more
    than the decisions)"""

    @property
    def policy_path(self) -> Path | None:
        return self.policy_dir / self.policy_file if self.policy_file else None


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
