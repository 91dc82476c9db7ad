"""The out-of-distribution guard: a policy whose metadata says where it was trained hands control
to the PID once the live observations leave that, in the embedded runtime after a few intervals
and for a client at once; it shows in /readyz, /v1/policy, the metrics and the arena's rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from runtime.decider.breaker import CircuitBreaker
from runtime.decider.decision import BAD_SIGNATURE, OUT_OF_DISTRIBUTION
from runtime.decider.guard import GuardedDecider
from runtime.decider.ood_guard import (
    CHECKED,
    MIN_SAMPLES,
    OOD_KEY,
    ObservationDistribution,
    OodGuard,
)
from runtime.observation import OBSERVATION_INDEX
from tests.conftest import observation, raw_fields

PROMPT = OBSERVATION_INDEX["prompt_tokens_mean"]
SHIPPED_SET = Path(__file__).resolve().parents[1] / "checkpoints" / "shipped" / "policies.json"


def trained_on(n: int = 2000, seed: int = 0) -> np.ndarray:
    """Observations of a 'training' set: moderate load, prompts of 500-2,000 tokens."""
    rng = np.random.default_rng(seed)
    rows = [observation(prompt_tokens_mean=float(rng.uniform(500, 2000)),
                        arrival_rate_rps=float(rng.uniform(2, 8))) for _ in range(n)]
    return np.stack(rows)


DIST = ObservationDistribution.measure(trained_on())
INSIDE = observation(prompt_tokens_mean=1200.0, arrival_rate_rps=5.0)
LONG = observation(prompt_tokens_mean=16000.0, arrival_rate_rps=5.0)
"""a long-prompt interval: prompts eight times the longest the policy saw"""


def test_the_distribution_is_each_fields_training_range_widened_and_survives_its_metadata():
    lo, hi = DIST.low[CHECKED.index("prompt_tokens_mean")], DIST.high[
        CHECKED.index("prompt_tokens_mean")]
    x = trained_on()[:, PROMPT]
    assert lo < x.min() and hi > x.max() and hi - lo < 0.2  # the range, not the whole axis
    assert DIST.outside(INSIDE) is None
    assert CHECKED[DIST.outside(LONG)] == "prompt_tokens_mean"
    assert ObservationDistribution.from_metadata(DIST.metadata()) == DIST
    with pytest.raises(ValueError, match=str(MIN_SAMPLES)):
        ObservationDistribution.measure(trained_on(10))
    with pytest.raises(ValueError, match=OOD_KEY):
        ObservationDistribution.from_metadata('{"version": 1, "fields": {"nope": [0, 1]}}')


def test_only_the_traffic_is_judged_not_the_state_the_controllers_own_decisions_made():
    # queues, KV use and latencies far past anything in training (a long window held past
    # capacity builds them) are the policy's doing, not traffic it never saw
    busy = observation(prompt_tokens_mean=1200.0, arrival_rate_rps=5.0,
                       waiting_requests=50_000.0, waiting_prompt_tokens=5e7,
                       kv_utilization=1.0, ttft_p99_ratio=400.0, preemptions=900.0)
    assert DIST.outside(busy) is None
    assert "cotenant_demand_fraction" in CHECKED and "waiting_requests" not in CHECKED
    # and a co-tenant's demand the policy never met is traffic it never saw
    lent = observation(prompt_tokens_mean=1200.0, arrival_rate_rps=5.0,
                       cotenant_demand_fraction=0.5)
    assert CHECKED[DIST.outside(lent)] == "cotenant_demand_fraction"


def test_a_distribution_of_some_fields_judges_only_those():
    # a policy stamped without the co-tenant's demand (it met one demand in training) is not
    # handed over for a demand it never met, and still is for traffic it never saw
    some = ObservationDistribution.measure(
        trained_on(), fields=("prompt_tokens_mean", "arrival_rate_rps"))
    assert some.fields == ("arrival_rate_rps", "prompt_tokens_mean")  # in the checked order
    lent = observation(prompt_tokens_mean=1200.0, arrival_rate_rps=5.0,
                       cotenant_demand_fraction=0.5)
    assert some.outside(lent) is None and DIST.outside(lent) is not None
    assert some.fields[some.outside(LONG)] == "prompt_tokens_mean"
    assert ObservationDistribution.from_metadata(some.metadata()) == some
    with pytest.raises(ValueError, match="waiting_requests"):
        ObservationDistribution.measure(trained_on(), fields=("waiting_requests",))
    with pytest.raises(ValueError, match="none"):
        ObservationDistribution.measure(trained_on(), fields=())


def test_the_embedded_guard_waits_a_few_intervals_and_gives_control_back_after_a_calm_window():
    g = OodGuard(DIST)
    d = DIST
    allowed = [g.observe(LONG) for _ in range(d.patience)]
    assert allowed == [True] * (d.patience - 1) + [False]  # the patience-th interval out trips it
    assert g.tripped and g.num_trips == 1 and g.last_field == "prompt_tokens_mean"
    assert [g.observe(INSIDE) for _ in range(d.window - 1)] == [False] * (d.window - 1)
    assert g.observe(INSIDE) and not g.tripped  # a whole window in: back to the policy
    # one interval out in a calm stretch does not switch the policy off
    g2 = OodGuard(DIST)
    assert all(g2.observe(LONG if i % 4 == 0 else INSIDE) for i in range(40))


def test_control_given_back_is_on_probation_and_each_trip_asks_for_a_longer_calm():
    d = DIST
    g = OodGuard(d)

    def trip() -> None:
        while g.observe(LONG):
            pass

    def calm() -> int:
        """intervals in until the policy decides again"""
        n = 1
        while not g.observe(INSIDE):
            n += 1
        return n

    trip()
    holds = []
    for _ in range(6):
        holds.append(calm())
        # just given back: one interval out hands control over again at once
        assert not g.observe(LONG) and g.tripped
    assert holds == [d.window, 2 * d.window, 4 * d.window, 8 * d.window, 16 * d.window,
                     min(32 * d.window, g.max_hold)]
    assert g.num_trips == 7
    # past probation, the patience rule again; and a policy that held the traffic long enough
    # starts the back-off over
    while g.observe(INSIDE) is False:
        pass
    assert all(g.observe(INSIDE) for _ in range(g.max_hold))
    assert g.hold == d.window
    assert g.observe(LONG)  # past probation, one interval out is tolerated again
    # a reset starts over, at the first hold and off probation
    trip()
    calm()
    g.reset()
    assert not g.tripped and g.hold == d.window
    assert [g.observe(LONG) for _ in range(d.patience)][-1] is False
    assert g.observe(INSIDE) is False
    with pytest.raises(ValueError, match="backoff"):
        OodGuard(d, backoff=0)
    with pytest.raises(ValueError, match="max_hold"):
        OodGuard(d, max_hold=d.window - 1)


def test_a_burst_of_arrivals_trips_the_guard_without_a_back_off_or_a_probation():
    """A rate past the training range is a state of the traffic that passes (a flash crowd),
    not the workload's make-up: each such trip asks for one window in, and control given back
    after it tolerates an interval out as before."""
    burst = observation(prompt_tokens_mean=1200.0, arrival_rate_rps=500.0)
    d = DIST
    g = OodGuard(d)
    for _ in range(5):
        assert [g.observe(burst) for _ in range(d.patience)][-1] is False
        assert [g.observe(INSIDE) for _ in range(d.window)] == [False] * (d.window - 1) + [True]
        assert g.hold == d.window
        assert g.observe(burst)  # no probation: one interval out is tolerated
        assert all(g.observe(INSIDE) for _ in range(d.window))
    assert g.num_trips == 5


def test_an_interval_without_arrivals_is_no_evidence_on_the_prompts():
    # training that had idle intervals: an idle one (no arrival, prompt fields 0) is in range
    rng = np.random.default_rng(1)
    idle = observation(prompt_tokens_mean=0.0, arrival_rate_rps=0.0)
    trained = np.concatenate([trained_on(), np.stack([idle] * 500)])
    dist = ObservationDistribution.measure(trained)
    assert dist.outside(idle) is None
    # sparse long prompts: one interval with an arrival, then idle ones, as on a long-context
    # trace near capacity. Counted as in, the idle intervals kept the guard from handing over
    g = OodGuard(dist)
    allowed = [g.observe(LONG if i % 6 == 0 else idle) for i in range(6 * dist.patience)]
    assert g.tripped and g.num_trips == 1 and not allowed[-1]
    # nor do they give control back: only intervals with arrivals in range do
    assert not any(g.observe(idle) for _ in range(3 * dist.window))
    assert [g.observe(INSIDE) for _ in range(dist.window)][-1] and not g.tripped
    # the arrival rate an idle interval does measure: bursts far past the training rate, one
    # interval in four, with idle ones between, stay under the guard's patience
    burst = observation(prompt_tokens_mean=1200.0, arrival_rate_rps=500.0)
    g2 = OodGuard(dist)
    assert all(g2.observe(burst if i % 4 == 0 else idle) for i in range(40))
    # an idle interval is still judged on the fields that are not the prompts'
    lent = observation(prompt_tokens_mean=0.0, arrival_rate_rps=0.0,
                       cotenant_demand_fraction=0.5)
    assert CHECKED[dist.outside(lent)] == "cotenant_demand_fraction"
    # and the batch route's rows agree with the single route's, idle rows included
    rows = np.stack([idle, LONG, INSIDE, lent,
                     observation(prompt_tokens_mean=16000.0, arrival_rate_rps=0.0)]
                    + [trained[i] for i in rng.integers(0, len(trained), 20)])
    assert dist.outside_rows(rows).tolist() == [dist.outside(r) is not None for r in rows]


@pytest.fixture()
def guarded_policy(tmp_path: Path) -> Path:
    pytest.importorskip("torch")
    from tests.policy_factory import make_mlp, write_policy

    return write_policy(tmp_path / "policy.onnx", make_mlp(seed=0), policy_version="ood-test",
                        metadata={OOD_KEY: DIST.metadata()})


def test_the_decider_hands_over_with_the_reason_and_a_client_is_judged_alone(guarded_policy):
    d = GuardedDecider(guarded_policy, breaker=CircuitBreaker(trip_after=0))
    assert d.decide(INSIDE).source == "policy"
    sources = [d.decide(LONG) for _ in range(8)]
    assert [x.source for x in sources[:DIST.patience - 1]] == ["policy"] * (DIST.patience - 1)
    assert all(x.source == "pid" and x.reason == OUT_OF_DISTRIBUTION
               for x in sources[DIST.patience - 1:])
    assert d.describe()["ood_guard"]["tripped"]
    fresh = GuardedDecider(guarded_policy, breaker=CircuitBreaker(trip_after=0))
    one = fresh.decide(LONG, client=True)
    assert (one.source, one.reason) == ("pid", OUT_OF_DISTRIBUTION)
    assert fresh.decide(INSIDE, client=True).source == "policy"  # no history kept for clients
    batch = fresh.decide_batch(np.stack([INSIDE, LONG, INSIDE]))
    assert [x.source for x in batch] == ["policy", "pid", "policy"]
    assert batch[1].reason == OUT_OF_DISTRIBUTION
    off = GuardedDecider(guarded_policy, breaker=CircuitBreaker(trip_after=0), ood_guard=False)
    assert all(off.decide(LONG).source == "policy" for _ in range(8))
    assert off.describe()["ood_guard"] is None


def test_a_malformed_distribution_refuses_the_policy(tmp_path: Path):
    pytest.importorskip("torch")
    from tests.policy_factory import make_mlp, write_policy

    bad = write_policy(tmp_path / "bad.onnx", make_mlp(seed=0),
                       metadata={OOD_KEY: '{"version": 1, "fields": {}}'})
    d = GuardedDecider(bad)
    assert d.policy is None and d.missing_reason == BAD_SIGNATURE
    assert OOD_KEY in d.last_error


def test_rest_shows_the_guard_in_readyz_policy_and_metrics(guarded_policy):
    from runtime.api.settings import Settings
    from runtime.server import create_app

    settings = Settings(policy_dir=str(guarded_policy.parent), policy_file=guarded_policy.name)
    client = TestClient(create_app(settings))
    long_fields = raw_fields(prompt_tokens_mean=16000.0, arrival_rate_rps=5.0)
    for _ in range(3):
        r = client.post("/v1/decide", json=long_fields)
        assert r.status_code == 200, r.text
        assert (r.json()["source"], r.json()["reason"]) == ("pid", OUT_OF_DISTRIBUTION)
    ready = client.get("/readyz").json()
    assert (ready["source"], ready["reason"]) == ("pid", OUT_OF_DISTRIBUTION)
    guard = client.get("/v1/policy").json()["ood_guard"]
    assert guard["client_out"] == 3 and guard["last_field"] == "prompt_tokens_mean"
    assert set(guard["fields"]) == set(CHECKED)
    metrics = client.get("/metrics").text
    assert 'batchpilot_fallbacks_total{reason="out of distribution"} 3.0' in metrics
    assert "batchpilot_ood_client_out 3.0" in metrics


@pytest.mark.training_stack
def test_the_arenas_row_says_who_decided_and_why_on_traffic_the_policy_never_saw(tmp_path):
    """A policy trained on a short-prompt window, replayed on a long-prompt one: the row counts
    the intervals the PID decided for being out of distribution; without the guard, none."""
    pytest.importorskip("torch")
    from agents.arena import controller_row
    from agents.policy_controller import PolicyController
    from agents.registry import EvalSpec
    from env.traces.lengths import LogNormalLengths
    from env.traces.plain_csv import write_plain_csv
    from env.traces.synthetic import poisson
    from tests.policy_factory import make_mlp, write_policy

    short = poisson(4.0, 120.0, seed=0)
    long_ = poisson(1.0, 60.0, seed=1, prompt=LogNormalLengths(mean=9000.0, p99=15000.0,
                                                                max_tokens=16000))
    csv = write_plain_csv(long_, tmp_path / "long.csv")
    from env.replay import replay
    from runtime.decider.controller import StaticController
    from runtime.knobs import DEFAULT_KNOBS

    seen: list[np.ndarray] = []
    from runtime.observation import FeatureBuilder

    fb = FeatureBuilder()
    replay(short, decider=StaticController(DEFAULT_KNOBS), history=0,
           on_interval=lambda rec: seen.append(fb.observe(rec.stats, rec.knobs)))
    dist = ObservationDistribution.measure(np.concatenate([np.stack(seen)] * 3))
    path = write_policy(tmp_path / "policy.onnx", make_mlp(seed=0),
                        metadata={OOD_KEY: dist.metadata()})
    spec = EvalSpec(str(csv), "all")
    guarded = controller_row(spec, "policy", PolicyController(path), 1.0, False)
    assert guarded["fallback_reasons"].get(OUT_OF_DISTRIBUTION, 0) > 0
    assert guarded["decision_sources"].get("pid", 0) >= guarded["fallback_reasons"][
        OUT_OF_DISTRIBUTION]
    bare = controller_row(spec, "policy", PolicyController(path, ood_guard=False), 1.0, False)
    assert OUT_OF_DISTRIBUTION not in bare["fallback_reasons"]


@pytest.mark.training_stack
def test_install_stamps_the_distribution_a_policy_meets_on_its_training_windows(tmp_path):
    """A policy exported without its distribution gets one from its own replays of its
    training trace's windows; the run's own file is left as it was."""
    import shutil

    from agents.install_policy import main as install_main
    from env.traces.plain_csv import write_plain_csv
    from env.traces.synthetic import poisson
    from tests.conftest import FIXTURES

    t = poisson(2.0, 300.0, seed=3)
    trace = write_plain_csv(t, tmp_path / "mine.csv")
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(FIXTURES / "policy-test-1.onnx", run / "policy.onnx")
    (run / "card.md").write_text("# card\n")
    before = (run / "policy.onnx").read_bytes()
    folder = tmp_path / "set"
    # a field the guard does not check is refused before any replay, and nothing is written
    assert install_main(["--run", str(run), "--workload", "mine", "--folder", str(folder),
                         "--stamp-distribution", f"{trace}@0.5-1",
                         "--guard-fields", "waiting_requests"]) == 2
    assert not (folder / "policy-mine.onnx").exists()
    assert install_main(["--run", str(run), "--workload", "mine", "--folder", str(folder),
                         "--stamp-distribution", f"{trace}@0.5-1", "--guard-fields",
                         "prompt_tokens_mean", "arrival_rate_rps"]) == 0
    assert (run / "policy.onnx").read_bytes() == before
    d = GuardedDecider(folder / "policy-mine.onnx")
    guard = d.policy.ood_guard
    assert guard is not None and guard.distribution.samples >= MIN_SAMPLES
    assert guard.distribution.fields == ("arrival_rate_rps", "prompt_tokens_mean")
    # what the policy saw: two requests a second, prompts of the conversation trace's lengths
    assert guard.distribution.outside(LONG) is not None
    # the card says how it was installed
    card = (folder / "card-mine.md").read_text()
    assert f"replays of `{trace}@0.5-1`'s training windows" in card
    assert "--guard-fields arrival_rate_rps prompt_tokens_mean" in card


def test_the_arenas_policy_hands_over_to_the_deployments_static_knobs(guarded_policy):
    """Under shed at slack 0.5 the PID the arena's policy hands over to holds the slack at 0.5,
    as the arena's own ``pid`` and ``static`` rows do (it held the static default's 1)."""
    from agents.registry import EvalSpec, make_controller
    from runtime.engine.engine import EngineConfig

    spec = EvalSpec("synthetic", config=EngineConfig(admission="shed", admission_slack=0.5))
    policy = make_controller(f"policy:{guarded_policy}", spec)
    for _ in range(DIST.patience):
        decision = policy.decide(LONG)
    assert decision.source == "pid"
    assert decision.knobs.admission_slack == make_controller("pid", spec).decide(
        LONG).knobs.admission_slack == 0.5


@pytest.mark.training_stack
def test_the_shipped_set_is_level_with_its_fallback_between_mooncakes_long_prompts(tmp_path):
    """Mooncake's long-context trace near the PID's capacity at 90% (x0.092, the shipped
    deployment): the guard keeps the PID in control between the long prompts, and the set
    attains at least what the PID alone does. Under the plain give-back rule the policy got
    control back four times there (238 intervals), raised the chunk and lent memory while the
    next long prompts arrived, and the set was a bisection step under the PID."""
    import json

    from agents.evaluate import main
    from env.traces.locations import mooncake_trace_path

    try:
        mooncake_trace_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    out = tmp_path / "arena"
    assert main(["--trace", "mooncake", "--split", "all", "--controllers",
                 f"pid,policy:{SHIPPED_SET}", "--rate-scales", "0.092",
                 "--admission", "shed", "--admission-slack", "0.5", "--cotenant",
                 "--no-capacity", "--past-capacity", "", "--scorecard-loads", "",
                 "--frontier-ratios", "", "--slo", "long-context", "--model", "llama3.1-8b",
                 "--accelerator", "h100", "--memory-gib", "40", "--json",
                 "--out", str(out)]) == 0
    rows = {r["controller"].split(":")[0]: r
            for r in json.loads((out / "results.json").read_text())["rows"]}
    pid, policy = rows["pid"], rows["policy"]
    assert policy["decision_sources"].get("policy", 0) <= 0.005 * sum(
        policy["decision_sources"].values())
    assert policy["interactive_attainment"] >= pid["interactive_attainment"] - 1e-9
