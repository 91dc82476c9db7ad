"""The lending guard: a policy's KV ratio is held at a floor while the serving pool is nearly
full, on every path a decision takes (embedded, REST one by one and in a batch), and it travels
in the policy's metadata from the install command to the runtime."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from runtime.decider.breaker import CircuitBreaker
from runtime.decider.decision import BAD_SIGNATURE
from runtime.decider.lend_guard import LEND_GUARD_KEY, RATIO_INDEX, LendGuard
from runtime.knobs import DEFAULT_KNOBS, Knobs, action_to_knobs, knobs_to_action
from tests.conftest import observation

GUARD = LendGuard.of(0.9, 0.95)
LENDING = (0.0, 0.0, -1.0, 0.0, 0.0)
"""a policy that always asks for the smallest pool (ratio 0.40)"""


def test_the_floor_holds_only_above_the_threshold_and_only_raises_the_ratio():
    low = knobs_to_action(dataclasses.replace(DEFAULT_KNOBS, kv_cache_ratio=0.5))
    high = knobs_to_action(dataclasses.replace(DEFAULT_KNOBS, kv_cache_ratio=0.95))
    floored = GUARD.floor(low, 0.95)
    assert floored is not None and action_to_knobs(floored).kv_cache_ratio == pytest.approx(0.95)
    assert [x for i, x in enumerate(floored) if i != RATIO_INDEX] == [
        x for i, x in enumerate(low) if i != RATIO_INDEX]
    assert GUARD.floor(low, 0.9) is None  # at the threshold: not above it
    assert GUARD.floor(high, 1.0) is None  # already at the floor


@pytest.mark.parametrize("text, message", [
    ("0.9", "UTILIZATION:RATIO"), ("a:0.9", "UTILIZATION:RATIO"),
    ("0.9:0.9:1:2", "UTILIZATION:RATIO[:HOLD]"), ("0.9:0.9:1.5", "UTILIZATION:RATIO[:HOLD]"),
    ("0.9:0.95:-1", "preemption_hold must be a whole number"),
    ("1.0:0.95", "kv_utilization must be in (0, 1)"), ("0:0.95", "kv_utilization"),
    ("nan:0.95", "kv_utilization"), ("0.9:0.2", "kv_cache_ratio must be in [0.4, 0.95]"),
    ("0.9:1.5", "kv_cache_ratio"),
])
def test_a_bad_flag_is_refused_naming_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        LendGuard.parse_flag(text)


@pytest.mark.parametrize("text", ['{"kv_utilization": 0.9}', "[0.9, 0.95]", "not json",
                                  '{"kv_utilization": true, "kv_cache_ratio": 0.95}',
                                  '{"kv_utilization": 0.9, "kv_cache_ratio": 0.95, "x": 1}',
                                  '{"kv_utilization": 0.9, "kv_cache_ratio": 0.95, '
                                  '"preemption_hold": 2.5}',
                                  '{"kv_utilization": 0.9, "kv_cache_ratio": 0.95, '
                                  '"preemption_hold": Infinity}'])
def test_malformed_metadata_is_refused(text):
    with pytest.raises(ValueError, match=LEND_GUARD_KEY):
        LendGuard.from_metadata(text)


def test_the_metadata_reads_back_as_the_same_guard():
    assert LendGuard.from_metadata(GUARD.metadata()) == GUARD == LendGuard.parse_flag("0.9:0.95")
    held = LendGuard.parse_flag("0.9:0.95:30")
    assert held.preemption_hold == 30 and LendGuard.from_metadata(held.metadata()) == held
    assert held.flag() == "0.9:0.95:30" and GUARD.flag() == "0.9:0.95"
    assert "preemption_hold" not in GUARD.metadata()  # an older runtime reads it as before


# --- on the decider's paths (the policies are exported from torch MLPs) ----------------------

def guarded_policy(action=LENDING, guard: str | None = GUARD.metadata()):
    pytest.importorskip("torch")
    import torch

    from runtime.decider.onnx_policy import OnnxPolicy
    from tests.policy_factory import export_policy_bytes, make_mlp

    mlp = make_mlp()
    with torch.no_grad():
        mlp[-1].weight.zero_()
        mlp[-1].bias.copy_(torch.tensor(action))
    metadata = {LEND_GUARD_KEY: guard} if guard is not None else None
    return OnnxPolicy(export_policy_bytes(mlp, policy_version="lend", metadata=metadata))


def decider(policy):
    from runtime.decider.guard import GuardedDecider

    return GuardedDecider(policy, breaker=CircuitBreaker(trip_after=0), max_step=2.0)


def test_under_pressure_the_pool_goes_back_to_the_floor_and_the_policy_still_decides():
    d = decider(guarded_policy())
    calm = d.decide(observation(kv_utilization=0.5))
    full = d.decide(observation(kv_utilization=0.97))
    assert calm.source == full.source == "policy"
    assert calm.knobs.kv_cache_ratio == pytest.approx(0.40)  # the policy lends as it chose
    assert full.knobs.kv_cache_ratio == pytest.approx(0.95)
    assert dataclasses.replace(full.knobs, kv_cache_ratio=0.4) == calm.knobs  # the rest: its own
    assert d.lend_guard_hits == 1 and d.describe()["lend_guard_hits"] == 1
    # without the metadata the same weights lend at any pressure
    bare = decider(guarded_policy(guard=None)).decide(observation(kv_utilization=0.97))
    assert bare.knobs.kv_cache_ratio == pytest.approx(0.40)


def test_the_floor_is_not_slew_limited_but_the_policys_own_move_is():
    from runtime.decider.guard import GuardedDecider

    d = GuardedDecider(guarded_policy(), breaker=CircuitBreaker(trip_after=0), max_step=0.1)
    now = Knobs(5.0, 2048, 0.5)
    full = d.decide(observation(now, kv_utilization=0.97)).knobs
    assert full.kv_cache_ratio == pytest.approx(0.95)  # 0.5 -> 0.95 in one decision
    assert full.prefill_chunk_tokens != now.prefill_chunk_tokens
    # the chunk moved by the slew limit, 0.1 action units (up to its rounding to a token)
    assert abs(knobs_to_action(full)[1] - knobs_to_action(now)[1]) == pytest.approx(0.1,
                                                                                   abs=1e-3)


def test_a_batch_is_guarded_row_by_row_as_one_decision_is():
    rows = np.stack([observation(kv_utilization=u) for u in (0.2, 0.91, 0.9, 1.0)])
    batch = decider(guarded_policy()).decide_batch(rows)
    one = decider(guarded_policy())
    assert [b.knobs for b in batch] == [one.decide(r, client=True).knobs for r in rows]
    assert [round(b.knobs.kv_cache_ratio, 3) for b in batch] == [0.4, 0.95, 0.4, 0.95]


HELD = LendGuard.of(0.9, 0.95, preemption_hold=3)


def test_a_hold_keeps_the_floor_after_lending_preempted_and_doubles_when_it_does_again():
    from runtime.decider.lend_guard import LendLatch

    lent = Knobs(5.0, 2048, 0.5)
    preempted = observation(lent, preemptions=2.0)
    calm = observation(lent)
    served = observation(Knobs(5.0, 2048, 0.95), preemptions=2.0)  # at the floor: not lending
    latch = LendLatch(HELD)
    assert not latch.observe(calm) and not latch.observe(served)
    assert [latch.observe(preempted)] + [latch.observe(calm) for _ in range(3)] == [
        True, True, True, False]  # three intervals from the one that preempted
    assert latch.trips == 1
    # lending preempted again: a hold of six intervals; still preempting when it ends, a third
    # of twelve starts at once
    assert [latch.observe(preempted) for _ in range(6)] == [True] * 6
    assert latch.trips == 2 and latch.left == 0
    assert latch.observe(calm) is False  # a calm interval ends nothing and starts nothing
    assert latch.observe(preempted) and latch.trips == 3 and latch.left == 11
    latch.reset()
    assert latch.trips == 0 and not latch.observe(calm)
    # without a hold the guard never holds
    assert not LendLatch(GUARD).observe(preempted) and not GUARD.lent_and_preempted(preempted)


def test_the_hold_runs_in_the_embedded_runtime_and_a_client_is_judged_alone():
    d = decider(guarded_policy(guard=HELD.metadata()))
    lent = Knobs(5.0, 2048, 0.4)
    ratios = [d.decide(observation(lent, kv_utilization=0.5,
                                   preemptions=p)).knobs.kv_cache_ratio
              for p in (0.0, 1.0, 0.0, 0.0, 0.0)]
    assert [round(r, 2) for r in ratios] == [0.4, 0.95, 0.95, 0.95, 0.4]
    described = d.describe()["lend_latch"]
    assert described == {"preemption_hold": 3, "trips": 1, "holding_intervals": 0}
    assert d.lend_guard_hits == 3
    # a client's observation: only one that shows preemptions under the floor gets it, and a
    # batch agrees with the single route row by row
    client = decider(guarded_policy(guard=HELD.metadata()))
    rows = np.stack([observation(lent, preemptions=p) for p in (1.0, 0.0, 0.0)])
    one = [client.decide(r, client=True).knobs.kv_cache_ratio for r in rows]
    assert [round(r, 2) for r in one] == [0.95, 0.4, 0.4]
    assert [b.knobs for b in client.decide_batch(rows)] == [
        client.decide(r, client=True).knobs for r in rows]
    assert client.describe()["lend_latch"]["trips"] == 0  # clients never feed it


def test_a_policy_with_malformed_guard_metadata_is_refused_and_the_pid_decides():
    from runtime.decider.onnx_policy import PolicyLoadError

    with pytest.raises(PolicyLoadError) as e:
        guarded_policy(guard='{"kv_utilization": 2, "kv_cache_ratio": 0.95}')
    assert e.value.reason == BAD_SIGNATURE and "kv_utilization" in str(e.value)


def test_install_stamps_the_guard_in_the_installed_copy_only(tmp_path: Path):
    pytest.importorskip("onnx")
    from agents.install_policy import main as install_main
    from runtime.decider.onnx_policy import OnnxPolicy

    fixtures = Path(__file__).resolve().parent / "fixtures"
    run = tmp_path / "run"
    run.mkdir()
    (run / "policy.onnx").write_bytes((fixtures / "policy-test-1.onnx").read_bytes())
    (run / "card.md").write_text("# card\n")
    folder = tmp_path / "shipped"
    assert install_main(["--run", str(run), "--workload", "mixed", "--folder", str(folder),
                         "--lend-guard", "0.9:0.95"]) == 0
    installed = OnnxPolicy.load(folder / "policy-mixed.onnx")
    assert installed.lend_guard == GUARD
    assert json.loads(installed.metadata[LEND_GUARD_KEY]) == {"kv_utilization": 0.9,
                                                              "kv_cache_ratio": 0.95}
    assert OnnxPolicy.load(run / "policy.onnx").lend_guard is None
    assert "--lend-guard 0.9:0.95" in (folder / "card-mixed.md").read_text()


def test_rest_floors_a_preempting_observation_and_shows_the_holds(tmp_path: Path):
    pytest.importorskip("torch")
    import torch
    from fastapi.testclient import TestClient

    from runtime.api.settings import Settings
    from runtime.server import create_app
    from tests.conftest import raw_fields
    from tests.policy_factory import make_mlp, write_policy

    mlp = make_mlp()
    with torch.no_grad():
        mlp[-1].weight.zero_()
        mlp[-1].bias.copy_(torch.tensor(LENDING))
    path = write_policy(tmp_path / "policy.onnx", mlp, policy_version="held",
                        metadata={LEND_GUARD_KEY: HELD.metadata()})
    client = TestClient(create_app(Settings(policy_dir=str(tmp_path),
                                            policy_file=path.name)))
    lent = Knobs(5.0, 2048, 0.4)
    r = client.post("/v1/decide", json=raw_fields(lent, preemptions=3.0))
    assert r.status_code == 200, r.text
    assert r.json()["knobs"]["kv_cache_ratio"] == pytest.approx(0.95)
    calm = client.post("/v1/decide", json=raw_fields(lent)).json()
    assert calm["knobs"]["kv_cache_ratio"] == pytest.approx(0.40)  # judged alone: no hold
    policy = client.get("/v1/policy").json()
    assert policy["lend_latch"] == {"preemption_hold": 3, "trips": 0, "holding_intervals": 0}
    assert policy["lend_guard_hits"] == 1
    metrics = client.get("/metrics").text
    assert "batchpilot_lend_hold_trips 0.0" in metrics
    assert "batchpilot_lend_holding 0.0" in metrics


def test_the_arenas_decided_by_column_gives_the_floors_share():
    from agents.report import decided_by

    assert decided_by({"decision_sources": {"policy": 200}, "lend_guard_hits": 50}) == (
        "policy 100%; the lending floor 25%")
    assert decided_by({"decision_sources": {"policy": 200}, "lend_guard_hits": 0}) == "-"
    assert decided_by({"decision_sources": {"static": 10}}) == "-"
