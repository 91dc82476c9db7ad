"""Knobs a policy holds at best static's value (``train.py --free-knobs``).

The mission's rule is to measure a lever's worth with the oracle before training a policy on it.
The levers study found room past 10% in one knob only, the KV ratio, and the imitation oracle
searches that one and keeps best static's value for every other knob. A policy free to move all
five knobs must still learn from data that the other four never change, and a network learns
that only on the states it was shown: on `mixed` the clone held best static's batch share on its
training windows (error 0.0000) and opened it to 0.57 on the held-out split.

Holding a knob makes it a constant of the policy rather than something to learn. Its row of the
action head gets a zero weight and best static's action as its bias; its log standard deviation
is set to :data:`HELD_LOG_STD` (PPO explores nothing there); gradient hooks zero every update of
those rows, so neither the clone nor PPO moves them. The exported policy carries the rows as
they are, so it outputs the held values on any input.
"""

from __future__ import annotations

from collections.abc import Mapping

from runtime.knobs import KNOB_NAMES, Knobs, knobs_to_action

HELD_LOG_STD = -10.0
"""log standard deviation of a held knob's action (std 4.5e-5 action units: a sampled action
rounds to the held knob)"""


def parse_free_knobs(text: str) -> tuple[str, ...]:
    """The knob names of ``--free-knobs`` (comma-separated; empty: every knob). Raises ValueError
    naming an unknown knob."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        return KNOB_NAMES
    for n in names:
        if n not in KNOB_NAMES:
            raise ValueError(f"--free-knobs: unknown knob {n!r}; the knobs are "
                             f"{', '.join(KNOB_NAMES)}")
    return tuple(n for n in KNOB_NAMES if n in names)


def held_actions(free: tuple[str, ...], references: Mapping[str, Knobs]) -> dict[int, float]:
    """Action index -> the action value each knob not in ``free`` holds: best static's on the
    training traces (``references``, by trace). Raises ValueError when the traces' best statics
    differ on a held knob (one policy cannot hold two values)."""
    held: dict[int, float] = {}
    for i, name in enumerate(KNOB_NAMES):
        if name in free:
            continue
        values = {t: knobs_to_action(k)[i] for t, k in references.items()}
        if len(set(values.values())) > 1:
            per_trace = ", ".join(f"{t} {getattr(k, name):g}" for t, k in references.items())
            raise ValueError(f"--free-knobs holds {name} at best static's value, which differs "
                             f"across the traces ({per_trace}): train one trace at a time, or "
                             f"free {name}")
        held[i] = next(iter(values.values()))
    return held


def hold_knobs(policy, held: Mapping[int, float]) -> None:
    """Make ``policy`` (an SB3 ``ActorCriticPolicy`` with a diagonal Gaussian) output ``held``
    (action index -> value) on every input, and keep it so through any later training."""
    import torch

    if not held:
        return
    head = policy.action_net
    rows = torch.tensor(sorted(held), dtype=torch.long)
    values = torch.tensor([held[i] for i in sorted(held)], dtype=head.bias.dtype)
    keep = torch.ones(head.out_features, 1, dtype=head.weight.dtype)
    keep[rows] = 0.0
    with torch.no_grad():
        head.weight[rows] = 0.0
        head.bias[rows] = values
        policy.log_std[rows] = HELD_LOG_STD
    # every gradient of a held row is zeroed before any optimizer sees it (Adam's moments then
    # stay zero there, so the rows never move)
    head.weight.register_hook(lambda g: g * keep)
    head.bias.register_hook(lambda g: g * keep[:, 0])
    policy.log_std.register_hook(lambda g: g * keep[:, 0])
