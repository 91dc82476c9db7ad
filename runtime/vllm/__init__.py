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

from runtime.engine.slo import DEFAULT_SLO_CLASSES, SloTarget
from runtime.vllm.versions import TESTED_VLLM_VERSIONS, VllmVersionError, check_vllm_version

SCHEDULER_CLS = "runtime.vllm.scheduler.BatchpilotScheduler"
"""the qualified name of the scheduler subclass, for ``scheduler_cls`` / ``--scheduler-cls``"""

TINY_CPU_SLO = SloTarget(ttft_s=1.0, tpot_s=0.1)
"""the interactive targets for the tiny model on vLLM's CPU backend, scaled to its speed: its
steps take 10-60 ms on the shared 2-core machines (the measured profile,
checkpoints/profiles/cpu-vllm-tiny-measured.json), so a 0.1-s TPOT target is two to ten steps,
as 50 ms is for a 7B model on an H100; the TTFT target keeps the default class's second"""
TINY_CPU_SLO_CLASSES: dict[str, SloTarget] = {"interactive": TINY_CPU_SLO,
                                              "batch": DEFAULT_SLO_CLASSES["batch"]}
"""the SLO classes of the vLLM replays, the arena and the fidelity check on the CPU"""

__all__ = ["SCHEDULER_CLS", "TESTED_VLLM_VERSIONS", "TINY_CPU_SLO", "TINY_CPU_SLO_CLASSES",
           "VllmVersionError", "check_vllm_version"]
