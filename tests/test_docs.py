"""The spec tables in docs/ are rendered from the code and must not drift from it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_docs_spec_is_rendered_from_the_code():
    pytest.importorskip("gymnasium")  # the reward table is env.session's
    out = subprocess.run([sys.executable, "scripts/render_docs.py", "--check"], cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
