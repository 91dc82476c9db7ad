"""vLLM under batchpilot's controller: the five knobs applied to a live vLLM V1 engine.

This package is the only place in ``runtime/`` that imports vLLM, and it imports it only in the
modules that need it (``scheduler``, ``engine``, ``probe``), never at the import of this package
or of the rest of ``runtime/``, which installs and runs without vLLM.

Two layers, so that the first runs on its own inside vLLM's engine-core process (``vllm serve``):

- :mod:`runtime.vllm.scheduler`: ``BatchpilotScheduler``, a subclass of vLLM's V1 ``Scheduler``
  (``LLM(..., scheduler_cls=SCHEDULER_CLS)`` or ``--scheduler-cls``) that holds the knob state
  and applies it at every ``schedule()``: the token budget, the KV cap by withheld blocks, the
  admission window, the SLO classes with ``batch_share``, and deadline-aware shedding. It keeps
  the request accounting (:mod:`runtime.vllm.accounting`, the engine's own outcome and SLO code)
  from vLLM's state, so it can close an interval and build the observation where it runs.
- :mod:`runtime.vllm.engine`: ``VllmEngine``, a :class:`runtime.session.ServingEngine` that
  drives an in-process ``LLMEngine`` step by step in wall-clock time, adding a trace's requests at
  their arrival times, for the replays, the arena, the environment and the fidelity check.

:mod:`runtime.vllm.versions` pins the vLLM versions the adapter is tested with and refuses
others at start; :mod:`runtime.vllm.model` writes the tiny dummy-weight model folder the tests
and the CPU figures use. docs/vllm.md describes all of it.
"""

from runtime.vllm.versions import TESTED_VLLM_VERSIONS, VllmVersionError, check_vllm_version

SCHEDULER_CLS = "runtime.vllm.scheduler.BatchpilotScheduler"
"""the qualified name of the scheduler subclass, for ``scheduler_cls`` / ``--scheduler-cls``"""

__all__ = ["SCHEDULER_CLS", "TESTED_VLLM_VERSIONS", "VllmVersionError", "check_vllm_version"]
