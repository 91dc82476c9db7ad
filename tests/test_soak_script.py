"""scripts/soak.py on a few seconds: the report it prints is made of what it measured."""

from __future__ import annotations

import math

import pytest

from scripts.soak import main, soak


def test_a_short_soak_reports_both_conditions_errors_and_memory():
    r = soak(duration_s=5.0, warmup_s=1.0, segment_s=2.0, good=1, hostile=1, max_open=2,
             attacks=("empty_rows", "text_plain", "slow"))
    assert r["good_decisions"]["without_hostile"] > 0 and r["good_decisions"]["with_hostile"] > 0
    assert r["good_p99_ms"]["without_hostile"] > 0 and r["good_p99_ratio"] > 0
    assert r["good_5xx"] == 0 and r["good_not_200"] == 0 and r["server_log_errors"] == 0
    # every hostile request answered is refused with a 422 (on a loaded machine, 2 s may see none)
    assert set(r["hostile_status"]) <= {"422"}
    assert r["memory_mib"]["end"] > 50 and math.isfinite(r["memory_slope_mib_per_min"])


@pytest.mark.parametrize("argv, message", [
    (["--duration-s", "10", "--warmup-s", "5", "--segment-s", "5"],
     "soak: --duration-s must cover the warm-up and one segment without and one with the "
     "hostile clients"),
    (["--attacks", "empty_rows,nope"], "soak: --attacks takes names from "
     "empty_rows,string_rows,extra_keys,text_plain,slow, got 'empty_rows,nope'"),
])
def test_bad_options_exit_2_naming_them(capsys, argv, message):
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == message
