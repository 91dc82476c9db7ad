"""List executor profiles with their key figures: every catalogue model on every accelerator
(derived, at ``--memory-gib`` per accelerator) and the profile files in checkpoints/profiles
(a file wins over the derivation of the same name, as when a command loads it).

    python scripts/list_profiles.py                  # markdown table
    python scripts/list_profiles.py --memory-gib 60 --model llama3.1-8b --json

Figures: KV bytes per token; KV blocks (16 tokens) at ratio 0.4, 0.9 and 0.95; a decode step
at batch 1 and at batch 64 with 4,096 tokens of context each; prefill per token; the context
(max_model_len); and where the figures come from (derived or measured).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import tyro

from runtime.engine.profile import Profile
from runtime.engine.roofline import ACCELERATORS, MODELS, derive
from runtime.locations import profiles_dir


def profiles(memory_gib: float, models: list[str], accelerators: list[str]) -> list[Profile]:
    out = []
    for model in models:
        for accel in accelerators:
            try:
                profile = derive(model, accel, memory_gib)
                if not (profiles_dir() / f"{profile.name}.json").exists():  # the file wins
                    out.append(profile)
            except ValueError as e:  # e.g. 70B weights that do not fit the budget
                print(f"skipped {model} on {accel}: {e}")
    return out + [Profile.load(p) for p in sorted(profiles_dir().glob("*.json"))]


@dataclass
class Args:
    memory_gib: float = 40.0
    """memory per accelerator of the derived profiles, GiB"""
    model: tuple[str, ...] = ()
    """only these catalogue models (default: all)"""
    accelerator: tuple[str, ...] = ()
    """only these catalogue accelerators (default: all)"""
    json: bool = False
    """one JSON object per profile"""


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    for flag, values, known in (("--model", args.model, MODELS),
                                ("--accelerator", args.accelerator, ACCELERATORS)):
        unknown = [v for v in values if v not in known]
        if unknown:
            print(f"list_profiles: {flag} must be among {', '.join(known)}, got {unknown}",
                  file=sys.stderr)
            return 2
    rows = [p.key_figures() for p in profiles(args.memory_gib, list(args.model or MODELS),
                                              list(args.accelerator or ACCELERATORS))]
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    print("| profile | context | KV KiB/token | KV blocks 0.4 / 0.9 / 0.95 | decode b=1 ms | "
          "decode b=64 ms | prefill us/token | source |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        b = r["kv_blocks"]
        print(f"| {r['name']} | {r['max_model_len']:,} | {r['kv_bytes_per_token'] / 1024:g} | "
              f"{b[0.4]:,} / {b[0.9]:,} / {b[0.95]:,} | {r['decode_step_ms_b1']:.2f} | "
              f"{r['decode_step_ms_b64']:.2f} | {r['prefill_us_per_token']:.2f} | "
              f"{r['source']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
