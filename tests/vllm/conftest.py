"""The tests on a real vLLM engine (CPU, the tiny dummy-weight model): collected only where vLLM
is installed (``make test-vllm`` builds ``.venv-vllm`` and runs them there). One vLLM serves every
test of the session (it takes tens of seconds to start); each test makes a fresh engine on it."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]

KV_CACHE_GIB = 1 / 64
"""the tests' KV pool: 16 MiB, 512 blocks of 32 tokens (16,384 tokens), small enough that a few
long prompts fill a capped pool"""
MAX_BATCHED_TOKENS = 4096
"""the tests' start-up token budget"""


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    from runtime.vllm.engine import VllmServer, VllmSettings
    from runtime.vllm.model import write_tiny_model

    model = write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))
    return VllmServer.start(VllmSettings(model=str(model), kv_cache_gib=KV_CACHE_GIB,
                                         max_num_batched_tokens=MAX_BATCHED_TOKENS,
                                         max_num_seqs=64))
