"""The end of a training run: the final evaluation of the exported policy beside the baselines on
the held-out split, and the run's card (``card.json``, everything; ``card.md``, the summary a
reader wants).

``cfg`` is train.py's ``Config``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path


def final_evaluation(cfg, traces: list[str], onnx_path: Path, run_dir: Path):
    """The baselines and the exported policy on the eval split: result, plots, markdown table."""
    from agents.arena import evaluate
    from agents.export import stamp_metadata
    from agents.oracle import ORACLE_NAME
    from agents.report import markdown_table, plot

    controllers = [c for c in cfg.final_controllers.split(",") if c]
    if any(own_trace(t) for t in traces):  # an operator's trace: compare with its own bounds
        controllers += [c for c in ("best-static", ORACLE_NAME) if c not in controllers]
    controllers.append(f"policy:{onnx_path}")
    from agents.controllers.best_static import parse_grid

    result = evaluate(traces, controllers, cfg.final_rate_scales, part="eval",
                      interval_s=cfg.interval_s, profile_path=cfg.profile,
                      config=cfg.engine_config(seed=cfg.seed),
                      capacity=cfg.final_capacity, workers=cfg.workers, ray=cfg.ray or None,
                      match_static=cfg.final_match_static or None,
                      static_grid=parse_grid(cfg.static_grid) if cfg.static_grid else None)
    plots = plot(result["rows"], run_dir / "plots")
    for r in result["rows"]:
        r.pop("timeline", None)
    table = markdown_table(result["rows"], result["capacity"])
    (run_dir / "evaluation.json").write_text(json.dumps(result, indent=1) + "\n")
    summary = {f"{r['trace']}/x{r['rate_scale']:g}": round(r["slo_attainment"], 4)
               for r in result["rows"] if r["controller"].startswith("policy:")}
    stamp_metadata(onnx_path, {"batchpilot.eval_summary": json.dumps(summary)})
    return result, plots, table


def own_trace(spec: str) -> bool:
    """Whether a trace spec names a file (an operator's own trace) rather than an alias."""
    from env.traces.resolve import MIXED_PREFIX, TRACE_ALIASES

    if spec.startswith(MIXED_PREFIX):
        return own_trace(spec[len(MIXED_PREFIX):])
    return spec not in TRACE_ALIASES


def write_card(cfg, run_dir: Path, run_name: str, traces: list[str], training: dict,
               export, result: dict, table: str) -> None:
    """``card.json`` (everything) and ``card.md`` (the summary a reader wants)."""
    card = {"run": run_name, "date": dt.datetime.now().isoformat(timespec="seconds"),
            "config": dataclasses.asdict(cfg), "traces": traces, "training": training,
            "export": export.as_dict(), "evaluation": result}
    (run_dir / "card.json").write_text(json.dumps(card, indent=1, default=str) + "\n")
    (run_dir / "card.md").write_text(
        f"# Policy card: {run_name}\n\n"
        f"- date: {card['date']}\n- preset: {cfg.preset}; seed {cfg.seed}\n"
        f"- training traces: {', '.join(traces)} (train split: first 40 minutes)\n"
        f"- training: {cfg.total_timesteps:,} steps in {training['seconds']:.0f} s "
        f"({training['env_steps_per_s']:.0f} env steps/s); reward {cfg.reward}; "
        f"{cfg.windows} windows per trace, curriculum {cfg.curriculum:g}\n"
        f"- best static (train split): "
        f"{'; '.join(f'{t}: {k}' for t, k in training['best_static_knobs'].items())}\n"
        f"{warm_start_line(training['warm_start'])}"
        f"{periodic_line(training)}"
        f"- export: max |ONNX - torch| = {export.max_abs_diff:.2g} on {export.num_checked} "
        f"observations ({export.graph_abs_diff:.2g} against the float32 module exported); "
        f"operators {export.operators}\n\n"
        f"## Evaluation on held-out windows (eval split: after minute 40)\n\n{table}\n\n"
        f"## Config\n\n```json\n{json.dumps(dataclasses.asdict(cfg), indent=1)}\n```\n")


def warm_start_line(warm: dict) -> str:
    """The card's line on how training started."""
    out = ""
    if "init_from" in warm:
        out += f"- started from {warm['init_from']['from']}\n"
    if "held_knobs" in warm:
        out += ("- held at best static's value (--free-knobs): "
                + ", ".join(f"{k} {v:g}" for k, v in warm["held_knobs"].items()) + "\n")
    imitation = warm.get("imitation", {})
    for r in imitation.get("rounds", []):
        before, after = r["held_out_mse_before"], r["held_out_mse_after"]
        mse = f"{before:.4f} -> {after:.4f}" if before is not None else "n/a"
        out += (f"- imitation {r['round']}: {r['labels']} {imitation.get('teacher', 'oracle')} "
                f"labels, held-out action MSE {mse}, {r['seconds']:.0f} s\n")
    return out


def periodic_line(training: dict) -> str:
    """The card's line on the best periodic evaluation against best static and the oracle."""
    history = training["periodic_evaluations"]
    if not history:
        return ""
    best = training["kept_evaluation"]
    gaps = ", ".join(f"{k} {best[k]:+.4f}" for k in ("gap_to_best_static", "gap_to_oracle",
                                                     "oracle_gain_share") if k in best)
    score = f", score {best['score']:.4f}" if "score" in best else ""
    return (f"- kept model's periodic evaluation (step {best['step']:,}): mean SLO attainment "
            f"{best['mean']:.4f}{score}; {gaps}\n")
