"""``batchpilot``: the one command, with a verb for each job.

    batchpilot --help                    # the verbs, in groups
    batchpilot train --preset smoke      # a verb's flags are its config dataclass's fields
    batchpilot VERB --help               # every flag of that verb, with its one-line doc
    batchpilot bench engine              # benchmarks are verbs of ``bench``

Each verb runs the ``main`` of the module that owns the job (train.py, agents/, runtime/,
scripts/), whose command line tyro builds from that module's config dataclass; from a checkout,
``python train.py``, ``python -m agents.evaluate`` and ``python scripts/<name>.py`` run the same
code. A verb's module is imported only when the verb runs, so ``batchpilot --help`` answers at
once and the runtime's verbs (``serve``, ``profiles``, ``roofline-profile``,
``check-published``, ``bench decider``) run on a runtime-only install (``pip install
"batchpilot[cpu]"``; ``bench decider``'s numpy floor needs ``onnx`` too); the others need the
``train`` extra.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

SCRIPTS = "scripts"
"""stands for this folder's package in a verb's target: ``batchpilot_scripts`` once installed,
``scripts`` in a checkout"""


@dataclass(frozen=True)
class Verb:
    name: str
    """what the user types after ``batchpilot``"""
    target: str
    """``module:function``, the function taking the verb's arguments (``argv``)"""
    summary: str
    """one line for ``batchpilot --help``"""


GROUPS: dict[str, tuple[Verb, ...]] = {
    "Train, evaluate and choose policies": (
        Verb("train", "train:main",
             "train a PPO policy (W&B), export it to ONNX, evaluate it: the main job"),
        Verb("evaluate", "agents.evaluate:main",
             "the arena: every controller on the same windows and loads, then the scorecard"),
        Verb("choose", "agents.choose:main",
             "choose a workload's policy among trained runs, on the train split"),
        Verb("install-policy", "agents.install_policy:main",
             "add a trained run's policy and card to a policy folder's set"),
        Verb("oracle-label", "agents.oracle_label:main",
             "label trace windows with the lookahead oracle's settings, for imitation"),
        Verb("tune-pid", "agents.tune_pid:main", "search the PID fallback's gains"),
        Verb("sweep", f"{SCRIPTS}.sweep:main",
             "train's seeds and hyper-parameters on Ray Tune, every trial in W&B"),
    ),
    "Serve decisions": (
        Verb("serve", f"{SCRIPTS}.cli:serve",
             "the REST decider (flags or BATCHPILOT_* variables; docs/rest.md)"),
        Verb("replay", f"{SCRIPTS}.replay:main",
             "replay a trace through the engine with fixed knobs, report SLO attainment"),
        Verb("serve-replay", f"{SCRIPTS}.serve_replay:main",
             "a wall-clock replay on the torch executor, a controller embedded"),
        Verb("vllm-serve", "runtime.vllm.serve.launch:main",
             "vLLM's OpenAI server, the controller in its engine core (docs/vllm-serve.md)"),
        Verb("vllm-load", f"{SCRIPTS}.vllm_load:main",
             "a trace window through a vLLM server's completions API, TTFT and TPOT"),
    ),
    "Executor profiles and the simulator's fidelity": (
        Verb("profiles", f"{SCRIPTS}.list_profiles:main",
             "list the executor profiles (catalogue and files) with their key figures"),
        Verb("roofline-profile", f"{SCRIPTS}.make_roofline_profile:main",
             "write a derived profile of the catalogue to a file"),
        Verb("profile", f"{SCRIPTS}.profile_executor:main",
             "measure the torch executor and write a measured profile"),
        Verb("fidelity", f"{SCRIPTS}.fidelity:main",
             "the simulator against the torch executor, one window side by side"),
        Verb("check-published", f"{SCRIPTS}.check_published:main",
             "derived profiles against published measurements of fixed workloads"),
    ),
    "Data": (
        Verb("download-traces", f"{SCRIPTS}.download_traces:main",
             "fetch the Azure 2023 and Mooncake traces into the traces folder"),
    ),
}
"""the verbs, grouped as ``batchpilot --help`` lists them (``bench`` is listed apart)"""

BENCH: tuple[Verb, ...] = (
    Verb("engine", f"{SCRIPTS}.bench_engine:main", "the engine's speed, simulated s per wall s"),
    Verb("env", f"{SCRIPTS}.bench_env:main", "the environment's overhead over the bare engine"),
    Verb("decider", f"{SCRIPTS}.bench_decider:main",
         "decision latency in-process and over REST, against a numpy floor"),
    Verb("fork", f"{SCRIPTS}.bench_fork:main", "an engine snapshot against a replay (the oracle)"),
    Verb("parallel", f"{SCRIPTS}.bench_parallel:main",
         "the arena on a local Ray against the process pool"),
    Verb("rollouts", f"{SCRIPTS}.bench_rollouts:main", "PPO's rollouts on Ray workers"),
    Verb("soak", f"{SCRIPTS}.soak:main", "the REST server under good and hostile clients"),
    Verb("digest", f"{SCRIPTS}.episode_digest:main",
         "a digest of episodes: a speed change must leave it unchanged"),
    Verb("vllm-serve", f"{SCRIPTS}.bench_vllm_serve:main",
         "batchpilot in vllm serve through the API: attainment, cost, faults, start"),
)
"""``batchpilot bench VERB``: the benchmarks and checks, each printing figures measured side by
side in one run"""

VERBS: dict[str, Verb] = {v.name: v for group in GROUPS.values() for v in group}


def scripts_package() -> str:
    """The package this folder is imported as; run as a file, the checkout's ``scripts``."""
    if __package__:
        return __package__
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    return "scripts"


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("batchpilot")
    except PackageNotFoundError:
        return "(not installed)"


def usage() -> str:
    width = max(len(v.name) for v in [*VERBS.values(), *BENCH]) + 2
    lines = ["usage: batchpilot [-h] [--version] VERB [ARGS ...]", "",
             "A run-time batching controller for LLM serving: train, evaluate, choose and serve "
             "policies", "that retune an engine's batching knobs every decision interval.", "",
             "`batchpilot VERB --help` lists every flag of a verb, with its one-line doc."]
    for title, verbs in GROUPS.items():
        lines += ["", f"{title}:"] + [f"  {v.name:<{width}}{v.summary}" for v in verbs]
    lines += ["", "Benchmarks and checks (batchpilot bench VERB):"]
    lines += [f"  {v.name:<{width}}{v.summary}" for v in BENCH]
    return "\n".join(lines)


def refuse(message: str, prog: str = "batchpilot") -> int:
    print(f"{prog}: error: {message}\n(see `{prog} --help`)", file=sys.stderr)
    return 2


def run(verb: Verb, prog: str, argv: list[str]) -> int:
    """Import the verb's module and call its function with ``argv``, named ``prog`` in its
    usage and errors."""
    module, _, function = verb.target.partition(":")
    if module.split(".")[0] == SCRIPTS:
        module = scripts_package() + module[len(SCRIPTS):]
    sys.argv = [prog, *argv]  # the verb's parser names itself by argv[0]
    code = getattr(importlib.import_module(module), function)(argv)
    return int(code or 0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"batchpilot {version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name == "bench":
        bench = {v.name: v for v in BENCH}
        if not rest or rest[0] in ("-h", "--help"):
            print("usage: batchpilot bench VERB [ARGS ...]\n\n" + "\n".join(
                f"  {v.name:<10}{v.summary}" for v in BENCH))
            return 0 if rest else 2
        if rest[0] not in bench:
            return refuse(unknown(rest[0], bench), "batchpilot bench")
        return run(bench[rest[0]], f"batchpilot bench {rest[0]}", rest[1:])
    if name not in VERBS:
        return refuse(unknown(name, {**VERBS, "bench": None}))
    return run(VERBS[name], f"batchpilot {name}", rest)


def unknown(name: str, known: dict) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"unknown verb {name!r}" + (f"; did you mean {close[0]!r}?" if close else "")


def serve(argv: list[str]) -> int:
    """``batchpilot serve``: the REST decider (:mod:`runtime.server`). Its settings are the
    ``BATCHPILOT_*`` environment variables of :class:`runtime.api.settings.Settings`; each may
    also be given as a flag (``--port 8001`` for ``BATCHPILOT_PORT``), which wins over the
    variable. The reload token stays a variable only: a flag would show it to every process
    listing."""
    from pydantic import ValidationError

    from runtime.api.settings import ENV_PREFIX, Settings, settings_table

    prog = "batchpilot serve"
    fields = {name: f for name, f in Settings.model_fields.items() if name != "reload_token"}
    if any(a in ("-h", "--help") for a in argv):
        print(f"usage: {prog} [--SETTING VALUE ...]\n\nThe REST decider: POST /v1/decide, "
              "POST /v1/decide/batch, GET /v1/policy, POST /v1/policy/reload, GET /healthz, "
              "GET /readyz, GET /metrics (docs/rest.md).\nEvery setting is an environment "
              f"variable; each but {ENV_PREFIX}RELOAD_TOKEN may also be a flag, --port 8001 "
              f"for {ENV_PREFIX}PORT (the flag wins).\n\n{settings_table()}")
        return 0
    values: dict[str, str] = {}
    i = 0
    while i < len(argv):
        flag = argv[i]
        key, eq, value = flag[2:].partition("=") if flag.startswith("--") else ("", "", "")
        name = key.replace("-", "_")
        negated = name.startswith("no_") and name[3:] in fields and not eq
        if negated:
            name = name[3:]
        if name not in fields:
            flags = [f"--{n.replace('_', '-')}" for n in fields]
            close = difflib.get_close_matches(flag.partition("=")[0], flags, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            why = " (the reload token is a variable only)" if name == "reload_token" else ""
            return refuse(f"unrecognised argument {flag!r}{why}{hint}", prog)
        if fields[name].annotation in (bool, "bool") and not eq:
            value = "false" if negated else "true"
        elif not eq:
            if i + 1 >= len(argv):
                return refuse(f"--{key} expects a value", prog)
            i += 1
            value = argv[i]
        values[name] = value
        i += 1
    variables = {ENV_PREFIX + name.upper(): value for name, value in values.items()}
    before = {v: os.environ.get(v) for v in variables}
    os.environ.update(variables)
    try:
        Settings()
    except ValidationError as e:
        for v, old in before.items():  # leave the environment as it was
            if old is None:
                del os.environ[v]
            else:
                os.environ[v] = old
        errors = "; ".join(
            f"--{str(err['loc'][0]).replace('_', '-')} ({ENV_PREFIX}{str(err['loc'][0]).upper()})"
            f": {err['msg']}" if err["loc"] else err["msg"] for err in e.errors())
        return refuse(errors, prog)
    from runtime.server import main as serve_main

    serve_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
