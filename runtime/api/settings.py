"""Server settings: one pydantic-settings object read from ``BATCHPILOT_*`` environment variables.

Every setting, its variable, its default and its bounds are listed in ``docs/rest.md`` (rendered
from this class by :func:`settings_table`, so the two cannot drift apart). Every limit and timeout
has an upper bound as well as a lower one, and none takes an infinity or NaN: a setting can tune
a protection, never switch it off. :func:`load_settings` turns a refusal into one line per
variable (:class:`SettingsError`), with no traceback and no value of a secret setting.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from runtime.decider.guard import DEFAULT_MAX_STEP
from runtime.decider.onnx_policy import DEFAULT_MAX_POLICY_BYTES
from runtime.decider.policy_set import (
    POLICY_NAME_PATTERN,
    POLICY_SET_FILE,
    WORKLOAD_NAME_PATTERN,
    PolicySet,
)
from runtime.knobs import DEFAULT_KNOBS, KNOB_SPEC_BY_NAME, Knobs, check_knob
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
KIB, MIB = 1024, 1024 * 1024
MAX_TIMEOUT_S = 300.0
"""the longest any timeout may be set to: a slow-client protection must stay one"""


def _seconds(default: float) -> Any:
    """A finite timeout in (0, :data:`MAX_TIMEOUT_S`] seconds."""
    return Field(default, gt=0.0, le=MAX_TIMEOUT_S, allow_inf_nan=False)


def _knob(name: str) -> Any:
    """A static knob's setting: the static default's value, within the knob's range."""
    spec = KNOB_SPEC_BY_NAME[name]
    return Field(getattr(DEFAULT_KNOBS, name), ge=spec.low, le=spec.high, allow_inf_nan=False)


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
    """bearer token that ``POST /v1/policy/reload`` requires; unset disables reload (403); never
    printed"""
    max_policy_bytes: int = Field(DEFAULT_MAX_POLICY_BYTES, ge=KIB, le=256 * MIB)
    """a policy file larger than this is refused before it is read, at start-up and on reload
    (the shipped policy is ~30 KB)"""
    max_step: float = Field(DEFAULT_MAX_STEP, gt=0.0, le=2.0, allow_inf_nan=False)
    """slew rate: the most a knob may move per decision, in action units (the range is 2 wide, so
    2 leaves only the range clamp)"""
    max_body_bytes: int = Field(4 * MIB, ge=KIB, le=32 * MIB)
    """larger request bodies are refused with 413 before they are read (a full batch of 4096
    observations is ~3 MB)"""
    max_decide_body_bytes: int = Field(16 * KIB, ge=KIB, le=MIB)
    """larger ``POST /v1/decide`` bodies are refused with 413 (one observation is ~700 bytes)"""
    max_body_bytes_in_progress: int = Field(64 * MIB, ge=KIB, le=1024 * MIB)
    """request bodies over 64 KB hold at most this many bytes in the server at once (received or
    being decided); a large body beyond it gets 503, so that many large uploads at once cannot
    exhaust memory"""
    max_header_bytes: int = Field(16 * KIB, ge=KIB, le=MIB)
    """a request line and headers longer than this get 431 and the connection is closed"""
    max_headers: int = Field(100, ge=8, le=1000)
    """a request with more header lines than this gets 431 and the connection is closed"""
    header_timeout_s: float = _seconds(10.0)
    """a connection's request line and headers must arrive within this; else it is closed"""
    body_timeout_s: float = _seconds(10.0)
    """a request's body must arrive within this after its headers; else 408 and the connection
    is closed"""
    keep_alive_timeout_s: int = Field(5, ge=1, le=int(MAX_TIMEOUT_S))
    """an idle keep-alive connection is closed after this"""
    max_concurrency: int = Field(256, ge=1, le=4096)
    """requests in progress at most (counted once the request and its body have arrived); beyond
    it 503"""
    max_connections: int = Field(1024, ge=16, le=65536)
    """open connections at most: a new connection beyond it closes the one idle longest among
    those with no request in progress (silent, half-sent headers, idle keep-alive)"""
    http: Literal["httptools", "h11"] = "httptools"
    """the HTTP/1.1 parser: ``httptools`` (llhttp, in C: the faster) or ``h11`` (pure Python);
    the header, idle and pipelining limits hold under both"""
    batch_worker: bool = True
    """batch bodies over 64 KB are answered by worker processes (one for bodies up to 256 KB, one
    at a lower CPU priority for larger ones), taken round-robin between clients (``false``: on
    the event loop, where one client's large batches hold up every other client's answers)"""
    batch_worker_nice: int = Field(10, ge=0, le=19)
    """how much lower the large batches' worker's CPU priority is than the server's (0: the
    same; on a machine shared with other low-priority work, a high value leaves the batches
    little CPU)"""
    batch_worker_small_nice: int = Field(0, ge=0, le=19)
    """the same for the worker of batch bodies up to 256 KB (0: the server's priority; their
    work is bounded and queued fairly, and at a lower priority a small batch waited for a CPU
    behind every busy process)"""
    static_batch_window_ms: float = _knob("batch_window_ms")
    """the deployment's static knobs, which the PID fallback is bound around and returns to and
    which the last resort answers, and the knobs a client's observation is assumed to run when
    it gives none: ``batch_window_ms``"""
    static_prefill_chunk_tokens: int = _knob("prefill_chunk_tokens")
    """static ``prefill_chunk_tokens`` (a multiple of the KV block size, 16)"""
    static_kv_cache_ratio: float = _knob("kv_cache_ratio")
    """static ``kv_cache_ratio``"""
    static_batch_share: float = _knob("batch_share")
    """static ``batch_share``"""
    static_admission_slack: float = _knob("admission_slack")
    """static ``admission_slack``, in TTFT targets (the shipped policies' deployment sheds at
    0.5)"""
    require_policy: bool = False
    """``GET /readyz`` answers 503 while no policy is loaded (else PID alone counts as ready)"""
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    """server log level"""
    access_log: bool = False
    """log every request (off by default: at thousands of requests per second it costs more
    than the decisions)"""

    @field_validator("static_batch_window_ms", "static_prefill_chunk_tokens",
                     "static_kv_cache_ratio", "static_batch_share", "static_admission_slack")
    @classmethod
    def _knob_in_range(cls, value: float, info: ValidationInfo) -> float:
        return check_knob(str(info.field_name).removeprefix("static_"), value)

    def static_knobs(self) -> Knobs:
        """The static knobs the settings name."""
        return Knobs(self.static_batch_window_ms, self.static_prefill_chunk_tokens,
                     self.static_kv_cache_ratio, self.static_batch_share,
                     self.static_admission_slack)

    @field_validator("log_level", "http", mode="before")
    @classmethod
    def _lower_case(cls, value: object) -> object:
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
        if self.max_body_bytes_in_progress < self.max_body_bytes:
            raise ValueError(f"{ENV_PREFIX}MAX_BODY_BYTES_IN_PROGRESS "
                             f"({self.max_body_bytes_in_progress}) must be at least "
                             f"{ENV_PREFIX}MAX_BODY_BYTES ({self.max_body_bytes}): one body of "
                             "the largest size must fit")
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
                raise ValueError(without_folder(f"workload {self.workload!r}: {e}",
                                                self.policy_dir)) from None
            return resolve_in_folder(self.policy_dir, chosen.name)
        if not self.policy_file:
            return None
        return resolve_in_folder(self.policy_dir, self.policy_file)


SECRET_SETTINGS = frozenset(name for name, f in Settings.model_fields.items()
                            if SecretStr in (f.annotation, *getattr(f.annotation, "__args__", ())))
"""settings whose value is never printed (the reload token)"""


class SettingsError(ValueError):
    """Settings the server refuses; the message names each variable and what is wrong with it,
    one per line, and holds no value of a secret setting."""


def describe_errors(error: ValidationError) -> str:
    """One line per refused setting: the variable, what is wrong, and the value given unless
    the setting is secret (pydantic's own text prints every input, the token included)."""
    lines = []
    for e in error.errors(include_url=False):
        loc = e.get("loc") or ()
        msg = e["msg"].removeprefix("Value error, ")
        if not loc:  # a check across settings (an unknown variable): its message names them
            lines.append(msg)
            continue
        name = str(loc[0])
        variable = ENV_PREFIX + name.upper()
        shown = ""
        if name not in SECRET_SETTINGS and "input" in e:
            value = repr(e["input"])
            shown = f" (got {value if len(value) <= 80 else value[:77] + '...'})"
        lines.append(f"{variable}: {msg}{shown}")
    return "\n".join(lines)


def load_settings(**overrides: Any) -> Settings:
    """:class:`Settings` from the environment (and ``overrides``); :class:`SettingsError`, whose
    message names the variables, when they are refused."""
    try:
        return Settings(**overrides)
    except ValidationError as e:
        raise SettingsError(describe_errors(e)) from None


def without_folder(message: str, folder: Path) -> str:
    """``message`` with ``folder`` (as given, and resolved) cut out of every path: answers name
    files by their names in the policy folder, never the server's folders."""
    for text in {str(folder.resolve()), str(folder), str(folder.absolute())}:
        if text and text != ".":
            message = message.replace(text + os.sep, "").replace(text, "")
    return message


def resolve_in_folder(folder: Path, name: str) -> Path:
    """``folder / name`` with symlinks resolved; ValueError when that leaves ``folder`` or
    cannot be resolved (a symlink loop). The messages name ``name`` only."""
    try:
        root = folder.resolve()
        path = (root / name).resolve()
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop (Python < 3.13)
        why = getattr(e, "strerror", None) or "a symlink loop"
        raise ValueError(f"{name!r} cannot be resolved: {why}") from None
    if path.parent != root:
        raise ValueError(f"{name!r} resolves outside the policy folder")
    return path


def _bounds(field: Any) -> str:
    low = high = None
    for m in field.metadata:
        for attr, sign in (("ge", "low"), ("gt", "low"), ("le", "high"), ("lt", "high")):
            value = getattr(m, attr, None)
            if value is not None:
                text = f"{value:g}" if isinstance(value, float) else str(value)
                if sign == "low":
                    low = (">" if attr == "gt" else "") + text
                else:
                    high = text
    if low is None and high is None:
        return ""
    return f"{low if low is not None else ''} .. {high if high is not None else ''}"


def settings_table() -> str:
    """The settings as a markdown table (environment variable, default, bounds, meaning)."""
    rows = ["| variable | default | bounds | meaning |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default
        if name == "policy_dir":
            default = f"checkpoints/shipped (see {CHECKPOINTS_DIR_ENV})"
        elif isinstance(default, bool):
            default = str(default).lower()
        elif default is None:
            default = "unset"
        bounds = _bounds(field)
        rows.append(f"| `{ENV_PREFIX}{name.upper()}` | `{default}` | {bounds} | "
                    f"{' '.join((field.description or '').split())} |")
    return "\n".join(rows)
