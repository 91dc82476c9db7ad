"""Traces and the Gymnasium environment (the layer above ``runtime/``).

The package registers ``batchpilot/Serving-v0`` with Gymnasium, with a string entry point, so
nothing heavy is imported until the environment is made. It does not import Gymnasium to do so:
the registration is made when Gymnasium is imported (at once, if it already is), so that the
traces, the replay and the commands that never make an environment start without it (about a
tenth of a second of every such process).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

ENV_ID = "batchpilot/Serving-v0"


def _register() -> None:
    import gymnasium

    if ENV_ID not in gymnasium.registry:
        gymnasium.register(id=ENV_ID, entry_point="env.serving_env:ServingEnv",
                           disable_env_checker=False)


class _RegisterWhenImported(importlib.abc.MetaPathFinder):
    """Finds ``gymnasium`` as the other finders would, and registers the environment once its
    module has run."""

    def find_spec(self, name: str, path: object = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != "gymnasium":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = spec.loader if spec is not None else None
        if loader is not None and hasattr(loader, "exec_module"):
            run = loader.exec_module

            def exec_and_register(module: ModuleType) -> None:
                run(module)
                _register()

            loader.exec_module = exec_and_register  # type: ignore[method-assign]
        return spec


if "gymnasium" in sys.modules:
    _register()
elif not any(isinstance(f, _RegisterWhenImported) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterWhenImported())
