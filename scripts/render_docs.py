"""Render the spec tables (knobs, observation, reward) from code into docs/spec.md.

    python scripts/render_docs.py            # rewrite docs/spec.md
    python scripts/render_docs.py --check    # exit 1 if docs/spec.md is stale (the tests do this)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import tyro

from runtime.knobs import DEFAULT_KNOBS, KNOB_SPECS
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
        + ", whose vector differs only in the range of the prompt-length fields "
        "and is rebuilt for it).\n\n"
        "## Knobs (the action)\n\n"
        "The action is `Box(-1, 1, (3,), float32)`; `runtime.knobs.action_to_knobs` maps it: "
        "log scales for the window and the chunk, linear for the ratio, the chunk rounded to "
        "the 16-token KV block.\n\n" + "\n".join(knobs) + "\n\n"
        "## Observation\n\n"
        "A float32 vector built by `runtime.observation.FeatureBuilder` from the engine's "
        "stats over the last decision interval. The REST API takes the fields by name, in the "
        "units below.\n\n" + observation_table() + "\n\n"
        "## Reward\n\n" + reward_doc + "\n\n"
        "| weight | default |\n|---|---|\n"
        + "\n".join(f"| `{f}` | {getattr(RewardWeights(), f):g} |"
                    for f in ("violation_weight", "memory_price", "oom_penalty")) + "\n")


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
