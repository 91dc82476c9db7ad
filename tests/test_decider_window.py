"""The last minute's decisions by source: what /readyz and GET /v1/policy report."""

from __future__ import annotations

from runtime.decider.window import DecisionWindow


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_counts_the_last_minute_and_forgets_what_is_older():
    clock = Clock()
    w = DecisionWindow(clock=clock)
    w.record("policy", None, 30)
    clock.t += 30
    w.record("pid", "non-finite output", 10)
    w.record("static", "bad input shape; pid failed")
    assert w.summary() == {"window_s": 60, "decisions": 41,
                           "by_source": {"policy": 30, "pid": 10, "static": 1},
                           "fallback_share": 11 / 41, "source": "policy",
                           "top_reason": "non-finite output"}
    clock.t += 31  # the policy's second is now 61 s old
    s = w.summary()
    assert (s["decisions"], s["source"], s["fallback_share"]) == (11, "pid", 1.0)
    clock.t += 3600  # a bucket is reused, not appended: memory is fixed however long it runs
    w.record("policy", None)
    assert w.summary()["by_source"] == {"policy": 1, "pid": 0, "static": 0}


def test_an_empty_window_names_no_source():
    s = DecisionWindow(clock=Clock()).summary()
    assert (s["decisions"], s["source"], s["fallback_share"], s["top_reason"]) == (
        0, None, 0.0, None)
