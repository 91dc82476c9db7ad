"""Write a roofline executor profile of the catalogue to a file (to edit or to ship it).

    python scripts/make_roofline_profile.py --model llama3.1-8b --accelerator h100 \
        --memory-gib 40 --out h100-llama3.1-8b-40gib-roofline.json

Commands take such a profile by name without a file (``--profile
h100-llama3.1-8b-40gib-roofline``, or ``--model --accelerator --memory-gib``); the derivation,
the datasheet figures and the efficiencies are in :mod:`runtime.engine.roofline`. The shipped
default ``checkpoints/profiles/h200-llama2-7b-40gib-roofline.json`` was written by the first
version of this script, which counted the input embedding in the FLOPs per token (its
``prefill_token_s`` is 2% above today's rule); it is kept as it is, since the shipped policy and
best-static grids were made with it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import tyro

from runtime.engine.roofline import ACCELERATORS, MODELS, derive


@dataclass
class Args:
    out: Path
    """the profile file to write"""
    model: str = "llama3.1-8b"
    """model shape, a key of runtime.engine.roofline.MODELS"""
    accelerator: str = "h100"
    """accelerator, a key of runtime.engine.roofline.ACCELERATORS"""
    memory_gib: float = 40.0
    """memory the engine may use on each accelerator, GiB"""
    tp: int | None = None
    """tensor-parallel degree (default: the model's own, 4 for the 70B models)"""


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    for flag, value, known in (("--accelerator", args.accelerator, ACCELERATORS),
                               ("--model", args.model, MODELS)):
        if value not in known:
            print(f"make_roofline_profile: {flag} must be one of {', '.join(known)}, "
                  f"got {value!r}", file=sys.stderr)
            return 2
    try:
        profile = derive(args.model, args.accelerator, args.memory_gib, args.tp)
    except ValueError as e:
        print(f"make_roofline_profile: {e}", file=sys.stderr)
        return 2
    profile.save(args.out)
    f = profile.key_figures()
    print(f"wrote {args.out}: {f['kv_blocks'][0.9]} KV blocks at ratio 0.9, decode step "
          f"{f['decode_step_ms_b1']:.2f} ms at batch 1 with 4k context, prefill "
          f"{f['prefill_us_per_token']:.1f} us/token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
