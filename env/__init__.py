"""Traces and the Gymnasium environment (the layer above ``runtime/``).

Importing this package registers ``batchpilot/Serving-v0`` with a string entry point, so nothing
heavy is imported until the environment is made.
"""

import gymnasium

ENV_ID = "batchpilot/Serving-v0"

if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point="env.serving_env:ServingEnv",
                       disable_env_checker=False)
