"""Where the shipped data lives: the policy, the executor profiles and the best-static caches.

All three sit in one checkpoints folder, found in this order:

1. ``$BATCHPILOT_CHECKPOINTS_DIR``, when set and not empty;
2. ``checkpoints/`` beside ``runtime/`` (a source checkout, or an editable install of one);
3. ``runtime/checkpoints/`` inside the installed package (a wheel carries the repository's
   ``checkpoints/`` there, see ``[tool.setuptools.package-dir]`` in ``pyproject.toml``).

Every module that reads or writes shipped data asks this one, so an installed server finds the
shipped policy as a checkout does, and one variable moves all of it.
"""

from __future__ import annotations

import os
from pathlib import Path

CHECKPOINTS_DIR_ENV = "BATCHPILOT_CHECKPOINTS_DIR"
"""environment variable that, when set and not empty, names the checkpoints folder"""

_PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_CHECKPOINTS_DIR = _PACKAGE_DIR.parent / "checkpoints"
"""the repository's ``checkpoints/`` in a source checkout"""
INSTALLED_CHECKPOINTS_DIR = _PACKAGE_DIR / "checkpoints"
"""where a wheel puts the repository's ``checkpoints/``"""


def checkpoints_dir() -> Path:
    """The checkpoints folder: the override, else the checkout's, else the installed copy.

    The folder need not exist (a wheel built without data); callers that open a file in it say
    what is missing.
    """
    override = os.environ.get(CHECKPOINTS_DIR_ENV, "")
    if override:
        return Path(override)
    if SOURCE_CHECKPOINTS_DIR.is_dir():
        return SOURCE_CHECKPOINTS_DIR
    return INSTALLED_CHECKPOINTS_DIR


def shipped_policy_dir() -> Path:
    """The folder of the shipped ONNX policy (the server's default ``policy_dir``)."""
    return checkpoints_dir() / "shipped"


def profiles_dir() -> Path:
    """The folder of the executor profiles (``*.json``)."""
    return checkpoints_dir() / "profiles"


def best_static_dir() -> Path:
    """The folder of the best-static tuning caches."""
    return checkpoints_dir() / "best_static"
