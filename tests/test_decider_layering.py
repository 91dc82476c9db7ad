"""The decider, the serving loop and the server install and run without the training stack."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = ("torch", "gymnasium", "stable_baselines3", "wandb", "env", "agents")


def test_the_runtime_imports_none_of_the_training_stack():
    code = ("import sys; import runtime.server, runtime.session, runtime.decider.guard; "
            f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_no_runtime_module_imports_a_layer_above_it():
    """Every module under runtime/ (the torch executor's torch aside) imports nothing from env/,
    agents/ or the training stack: checked on the source, so no import path can hide one."""
    import ast

    offenders = []
    for path in sorted((REPO / "runtime").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            for name in names:
                top = name.split(".")[0]
                if top in FORBIDDEN and not (top == "torch" and path.name.startswith("torch_")):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} imports {name}")
    assert not offenders, "\n".join(offenders)


def test_the_tree_passes_ruff():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "runtime", "env", "agents",
                          "scripts", "tests", "train.py"], cwd=REPO, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-1000:]
