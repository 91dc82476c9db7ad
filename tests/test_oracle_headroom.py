"""The per-lever headroom table (scripts/experiments/oracle_headroom.py): how arms are built, how
best static chooses, and how a figure becomes a gain and a lever a verdict."""

from __future__ import annotations

import json

import pytest

from runtime.knobs import DEFAULT_KNOBS, Knobs
from scripts.experiments.oracle_headroom import (
    SettingController,
    figure_rows,
    frontier_best,
    gain,
    knob_spec,
    main,
    one_setting,
    override,
    pick_best,
    tune_score,
    verdict,
)
from tests.engine_factory import make_engine

pytestmark = pytest.mark.training_stack


def test_knobs_are_written_in_the_oracles_grammar_and_read_back():
    assert knob_spec(Knobs(5.0, 1024, 0.95)) == "window=5;chunk=1024;ratio=0.95"
    # a knob beyond the first three is written where it differs from the static default
    assert knob_spec(Knobs(5.0, 1024, 0.95, batch_share=0.1)) == (
        "window=5;chunk=1024;ratio=0.95;batch_share=0.1")
    assert one_setting(knob_spec(DEFAULT_KNOBS)).knobs == DEFAULT_KNOBS
    assert one_setting("window=20;chunk=512;ratio=0.7").knobs == Knobs(20.0, 512, 0.7)


def test_a_key_is_overridden_in_place_or_appended():
    base = "window=5;chunk=1024;ratio=0.95"
    assert override(base, "ratio", "0.5,0.6") == "window=5;chunk=1024;ratio=0.5,0.6"
    assert override(base, "admission", "shed") == base + ";admission=shed"
    # admission does not clobber admission_slack, nor the reverse
    assert override(base + ";admission_slack=0.5", "admission", "fcfs") == (
        base + ";admission_slack=0.5;admission=fcfs")


def test_one_setting_refuses_a_grid():
    with pytest.raises(ValueError, match="names 2 settings, not one"):
        one_setting("chunk=512,1024")


def test_a_static_arm_sets_its_levers_when_bound_and_decides_its_knobs():
    setting = one_setting("window=5;chunk=1024;ratio=0.5;admission=shed;admission_slack=0.5;"
                          "batch_share=0.25")
    engine = make_engine()
    arm = SettingController(setting, "best-static")
    arm.bind(engine)
    assert (engine.admission, engine.admission_slack, engine.batch_share) == ("shed", 0.5, 0.25)
    decision = arm.decide(None)
    assert decision.knobs == Knobs(5.0, 1024, 0.5, batch_share=0.25, admission_slack=0.5)
    assert decision.source == "best-static"


def test_best_static_tunes_admission_on_goodput_and_batch_share_on_the_oracles_score():
    row = {"interactive_attainment": 0.8, "interactive_goodput_rps": 4.0,
           "batch_goodput_tps": 20000.0}
    assert tune_score("admission", row) == 4.0
    # 4 met/s, 1 violated/s (4 * 0.2 / 0.8), 20,000 batch tok/s at 1e-4 each
    assert tune_score("batch_share", row) == pytest.approx(4.0 - 1.0 + 2.0)
    assert pick_best({"fcfs": [1.0, 0.1], "shed": [1.0, 0.9], "late": [1.0, 0.9]}) == "shed"


def test_the_frontier_takes_the_smallest_pool_that_holds_the_target():
    points = [{"arm": "0.5", "interactive_attainment": 0.97, "mean_kv_gib": 10.0},
              {"arm": "0.6", "interactive_attainment": 0.991, "mean_kv_gib": 12.0},
              {"arm": "0.95", "interactive_attainment": 0.995, "mean_kv_gib": 20.0}]
    assert frontier_best(points)["arm"] == "0.6"
    # none holds it: the point of highest attainment
    assert frontier_best(points, target=0.999)["arm"] == "0.95"


def test_gain_is_relative_and_memory_counts_less_as_better():
    assert gain("capacity", 1.1, 1.0) == pytest.approx(0.1)
    assert gain("memory", 13.74, 16.46) == pytest.approx(1 - 13.74 / 16.46)
    assert gain("past", None, 1.0) is None
    assert gain("batch", 5.0, 0.0) is None


def test_a_lever_is_worth_learning_iff_some_figure_gains_ten_percent():
    assert verdict([0.012, -0.02, 0.1]) == "worth learning"
    assert verdict([0.012, 0.0999]) == "not worth learning"
    assert verdict([None, None]) == "not measured"


CELLS = [
    {"lever": "knobs", "trace": "code", "l_star": 0.582, "anchor": "window=5",
     "figures": {"capacity": {"static": 0.279, "best-static": 0.582, "oracle": 0.589},
                 "capacity_fails_at": {"static": 0.285, "best-static": 0.594, "oracle": 0.6},
                 "past_2x": {"static": 1.0, "best-static": 1.46, "oracle": 1.5}},
     "runs": [{"arm": "oracle", "sim_s": 100.0, "wall_s": 4.0, "cpu_s": 2.0}]},
    {"lever": "kv", "trace": "conv", "l_star": 1.59, "anchor": "window=5",
     "figures": {"memory_1x": {"static": 26.07, "best-static": 16.46, "oracle": 13.74},
                 "memory_1x_detail": {}},
     "runs": []},
]


def test_the_table_has_a_row_per_figure_and_one_verdict_per_lever():
    rows = figure_rows(CELLS)
    assert [(r["lever"], r["figure"], r["verdict"]) for r in rows] == [
        ("knobs", "capacity", "not worth learning"), ("knobs", "past_2x", "not worth learning"),
        ("kv", "memory_1x", "worth learning")]
    assert rows[0]["gain"] == pytest.approx(0.589 / 0.582 - 1)
    # where the bisections stopped bounds the gain: oracle low / best high .. oracle high / best low
    assert rows[0]["gain_range"] == pytest.approx((0.589 / 0.594 - 1, 0.6 / 0.582 - 1))


def test_report_prints_the_saved_cells_side_by_side(tmp_path, capsys):
    path = tmp_path / "h.json"
    path.write_text(json.dumps({"cells": CELLS}))
    assert main(["--report", str(path)]) == 0
    out = capsys.readouterr().out
    assert ("| knobs | code | capacity @99% interactive | x0.279 | x0.582 | x0.589 | "
            "+1.2% (-0.8% .. +3.1%) | not worth learning |") in out
    assert ("| knobs | code | goodput share of goodput @ L* at 2x L* | 100.0% | 146.0% | 150.0% "
            "| +2.7% | not worth learning |") in out
    assert ("| kv | conv | mean KV GiB holding 99% at 1x L* | 26.07 GiB | 16.46 GiB | "
            "13.74 GiB | +16.5% | worth learning |") in out
    assert "oracle cost, simulated s per wall s: knobs 25.0 (50.0 per CPU s, 1 runs)" in out
