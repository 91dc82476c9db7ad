"""The one command, ``batchpilot``: its verbs in groups, each running the main of the module that
owns the job, and the REST decider's settings as flags."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.cli import BENCH, GROUPS, SCRIPTS, VERBS, main, usage

ROOT = Path(__file__).resolve().parents[1]


def batchpilot(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/cli.py", *args], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=120)


def source_of(target: str) -> Path:
    module = target.partition(":")[0]
    if module.startswith(SCRIPTS + "."):
        return ROOT / "scripts" / (module.split(".", 1)[1].replace(".", "/") + ".py")
    return ROOT / (module.replace(".", "/") + ".py")


@pytest.mark.parametrize("verb", [*VERBS.values(), *BENCH], ids=lambda v: v.name)
def test_every_verb_runs_a_function_that_exists(verb):
    # read, not imported: the training verbs' modules need the training stack
    source = source_of(verb.target)
    assert source.is_file(), verb
    assert f"\ndef {verb.target.partition(':')[2]}(argv" in source.read_text(), verb


def test_help_lists_every_verb_under_its_group(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out == usage() + "\n"
    for title, verbs in GROUPS.items():
        block = out.split(f"\n{title}:\n", 1)[1].split("\n\n", 1)[0]
        assert [line.split()[0] for line in block.splitlines()] == [v.name for v in verbs]
    bench = out.split("(batchpilot bench VERB):\n", 1)[1]
    assert [line.split()[0] for line in bench.splitlines()] == [v.name for v in BENCH]
    assert all(len(line) <= 100 for line in out.splitlines())


def test_no_verb_prints_the_help_and_fails(capsys):
    assert main([]) == 2
    assert "Serve decisions:" in capsys.readouterr().out


def test_an_unknown_verb_is_refused_with_the_nearest_one(capsys):
    assert main(["evalute"]) == 2
    assert "batchpilot: error: unknown verb 'evalute'; did you mean 'evaluate'?" in (
        capsys.readouterr().err)
    assert main(["bench", "engin"]) == 2
    assert "batchpilot bench: error: unknown verb 'engin'; did you mean 'engine'?" in (
        capsys.readouterr().err)


def test_a_verbs_help_is_its_config_dataclass_named_as_the_verb():
    out = batchpilot("roofline-profile", "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: batchpilot roofline-profile [-h] [OPTIONS]")
    assert "--memory-gib" in out.stdout
    bad = batchpilot("bench", "decider", "--calls", "1.5")
    assert bad.returncode == 2
    assert "Error parsing --calls" in " ".join(bad.stderr.replace("\u2502", " ").split())


@pytest.mark.training_stack
def test_train_is_train_py_and_refuses_a_bad_preset_under_its_verb_name():
    out = batchpilot("train", "--preset", "huge")
    assert out.returncode == 2
    assert "batchpilot train: error: --preset must be one of smoke, default, full, got 'huge'" in (
        out.stderr)


def test_serve_takes_each_setting_as_a_flag_and_names_a_bad_one(capsys):
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    assert "| `BATCHPILOT_PORT` | `8000` |" in out
    assert main(["serve", "--port", "lots"]) == 2
    assert "batchpilot serve: error: --port (BATCHPILOT_PORT): Input should be a valid integer" in (
        capsys.readouterr().err)
    assert main(["serve", "--prot", "9"]) == 2
    assert "unrecognised argument '--prot'; did you mean --port?" in capsys.readouterr().err
    assert main(["serve", "--reload-token", "x"]) == 2
    assert "(the reload token is a variable only)" in capsys.readouterr().err
    assert main(["serve", "--port"]) == 2
    assert "--port expects a value" in capsys.readouterr().err
    assert "BATCHPILOT_PORT" not in os.environ  # a refused flag leaves the environment alone
