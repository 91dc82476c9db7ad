"""The arena's report: markdown tables (the scorecard among them), the JSON results and the
plots (attainment against load, one window over time, and the Pareto plot of interactive
attainment against KV memory)."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from pathlib import Path

from agents.arena import RATIO_KNOB, is_upper_bound
from agents.oracle import ORACLE_LABEL, SEARCHES
from agents.scorecard import HINDSIGHT, REFERENCE
from runtime.knobs import KNOB_NAMES, KNOB_SPECS


def short_name(controller: str) -> str:
    """``policy:runs/x/policy.onnx`` -> ``policy:x``, ``policy:runs/x/policies.json`` ->
    ``policy:x/policies``: names short enough for tables and plots."""
    if controller.startswith(("policy:", "policy-unguarded:")):
        kind, _, rest = controller.partition(":")
        path = Path(rest)
        folder = path.parent.name or "onnx"
        return f"{kind}:{folder}" if path.name == "policy.onnx" else f"{kind}:{folder}/{path.stem}"
    if controller == HINDSIGHT:
        return "hindsight static (not deployable)"
    return SEARCHES[controller][2] if controller in SEARCHES else controller


def _fmt(x: float | None, spec: str) -> str:
    if x is None:
        return "-"
    return "inf" if isinstance(x, float) and math.isinf(x) else format(x, spec)


def _knob(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _rate(r: dict) -> str:
    rate = f"{r['rate_scale']:.3g}"
    if r.get("matched_static"):
        rate += " (static match)"
    if "past_capacity_multiple" in r:
        rate += f" ({r['past_capacity_multiple']:g}x {REFERENCE} cap.)"
    if r.get("scorecard_load_multiple") is not None:
        rate += f" ({r['scorecard_load_multiple']:g}x {REFERENCE} cap., scorecard)"
    return rate


def markdown_table(rows: Sequence[dict], capacity: Sequence[dict],
                   past_capacity: Sequence[dict] = (), frontier: Sequence[dict] = ()) -> str:
    """The rows, then capacities, goodput past capacity and the static frontier, as markdown.
    The oracle is named "oracle (upper bound)" in every table."""
    knob_names = [k for k in KNOB_NAMES if rows and f"mean_{k}" in rows[0]]
    head = ["trace", "controller", "rate x", "SLO att.", "interactive att.", "batch tok/s",
            "batch backlog req / mean tok", "goodput rps", "TTFT p99 s", "TPOT p99 ms",
            "preempt", "OOMs", "shed / expired / late", *knob_names, "KV GiB",
            "co-tenant served", "recovery s", "decided by"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        rec = ("-" if "bursts" not in r else
               f"{_fmt(r['recovery_s_mean'], '.1f')} ({r['bursts']} bursts)")
        knobs = "".join(f"{_knob(r[f'mean_{k}'])} | " for k in knob_names)
        lines.append(
            f"| {r['trace']} | {short_name(r['controller'])} | {_rate(r)} | "
            f"{r['slo_attainment']:.2%} | {r['interactive_attainment']:.2%} | "
            f"{r['batch_goodput_tps']:.0f} | "
            f"{r['batch_backlog_requests']} / {r['batch_backlog_tokens_mean']:.0f} | "
            f"{r['goodput_rps']:.2f} | {r['ttft_p99_s']:.2f} | "
            f"{r['tpot_p99_s'] * 1e3:.1f} | {r['preemptions']} | {r['ooms']} | "
            f"{r['shed']} / {r['expired']} / {r['late']} | {knobs}"
            f"{r['mean_kv_gib']:.2f} | {_share(r['cotenant_served_share'])} | {rec} | "
            f"{decided_by(r)} |")
    if capacity:
        lines += ["", "| trace | controller | capacity @99% interactive | goodput there rps | "
                  "capacity @90% | note |",
                  "|---|---|---|---|---|---|"]
        for c in capacity:
            lines.append(f"| {c['trace']} | {short_name(c['controller'])} | "
                         f"{c['capacity_99']:.3g} | {_fmt(c['goodput_at_capacity_99_rps'], '.2f')}"
                         f" | {c['capacity_90']:.3g} | {_capacity_note(c)} |")
    if past_capacity:
        multiples = [p["multiple"] for p in past_capacity[0]["points"]]
        lines += ["", f"Goodput past capacity: at multiples of {REFERENCE}'s capacity @99%, "
                  "as a share of the controller's goodput at its own capacity @99%", "",
                  "| trace | controller | capacity @99% | goodput there rps | "
                  + " | ".join(f"{m:g}x: rate x, goodput rps (share)" for m in multiples) + " |",
                  "|" + "---|" * (4 + len(multiples))]
        for e in past_capacity:
            pts = " | ".join(f"{p['rate_scale']:.3g}, {p['goodput_rps']:.2f} "
                             f"({_share(p['goodput_share'])})" for p in e["points"])
            lines.append(f"| {e['trace']} | {short_name(e['controller'])} | "
                         f"{e['capacity_99']:.3g} | {_fmt(e['goodput_at_capacity_99_rps'], '.2f')}"
                         f" | {pts} |")
    if frontier:
        lines += ["", "Static frontier: best static's setting with the KV ratio held fixed", "",
                  "| trace | rate x | KV ratio | setting | mean KV GiB | interactive att. | "
                  "SLO att. | co-tenant served |", "|---|---|---|---|---|---|---|---|"]
        for f in frontier:
            knobs = ", ".join([f"{k}={_knob(v)}" for k, v in f["knobs"].items()
                               if k != RATIO_KNOB] + [f"admission={f['admission']}"])
            lines.append(f"| {f['trace']} | {f['rate_scale']:.3g} | {f[RATIO_KNOB]:g} | {knobs} | "
                         f"{f['mean_kv_gib']:.2f} | {f['interactive_attainment']:.2%} | "
                         f"{f['slo_attainment']:.2%} | {_share(f['cotenant_served_share'])} |")
    return "\n".join(lines)


def decided_by(r: dict) -> str:
    """Who decided a row's intervals, as shares, with the fallback reasons of a policy's row
    (``policy 91%, pid 9% (out of distribution 9%)``) and the share of them whose KV ratio the
    lending guard raised; ``-`` for a controller deciding alone, unguarded."""
    sources = r.get("decision_sources") or {}
    total = sum(sources.values())
    hits = r.get("lend_guard_hits") or 0
    if (len(sources) < 2 and not hits) or not total:
        return "-"
    text = ", ".join(f"{s} {n / total:.0%}" for s, n in sorted(sources.items(),
                                                                key=lambda kv: -kv[1]))
    reasons = r.get("fallback_reasons") or {}
    if reasons:
        text += " (" + ", ".join(f"{k} {n / total:.0%}" for k, n in reasons.items()) + ")"
    if hits:
        text += f"; the lending floor {hits / total:.0%}"
    return text


def _setting(d: dict) -> str:
    k = d["knobs"]
    text = (f"{k['batch_window_ms']:g} ms, {k['prefill_chunk_tokens']:,}, "
            f"{k['kv_cache_ratio']:g}")
    if k.get("batch_share", 1.0) != 1.0:
        text += f", share {k['batch_share']:g}"
    return text + f", {d['admission']}@{k['admission_slack']:g}"


def _capacity_note(c: dict) -> str:
    notes = []
    for tag in ("99", "90"):
        if f"setting_{tag}" in c:
            notes.append(f"@{tag}%: {_setting(c[f'setting_{tag}'])}")
    if "search_capacity_99" in c:
        notes.append(f"the search alone x{c['search_capacity_99']:.3g} / "
                     f"x{c['search_capacity_90']:.3g}; the bound is the best run at each load")
    return "; ".join(notes) or "-"


def fixed_settings_table(fixed: dict) -> str:
    """Best static's and hindsight static's capacity searches: per trace and figure, the
    setting chosen, the top settings, and how many candidates were proven below them."""
    if not any(fixed.values()):
        return ""
    lines = ["Fixed settings by capacity: best static on the train split (deployable), hindsight "
             "static on the evaluated window (not deployable); each figure its own search",
             "", "| trace | search | chosen | capacity | top settings (capacity, attainment "
             "there) | measured / proven below (their bound) |", "|---|---|---|---|---|---|"]
    for trace, found in fixed.items():
        for key, f in found.items():
            top = "; ".join(f"{_setting(e)}: x{e['capacity']:.3g} "
                            f"({e['attainment_at_capacity']:.2%})" for e in f["top"])
            rest = (f"{f['measured']} / {f['proven_below']}"
                    + (f" (< x{f['highest_bound_of_the_rest']:.3g})"
                       if f["highest_bound_of_the_rest"] is not None else ""))
            lines.append(f"| {trace} | {key.replace('_', ' ')} ({f['split']}) | "
                         f"{_setting(f['best'])} | x{f['best']['capacity']:.3g} | {top} | "
                         f"{rest} |")
    lines += ["", f"Ties: {next(iter(next(iter(fixed.values())).values()))['tie_rule']}."]
    return "\n".join(lines)


def _judged(cell: dict | None) -> str:
    if cell is None:
        return "-"
    if cell["pass"] is None:
        return f"({cell['verdict']})" if cell["text"] == "-" else (
            f"{cell['text']} ({cell['verdict']})")
    mark, _, why = cell["verdict"].partition(": ")
    return f"{cell['text']} **{'pass' if cell['pass'] else 'FAIL'}**" + (f": {why}" if why
                                                                         else "")


def _beside(cell: dict | None) -> str:
    if cell is None:
        return "-"
    return cell["text"] if cell["value"] is not None else f"({cell['verdict']})"


def scorecard_table(card: dict) -> str:
    """The scorecard (:mod:`agents.scorecard`) as markdown: one row per trace, target and load;
    best static and the oracle (an upper bound) beside every controller, whose cell says pass or
    FAIL against the target's bar (or why it is not judged); then the notes, what was not
    measured, and each controller's count of passes."""
    table = card["table"]
    names = list(dict.fromkeys(c for g in table for c in g["controllers"]))
    head = ["trace", "target", "load", "bar", "best static", "hindsight static", ORACLE_LABEL,
            *(short_name(c) for c in names)]
    lines = ["Scorecard: every controller beside best static (deployable), hindsight static (the "
             "best fixed setting on the window itself) and the oracle (an upper bound), against "
             "the project's targets (docs/scorecard.md says why each is set where it is)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g in table:
        cells = " | ".join(_judged(g["controllers"].get(c)) for c in names)
        lines.append(f"| {g['trace']} | {g['title']} | {g['load'] or '-'} | {g['bar']} | "
                     f"{_beside(g['best_static'])} | {_beside(g.get('hindsight'))} | "
                     f"{_beside(g['oracle'])} | {cells} |")
    notes = [f"- {g['trace']}, {g['title']}{', ' + g['load'] if g['load'] else ''}: "
             f"{g['note']}" for g in table if g["note"]]
    notes += [f"- not measured: {why}" for why in card["not_measured"]]
    notes += [f"- {short_name(c)}: {s['pass']} pass, {s['fail']} fail, {s['not judged']} not "
              "judged" for c, s in card["summary"].items()]
    return "\n".join(lines + ([""] + notes if notes else []))


def write_json(result: dict, path: Path) -> Path:
    """The arena's result without the per-interval timelines (they go to the plots); every
    entry that names a controller gets its table ``label`` ("oracle (upper bound)")."""
    for r in result["rows"]:
        r.pop("timeline", None)
    for key in ("rows", "capacity", "past_capacity"):
        for r in result.get(key, ()):
            r["label"] = short_name(r["controller"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def _at_own_load(r: dict) -> bool:
    """Whether a row is at one of the arena's rate scales (not the static match's, not past
    capacity's, not a neighbouring load's)."""
    return (not r.get("matched_static") and "past_capacity_multiple" not in r
            and "neighbour_of" not in r)


def plot(rows: Sequence[dict], out_dir: Path, frontier: Sequence[dict] = ()) -> list[Path]:
    """Attainment against load per trace (the neighbouring loads as dots beside each line);
    knobs, queue and attainment over time for one window; the Pareto plot of interactive
    attainment against mean KV GiB per trace (one panel per rate scale of the arena's own rows):
    the static frontier as a line, each controller as a point, the oracle's marked as an upper
    bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for trace in sorted({r["trace"] for r in rows}):
        sub = [r for r in rows if r["trace"] == trace]
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for name in dict.fromkeys(r["controller"] for r in sub):
            mine = [r for r in sub if r["controller"] == name]
            pts = sorted((r["rate_scale"], r["slo_attainment"]) for r in mine
                         if "neighbour_of" not in r)
            (line,) = ax.plot([p[0] for p in pts], [p[1] * 100 for p in pts], marker="o",
                              label=short_name(name), ls="--" if is_upper_bound(name) else "-")
            near = [(r["rate_scale"], r["slo_attainment"]) for r in mine if "neighbour_of" in r]
            if near:  # the neighbouring loads the never-worse figure averages over, as dots
                ax.scatter([p[0] for p in near], [p[1] * 100 for p in near], s=6,
                           color=line.get_color(), alpha=0.5)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rate scale (x trace rate)")
        ax.set_ylabel("SLO attainment (%)")
        ax.set_title(f"SLO attainment against load: {trace}")
        ax.axhline(99, color="grey", lw=0.6, ls="--")
        ax.axhline(90, color="grey", lw=0.6, ls=":")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        p = out_dir / f"attainment_vs_load_{trace}.png"
        fig.tight_layout()
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
        paths.append(_pareto(plt, rows, [f for f in frontier if f["trace"] == trace], trace,
                             out_dir))

        # one window over time: the median rate scale of the rows that kept their timeline
        scales = sorted({r["rate_scale"] for r in sub if "timeline" in r})
        if not scales:
            continue
        scale = scales[len(scales) // 2]
        ts = [r for r in sub if r["rate_scale"] == scale and "timeline" in r]
        keys = [(k.name, f"{k.name} ({k.unit})", k.scale == "log") for k in KNOB_SPECS]
        keys += [("waiting", "waiting requests", False),
                 ("slo_attainment", "interval SLO attainment", False)]
        fig, axes = plt.subplots(len(keys), 1, figsize=(8, 2 * len(keys)), sharex=True)
        for r in ts:
            t = r["timeline"]
            for ax, (k, label, _) in zip(axes, keys):
                ax.plot(t["t"], t[k], lw=0.8, label=short_name(r["controller"]))
                ax.set_ylabel(label, fontsize=8)
        for ax, (k, _, log) in zip(axes, keys):
            if log:
                ax.set_yscale("log", base=2)
            elif k == "waiting":
                ax.set_yscale("symlog")
        axes[0].legend(fontsize=7, ncol=3)
        axes[-1].set_xlabel("simulated time (s)")
        fig.suptitle(f"{trace} at rate x{scale:g}: knobs, queue and attainment over time")
        fig.tight_layout()
        p = out_dir / f"timeline_{trace}_x{scale:g}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
"""a controller's marker in the Pareto plot (the oracle's is a star)"""


def _pareto(plt, rows: Sequence[dict], frontier: Sequence[dict], trace: str,
            out_dir: Path) -> Path:
    own = [r for r in rows if r["trace"] == trace and _at_own_load(r)]
    scales = sorted({r["rate_scale"] for r in own})
    fig, axes = plt.subplots(1, len(scales), figsize=(5.2 * len(scales), 4.4), squeeze=False)
    for ax, scale in zip(axes[0], scales):
        line = sorted((f["mean_kv_gib"], f["interactive_attainment"] * 100, f[RATIO_KNOB])
                      for f in frontier if f["rate_scale"] == scale)
        if line:
            ax.plot([p[0] for p in line], [p[1] for p in line], color="black", lw=1.2,
                    marker=".", label="static frontier (best static per KV ratio)")
            for x, y, ratio in line:
                ax.annotate(f"{ratio:g}", (x, y), fontsize=7, textcoords="offset points",
                            xytext=(3, -9))
        at = [r for r in own if r["rate_scale"] == scale]
        for r, marker in zip(at, itertools.cycle(_MARKERS)):
            ub = is_upper_bound(r["controller"])
            # the oracle's star is hollow, so a controller at the same point still shows
            ax.plot(r["mean_kv_gib"], r["interactive_attainment"] * 100, ls="none",
                    marker="*" if ub else marker, markersize=15 if ub else 7, alpha=0.8,
                    markerfacecolor="none" if ub else None, label=short_name(r["controller"]))
        ax.set_xlabel("mean KV cache reserved (GiB)")
        ax.set_ylabel("interactive SLO attainment (%)")
        ax.set_title(f"x{scale:g}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{trace}: interactive attainment against KV memory (up and left is better)")
    fig.tight_layout()
    p = out_dir / f"pareto_{trace}.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
