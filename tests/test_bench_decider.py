"""scripts/bench_decider.py times the policy, not its fallback: its observations lie inside the
shipped policy's training distribution, which the out-of-distribution guard checks."""

from __future__ import annotations

import importlib.util
from collections import Counter

from runtime.decider.breaker import CircuitBreaker
from runtime.decider.guard import GuardedDecider
from runtime.locations import shipped_policy_dir
from runtime.observation import vector_from_fields
from scripts.bench_decider import main, observation_pool, training_distribution


def test_the_shipped_policy_decides_every_benchmark_observation():
    path = shipped_policy_dir() / "policy.onnx"
    distribution = training_distribution(path)
    assert distribution is not None  # the shipped policy carries its guard
    decider = GuardedDecider(path, breaker=CircuitBreaker(trip_after=0))
    for seed in (0, 1):
        pool = observation_pool(1024, seed=seed, distribution=distribution)
        sources = Counter(decider.decide(vector_from_fields(o)).source for o in pool)
        assert sources == {"policy": 1024}, sources
    # without the ranges, the random pool lies mostly outside them: the guard hands it to the PID
    pool = observation_pool(256, seed=0)
    sources = Counter(decider.decide(vector_from_fields(o)).source for o in pool)
    assert sources["pid"] > 128, sources


def test_without_onnx_it_names_the_package_it_needs(monkeypatch, capsys):
    """The floor reads the policy's weights with ``onnx``, which a runtime-only install lacks:
    the benchmark says so before it times anything."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnx" else real(name, *a))
    assert main(["--no-rest", "--calls", "10", "--spaced-calls", "0"]) == 2
    assert "pip install onnx" in capsys.readouterr().err
