"""Traffic families: an hour of traffic whose parameters are drawn afresh every segment from the
documented ranges, the same hour for the same seed, and held-out families outside the training
family's ranges; the long-prompt conversation trace."""

from __future__ import annotations

import numpy as np
import pytest

from env.traces import split
from env.traces.families import CONTEXT_TOKENS, FAMILIES, Range, family_trace
from env.traces.long_prompt import LONG_CONV
from env.traces.resolve import resolve_trace, trace_label


def test_a_family_is_the_same_hour_for_a_seed_and_another_for_another_seed():
    a, b, c = family_trace("family:train"), family_trace("family:train"), family_trace(
        "family:train:1")
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.prompt_tokens,
                                                                          b.prompt_tokens)
    assert len(a) != len(c) or not np.array_equal(a.prompt_tokens, c.prompt_tokens)
    assert a.arrival_s[-1] < 3600.0 and np.all(np.diff(a.arrival_s) >= 0)
    assert trace_label("family:train") == "family-train"
    assert len(split(a, "train")) > 0 and len(split(a, "eval")) > 0
    with pytest.raises(ValueError, match="unknown traffic family 'nope'"):
        resolve_trace("family:nope")


def test_every_segment_draws_its_own_parameters_within_the_documented_ranges():
    fam = FAMILIES["train"]
    rng = np.random.default_rng(0)
    draws = [fam.segment(rng, fam.segment_s)[1] for _ in range(60)]
    for key, rng_ in (("prompt_token_rate", fam.prompt_token_rate), ("cv", fam.cv),
                      ("amplitude", fam.amplitude), ("period_s", fam.period_s),
                      ("prompt_mean", fam.prompt_mean), ("output_mean", fam.output_mean),
                      ("long_share", fam.long_share)):
        values = [d[key] for d in draws]
        assert rng_.low <= min(values) and max(values) <= rng_.high, key
        assert len(set(values)) > 50  # a fresh draw each segment
    # the load is the drawn prompt-token rate: requests/s times the mean prompt
    t, d = fam.segment(np.random.default_rng(5), 600.0)
    measured = t.prompt_tokens.sum() / 600.0
    assert measured == pytest.approx(d["prompt_token_rate"], rel=0.5)


def test_long_prompts_reach_the_context_and_held_out_families_leave_the_training_ranges():
    train = resolve_trace("family:train")
    assert train.prompt_tokens.max() > 12000
    assert (train.prompt_tokens + train.output_tokens).max() <= CONTEXT_TOKENS
    heavy = resolve_trace("family:decode-heavy")
    assert np.median(heavy.output_tokens) > FAMILIES["train"].output_mean.high
    crowd, steady = FAMILIES["flash-crowd"], FAMILIES["train"]
    assert crowd.cv.low > steady.cv.high
    assert Range(1.0, 2.0, log=True).draw(np.random.default_rng(0)) >= 1.0


def test_the_long_prompt_conversation_trace_keeps_the_arrivals_and_redraws_the_prompts():
    try:
        conv = resolve_trace("azure-conv")
    except FileNotFoundError:
        pytest.skip("Azure conversation trace not found")
    long = resolve_trace(LONG_CONV)
    assert np.array_equal(long.arrival_s, conv.arrival_s)
    assert np.array_equal(long.output_tokens, conv.output_tokens)
    assert long.prompt_tokens.mean() > 3 * conv.prompt_tokens.mean()
    assert long.prompt_tokens.max() <= 15384 and np.percentile(long.prompt_tokens, 99) > 12000


def test_a_family_written_as_a_plain_csv_reads_back_to_the_same_requests(tmp_path):
    from env.traces.plain_csv import read_plain_csv, write_plain_csv

    t = split(family_trace("family:flash-crowd"), "eval")
    back = read_plain_csv(write_plain_csv(t, tmp_path / "f.csv"))
    assert np.array_equal(back.arrival_s, t.arrival_s - t.arrival_s[0])
    assert np.array_equal(back.prompt_tokens, t.prompt_tokens)
    assert np.array_equal(back.output_tokens, t.output_tokens)
