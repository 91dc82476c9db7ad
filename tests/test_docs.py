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


def test_every_link_in_the_docs_leads_to_a_file_in_the_repository():
    """The README and docs/ stand alone: a relative link resolves to a file of the repository,
    and none leads out of it."""
    import re

    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path = (page.parent / target).resolve()
            if not path.is_relative_to(ROOT) or not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "\n".join(broken)
