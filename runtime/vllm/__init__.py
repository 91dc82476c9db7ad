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

from runtime.engine.profile import Profile
from runtime.engine.slo import DEFAULT_SLO_CLASSES, SloTarget
from runtime.vllm.versions import TESTED_VLLM_VERSIONS, VllmVersionError, check_vllm_version

SCHEDULER_CLS = "runtime.vllm.scheduler.BatchpilotScheduler"
"""the qualified name of the scheduler subclass, for ``scheduler_cls`` / ``--scheduler-cls``"""

PROFILE_NAME = "cpu-vllm-tiny-measured.json"
"""the committed profile of vLLM with the tiny model on the CPU, a file in
``runtime.locations.profiles_dir()``"""
TPOT_DECODE_BATCH = (16, 512)
"""the decode step the CPU targets are scaled from: 16 sequences at 512 tokens of context"""
TPOT_OVER_STEP = 2.0
"""the TPOT target over that step's time: a stream may lose one step in two to prefill"""
TTFT_OVER_TPOT = 10.0
"""the TTFT target over the TPOT target (the default class's is 20: 1 s against 50 ms)"""
PROMPT_ALLOWANCE = 1.5
"""the TTFT target's allowance per prompt token over the profile's prefill cost per token (as
the long-context class allows 1.5x a prefill: ``runtime.engine.slo``): on the CPU a prompt of
the Azure code trace's (median 1.5k tokens, p99 7k) takes seconds to prefill alone"""


def slo_classes_for(profile: Profile) -> dict[str, SloTarget]:
    """SLO classes scaled to a measured vLLM profile's speed, as the torch executor's replays
    scale theirs to its shape: the TPOT target is :data:`TPOT_OVER_STEP` decode steps of
    :data:`TPOT_DECODE_BATCH`, the TTFT target :data:`TTFT_OVER_TPOT` TPOT targets (rounded to
    10 ms) plus :data:`PROMPT_ALLOWANCE` times the profile's prefill time per prompt token; the
    batch class is the default's. On the shared 2-core CPU a vLLM step of the tiny
    model takes 15-25 ms when the machine is quiet and over 100 ms when it is busy, so the
    targets follow the profile measured with the machine as it is."""
    seqs, ctx = TPOT_DECODE_BATCH
    c = profile.cost
    step = c.const_s + c.decode_seq_s * seqs + c.decode_ctx_token_s * seqs * (ctx + 1)
    tpot = max(0.01, round(TPOT_OVER_STEP * step, 2))
    allowance = float(f"{PROMPT_ALLOWANCE * c.prefill_token_s:.2g}")
    return {"interactive": SloTarget(ttft_s=round(TTFT_OVER_TPOT * tpot, 2), tpot_s=tpot,
                                     ttft_per_prompt_token_s=allowance),
            "batch": DEFAULT_SLO_CLASSES["batch"]}


__all__ = ["SCHEDULER_CLS", "TESTED_VLLM_VERSIONS", "VllmVersionError", "check_vllm_version",
           "slo_classes_for", "PROFILE_NAME"]
