"""The periodic evaluation of training (train.py ``--eval-every``): the windows it replays (the
busiest minutes of each trace's train split), and one controller's attainment on them, the
figure the kept model is chosen by (:class:`agents.sb3_callbacks.PeriodicEval` ranks them).

``cfg`` is train.py's ``Config``.
"""

from __future__ import annotations

import numpy as np

from env.session import RewardWeights


def periodic_eval_windows(cfg, trace_ranges: list[tuple[str, tuple]]) -> list[tuple]:
    """``(trace, trace label, rate scale, window)`` of the periodic evaluation: the
    ``eval_episode_s`` of each trace's train split that holds the most tokens (prompt and
    output), at ``eval_rate_scales`` (or the quartiles of its training range on a log scale).

    The kept model is chosen on these windows, so they come from the train split: the held-out
    (eval) split is read only by the final evaluation, whose figures would otherwise include the
    windows the model was chosen by (runs before this rule read the eval split's first
    ``eval_episode_s``). The busiest stretch, because a calm one tells models apart no better
    than a coin: the last 300 s of mixed's train split held 100% under every baseline at x2."""
    from env.traces import rate_scale, split, time_window
    from env.traces.resolve import resolve_trace, trace_label

    windows = []
    for t, (lo, hi) in trace_ranges:
        train = split(resolve_trace(t), "train")
        start = busiest_start(train, cfg.eval_episode_s)
        window = time_window(train, start, start + cfg.eval_episode_s)
        scales = cfg.eval_rate_scales or tuple(round(lo * (hi / lo) ** q, 3)
                                               for q in (0.25, 0.5, 0.75))
        for s in scales:
            windows.append((t, trace_label(t), s, rate_scale(window, s) if s != 1 else window))
    return windows


def busiest_start(trace, seconds: float) -> float:
    """The arrival time at which the ``seconds`` of ``trace`` with the most tokens (prompt and
    output) start; the first such when several tie."""
    arrival = trace.arrival_s
    tokens = np.concatenate(([0], np.cumsum(trace.prompt_tokens.astype(np.int64)
                                            + trace.output_tokens)))
    end = np.searchsorted(arrival, arrival + seconds, side="left")
    return float(arrival[int(np.argmax(tokens[end] - tokens[:-1]))])



SELECT_ON = {"all": "slo_attainment", "interactive": "interactive_attainment"}
"""--select-on: the run summary's attainment the periodic evaluation ranks models by"""


def evaluate_controller(controller, windows: list[tuple], interval_s: float, profile,
                        config=None, weights: RewardWeights | None = None,
                        attainment: str = "slo_attainment") -> dict[str, float]:
    """SLO attainment of one controller on each window, and their mean. ``controller`` is a
    controller, or a function of the trace that builds one (a baseline tuned per trace);
    ``attainment`` is the run summary's field (``slo_attainment``: every request;
    ``interactive_attainment``: the interactive classes').

    With a co-tenant in ``config`` the result also has ``score``, what the best model is chosen
    by: per window, attainment plus the reward's memory terms (``weights``: the co-tenant's value
    times the share of its demand served, less the memory price times the mean KV ratio),
    averaged; attainment alone would always choose to keep the memory."""
    from agents.arena import run_episode
    from runtime.knobs import KNOB_NAMES

    out, scores = {}, []
    ratio = KNOB_NAMES.index("kv_cache_ratio")
    for trace, label, s, window in windows:
        c = controller(trace) if callable(controller) and not hasattr(controller, "decide") \
            else controller
        ep = run_episode(window, c, interval_s=interval_s, profile=profile, config=config)
        out[f"{label}/x{s:g}"] = ep.summary[attainment]
        if weights is not None and config is not None and config.cotenant is not None:
            scores.append(ep.summary[attainment]
                          + weights.cotenant_value * ep.summary["cotenant_served_share"]
                          - weights.memory_price * ep.mean_knobs[ratio])
    out["mean"] = float(np.mean(list(out.values())))
    if scores:
        out["score"] = float(np.mean(scores))
    return out
