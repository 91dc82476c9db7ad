"""Render the spec tables (knobs, observation, reward) from code into docs/spec.md.

    python scripts/render_docs.py            # rewrite docs/spec.md
    python scripts/render_docs.py --check    # exit 1 if docs/spec.md is stale (the tests do this)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import tyro

from runtime.knobs import DEFAULT_KNOBS, KNOB_SPECS, NUM_KNOBS
from runtime.observation import SPEC_ADAPTERS, SPEC_VERSION, observation_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "spec.md"


def render() -> str:
    from env.session import RewardWeights

    knobs = ["| index | knob | unit | range | scale | default | meaning |",
             "|---|---|---|---|---|---|---|"]
    for i, (k, d) in enumerate(zip(KNOB_SPECS, DEFAULT_KNOBS.as_tuple())):
        knobs.append(f"| {i} | `{k.name}` | {k.unit} | {k.low:g} .. {k.high:g} | {k.scale} | "
                     f"{d:g} | {k.doc} |")
    reward_doc = "\n".join(line[4:] if line.startswith("    ") else line
                           for line in RewardWeights.__doc__.strip().splitlines())
    return (
        "# The spec: knobs, observation, reward\n\n"
        "Rendered from the code by `python scripts/render_docs.py`; do not edit by hand.\n\n"
        f"Spec version: `{SPEC_VERSION}` (written into every exported policy; the runtime "
        "refuses a policy of another spec, except the older ones it still serves: "
        + ", ".join(f"`{v}`" for v in SPEC_ADAPTERS)
        + ": their vector is rebuilt from today's by an index map and a factor, and their "
        "three actions set the first three knobs, the runtime's static knobs the others; see "
        "`runtime/observation.py`).\n\n"
        "## Knobs (the action)\n\n"
        f"The action is `Box(-1, 1, ({NUM_KNOBS},), float32)`; "
        "`runtime.knobs.action_to_knobs` maps it, each knob on its scale and rounded to its "
        "step (the chunk to the 16-token KV block). The admission policy (`fcfs`, `shed`, "
        "`late_to_back`) is a deployment setting, not a knob: the slack acts under `shed` and "
        "`late_to_back` only.\n\n" + "\n".join(knobs) + "\n\n"
        "## Observation\n\n"
        "A float32 vector built by `runtime.observation.FeatureBuilder` from the engine's "
        "stats over the last decision interval. The REST API takes the fields by name, in the "
        "units below; a field marked with a default in the \"if absent\" column may be left "
        "out (a spec-2 client's body still decides), a knob left out is the runtime's static "
        "knob, an unknown field is refused.\n\n" + observation_table() + "\n\n"
        "## Reward\n\n" + reward_doc + "\n\n"
        "| weight | default |\n|---|---|\n"
        + "\n".join(f"| `{f}` | {getattr(RewardWeights(), f):g} |"
                    for f in ("violation_weight", "memory_price", "oom_penalty", "batch_weight",
                              "cotenant_value")) + "\n")


@dataclass
class Args:
    check: bool = False
    """only check that docs/spec.md is current (exit 1 if stale) instead of writing it"""


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    text = render()
    if args.check:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC} is stale: run python scripts/render_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
