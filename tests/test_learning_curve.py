"""scripts/experiments/learning_curve.py: variants name train.py flags; the summary is the mean
over seeds."""

from __future__ import annotations

import pytest

from scripts.experiments.learning_curve import summarise, variant_flags


def test_a_variant_names_the_train_flags_it_sets():
    assert variant_flags("reward=raw,warm_start=dagger") == ["--reward", "raw", "--warm-start",
                                                              "dagger"]
    with pytest.raises(ValueError, match="variant 'reward': 'reward' is not flag=value"):
        variant_flags("reward")


def test_the_summary_is_the_mean_over_seeds_of_the_last_and_the_best_evaluation():
    result = {"metric": "gap", "variants": {"a": {
        0: [{"step": 1, "gap": -0.2}, {"step": 2, "gap": 0.1}, {"step": 3, "gap": 0.0}],
        1: [{"step": 1, "gap": -0.4}, {"step": 2, "gap": -0.3}, {"step": 3, "gap": -0.1}]}}}
    s = summarise(result)["a"]
    assert s["last"] == [0.0, -0.1] and s["last_mean"] == pytest.approx(-0.05)
    assert s["best"] == [0.1, -0.1] and s["best_mean"] == pytest.approx(0.0)
