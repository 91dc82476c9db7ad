"""Choose a workload's policy among trained ones, on the train split only.

    batchpilot choose --trace mixed --candidates runs/run-a,runs/run-b,policy.onnx \\
        --admission shed --admission-slack 0.5 --cotenant

The rule is the scorecard's co-tenant memory target (:mod:`agents.scorecard`): best static's
capacity at 99% on the split (``L*``) sets the loads (``--loads`` times it: half and all of it by
default); every candidate runs there beside best static; a candidate whose mean interactive
attainment over those loads is within ``--within`` (half a point) of best static's is eligible,
and the eligible one with the least mean KV memory is chosen. The table also says whether each
candidate attains at ``L*`` at least what best static attains there (the capacity target's bar
at the one load where it is decided); ``--hold-capacity`` makes that a condition of
eligibility too. Nothing here reads the held-out
split unless ``--split`` says so: the held-out figures (``batchpilot evaluate --split
eval``) stay a test the choice never saw. Prints the table and the ``batchpilot install-policy``
command that puts the chosen run into the shipped set (``--json``: one object). A candidate is a
run folder train.py wrote (its ``policy.onnx``) or an ONNX policy file.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import tyro

from agents.arena import evaluate
from agents.controllers.best_static import parse_grid
from agents.evaluate import positive_numbers
from agents.registry import EvalSpec, make_controller
from agents.scorecard import MEMORY_ATTAINMENT_SLACK, REFERENCE, TARGET
from env.engine_choice import EngineChoice
from env.traces.resolve import resolve_trace, trace_label
from runtime.engine.roofline import ProfileChoice
from runtime.session import DEFAULT_INTERVAL_S


@dataclass
class Config(ProfileChoice, EngineChoice):
    trace: str = "synthetic"
    """the workload's trace: synthetic | azure-conv | azure-code | mixed | mixed:SPEC | PATH"""
    candidates: str = ""
    """the policies to choose among, comma-separated: run folders (their policy.onnx) or ONNX
    policy files"""
    split: Literal["train", "eval", "all"] = "train"
    """the part of the trace the choice replays (train: the held-out split stays unseen)"""
    loads: str = "0.5,1"
    """the loads, comma-separated multiples of best static's capacity at 99% on the split"""
    within: float = MEMORY_ATTAINMENT_SLACK
    """a candidate is eligible when its mean interactive attainment is at most this below best
    static's (0.005: half a point, the memory figure's slack)"""
    hold_capacity: bool = False
    """a candidate is eligible only if it also attains at the load 1 (best static's capacity;
    ``--loads`` must hold 1) at least best static's interactive attainment there: the capacity
    figure's bar where it is decided. Off by default: that comparison turns on a few requests
    (a few hundredths of a point), and on the conversation and mixed train splits no trained
    policy passes it"""
    tuning_scales: str | None = None
    """rate scales of best static's attainment search (its frontier), comma-separated (default:
    the registry's)"""
    static_grid: str = ""
    """the knob grid of best static's capacity search, ``window=..;chunk=..;ratio=..`` (empty:
    the full grid)"""
    interval_s: float = DEFAULT_INTERVAL_S
    """the decision interval, engine seconds"""
    workers: int = 2
    """worker processes"""
    any_deployment: bool = False
    """judge run folders trained under another deployment than these flags name (by default
    such a candidate is refused: see :func:`deployment_mismatch`)"""
    json: bool = False
    """print one JSON object instead of the table"""


def policy_path(candidate: str) -> Path:
    """The ONNX file of a candidate: a run folder's ``policy.onnx``, or the file itself."""
    path = Path(candidate)
    if path.is_dir():
        path = path / "policy.onnx"
    if not path.is_file():
        raise FileNotFoundError(f"--candidates: {candidate}: no run folder with a policy.onnx "
                                "and no such ONNX file")
    return path


DEPLOYMENT_FIELDS = ("slo", "batch_share", "admission", "admission_slack", "cotenant", "kv_shrink")
"""The :class:`EngineChoice` fields a run folder's ``config.json`` records (train.py's config
inherits them) and the choice must replay under."""


def deployment_mismatch(choice: EngineChoice, candidate: str) -> str | None:
    """Why ``candidate``, a run folder, was trained under another deployment than ``choice``
    names (None when it was not, or when it is an ONNX file or has no ``config.json``). A
    policy judged under a deployment it never served in, or beside a best static tuned for
    another, is chosen on the wrong rows: forgetting ``--admission shed --cotenant`` moved every
    mixed candidate three points under best static."""
    path = Path(candidate) / "config.json"
    if not path.is_file():
        return None
    try:
        trained = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--candidates: {path}: unreadable ({e})") from e
    if not isinstance(trained, dict):
        raise ValueError(f"--candidates: {path}: not a run's config (a JSON object)")
    for name in DEPLOYMENT_FIELDS:
        if name not in trained:
            continue
        ours = getattr(choice, name)
        ours = getattr(ours, "value", ours)  # the admission policy's enum
        if trained[name] != ours:
            flag = "--" + name.replace("_", "-")
            return (f"--candidates: {candidate} was trained with {flag} {trained[name]!r} and "
                    f"this choice runs {flag} {ours!r}: pass the deployment the run serves in "
                    "(its config.json), or --any-deployment")
    return None


def at_load(entry: dict, scale: float, name: str) -> float:
    """An entry's interactive attainment at rate scale ``scale``."""
    for d in entry["loads"]:
        if d["rate_scale"] == scale:
            return d["interactive_attainment"]
    raise ValueError(f"{name} has no row at x{scale:g}, best static's capacity")


def rank(rows: list[dict], names: dict[str, str], within: float,
         hold_at: float | None = None, hold: bool = False) -> list[dict]:
    """One entry per controller of ``rows`` (best static first, then the candidates in the
    order of ``names``: controller name -> candidate as given): its per-load attainment and KV,
    the means, the gap to best static and whether it is eligible; the chosen one (eligible,
    least mean KV; the first given on a tie) has ``"chosen": True``. With ``hold_at`` (a rate
    scale of the rows: best static's capacity) each candidate's ``"holds_capacity"`` says whether
    its interactive attainment there is at least best static's; with ``hold`` too, one that does
    not is not eligible."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["controller"], []).append(r)
    if REFERENCE not in by:
        raise ValueError(f"the rows hold no {REFERENCE} to compare with")

    def entry(name: str) -> dict:
        runs = sorted(by[name], key=lambda r: r["rate_scale"])
        att = sum(r["interactive_attainment"] for r in runs) / len(runs)
        kv = sum(r["mean_kv_gib"] for r in runs) / len(runs)
        return {"controller": name, "candidate": names.get(name, REFERENCE),
                "loads": [{"rate_scale": r["rate_scale"],
                           "interactive_attainment": r["interactive_attainment"],
                           "mean_kv_gib": r["mean_kv_gib"]} for r in runs],
                "mean_interactive_attainment": att, "mean_kv_gib": kv}

    ref = entry(REFERENCE)
    out = [ref]
    for name in names:
        e = entry(name)
        e["gap"] = e["mean_interactive_attainment"] - ref["mean_interactive_attainment"]
        e["eligible"] = e["gap"] >= -within - 1e-12
        if hold_at is not None:
            e["holds_capacity"] = (at_load(e, hold_at, name)
                                   >= at_load(ref, hold_at, REFERENCE) - 1e-12)
            e["eligible"] = e["eligible"] and (e["holds_capacity"] or not hold)
        e["chosen"] = False
        out.append(e)
    eligible = [e for e in out[1:] if e["eligible"]]
    if eligible:
        min(eligible, key=lambda e: e["mean_kv_gib"])["chosen"] = True
    return out


def table(entries: list[dict], within: float) -> str:
    loads = [f"x{d['rate_scale']:.3g}" for d in entries[0]["loads"]]
    held = any("holds_capacity" in e for e in entries)
    rows = ["| candidate | " + " | ".join(f"{s} att. / KV" for s in loads)
            + " | mean att. | gap |" + (" at best static's att. at L* |" if held else "")
            + " mean KV GiB | |",
            "|---|" + "---|" * (len(loads) + 4 + held)]
    for e in entries:
        cells = [f"{d['interactive_attainment']:.2%} / {d['mean_kv_gib']:.2f}" for d in e["loads"]]
        if "gap" not in e:
            verdict, gap = "reference", ""
        else:
            gap = f"{e['gap'] * 100:+.2f} pt"
            verdict = ("**chosen**" if e["chosen"] else "eligible" if e["eligible"]
                       else f"out: more than {within * 100:g} pt under"
                       if e["gap"] < -within - 1e-12
                       else "out: under best static at its capacity")
        hold = ""
        if held:
            hold = (" yes |" if e.get("holds_capacity") else " no |") if "gap" in e else " |"
        rows.append(f"| {e['candidate']} | " + " | ".join(cells)
                    + f" | {e['mean_interactive_attainment']:.2%} | {gap} |{hold} "
                    f"{e['mean_kv_gib']:.2f} | {verdict} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    cfg = tyro.cli(Config, args=argv, description=__doc__.splitlines()[0])
    try:
        names = [c.strip() for c in cfg.candidates.split(",") if c.strip()]
        if not names:
            raise ValueError("--candidates names nothing: give run folders or ONNX files")
        loads = positive_numbers(cfg.loads, "--loads", empty=False)
        if cfg.hold_capacity and 1.0 not in loads:
            raise ValueError("--hold-capacity judges the load 1 (best static's capacity): "
                             "--loads must hold 1")
        if not 0.0 <= cfg.within <= 1.0:
            raise ValueError(f"--within must be in [0, 1], got {cfg.within}")
        if cfg.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {cfg.workers}")
        controllers = {f"policy:{policy_path(c)}": c for c in names}
        if len(controllers) < len(names):
            raise ValueError("--candidates names one policy twice")
        if not cfg.any_deployment:
            for c in names:
                why = deployment_mismatch(cfg, c)
                if why is not None:
                    raise ValueError(why)
        tuning = (tuple(positive_numbers(cfg.tuning_scales, "--tuning-scales"))
                  if cfg.tuning_scales else None)
        profile = cfg.spec()
        config = cfg.engine_config()
        resolve_trace(cfg.trace)  # fail fast on a missing or unreadable trace
        grid = parse_grid(cfg.static_grid) if cfg.static_grid else None
        spec = EvalSpec(cfg.trace, cfg.split, profile, cfg.interval_s, config,
                        tuning_scales=tuning, static_grid=grid)
        for c in controllers:
            make_controller(c, spec)  # fail fast on a policy the runtime refuses
    except (ValueError, FileNotFoundError) as e:
        print(f"choose: {e}", file=sys.stderr)
        return 2
    common = dict(part=cfg.split, interval_s=cfg.interval_s, profile_path=profile,
                  config=config, workers=cfg.workers, progress=not cfg.json,
                  tuning_scales=tuning, static_grid=grid)
    found = evaluate([cfg.trace], [REFERENCE], [1.0], capacity=True, **common)
    capacity = next(c["capacity_99"] for c in found["capacity"]
                    if c["controller"] == REFERENCE)
    if not capacity > 0:
        print(f"choose: best static misses {TARGET:.0%} at every load of {cfg.trace}'s "
              f"{cfg.split} split; there is no capacity to set the loads by", file=sys.stderr)
        return 1
    scales = [round(m * capacity, 4) for m in loads]
    result = evaluate([cfg.trace], [REFERENCE, *controllers], scales, capacity=False, **common)
    entries = rank(result["rows"], controllers, cfg.within,
                   scales[loads.index(1.0)] if 1.0 in loads else None, cfg.hold_capacity)
    chosen = next((e for e in entries[1:] if e["chosen"]), None)
    workload = trace_label(cfg.trace)
    install = None
    if chosen is not None and Path(chosen["candidate"]).is_dir():
        install = (f"batchpilot install-policy --run {chosen['candidate']} "
                   f"--workload {workload}")
    if cfg.json:
        print(json.dumps({"trace": workload, "split": cfg.split, "capacity_99": capacity,
                          "rate_scales": scales, "within": cfg.within,
                          "hold_capacity": cfg.hold_capacity, "entries": entries,
                          "chosen": chosen["candidate"] if chosen else None,
                          "install": install}))
        return 0
    print(f"{workload}, {cfg.split} split: best static's capacity at {TARGET:.0%} x{capacity:.3g};"
          f" loads {', '.join(f'x{s:.3g}' for s in scales)}\n")
    print(table(entries, cfg.within))
    if chosen is None:
        print(f"\nno candidate is within {cfg.within * 100:g} pt of best static's attainment"
              + (" and at least its attainment at its capacity" if cfg.hold_capacity else "")
              + ": keep what the set serves now")
    else:
        print(f"\nchosen: {chosen['candidate']}" + (f"\ninstall it: {install}" if install else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
