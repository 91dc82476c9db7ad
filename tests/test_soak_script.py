"""scripts/soak.py on a few seconds: the report it prints is made of what it measured."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from scripts.soak import ATTACKS, _lag_p99_ms, _status_field, main, soak, unique_resident_bytes


def test_the_loop_lag_p99_is_read_from_the_counts_added_within_segments():
    bounds = [0.001, 0.004, float("inf")]

    def sample(segment, counts):
        return segment, list(zip(bounds, counts, strict=True))

    lag = [sample(0, [0, 0, 0]), sample(0, [98, 100, 100]),  # segment 0: 98 of 100 under 1 ms
           sample(1, [100, 100, 100]), sample(1, [100, 200, 200]),  # 1: every one 1-4 ms
           sample(1, [200, 300, 300])]  # the step from 0 to 1 counts in neither
    assert _lag_p99_ms(lag, [0]) == 4.0
    assert _lag_p99_ms(lag, [1]) == 4.0 and _lag_p99_ms([lag[3], lag[4]], [1]) == 1.0
    assert _lag_p99_ms(lag, [5]) is None


def test_resident_pages_two_processes_share_are_counted_once():
    me = unique_resident_bytes([os.getpid()])
    if me is None:
        pytest.skip("the page map's frame numbers need a privileged reader")
    rss = _status_field(os.getpid(), "VmRSS")
    assert 0.8 * rss <= me <= 1.05 * rss, (me, rss)
    # a process listed twice is counted once
    assert unique_resident_bytes([os.getpid(), os.getpid()]) <= 1.05 * me
    child = subprocess.Popen([sys.executable, "-c", "import numpy, sys, time; print(flush=True);"
                              " sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        child.stdout.readline()  # numpy imported
        theirs = unique_resident_bytes([child.pid])
        both = unique_resident_bytes([os.getpid(), child.pid])
    finally:
        child.communicate(b"")
    # both interpreters map libpython and numpy's libraries from the same files: those pages
    # count once
    assert max(me, theirs) < both < me + theirs - 2 * 2**20, (me, theirs, both)


def test_a_short_soak_reports_both_conditions_errors_and_memory():
    r = soak(duration_s=6.0, warmup_s=1.0, segment_s=2.5, good=1, hostile=1, max_open=2,
             attacks=("empty_rows", "text_plain", "repeated_key", "big_header", "pipelined",
                      "reload_huge", "reload_outside", "slow", "silent"), silent=20)
    g = r["good"]
    assert g["decisions"]["without_hostile"] > 0 and g["decisions"]["with_hostile"] > 0
    assert g["p99_ms"]["without_hostile"] > 0 and g["p99_ratio"] > 0
    assert r["good_5xx"] == 0 and r["good_not_200"] == 0 and r["server_log_errors"] == 0
    # every hostile request answered is refused with its status (on a loaded machine, 2.5 s
    # may see only some of them)
    expected = {"empty_rows": {"422"}, "text_plain": {"422"}, "repeated_key": {"422"},
                "big_header": {"431"}, "pipelined": {"200"}, "reload_huge": {"422"},
                "reload_outside": {"400"}}
    for attack, by_status in r["hostile_status"].items():
        assert set(by_status) <= expected[attack], (attack, by_status)
    for attack, t in r["hostile_answer_ms"].items():
        assert 0 < t["p50"] <= t["p99"] <= t["max"] < 30_000, (attack, t)
    m = r["memory_mib"]
    assert m["end"] > 50 and m["peak"] >= m["max"] >= m["end"]
    assert math.isfinite(r["memory_slope_mib_per_min"])
    # the server and both lanes of its batch worker, which a thread of the server starts
    assert m["processes"] == 3
    # each process's own peak, by role: the server, and the two lanes at their default nices
    by_process = m["peak_by_process"]
    assert set(by_process) == {"server", "batch worker (nice 0)", "batch worker (nice 10)"}
    assert all(v > 20 for v in by_process.values())
    assert sum(by_process.values()) == pytest.approx(m["peak"], rel=0.05)
    assert 0 < m["pss_end"] <= m["end"] and math.isfinite(r["memory_pss_slope_mib_per_min"])
    assert r["memory_settled_from_s"] == 1.0 + 2 * 2.5
    # the pages of the three counted once: fewer than their resident sizes summed
    if m["unique"] is not None:
        assert m["unique"]["samples"] >= 1
        assert 20 < m["unique"]["max"] < m["max"] and m["unique"]["end"] <= m["unique"]["max"]
    # the server's event-loop lag, read from its /metrics once a second
    assert r["loop_lag_p99_ms"]["without_hostile"] > 0


def test_one_attack_a_segment_is_reported_apart():
    # the good clients' priority changed (lowered: raising it needs a privilege CI may lack)
    r = soak(duration_s=0.0, warmup_s=0.5, segment_s=1.5, good=1, hostile=1, max_open=2,
             attacks=("empty_rows", "many_headers"), each=True, good_nice=1)
    assert r["good_nice"] == 1
    assert set(r["per_attack"]) == {"empty_rows", "many_headers"}
    for name, a in r["per_attack"].items():
        assert a["decisions"]["with_hostile"] > 0, name
        assert len(a["p99_ratio_by_round"]) >= 1, name
        assert len(a["batches_p99_ratio_by_round"]) == len(a["p99_ratio_by_round"]), name
        assert a["batches"]["decisions"]["without_hostile"] > 0, name
    assert set(r["per_attack"]["many_headers"]["hostile_status"]) <= {"431"}


@pytest.mark.parametrize("argv, message", [
    (["--duration-s", "10", "--warmup-s", "5", "--segment-s", "5"],
     "soak: --duration-s must cover the warm-up and one segment without and one with the "
     "hostile clients"),
    (["--attacks", "empty_rows,nope"], "soak: --attacks takes names from "
     f"{','.join(ATTACKS)}, got 'empty_rows,nope'"),
    (["--each", "--rounds", "0"], "soak: --rounds must be >= 1"),
])
def test_bad_options_exit_2_naming_them(capsys, argv, message):
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == message


def test_a_priority_a_client_cannot_take_is_refused_before_the_run():
    from scripts.soak import _nice_problem

    assert _nice_problem(0) is None and _nice_problem(1) is None
    assert "[-20, 19]" in (_nice_problem(30) or "")
    assert main(["--good-nice", "-30", "--duration-s", "100", "--warmup-s", "1",
                 "--segment-s", "1"]) == 2


def test_good_clients_under_a_real_time_policy_where_the_user_may_set_one():
    """``--good-realtime``: the good clients' wake-ups do not wait for the event loop's time
    slice on their shared CPU. Refused before the run where the user may not set the policy."""
    from scripts.soak import _realtime_problem

    problem = _realtime_problem()
    if problem is not None:
        assert "real-time" in problem
        assert main(["--good-realtime", "--duration-s", "100", "--warmup-s", "1",
                     "--segment-s", "1"]) == 2
        return
    r = soak(duration_s=4.0, warmup_s=0.5, segment_s=1.5, good=1, hostile=1, max_open=2,
             attacks=("empty_rows",), good_realtime=True)
    assert r["good_realtime"] is True
    assert r["good"]["decisions"]["with_hostile"] > 0
