"""Render the tables written in code into docs/: the spec (knobs, observation, reward) into
docs/spec.md, the scorecard's targets into docs/scorecard.md.

    python scripts/render_docs.py            # rewrite both
    python scripts/render_docs.py --check    # exit 1 if either is stale (the tests do this)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import tyro

from runtime.knobs import DEFAULT_KNOBS, KNOB_SPECS, NUM_KNOBS
from runtime.observation import SPEC_ADAPTERS, SPEC_VERSION, observation_table

DOCS = Path(__file__).resolve().parents[1] / "docs"


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


def render_scorecard() -> str:
    from agents.arena import LOAD_NEIGHBOURS, SCORECARD_LOADS
    from agents.scorecard import NEVER_WORSE_THAN, REFERENCE, TARGET, TARGETS

    loads = " and ".join(f"{m:g}" for m in SCORECARD_LOADS)
    neighbours = ", ".join(f"{m:g}" for m in LOAD_NEIGHBOURS)
    parts = [
        "# The scorecard: the project's targets\n\n"
        "Rendered from the code (`agents/scorecard.py`) by `python scripts/render_docs.py`; do "
        "not edit by hand.\n\n"
        "Every arena run (`python -m agents.evaluate`) ends with a scorecard: per trace, each "
        f"controller beside `{REFERENCE}` (the reference: the best fixed setting, tuned on the "
        "trace's train split) and the lookahead oracle (an upper bound: it knows the arrivals "
        "to come), each cell `pass`, `FAIL` with the reason, or why it is not judged. A target "
        "whose inputs the run did not measure (no co-tenant, no capacity search, no oracle, no "
        "static match, no batch work) is reported as not measured, never filled in. It is "
        "printed after the arena's tables, kept under `\"scorecard\"` in `results.json`, and "
        "`python -m agents.evaluate --report results.json` prints it again.\n\n"
        f"Where a target is judged at a load: `L*` is {REFERENCE}'s capacity at "
        f"{TARGET:.0%} interactive attainment on the same trace, and the scorecard loads are "
        f"{loads} times it (`--scorecard-loads`, or `--scorecard-rate-scales`); the headline "
        "is judged at the static match (`--match-static 0.68`); the never-worse margin against "
        f"{', '.join(NEVER_WORSE_THAN)} over every load the run holds, past `L*` as the mean "
        f"over the load and its neighbours at {neighbours} of it (`--load-neighbours`).\n\n"
        "| target | what it reads | bar |\n|---|---|---|"]
    parts += [f"| `{name}` | {t.title} | {t.bar} |" for name, t in TARGETS.items()]
    seen: set[str] = set()
    for t in TARGETS.values():
        if t.why in seen:
            continue
        same = [n for n, o in TARGETS.items() if o.why == t.why]
        seen.add(t.why)
        parts.append(f"\n## {', '.join(f'`{n}`' for n in same)}\n\n"
                     f"What it reads: {'; '.join(TARGETS[n].title for n in same)}. "
                     f"Bar: {t.bar}.\n\nWhy: {t.why}")
    return "\n".join(parts) + "\n"


def render_cli() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # cli.py beside this file
    from cli import BENCH, GROUPS, SCRIPTS

    def where(target: str) -> str:
        module = target.partition(":")[0]
        if module.startswith(SCRIPTS + "."):
            return f"scripts/{module.split('.', 1)[1]}.py"
        return f"{module.replace('.', '/')}.py"

    parts = ["# The batchpilot command\n\n"
             "Rendered from the code (`scripts/cli.py`) by `python scripts/render_docs.py`; do "
             "not edit by hand.\n\n"
             "`pip install` puts one command on the PATH, `batchpilot`, with a verb for each job. "
             "`batchpilot --help` lists them; `batchpilot VERB --help` lists every flag of a "
             "verb with its one-line doc (the flags are the fields of the module's config "
             "dataclass, built by tyro; a bad value exits with status 2 naming the flag). From "
             "a checkout, `python train.py`, `python -m agents.<module>` and `python "
             "scripts/<tool>.py` run the same code. `serve`, `profiles`, `roofline-profile`, "
             "`check-published` and `bench decider` run on the runtime alone (`pip install "
             "\"batchpilot[cpu]\"`; `bench decider` also needs `pip install onnx`, to read "
             "the policy's weights for its numpy floor, and says so when it is missing); the "
             "others need the `train` extra."]
    for title, verbs in [*GROUPS.items(), ("Benchmarks and checks", BENCH)]:
        prefix = "bench " if verbs is BENCH else ""
        parts.append(f"\n## {title}\n\n| verb | what | code |\n|---|---|---|")
        parts += [f"| `batchpilot {prefix}{v.name}` | {v.summary} | `{where(v.target)}` |"
                  for v in verbs]
    parts.append("\nThe studies that produced one figure each live apart, in "
                 "`scripts/experiments/` (not installed): each docstring names the figure and the "
                 "page that quotes it.")
    return "\n".join(parts) + "\n"


RENDERED = {"spec.md": render, "scorecard.md": render_scorecard, "cli.md": render_cli}
"""each page of docs/ that is rendered from the code, and its renderer"""


@dataclass
class Args:
    check: bool = False
    """only check that the rendered pages are current (exit 1 if one is stale) instead of
    writing them"""


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    stale = 0
    for name, renderer in RENDERED.items():
        doc, text = DOCS / name, renderer()
        if not args.check:
            doc.write_text(text)
            print(f"wrote {doc}")
        elif not doc.exists() or doc.read_text() != text:
            print(f"{doc} is stale: run python scripts/render_docs.py", file=sys.stderr)
            stale = 1
    return stale


if __name__ == "__main__":
    sys.exit(main())
