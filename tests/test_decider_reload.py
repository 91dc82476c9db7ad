"""Hot reload: atomic under concurrent decisions, and a failed reload keeps the old policy."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from runtime.decider.breaker import CircuitBreaker
from runtime.decider.guard import GuardedDecider
from runtime.decider.onnx_policy import OnnxPolicy, PolicyLoadError
from runtime.knobs import Knobs
from tests.conftest import observation


def test_reload_swaps_the_policy_and_counts_it(policy_dir):
    d = GuardedDecider(policy_dir / "policy.onnx")
    assert d.decide(observation()).policy_version == "test-1"
    new = d.reload(policy_dir / "policy-v2.onnx")
    assert new.policy_version == "test-2" and d.num_reloads == 1
    assert d.decide(observation()).policy_version == "test-2"


@pytest.mark.parametrize("content, reason", [(None, "model missing"),
                                             (b"garbage", "model corrupt")])
def test_a_failed_reload_keeps_the_old_policy(policy_dir, content, reason):
    d = GuardedDecider(policy_dir / "policy.onnx")
    bad = policy_dir / "bad.onnx"
    if content is not None:
        bad.write_bytes(content)
    with pytest.raises(PolicyLoadError) as e:
        d.reload(bad)
    assert e.value.reason == reason
    assert d.num_failed_reloads == 1 and reason in d.last_error
    decision = d.decide(observation())
    assert (decision.source, decision.policy_version) == ("policy", "test-1")


def test_a_reload_brings_a_missing_policy_in(policy_dir):
    d = GuardedDecider(policy_dir / "absent.onnx")
    assert d.decide(observation()).source == "pid"
    d.reload(policy_dir / "policy.onnx")
    assert d.decide(observation()).source == "policy"


def test_decisions_during_reloads_come_whole_from_the_old_or_the_new_policy(policy_dir):
    """Four threads decide (single and batch) while the main thread reloads back and forth;
    every decision must equal what one of the two policies gives for its observation."""
    paths = {"test-1": policy_dir / "policy.onnx", "test-2": policy_dir / "policy-v2.onnx"}
    observations = [observation(Knobs(w, c, r)) for w, c, r in
                    [(5.0, 2048, 0.9), (40.0, 512, 0.6), (150.0, 8192, 0.45), (12.0, 64, 0.95)]]
    expected = {}
    for version, path in paths.items():
        ref = GuardedDecider(OnnxPolicy.load(path), breaker=CircuitBreaker(trip_after=0))
        expected[version] = [ref.decide(o).knobs for o in observations]
    d = GuardedDecider(paths["test-1"], breaker=CircuitBreaker(trip_after=0))
    stop = threading.Event()
    failures: list[str] = []
    seen: dict[str, int] = {"test-1": 0, "test-2": 0}

    def check(i: int, decision) -> None:
        if decision.source != "policy":
            failures.append(f"obs {i}: {decision.source} ({decision.reason})")
        elif decision.knobs != expected[decision.policy_version][i]:
            failures.append(f"obs {i}: knobs {decision.knobs} are not {decision.policy_version}'s")
        else:
            seen[decision.policy_version] += 1

    def hammer(batch: bool) -> None:
        stacked = np.stack(observations)
        while not stop.is_set():
            if batch:
                out = d.decide_batch(stacked)
                if len({x.policy_version for x in out}) != 1:
                    failures.append(f"one batch saw {[x.policy_version for x in out]}")
                for i, x in enumerate(out):
                    check(i, x)
            else:
                for i, o in enumerate(observations):
                    check(i, d.decide(o))

    threads = [threading.Thread(target=hammer, args=(k == 3,)) for k in range(4)]
    for t in threads:
        t.start()
    try:
        for k in range(20):
            d.reload(paths["test-2" if k % 2 == 0 else "test-1"])
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == []
    assert d.num_reloads == 20
    assert seen["test-1"] > 0 and seen["test-2"] > 0
