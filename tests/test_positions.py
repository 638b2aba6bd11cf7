"""Index transforms against the loop definitions, on every backend."""

from __future__ import annotations

import _reference as ref
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import relpos_ref as rp

lengths = st.integers(0, 9)
offsets = st.integers(-6, 9)


@given(t_q=lengths, t_k=lengths, q_offset=offsets)
def test_relative_positions_match_definition(backend, xp, t_q, t_k, q_offset):
    dev = backend.native_device()
    r = rp.relative_positions(t_q, t_k, q_offset=q_offset, xp=xp, device=dev)
    assert r.shape == (t_q, t_k)
    assert r.dtype == xp.__array_namespace_info__().default_dtypes(device=dev)["indexing"]
    np.testing.assert_array_equal(backend.to_numpy(r), ref.relative_positions(t_q, t_k, q_offset))


@given(t_q=lengths, t_k=lengths, q_offset=offsets)
def test_distance_range_is_the_extremes(t_q, t_k, q_offset):
    r = ref.relative_positions(t_q, t_k, q_offset)
    span = rp.distance_range(t_q, t_k, q_offset=q_offset)
    if r.size == 0:
        assert span is None
    else:
        assert span == (int(r.min()), int(r.max()))


def test_end_aligned_last_query_meets_last_key(xp):
    r = np.asarray(rp.relative_positions(3, 7, q_offset=4, xp=xp))
    assert r[-1, -1] == 0
    assert (r[-1] <= 0).all()


@given(
    t_q=lengths,
    t_k=lengths,
    q_offset=offsets,
    k=st.integers(0, 6),
    beyond=st.sampled_from(["clip", "zero"]),
)
def test_table_index_matches_definition(backend, xp, t_q, t_k, q_offset, k, beyond):
    r = rp.relative_positions(t_q, t_k, q_offset=q_offset, xp=xp, device=backend.native_device())
    index, valid = rp.table_index(r, k, beyond=beyond)
    want_index, want_valid = ref.table_index(ref.relative_positions(t_q, t_k, q_offset), k, beyond)
    assert index.dtype == r.dtype
    np.testing.assert_array_equal(backend.to_numpy(index), want_index)
    np.testing.assert_array_equal(backend.to_numpy(valid), want_valid)


@given(
    t_q=lengths,
    t_k=lengths,
    q_offset=offsets,
    m=st.integers(1, 6),
    beyond=st.sampled_from(["clip", "zero"]),
)
def test_causal_table_index_matches_definition(backend, xp, t_q, t_k, q_offset, m, beyond):
    r = rp.relative_positions(t_q, t_k, q_offset=q_offset, xp=xp, device=backend.native_device())
    index, valid = rp.causal_table_index(r, m, beyond=beyond)
    want_index, want_valid = ref.causal_table_index(
        ref.relative_positions(t_q, t_k, q_offset), m, beyond
    )
    np.testing.assert_array_equal(backend.to_numpy(index), want_index)
    np.testing.assert_array_equal(backend.to_numpy(valid), want_valid)


def test_error_policy_passes_inside_and_names_the_distance_outside(xp):
    inside = rp.relative_positions(3, 3, xp=xp)
    index, valid = rp.table_index(inside, 2, beyond="error")
    assert bool(xp.all(valid))
    assert bool(xp.all(index == rp.table_index(inside, 2).index))
    outside = rp.relative_positions(4, 4, xp=xp)
    with pytest.raises(ValueError, match=r"distance -3 is beyond the table \(max_distance=2"):
        rp.table_index(outside, 2, beyond="error")
    with pytest.raises(ValueError, match=r"distance -3 is beyond the table \(length=3"):
        rp.causal_table_index(outside, 3, beyond="error")
    # The future never counts as beyond a causal table.
    _, valid = rp.causal_table_index(rp.relative_positions(2, 4, xp=xp), 2, beyond="error")
    assert not bool(xp.any(valid[0, 1:]))


def test_host_check_matches_array_check():
    rp.check_distances_in_table(3, 5, q_offset=2, low=-4, high=2, what="K")
    with pytest.raises(ValueError, match="distance 3 is beyond"):
        rp.check_distances_in_table(3, 5, q_offset=1, low=-4, high=2, what="K")


@given(h=st.integers(0, 5), w=st.integers(0, 5))
def test_grid_positions_are_row_major(backend, xp, h, w):
    rows, cols = rp.grid_positions(h, w, xp=xp, device=backend.native_device())
    want_rows, want_cols = ref.grid_positions(h, w)
    np.testing.assert_array_equal(backend.to_numpy(rows), want_rows)
    np.testing.assert_array_equal(backend.to_numpy(cols), want_cols)


def test_worked_example_five_word_window(xp):
    # Shaw et al.: with K = 2 and five words, word 0 uses rows 2..4 of the
    # five-row table for keys 0..2 and the clipped row 4 beyond; the last
    # word uses rows 0..2 for keys 2..4.
    index, _ = rp.table_index(rp.relative_positions(5, 5, xp=xp), 2)
    index = np.asarray(index)
    np.testing.assert_array_equal(index[0], [2, 3, 4, 4, 4])
    np.testing.assert_array_equal(index[4], [0, 0, 0, 1, 2])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda xp: rp.relative_positions(-1, 3, xp=xp), r"`t_q` must be >= 0, got -1"),
        (lambda xp: rp.relative_positions(2, -4, xp=xp), r"`t_k` must be >= 0, got -4"),
        (lambda xp: rp.relative_positions(2.0, 3, xp=xp), r"`t_q` must be an integer, got 2.0"),
        (
            lambda xp: rp.relative_positions(2, 3, q_offset=0.5, xp=xp),
            r"`q_offset` must be an integer",
        ),
        (lambda xp: rp.grid_positions(-2, 3, xp=xp), r"`h` must be >= 0, got -2"),
        (
            lambda xp: rp.table_index(rp.relative_positions(2, 2, xp=xp), -1),
            r"`max_distance` must be >= 0, got -1",
        ),
        (
            lambda xp: rp.table_index(rp.relative_positions(2, 2, xp=xp), 1.5),
            r"`max_distance` must be an integer, got 1.5",
        ),
        (
            lambda xp: rp.table_index(rp.relative_positions(2, 2, xp=xp), True),
            r"`max_distance` must be an integer, got the bool",
        ),
        (
            lambda xp: rp.table_index(rp.relative_positions(2, 2, xp=xp), 1, beyond="wrap"),
            r"`beyond` must be one of 'clip', 'zero', 'error', got 'wrap'",
        ),
        (
            lambda xp: rp.causal_table_index(rp.relative_positions(2, 2, xp=xp), 0),
            r"`length` must be >= 1, got 0",
        ),
    ],
)
def test_bad_input_names_parameter_and_value(xp, call, message):
    with pytest.raises(ValueError, match=message):
        call(xp)


def test_float_distances_are_refused(xp):
    r = xp.asarray([[0.0, 1.0]])
    with pytest.raises(TypeError, match="`r` must have an integer dtype"):
        rp.table_index(r, 1)
