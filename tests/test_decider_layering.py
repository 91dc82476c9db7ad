"""The decider, the serving loop and the server install and run without the training stack."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = ("torch", "gymnasium", "stable_baselines3", "wandb", "env", "agents")


def test_the_runtime_imports_none_of_the_training_stack():
    code = ("import sys; import runtime.server, runtime.serving, runtime.decider.guard; "
            f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
