"""vectors_from_rows: the batch twin of vector_from_fields."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.knobs import NUM_KNOBS, Knobs, current_action, knobs_to_action
from runtime.observation import (
    OBS_DIM,
    OBSERVATION_FIELDS,
    OBSERVATION_NAMES,
    _vector,
    vector_from_fields,
    vectors_from_rows,
)


def field_values(f):
    span = f.high - f.low
    return st.one_of(st.floats(f.low - 0.1 * span, f.high + 0.1 * span),
                     st.sampled_from([f.low, f.high, 0.0, -0.0, (f.low + f.high) / 2]),
                     st.floats(-1e12, 1e12))


rows_strategy = st.lists(st.tuples(*(field_values(f) for f in OBSERVATION_FIELDS)),
                         min_size=1, max_size=8)


@settings(max_examples=120, deadline=None)
@given(rows_strategy)
def test_matches_vector_from_fields_row_by_row(rows):
    expected = np.stack([vector_from_fields(dict(zip(OBSERVATION_NAMES, r))) for r in rows])
    got = vectors_from_rows(np.asarray(rows))
    assert got.dtype == np.float32 and got.shape == (len(rows), OBS_DIM)
    np.testing.assert_array_max_ulp(got, expected, maxulp=1)


def test_knob_values_are_rounded_half_to_even_as_knobs_clamped_does():
    # 12.5 ms -> 12; 2056 = 128.5 blocks -> 2048; a share of 0.125 -> 0.12; slack 0.625 -> 0.62
    row = [1.0] * (OBS_DIM - NUM_KNOBS) + [12.5, 2056.0, 0.5, 0.125, 0.625]
    np.testing.assert_array_equal(vectors_from_rows([row])[0],
                                  vector_from_fields(dict(zip(OBSERVATION_NAMES, row))))


def test_names_the_first_non_finite_field_and_row():
    rows = np.ones((3, OBS_DIM))
    rows[2, 5] = np.inf
    rows[1, 7] = np.nan
    with pytest.raises(ValueError, match="field 'kv_utilization' is not finite in row 1"):
        vectors_from_rows(rows)
    with pytest.raises(ValueError, match=rf"have shape \[n, {OBS_DIM}\], got \[{OBS_DIM}\]"):
        vectors_from_rows(np.ones(OBS_DIM))


def test_the_remembered_action_is_the_knobs_action_and_follows_a_new_knobs_object():
    a = Knobs(10.0, 1024, 0.5, 0.25, 2.0)
    b = Knobs(10.0, 1024, 0.5, 0.5, 2.0)
    assert current_action(a) == knobs_to_action(a)
    assert current_action(a) is current_action(a)  # remembered, not recomputed
    assert current_action(b) == knobs_to_action(b) != knobs_to_action(a)
    assert current_action(a) == knobs_to_action(a)


def table_vector(values: list[float], knobs: Knobs) -> np.ndarray:
    """The transforms as the table states them, field by field (the reference)."""
    out = []
    for f, x in zip(OBSERVATION_FIELDS, values):
        x = min(max(x, f.low), f.high)
        if f.transform == "log":
            out.append(math.log1p(x) / math.log1p(f.high))
        elif f.transform == "slog":
            out.append(math.copysign(math.log1p(abs(x)), x) / math.log1p(f.high))
        else:
            out.append((x - f.low) / (f.high - f.low))
    return np.array(out + list(knobs_to_action(knobs)), dtype=np.float32)


@settings(max_examples=60, deadline=None)
@given(rows_strategy)
def test_the_written_out_transforms_are_the_tables_bit_for_bit(rows):
    knobs = Knobs(10.0, 1024, 0.5, 0.25, 2.0)
    for r in rows:
        values = list(r[:OBS_DIM - NUM_KNOBS])
        assert _vector(values, knobs).tobytes() == table_vector(values, knobs).tobytes()
