"""A ``vllm serve`` process started and stopped from Python (the tests and the benchmarks): with
batchpilot's controller (``batchpilot vllm-serve``) or without it (vLLM's server with the same
flags), in a process group of its own, so that stopping it stops vLLM's engine core too.

    with ServeProcess.start(model, port=8123, settings={"CONTROLLER": "pid"}) as server:
        ...  # server.url, server.side_url, server.ready_s
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from runtime.vllm.serve import REQUIRED_FLAGS
from runtime.vllm.serve.launch import VLLM_SERVER_MODULE
from runtime.vllm.serve.settings import ENV_PREFIX

STOP_GRACE_S = 20.0
"""seconds a stopped server has to exit after SIGTERM before SIGKILL"""


def free_port() -> int:
    """A TCP port free on the loopback interface now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class TinyServeFlags:
    """vLLM's flags for the tiny dummy-weight model on the CPU (what the tests and the CPU
    figures serve)."""

    kv_cache_gib: float = 1 / 16
    """the KV pool vLLM allocates at start-up, GiB"""
    max_num_batched_tokens: int = 2048
    """vLLM's start-up token budget (the chunk knob is capped at it)"""
    max_num_seqs: int = 64
    """vLLM's most running sequences"""
    extra: list[str] = field(default_factory=list)
    """more of vLLM's flags"""

    def argv(self, model: str | Path) -> list[str]:
        return [str(model), "--load-format", "dummy", "--skip-tokenizer-init",
                "--kv-cache-memory-bytes", str(int(self.kv_cache_gib * 1024 ** 3)),
                "--block-size", "32", "--enforce-eager", "--no-enable-prefix-caching",
                "--max-num-batched-tokens", str(self.max_num_batched_tokens),
                "--max-num-seqs", str(self.max_num_seqs), "--seed", "0", *self.extra]


class ServeProcess:
    """A running server (see the module docstring)."""

    def __init__(self, proc: subprocess.Popen, port: int, side_port: int | None,
                 log_path: Path, started: float) -> None:
        self.proc = proc
        self.port = port
        self.side_port = side_port
        self.log_path = log_path
        self.started = started
        """``time.time()`` when the command was launched"""
        self.ready_s: float | None = None
        """seconds from the launch to ``GET /health`` answering 200"""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def side_url(self) -> str:
        return f"http://127.0.0.1:{self.side_port}"

    @classmethod
    def start(cls, model: str | Path, *, port: int | None = None, side_port: int | None = None,
              settings: dict[str, str] | None = None, controller: bool = True,
              flags: TinyServeFlags | None = None, log_path: str | Path | None = None,
              python: str = sys.executable, timeout_s: float = 600.0,
              wait: bool = True) -> ServeProcess:
        """Launch ``batchpilot vllm-serve`` (``controller``) or vLLM's own server with the same
        flags, and wait until it answers (``timeout_s``; the process is stopped and
        RuntimeError raised, with the log's tail, if it does not).

        :param settings: batchpilot's settings, by name without the prefix (``CONTROLLER``)
        """
        port = port if port is not None else free_port()
        flags = flags if flags is not None else TinyServeFlags()
        env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        env["PYTHONUNBUFFERED"] = "1"
        if controller:
            side_port = side_port if side_port is not None else free_port()
            env.update({ENV_PREFIX + k.upper(): str(v) for k, v in (settings or {}).items()})
            env[ENV_PREFIX + "METRICS_PORT"] = str(side_port)
            cmd = [python, "-m", "runtime.vllm.serve.launch"]
        else:
            side_port = None
            cmd = [python, "-m", VLLM_SERVER_MODULE, "--model"]
        cmd += flags.argv(model) + ["--host", "127.0.0.1", "--port", str(port)]
        if not controller:
            cmd += list(REQUIRED_FLAGS)  # the same scheduling, without the scheduler class
        log = Path(log_path) if log_path is not None else Path(
            f"/tmp/batchpilot-vllm-serve-{port}.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        out = open(log, "wb")
        started = time.time()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        out.close()
        server = cls(proc, port, side_port, log, started)
        if wait:
            server.wait_ready(timeout_s)
        return server

    def wait_ready(self, timeout_s: float) -> float:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        self.ready_s = time.time() - self.started
                        return self.ready_s
            except OSError:
                pass
            time.sleep(0.5)
        tail = self.log_tail()
        self.stop()
        raise RuntimeError(f"vLLM did not answer within {timeout_s:g} s:\n{tail}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> int | None:
        """Stop the server and its engine core (its process group): SIGTERM, then SIGKILL
        after :data:`STOP_GRACE_S`. Returns the exit code."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        try:  # the engine core, or anything else left in the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            return self.proc.wait(5)
        except subprocess.TimeoutExpired:
            return None

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
