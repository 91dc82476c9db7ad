"""batchpilot inside ``vllm serve``: the controller in vLLM's engine core (docs/vllm-serve.md).

- :mod:`runtime.vllm.serve.settings`: the ``BATCHPILOT_VLLM_*`` settings, checked at start
  (no vLLM import: ``batchpilot vllm-serve`` checks them before vLLM starts);
- :mod:`runtime.vllm.serve.scheduler`: ``ServingScheduler``, the knob scheduler that vLLM's
  ``--scheduler-cls`` loads in its engine core, with the controller inside;
- :mod:`runtime.vllm.serve.controller`: the interval loop on vLLM's clock, its fault barrier,
  the policy file's watch, the knob timeline;
- :mod:`runtime.vllm.serve.side_port`: the metrics, the state and the operator's actions;
- :mod:`runtime.vllm.serve.launch`: ``batchpilot vllm-serve``, vLLM's OpenAI server with the
  scheduler and the flags it needs.
"""

SERVE_SCHEDULER_CLS = "runtime.vllm.serve.scheduler.ServingScheduler"
"""the scheduler class to give vLLM: ``--scheduler-cls`` or ``LLM(scheduler_cls=...)``"""
REQUIRED_FLAGS = ("--scheduling-policy", "priority", "--no-async-scheduling")
"""vLLM flags the scheduler needs beside ``--scheduler-cls``: priority scheduling (interactive
before batch) and synchronous scheduling (the knobs change between steps)"""
