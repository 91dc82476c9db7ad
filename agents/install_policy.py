"""Put a trained run's policy into a policy set as one workload's policy.

    python -m agents.install_policy --run runs/my-run --workload azure-code

copies the run's ``policy.onnx`` to ``<folder>/policy-<workload>.onnx`` and its ``card.md`` to
``<folder>/card-<workload>.md``, and names the policy for the workload in ``<folder>/
policies.json`` (created when there is none, with the folder's ``policy.onnx`` as the default,
or this policy where the folder has none). The server
then serves it with ``BATCHPILOT_WORKLOAD=<workload>``, and the arena runs it on that trace with
``policy:<folder>/policies.json``. The policy is checked by the runtime's decider before
anything is written: a policy the runtime would refuse is never installed.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import tyro

from runtime.decider.guard import GuardedDecider
from runtime.decider.policy_set import POLICY_SET_FILE, PolicySet
from runtime.locations import shipped_policy_dir


@dataclass
class Args:
    run: Path
    """the run folder train.py wrote (its policy.onnx and card.md)"""
    workload: str
    """the workload the policy is for: a trace alias (azure-code) or a trace file's stem"""
    folder: Path | None = None
    """the policy folder (default: the shipped one, checkpoints/shipped)"""


def install(run: Path, workload: str, folder: Path) -> PolicySet:
    """Copy ``run``'s policy and card into ``folder`` for ``workload`` and name them in the
    folder's policy set; returns the updated set. Raises ValueError (a PolicySetError for
    the set) naming what is wrong."""
    source = run / "policy.onnx"
    if not source.is_file():
        raise ValueError(f"{source}: no exported policy in the run folder")
    decider = GuardedDecider(source)
    if decider.policy is None:
        raise ValueError(f"{source}: the runtime refuses this policy: {decider.last_error}")
    set_path = folder / POLICY_SET_FILE
    name = f"policy-{workload}.onnx"
    default = "policy.onnx" if (folder / "policy.onnx").is_file() else name
    policies = (PolicySet.load(set_path) if set_path.exists()
                else PolicySet(set_path, default,
                               doc="one policy per workload: python -m agents.install_policy"))
    policies = policies.with_workload(workload, name)  # checks the names before any copy
    folder.mkdir(parents=True, exist_ok=True)
    for src, dst in ((source, folder / name), (run / "card.md", folder / f"card-{workload}.md")):
        if src.is_file():
            tmp = dst.with_suffix(dst.suffix + ".tmp")
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
    policies.save()
    return PolicySet.load(set_path)  # and it reads back: every file it names is there


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.split("\n\n")[0])
    folder = args.folder if args.folder is not None else shipped_policy_dir()
    try:
        policies = install(args.run, args.workload, folder)
    except ValueError as e:  # PolicySetError among them
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{policies.path}: {args.workload} -> {policies.workloads[args.workload]} "
          f"(default {policies.default})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
