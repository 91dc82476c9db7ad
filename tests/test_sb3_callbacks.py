"""What each periodic evaluation logs beside the policy's attainment: its gaps to best static and
to the oracle, and the knobs it chose."""

from __future__ import annotations

import numpy as np
import pytest

from agents.sb3_callbacks import KnobRecorder, gaps
from runtime.decider.controller import StaticController
from runtime.knobs import Knobs

pytestmark = pytest.mark.training_stack


def test_gaps_are_the_policys_mean_minus_best_statics_and_the_oracles():
    baselines = {"static": {"mean": 0.7}, "best-static": {"mean": 0.8}, "oracle": {"mean": 0.9}}
    g = gaps(0.86, baselines)
    assert g["gap_to_best_static"] == pytest.approx(0.06)
    assert g["gap_to_oracle"] == pytest.approx(-0.04)
    assert g["oracle_gain_share"] == pytest.approx(0.6)  # 0.06 of the oracle's 0.10


def test_no_share_of_the_oracles_gain_is_claimed_where_it_gains_nothing():
    g = gaps(0.8, {"best-static": {"mean": 0.8}, "oracle": {"mean": 0.8}})
    assert g == {"gap_to_best_static": 0.0, "gap_to_oracle": 0.0}
    assert gaps(0.8, {"static": {"mean": 0.7}}) == {}


def test_the_knob_recorder_keeps_every_decision_and_passes_it_on():
    knobs = Knobs(20.0, 1024, 0.8)
    recorder = KnobRecorder(StaticController(knobs))
    observation = np.zeros(4, dtype=np.float32)
    decisions = [recorder.decide(observation) for _ in range(3)]
    assert [d.knobs for d in decisions] == [knobs] * 3
    assert recorder.knobs == [knobs.as_tuple()] * 3
    assert recorder.name == "static"
