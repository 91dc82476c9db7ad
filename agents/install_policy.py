"""Put a trained run's policy into a policy set as one workload's policy.

    batchpilot install-policy --run runs/my-run --workload azure-code

copies the run's ``policy.onnx`` to ``<folder>/policy-<workload>.onnx`` and its ``card.md`` to
``<folder>/card-<workload>.md``, and names the policy for the workload in ``<folder>/
policies.json`` (created when there is none, with the folder's ``policy.onnx`` as the default,
or this policy where the folder has none). The server
then serves it with ``BATCHPILOT_WORKLOAD=<workload>``, and the arena runs it on that trace with
``policy:<folder>/policies.json``. The policy is checked by the runtime's decider before
anything is written: a policy the runtime would refuse is never installed. ``--workload default``
installs it as the set's default instead (``<folder>/policy.onnx`` and ``card.md``: the policy
of every workload the set does not name).

``--stamp-distribution azure-code@0.3-1.2`` stamps the installed copy with the distribution of
the observations the policy meets on those traces' training windows (its own replays, under the
deployment the flags name), for a policy exported before training recorded it: the decider's
out-of-distribution guard (:mod:`runtime.decider.ood_guard`) then hands control to the PID where
the live observations leave it.

``--lend-guard 0.9:0.95:30`` installs it with a lending guard (:mod:`runtime.decider.lend_guard`:
while more than 90% of the serving pool is in use, the KV ratio is at least 0.95, and for 30
intervals, doubling on each repeat, after lending under 0.95 preempted a request), stamped in
the installed copy's metadata; the run's own file is left as it was. To measure a guard before
it serves, install into a scratch folder (``--folder``) and run the arena on
``policy:<folder>/policy-<workload>.onnx``.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import tyro

from agents.export import stamp_metadata
from env.engine_choice import EngineChoice
from runtime.decider.guard import GuardedDecider
from runtime.decider.lend_guard import LEND_GUARD_KEY, LendGuard
from runtime.decider.ood_guard import CHECKED, OOD_KEY, ObservationDistribution
from runtime.decider.policy_set import POLICY_SET_FILE, PolicySet
from runtime.locations import shipped_policy_dir

DEFAULT_WORKLOAD = "default"
"""the --workload that installs a policy as the set's default"""
DEFAULT_POLICY = "policy.onnx"
"""the default policy's file in a set installed here"""


@dataclass(kw_only=True)
class Args(EngineChoice):
    run: Path
    """the run folder train.py wrote (its policy.onnx and card.md)"""
    workload: str
    """the workload the policy is for: a trace alias (azure-code) or a trace file's stem; or
    default, the set's default policy (the policy of every workload the set does not name)"""
    folder: Path | None = None
    """the policy folder (default: the shipped one, checkpoints/shipped)"""
    lend_guard: str | None = None
    """UTILIZATION:RATIO[:HOLD]: while more than UTILIZATION of the serving pool is in use, the
    KV ratio is at least RATIO, and with HOLD for HOLD intervals (doubling on each repeat) after
    an interval decided under RATIO preempted (e.g. 0.9:0.95:30; default: the run's policy as
    it is)"""
    stamp_distribution: str | None = None
    """training traces, as train.py's --trace takes them (TRACE@LOW-HIGH,...): stamp the
    installed copy with the observations the policy meets on their training windows, under the
    deployment of --slo --admission --admission-slack --batch-share --cotenant (for a policy
    exported without its training distribution; default: the run's policy as it is)"""
    profile: str | None = None
    """the executor profile of --stamp-distribution's replays (default: the shipped one)"""
    guard_fields: tuple[str, ...] = ()
    """the observation fields --stamp-distribution's guard checks, some of the traffic's own
    (runtime.decider.ood_guard.CHECKED; default: all of them): leave one out for a policy
    whose training met one value of it (cotenant_demand_fraction for a policy trained when
    every episode met the co-tenant's first minutes)"""


def install(run: Path, workload: str, folder: Path,
            lend_guard: LendGuard | None = None,
            distribution: str | None = None,
            stamped_from: str | None = None) -> PolicySet:
    """Copy ``run``'s policy and card into ``folder`` for ``workload`` and name them in the
    folder's policy set, the policy with ``lend_guard`` and ``distribution`` (a metadata value,
    measured on ``stamped_from``'s training windows) stamped in when given, and the card saying
    so; returns the updated set. Raises ValueError (a PolicySetError for the set) naming what
    is wrong."""
    source = run / "policy.onnx"
    if not source.is_file():
        raise ValueError(f"{source}: no exported policy in the run folder")
    decider = GuardedDecider(source)
    if decider.policy is None:
        raise ValueError(f"{source}: the runtime refuses this policy: {decider.last_error}")
    set_path = folder / POLICY_SET_FILE
    as_default = workload == DEFAULT_WORKLOAD
    name = DEFAULT_POLICY if as_default else f"policy-{workload}.onnx"
    card = "card.md" if as_default else f"card-{workload}.md"
    default = DEFAULT_POLICY if (folder / DEFAULT_POLICY).is_file() else name
    policies = (PolicySet.load(set_path) if set_path.exists()
                else PolicySet(set_path, default,
                               doc="one policy per workload: batchpilot install-policy"))
    policies = (PolicySet(set_path, name, policies.workloads, policies.doc) if as_default
                else policies.with_workload(workload, name))  # names checked before any copy
    notes = deployment_notes(lend_guard, distribution, stamped_from)
    folder.mkdir(parents=True, exist_ok=True)
    for src, dst in ((source, folder / name), (run / "card.md", folder / card)):
        if src.is_file():
            tmp = dst.with_suffix(dst.suffix + ".tmp")
            shutil.copyfile(src, tmp)
            if dst.suffix == ".onnx" and (lend_guard is not None or distribution is not None):
                stamp_metadata(tmp, {
                    **({LEND_GUARD_KEY: lend_guard.metadata()} if lend_guard else {}),
                    **({OOD_KEY: distribution} if distribution else {})})
                stamped = GuardedDecider(tmp)
                if stamped.policy is None:
                    raise ValueError(f"{tmp}: the runtime refuses the stamped policy: "
                                     f"{stamped.last_error}")
            if dst.suffix == ".md" and notes:
                with open(tmp, "a") as card:
                    where = ("as the set's default (the policy of every workload the set does "
                             "not name)" if as_default else f"for `{workload}`")
                    card.write(f"\n## Deployment\n\nInstalled {where} " + "; ".join(notes)
                               + ".\n")
            os.replace(tmp, dst)
    policies.save()
    return PolicySet.load(set_path)  # and it reads back: every file it names is there


def deployment_notes(lend_guard: LendGuard | None, distribution: str | None,
                     stamped_from: str | None) -> list[str]:
    """What the card's deployment section says of the guards stamped in."""
    notes = []
    if lend_guard is not None:
        hold = (f", and for {lend_guard.preemption_hold} intervals (doubling on each repeat) "
                "after an interval decided under it preempted" if lend_guard.preemption_hold
                else "")
        notes.append(f"with a lending guard: while more than {lend_guard.kv_utilization:g} "
                     "of the serving pool is in use, the KV ratio is at least "
                     f"{lend_guard.kv_cache_ratio:g}{hold} (`--lend-guard "
                     f"{lend_guard.flag()}`)")
    if distribution is not None:
        fields = ObservationDistribution.from_metadata(distribution).fields
        notes.append(f"with an out-of-distribution guard on {', '.join(fields)}, measured on "
                     "its own replays of "
                     + (f"`{stamped_from}`'s training windows" if stamped_from else
                        "its training windows")
                     + (f" (`--guard-fields {' '.join(fields)}`)" if fields != CHECKED else ""))
    return notes


def measured_distribution(policy: Path, traces: str, choice: Args) -> str:
    """The metadata value of the distribution ``policy`` meets on ``traces``' training windows
    (:func:`agents.export.replayed_observations`) over ``choice.guard_fields``; ValueError
    naming what is wrong."""
    from agents.export import replayed_observations
    from agents.training import parse_traces
    from runtime.decider.ood_guard import checked_fields

    if not policy.is_file():
        raise ValueError(f"{policy}: no exported policy in the run folder")
    fields = checked_fields(choice.guard_fields or CHECKED)  # before the replays
    observations = replayed_observations(policy, parse_traces(traces, (0.5, 2.5)),
                                         config=choice.engine_config(), profile=choice.profile)
    return ObservationDistribution.measure(observations, fields=fields).metadata()


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.split("\n\n")[0])
    folder = args.folder if args.folder is not None else shipped_policy_dir()
    try:
        guard = LendGuard.parse_flag(args.lend_guard) if args.lend_guard is not None else None
        distribution = None
        if args.stamp_distribution:
            distribution = measured_distribution(args.run / "policy.onnx",
                                                 args.stamp_distribution, args)
        policies = install(args.run, args.workload, folder, guard, distribution,
                           args.stamp_distribution or None)
    except ValueError as e:  # PolicySetError among them
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{policies.path}: {args.workload} -> "
          f"{policies.workloads.get(args.workload, policies.default)} "
          f"(default {policies.default})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
