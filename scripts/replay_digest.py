"""A digest of whole-trace replays, to show that a speed change left the engine bit-identical.

    python scripts/replay_digest.py [--only conv-x1 mixed-x2-shed]

Replays every request of each run below to its end and hashes the run summary (every field but
the wall time and the speed) and every request's status, first token, finish, preemptions,
reject reason and output tokens; two more runs are sessions whose knobs, all five, are drawn at
random every second (the KV pool grows and shrinks, requests are preempted mid-decode). Prints
one line per run and one for all of them; run it on two checkouts and compare the lines. The
CPU seconds printed beside each line are for orientation only (one run, not a benchmark).

| run | trace | rate scale | engine |
|---|---|---|---|
| conv-x1, conv-x3 | azure-conv | 1, 3 | closed form |
| code-x0.65, code-x1.5 (and -steps) | azure-code | 0.65, 1.5 | closed form (step by step) |
| mixed-x1-late, mixed-x2-shed, mixed-x3 | mixed | 1, 2, 3 | admission late_to_back, shed, fcfs |
| session-conv-x2, session-mixed-x2-shed | azure-conv, mixed | 2 | random knobs every 1 s, 900 s |
"""

from __future__ import annotations

import hashlib
import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import tyro

from env.replay import replay
from env.traces import rate_scale
from env.traces.resolve import resolve_trace
from runtime.decider.decision import Decision, decided_by
from runtime.engine.engine import EngineConfig
from runtime.knobs import DEFAULT_KNOBS, NUM_KNOBS, action_to_knobs

RUNS: dict[str, tuple[str, float, dict, int | None]] = {
    # name: (trace, rate scale, EngineConfig fields, seed of the random knobs or None)
    "conv-x1": ("azure-conv", 1.0, {}, None),
    "conv-x3": ("azure-conv", 3.0, {}, None),
    "code-x0.65": ("azure-code", 0.65, {}, None),
    "code-x0.65-steps": ("azure-code", 0.65, {"fast_path": False}, None),
    "code-x1.5": ("azure-code", 1.5, {}, None),
    "code-x1.5-steps": ("azure-code", 1.5, {"fast_path": False}, None),
    "mixed-x1-late": ("mixed", 1.0, {"admission": "late_to_back"}, None),
    "mixed-x2-shed": ("mixed", 2.0, {"admission": "shed"}, None),
    "mixed-x3": ("mixed", 3.0, {}, None),
    "session-conv-x2": ("azure-conv", 2.0, {}, 1),
    "session-mixed-x2-shed": ("mixed", 2.0, {"admission": "shed"}, 2),
}
SESSION_S = 900.0
"""engine seconds a random-knob session runs (the rest is aborted)"""


@dataclass
class Args:
    only: list[str] = field(default_factory=lambda: list(RUNS))
    """the runs to digest (names in the table of the module's help)"""


class RandomKnobs:
    """Seeded uniform knobs, all five, every decision."""

    name = "random"

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def reset(self) -> None:
        pass

    def decide(self, observation: np.ndarray) -> Decision:
        return decided_by(action_to_knobs(self.rng.uniform(-1.0, 1.0, NUM_KNOBS)), self.name)


def run_digest(name: str) -> tuple[str, float]:
    """The hex digest of one run and the CPU seconds it took."""
    trace_name, scale, fields, seed = RUNS[name]
    trace = resolve_trace(trace_name)
    if scale != 1.0:
        trace = rate_scale(trace, scale)
    config = EngineConfig(**fields)
    decider = RandomKnobs(seed) if seed is not None else None
    c0 = time.process_time()
    result = replay(trace, config.start_knobs(DEFAULT_KNOBS), config=config, decider=decider,
                    interval_s=1.0, max_s=SESSION_S if seed is not None else math.inf)
    cpu = time.process_time() - c0
    h = hashlib.sha256()
    summary = {k: v for k, v in result.summary.as_dict().items() if k not in ("wall_s", "speedup")}
    h.update(repr(sorted(summary.items())).encode())
    for r in result.engine.requests:
        h.update(repr((r.req_id, int(r.status), r.first_token_s, r.finish_s, r.num_preemptions,
                       r.reject_reason, r.num_output_tokens)).encode())
    return h.hexdigest(), cpu


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    unknown = [n for n in args.only if n not in RUNS]
    if unknown:
        print(f"replay_digest: --only: unknown run(s) {', '.join(unknown)}; "
              f"the runs are {', '.join(RUNS)}", file=sys.stderr)
        return 2
    total = hashlib.sha256()
    for name in args.only:
        d, cpu = run_digest(name)
        total.update(d.encode())
        print(f"{name:>22} {d[:24]}  ({cpu:.2f} s CPU)", flush=True)
    print(f"{'all':>22} {total.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
