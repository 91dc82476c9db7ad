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


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules a file imports, wherever in the file (a lazy import counts)."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return found & modules


def test_no_modules_import_each_other_even_lazily():
    """No import circle anywhere in the tree: the modules of runtime/, env/, agents/, scripts/
    and train.py form a graph without a cycle, imports inside functions included."""
    files = {}
    for path in [REPO / "train.py", *(p for top in ("runtime", "env", "agents", "scripts")
                                      for p in (REPO / top).rglob("*.py"))]:
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {m: _imports(p, set(files)) - {m} for m, p in files.items()}
    done: set[str] = set()

    def visit(m: str, stack: list[str]) -> None:
        if m in stack:
            raise AssertionError("import circle: " + " -> ".join(stack[stack.index(m):] + [m]))
        if m in done:
            return
        for n in sorted(graph[m]):
            visit(n, [*stack, m])
        done.add(m)

    for m in sorted(graph):
        visit(m, [])


def test_the_tree_passes_ruff():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "runtime", "env", "agents",
                          "scripts", "tests", "train.py"], cwd=REPO, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-1000:]
