"""The settings of batchpilot inside ``vllm serve``: ``BATCHPILOT_VLLM_*`` environment variables,
or a JSON file of the same names (``BATCHPILOT_VLLM_SETTINGS_FILE``; a variable wins over the
file), validated when the engine core starts, with errors that name the setting.

Every setting, its variable and its default are listed in docs/vllm-serve.md (rendered from this
class by :func:`settings_table`, so that the two cannot drift apart). This module imports nothing
from vLLM: ``batchpilot vllm-serve`` checks the settings before it spends a minute starting vLLM.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from runtime.decider.guard import DEFAULT_MAX_STEP
from runtime.decider.policy_set import (
    POLICY_NAME_PATTERN,
    POLICY_SET_FILE,
    WORKLOAD_NAME_PATTERN,
    PolicySet,
)
from runtime.engine.admission import AdmissionPolicy
from runtime.engine.config import EngineConfig
from runtime.engine.profile import Profile
from runtime.engine.slo import SloTarget, slo_classes_from_arg
from runtime.knobs import DEFAULT_KNOBS, Knobs, check_knob
from runtime.locations import profiles_dir, shipped_policy_dir

ENV_PREFIX = "BATCHPILOT_VLLM_"
SETTINGS_FILE_VARIABLE = ENV_PREFIX + "SETTINGS_FILE"
"""names a JSON file of settings (``{"controller": "pid", "interval_s": 0.5}``); a variable
wins over the file"""
PROFILE_SLO = "profile"
"""``slo`` value: targets scaled to the committed vLLM CPU profile's speed; ``profile:PATH``
scales them to another measured profile (``runtime.vllm.slo_classes_for``)"""
MAX_BODY_BYTES = 4096
"""the side port refuses larger request bodies (413)"""

Controller = Literal["policy", "pid", "static"]
"""who decides: ``policy`` the guarded decider (the ONNX policy, the PID when it cannot be
trusted, the static knobs when not even the PID can decide), ``pid`` the PID alone, ``static``
the static knobs held (the controller still closes every interval and reports it)"""


class ServeSettingsError(ValueError):
    """Settings that cannot be used; the message names every variable at fault."""



class ServeSettings(BaseModel):
    """batchpilot's controller inside vLLM's engine core (read them with
    :meth:`from_environment`)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    controller: Controller = "policy"
    """who decides at start: policy (the ONNX policy behind its guard: PID fallback, static last
    resort), pid (the PID alone) or static (the static knobs held); the side port's
    ``POST /v1/controller`` switches it while serving"""
    policy_dir: Path = Field(default_factory=shipped_policy_dir)
    """the policy folder: the start-up policy and every reload are read from it, nowhere else"""
    policy_file: str = Field("policy.onnx", pattern=POLICY_NAME_PATTERN + "|^$")
    """the policy loaded at start, a file name inside ``policy_dir``; empty for the PID alone"""
    workload: str = Field("", pattern=WORKLOAD_NAME_PATTERN + "|^$")
    """the workload this server serves (e.g. ``azure-code``): when set, the start-up policy is
    the one ``policy_dir``'s policy set (``policies.json``) names for it (``policy_file`` is then
    not read)"""
    interval_s: float = Field(0.25, ge=0.01, le=60.0)
    """seconds of vLLM's clock between decisions"""
    static_batch_window_ms: float = DEFAULT_KNOBS.batch_window_ms
    """the static knobs (what vLLM runs at start, what a fault holds): ``batch_window_ms``"""
    static_prefill_chunk_tokens: int = DEFAULT_KNOBS.prefill_chunk_tokens
    """static ``prefill_chunk_tokens`` (capped at vLLM's ``--max-num-batched-tokens``)"""
    static_kv_cache_ratio: float = DEFAULT_KNOBS.kv_cache_ratio
    """static ``kv_cache_ratio`` (a cap on the KV blocks vLLM may hold; 0.95 is its whole pool)"""
    static_batch_share: float = DEFAULT_KNOBS.batch_share
    """static ``batch_share``"""
    static_admission_slack: float = DEFAULT_KNOBS.admission_slack
    """static ``admission_slack``, in TTFT targets"""
    hold_window: bool = True
    """hold new requests for the batch window (the knob, 5 ms at least); false releases it: they
    enter vLLM's queue at once, as in vLLM without batchpilot, and the window is decided and
    reported but not applied (the policy still sees the window it decided)"""
    admission: Literal["fcfs", "shed", "late_to_back"] = "fcfs"
    """what happens to an interactive request late for its first token: fcfs (nothing), shed
    (vLLM aborts it: its stream ends with ``finish_reason`` abort and ``stop_reason``
    ``batchpilot:shed``) or late_to_back (it waits behind on-time requests)"""
    slo: str = "default"
    """the SLO classes: default (interactive 1 s / 50 ms, batch within the hour), long-context,
    ``profile`` (scaled to the committed vLLM CPU profile), ``profile:PATH``, or a list
    ``name:ttft_s:tpot_s[:deadline_s],...``; a request names its class in ``vllm_xargs``
    (``{"slo_class": "batch"}``), else it gets the first"""
    max_step: float = Field(DEFAULT_MAX_STEP, gt=0.0)
    """slew rate: the most a knob may move per decision, in action units (the range is 2 wide)"""
    breaker_target: float = Field(0.9, ge=0.0, le=1.0)
    """the circuit breaker's SLO attainment target under the policy"""
    breaker_trip_after: int = Field(3, ge=0)
    """intervals in a row under target that hand control to the PID; 0 disables the breaker"""
    breaker_cooldown_s: float = Field(30.0, ge=0.0)
    """seconds the PID keeps control once the breaker opens"""
    decision_limit_ms: float = Field(5.0, gt=0.0, le=1000.0)
    """a policy decision that takes longer is slow: three slow in a row hand the decisions to
    the PID (reason ``policy slow``) for 240 intervals, then the policy is tried again; a reload
    gives a new policy its place at once (the decision runs inside vLLM's step: the shipped
    policy decides in about 10 us)"""
    reload_poll_s: float = Field(2.0, ge=0.0)
    """seconds between checks of the policy file; a file replaced (new size, time or inode) is
    reloaded, the old policy kept on any refusal; 0 turns the watch off"""
    metrics_host: str = "127.0.0.1"
    """the side port's interface (metrics, state, reload); 0.0.0.0 for all"""
    metrics_port: int = Field(8001, ge=0, le=65535)
    """the side port: ``GET /metrics`` (Prometheus), ``GET /v1/state``, ``POST
    /v1/policy/reload``, ``POST /v1/controller``; 0 turns it off"""
    reload_token: SecretStr | None = None
    """bearer token the side port's POST routes require; unset disables them (403)"""
    timeline_s: float = Field(10.0, ge=0.0)
    """seconds between the knob timeline's lines in the log (and a line at once when who decides
    changes); 0 turns it off"""

    @field_validator("static_batch_window_ms", "static_prefill_chunk_tokens",
                     "static_kv_cache_ratio", "static_batch_share", "static_admission_slack")
    @classmethod
    def _knob_in_range(cls, value: float, info: ValidationInfo) -> float:
        return check_knob(str(info.field_name).removeprefix("static_"), value)

    @field_validator("slo")
    @classmethod
    def _slo_parses(cls, value: str) -> str:
        slo_classes(value)
        return value

    @model_validator(mode="after")
    def _checked(self) -> ServeSettings:
        self.static_knobs()
        self.engine_config()
        return self

    # ------------------------------------------------------------------ derived
    def static_knobs(self) -> Knobs:
        """The static knobs the settings name."""
        return Knobs(self.static_batch_window_ms, self.static_prefill_chunk_tokens,
                     self.static_kv_cache_ratio, self.static_batch_share,
                     self.static_admission_slack)

    def engine_config(self) -> EngineConfig:
        """The SLO classes and admission policy the scheduler accounts with (ended requests are
        dropped: a server's memory stays bounded)."""
        classes = slo_classes(self.slo)
        return EngineConfig(slo_classes=classes, default_slo_class=next(iter(classes)),
                            admission=AdmissionPolicy(self.admission).value,
                            keep_requests=False)

    def start_policy_path(self) -> Path | None:
        """The start-up policy's path, resolved (None: the PID alone); ValueError when it leads
        out of the policy folder or the workload's policy set cannot be read."""
        from runtime.api.settings import resolve_in_folder

        if self.workload:
            try:
                chosen = PolicySet.load(self.policy_dir / POLICY_SET_FILE).file_for(self.workload)
            except ValueError as e:
                raise ValueError(f"workload {self.workload!r}: {e}") from None
            return resolve_in_folder(self.policy_dir, chosen.name)
        if not self.policy_file:
            return None
        return resolve_in_folder(self.policy_dir, self.policy_file)

    # ------------------------------------------------------------------ reading
    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> ServeSettings:
        """The settings from ``environ`` (default: this process's) and the settings file it
        names; :class:`ServeSettingsError` naming each variable (or file field) at fault."""
        env = dict(os.environ if environ is None else environ)
        known = {ENV_PREFIX + name.upper() for name in cls.model_fields} | {SETTINGS_FILE_VARIABLE}
        errors = []
        for variable in sorted(env):
            if variable.upper().startswith(ENV_PREFIX) and variable.upper() not in known:
                close = difflib.get_close_matches(variable.upper(), sorted(known), n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                errors.append(f"unknown setting {variable}{hint}")
        from_file: dict[str, Any] = {}
        path = env.get(SETTINGS_FILE_VARIABLE, "")
        if path:
            from_file, file_errors = _read_file(Path(path), set(cls.model_fields))
            errors += file_errors
        if errors:
            raise ServeSettingsError("; ".join(errors) + " (the settings: docs/vllm-serve.md)")
        names = {ENV_PREFIX + n.upper(): n for n in cls.model_fields}
        given_env = {names[v.upper()]: value for v, value in env.items() if v.upper() in names}
        try:
            return cls(**{**from_file, **given_env})
        except ValidationError as e:
            raise ServeSettingsError(describe_errors(e, set(given_env), path)) from None


def describe_errors(e: ValidationError, from_env: set[str], path: str) -> str:
    """One line per error, naming the variable (or the file's field) and what is wrong."""
    lines = []
    for err in e.errors():
        name = str(err["loc"][0]) if err["loc"] else ""
        msg = err["msg"].removeprefix("Value error, ")
        if not name:
            lines.append(msg)
        elif name in from_env or not path:
            lines.append(f"{ENV_PREFIX}{name.upper()}: {msg}")
        else:
            lines.append(f"{path}: field {name!r}: {msg}")
    return "; ".join(lines)


def _read_file(path: Path, fields: set[str]) -> tuple[dict[str, Any], list[str]]:
    where = f"{SETTINGS_FILE_VARIABLE}={path}"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}, [f"{where}: no such file"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return {}, [f"{where}: not a JSON object of settings ({e})"]
    if not isinstance(raw, dict):
        return {}, [f"{where}: expected a JSON object, got {type(raw).__name__}"]
    unknown = sorted(set(raw) - fields)
    errors = []
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(fields), n=1)
        errors.append(f"{where}: unknown field {name!r}"
                      + (f"; did you mean {close[0]!r}?" if close else ""))
    return {k: v for k, v in raw.items() if k in fields}, errors


def slo_classes(text: str) -> dict[str, SloTarget]:
    """The SLO classes an ``slo`` setting names (see :class:`ServeSettings`)."""
    from runtime.vllm import PROFILE_NAME, slo_classes_for

    head, colon, rest = text.partition(":")
    if head.strip() == PROFILE_SLO:
        path = Path(rest) if colon else profiles_dir() / PROFILE_NAME
        try:
            return slo_classes_for(Profile.load(path))
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"profile {path}: {e}") from None
    return slo_classes_from_arg(text)


def settings_table() -> str:
    """The settings as a markdown table (environment variable, default, meaning)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in ServeSettings.model_fields.items():
        default = field.default
        if name == "policy_dir":
            shown = "`checkpoints/shipped`"
        elif default is None:
            shown = "unset"
        elif default == "":
            shown = "empty"
        else:
            shown = f"`{str(default).lower() if isinstance(default, bool) else default}`"
        rows.append(f"| `{ENV_PREFIX}{name.upper()}` | {shown} | "
                    f"{' '.join((field.description or '').split())} |")
    rows.append(f"| `{SETTINGS_FILE_VARIABLE}` | unset | a JSON file of these settings by name "
                "(`{\"controller\": \"pid\"}`); a variable wins over the file |")
    return "\n".join(rows)


__all__ = ["ENV_PREFIX", "ServeSettings", "ServeSettingsError",
           "settings_table", "slo_classes"]
