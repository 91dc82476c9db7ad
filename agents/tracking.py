"""Weights & Biases for a training run: the mode (``--wandb-mode auto``), and the run's final
table, plots and policy logged as an artifact."""

from __future__ import annotations

import os
from pathlib import Path


def wandb_mode(requested: str) -> str:
    """``--wandb-mode auto``: online if an API key is configured, else offline."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    netrc = Path.home() / ".netrc"
    configured = os.environ.get("WANDB_API_KEY") or (
        netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore"))
    return "online" if configured else "offline"


def log_to_wandb(wandb_run, result: dict, plots: list[Path], onnx_path: Path, run_dir: Path,
                 run_name: str, summary: dict) -> None:
    """The final table, the plots and the policy (with its card) as a W&B artifact."""
    import json

    import wandb

    # who decided and why are counts by name, a different set of names on every row: a table
    # cell of W&B holds one type per column, so they go in as JSON text
    counts = ("decision_sources", "fallback_reasons")
    columns = sorted({k for r in result["rows"] for k in r})

    def cell(r: dict, k: str):
        v = r.get(k)
        return json.dumps(v, sort_keys=True) if k in counts and v is not None else v

    wandb.log({"final/evaluation": wandb.Table(
        columns=columns, data=[[cell(r, k) for k in columns] for r in result["rows"]])})
    for p in plots:
        wandb.log({f"plots/{p.stem}": wandb.Image(str(p))})
    artifact = wandb.Artifact(f"policy-{run_name}", type="model",
                              metadata={"spec_version": export_spec_version(onnx_path)})
    artifact.add_file(str(onnx_path))
    artifact.add_file(str(run_dir / "card.md"))
    wandb_run.log_artifact(artifact)
    wandb_run.summary.update(summary)


def export_spec_version(path: Path) -> str:
    import onnx

    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    return props.get("batchpilot.spec_version", "")
