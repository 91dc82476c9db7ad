"""Deadline-aware admission: what the engine does with an interactive request whose first token
can no longer come in time.

Under first come, first served an overloaded engine spends the accelerator on requests that have
already missed, so everything behind them misses too and goodput collapses past capacity. A
request is *late* once it has waited ``admission_slack`` times its TTFT target without a first
token (slack 1: its miss is certain; below 1: it is dropped or moved before the miss is certain,
leaving its successors more room; above 1: stragglers get a grace period). Then:

==============  ==============================================================================
policy          what happens to a late request
==============  ==============================================================================
``fcfs``        nothing: it keeps its place (the engine as vLLM runs it; the collapse above)
``shed``        a waiting one is rejected with reason ``shed`` (a miss; to a client, HTTP 429
                with Retry-After), and so is a running one still prefilling once its TTFT
                target has passed (its KV blocks go back to the pool)
``late_to_back`` a waiting one moves to a late queue served only when no on-time interactive
                request waits: nothing is dropped, and it still finishes (a miss)
==============  ==============================================================================

Batch requests are not judged on TTFT, so these apply to interactive ones only; a batch request
whose completion deadline passes before it is (re)admitted is rejected as ``expired`` under
every policy (it can no longer meet its SLO, and would only take room from those that can).
"""

from __future__ import annotations

import enum

from runtime.knobs import KNOB_SPEC_BY_NAME


class AdmissionPolicy(enum.StrEnum):
    FCFS = "fcfs"
    """late requests keep their place"""
    SHED = "shed"
    """late requests are rejected (reason ``shed``)"""
    LATE_TO_BACK = "late_to_back"
    """late requests wait behind on-time ones"""


_SLACK = KNOB_SPEC_BY_NAME["admission_slack"]
ADMISSION_SLACK_RANGE = (_SLACK.low, _SLACK.high)
"""the admission slack's allowed range, in TTFT targets (the ``admission_slack`` knob's)"""
