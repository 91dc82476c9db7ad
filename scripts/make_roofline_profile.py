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

import argparse
from pathlib import Path

from runtime.engine.roofline import ACCELERATORS, MODELS, derive


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--accelerator", default="h100", choices=list(ACCELERATORS))
    ap.add_argument("--model", default="llama3.1-8b", choices=list(MODELS))
    ap.add_argument("--memory-gib", type=float, default=40.0,
                    help="memory the engine may use on each accelerator (default 40 GiB)")
    ap.add_argument("--tp", type=int, default=None,
                    help="tensor-parallel degree (default: the model's own, 4 for 70B)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    profile = derive(args.model, args.accelerator, args.memory_gib, args.tp)
    profile.save(args.out)
    f = profile.key_figures()
    print(f"wrote {args.out}: {f['kv_blocks'][0.9]} KV blocks at ratio 0.9, decode step "
          f"{f['decode_step_ms_b1']:.2f} ms at batch 1 with 4k context, prefill "
          f"{f['prefill_us_per_token']:.1f} us/token")


if __name__ == "__main__":
    main()
