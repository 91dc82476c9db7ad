"""Every input found to hang or to fail without a location ends within a second, with a clear
error or a result, and conservation holds in the replays that run."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from runtime.engine.engine import MAX_ARRIVAL_S
from runtime.engine.request import Status
from tests.engine_factory import hand_profile, make_engine, random_workload

PLAIN = "arrival_s,prompt_tokens,output_tokens"
BOUND_S = 5.0
"""the wall time these inputs must be answered in: a normal run here takes 0.1-0.3 s, and what
they guard against (a replay stepping through a gap of 1e9 s interval by interval) takes hours,
so the bound needs no tightness; at 1 s, load from the machine's other processes alone failed
five of them"""


def run_replay(capsys, tmp_path: Path, name: str, text: str, *args: str) -> tuple[int, str]:
    """scripts/replay.py on a file holding ``text``: (exit code, stdout or stderr), timed."""
    from scripts.replay import main as replay_main  # needs env/ (the train extra)

    path = tmp_path / name
    path.write_text(text, newline="")
    t0 = time.perf_counter()
    code = replay_main(["--trace", str(path), "--json", *args])
    elapsed = time.perf_counter() - t0
    assert elapsed < BOUND_S, f"{name} took {elapsed:.2f} s"
    out = capsys.readouterr()
    return code, (out.out if code == 0 else out.err).strip()


@pytest.mark.parametrize("name, text, args, message", [
    ("gap.csv", f"{PLAIN}\n0,100,10\n1e300,100,10\n", (),
     "replay: gap.csv, line 3, column arrival_s: 1e300 s is past the engine's limit of 1e+10 s"),
    ("slow.csv", f"{PLAIN}\n0,100,10\n4,100,10\n", ("--rate-scale", "1e-300"),
     "replay: rate scale factor 1e-300 stretches the trace's last arrival, 4 s, to 4e+300 s, "
     "past the engine's limit of 1e+10 s"),
    ("far.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 5}\n'
                  '{"timestamp": 1e300, "input_length": 5, "output_length": 5}\n', (),
     "replay: far.jsonl, line 2, column timestamp: 1e+300 ms is past the engine's limit of "
     "1e+10 s"),
    ("classes.csv", f"{PLAIN},slo_class\n0,100,10,interactive\n1,100,10,nosuch\n", (),
     "replay: trace 'classes' ({path} (plain CSV; time 0 = 0 s in the file)): slo_class "
     "'nosuch' of request 1 (in arrival order; 1 request in all with classes ['nosuch']) is not "
     "one of the engine's classes ['batch', 'interactive']"),
    ("newline.csv", f'{PLAIN}\n0,100,10\n1,"100\n5",10\n', (),
     "replay: newline.csv, line 4, column prompt_tokens: expected a non-negative integer, got "
     "'100\\n5'"),
    ("deep.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 5, "x": '
                   + "[" * 100_000 + "]" * 100_000 + "}\n", (),
     "replay: deep.jsonl, line 1: invalid JSON: nested too deeply to read"),
    ("digits.csv", f"{PLAIN}\n0,{'9' * 5000},10\n", (),
     "replay: digits.csv, line 2, column prompt_tokens: expected a non-negative integer, got "
     "'999999999999999999999999999999999999999... (5002 characters)"),
    ("digits.jsonl", '{"timestamp": ' + "9" * 5000 + ', "input_length": 5, '
                     '"output_length": 5}\n', (),
     "replay: digits.jsonl, line 1: invalid JSON: Exceeds the limit (4300 digits) for integer "
     "string conversion: value has 5000 digits; use sys.set_int_max_str_digits() to increase "
     "the limit"),
])
@pytest.mark.training_stack
def test_a_bad_trace_is_refused_within_a_second_naming_where(capsys, tmp_path, name, text,
                                                             args, message):
    code, err = run_replay(capsys, tmp_path, name, text, *args)
    assert code == 2
    assert err == message.format(path=tmp_path / name)


@pytest.mark.training_stack
def test_a_unix_epoch_gap_runs_in_time_proportional_to_its_requests(capsys, tmp_path):
    # 0, then 1.7e9 s: an idle engine used to walk the gap 60 s at a time (28 s of wall time)
    code, out = run_replay(capsys, tmp_path, "epoch.csv",
                           f"{PLAIN}\n0,100,10\n1700000000,100,10\n")
    assert code == 0
    result = json.loads(out)
    assert (result["requests"], result["finished"], result["rejected"]) == (2, 2, 0)


@pytest.mark.training_stack
def test_cr_only_line_endings_read_as_lines(capsys, tmp_path):
    code, out = run_replay(capsys, tmp_path, "mac.csv", f"{PLAIN}\r0,100,10\r1,100,10\r")
    assert code == 0 and json.loads(out)["finished"] == 2


@pytest.mark.training_stack
def test_rows_out_of_order_are_reported_in_the_json(capsys, tmp_path):
    code, out = run_replay(capsys, tmp_path, "order.csv",
                           f"{PLAIN}\n5,100,10\n1,100,10\n0,1,1\n")
    assert code == 0
    result = json.loads(out)
    assert result["reordered_rows"] == 2 and result["finished"] == 3  # 0 and 5 swapped places


# ---------------------------------------------------------------------------------- the engine
def test_an_idle_engine_jumps_straight_to_the_next_arrival():
    e = make_engine()
    e.add_requests([0.0, 1e9, 2e9], [32, 32, 32], [4, 4, 4])
    t0 = time.perf_counter()
    e.run_to_completion()
    assert time.perf_counter() - t0 < BOUND_S
    s = e.summary()
    assert (s.finished, s.rejected) == (3, 0)
    assert e.num_iterations == 12  # 4 a request (one prefill, three decodes): no idle steps


def test_the_engine_refuses_an_arrival_past_its_limit():
    e = make_engine()
    with pytest.raises(ValueError, match=r"request 1: arrival 1e\+300 s is past the engine's "
                                         r"limit of 1e\+10 s \(MAX_ARRIVAL_S\)"):
        e.add_requests([0.0, 1e300], [32, 32], [4, 4])
    e.add_requests([0.0, MAX_ARRIVAL_S], [32, 32], [4, 4])
    e.run_to_completion()
    assert e.summary().finished == 2


@pytest.mark.parametrize("max_time_s", [np.inf, 7.0])
def test_dropping_ended_requests_keeps_the_summary_exact(max_time_s):
    """A long-running loop keeps only the requests in flight; the summary is the same,
    conservation included (a bounded run aborts what is left)."""
    runs = {}
    for keep in (True, False):
        e = make_engine(hand_profile(blocks_at_half=60, prefill_token_s=1e-5,
                                     decode_ctx_token_s=1e-6), chunk=256, keep_requests=keep)
        arrivals, prompts, outputs = random_workload(5, 3000, 300)
        e.add_requests(arrivals, prompts, outputs)
        e.run_to_completion(max_time_s)
        if e.has_work():
            e.abort_all()
        runs[keep] = e
    kept, dropped = runs[True].summary(), runs[False].summary()
    assert dropped == kept
    assert kept.requests == 3000
    assert kept.finished + sum(kept.rejected_by_reason.values()) == 3000
    assert len(runs[True].requests) == 3000
    assert len(runs[False].requests) < 1100  # ended ones are dropped in bulk past 1024
    assert all(r.status < Status.FINISHED for r in runs[False].requests[1024:])


def test_a_controller_replay_decides_an_idle_gap_once_not_per_interval():
    from runtime.decider.pid import PidController
    from runtime.engine.sim_executor import SimulatedExecutor
    from runtime.session import replay

    t0 = time.perf_counter()
    result = replay(SimulatedExecutor(hand_profile()), [0.0, 1.7e9, 1.7e9 + 1.0], [32, 32, 32],
                    [4, 4, 4], decider=PidController(), interval_s=0.25)
    assert time.perf_counter() - t0 < BOUND_S
    s = result.summary
    assert (s.requests, s.finished, s.rejected) == (3, 3, 0)
    assert result.decisions < 20


@pytest.mark.training_stack
def test_a_replay_reports_the_batch_share_and_slack_the_engine_ran_with(capsys, tmp_path):
    # the flags set them through the engine config; the report used to show the defaults (1, 1)
    code, out = run_replay(capsys, tmp_path, "levers.csv", f"{PLAIN}\n0,100,10\n0.5,100,10\n",
                           "--batch-share", "0.5", "--admission", "shed",
                           "--admission-slack", "0.5")
    assert code == 0
    assert json.loads(out)["knobs"] == {
        "batch_window_ms": 5.0, "prefill_chunk_tokens": 2048, "kv_cache_ratio": 0.9,
        "batch_share": 0.5, "admission_slack": 0.5}
