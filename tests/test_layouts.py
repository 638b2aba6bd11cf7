"""Every layout equals the gather definition on its valid region, on every backend."""

from __future__ import annotations

import _reference as ref
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import relpos_ref as rp

batches = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)
dtypes = st.sampled_from(["float32", "float64", "int64"])


def _relative(backend, batch, t_q, n_rel, dtype, seed):
    rng = np.random.default_rng(seed)
    data = rng.integers(-50, 50, size=(*batch, t_q, n_rel)).astype(dtype)
    return data, backend.asarray(data)


def _check_meta(backend, x, out, shape):
    import array_api_compat

    assert out.shape == shape
    assert out.dtype == x.dtype
    assert array_api_compat.device(out) == array_api_compat.device(x)


@given(
    batch=batches,
    t_q=st.integers(0, 7),
    t_k=st.integers(0, 7),
    n_rel=st.integers(0, 12),
    offset=st.integers(-3, 12),
    q_offset=st.integers(-4, 8),
    dtype=dtypes,
    seed=st.integers(0, 99),
)
def test_gather_is_the_definition_everywhere(
    backend, batch, t_q, t_k, n_rel, offset, q_offset, dtype, seed
):
    data, x = _relative(backend, batch, t_q, n_rel, dtype, seed)
    out = rp.gather(x, t_k, offset=offset, q_offset=q_offset)
    _check_meta(backend, x, out, (*batch, t_q, t_k))
    want, _ = ref.relative_to_absolute(data, t_k, offset, q_offset)
    np.testing.assert_array_equal(backend.to_numpy(out), want)


@given(
    batch=batches,
    t_q=st.integers(0, 7),
    t_k=st.integers(0, 7),
    extra=st.integers(0, 6),
    start=st.integers(0, 6),
    q_offset=st.integers(-4, 8),
    dtype=dtypes,
    seed=st.integers(0, 99),
)
def test_pad_flatten_reshape_equals_gather_where_valid(
    backend, batch, t_q, t_k, extra, start, q_offset, dtype, seed
):
    n_rel = t_k + extra
    assume(start <= extra)
    offset = start + q_offset
    data, x = _relative(backend, batch, t_q, n_rel, dtype, seed)
    out = rp.pad_flatten_reshape(x, t_k, offset=offset, q_offset=q_offset)
    _check_meta(backend, x, out, (*batch, t_q, t_k))
    got = backend.to_numpy(out)
    want, exists = ref.relative_to_absolute(data, t_k, offset, q_offset)
    np.testing.assert_array_equal(got[..., exists], want[..., exists])
    # The documented fill: zero right past the past end of the table.
    r = ref.relative_positions(t_q, t_k, q_offset)
    edge = r + offset == -1
    np.testing.assert_array_equal(got[..., edge], 0)


def test_pad_flatten_reshape_classic_case_is_fully_valid(backend):
    # t_q = t_k = L with a full 2L - 1 table: every entry is the definition.
    L = 5
    data, x = _relative(backend, (2,), L, 2 * L - 1, "float64", 0)
    got = backend.to_numpy(rp.pad_flatten_reshape(x, L, offset=L - 1))
    want, exists = ref.relative_to_absolute(data, L, L - 1)
    assert exists.all()
    np.testing.assert_array_equal(got, want)


@given(batch=batches, L=st.integers(0, 8), dtype=dtypes, seed=st.integers(0, 99))
def test_skew_equals_gather_on_causal_region(backend, batch, L, dtype, seed):
    data, x = _relative(backend, batch, L, L, dtype, seed)
    out = rp.skew(x)
    _check_meta(backend, x, out, (*batch, L, L))
    got = backend.to_numpy(out)
    want, _ = ref.relative_to_absolute(data, L, L - 1)
    causal = ref.relative_positions(L, L) <= 0
    np.testing.assert_array_equal(got[..., causal], want[..., causal])
    first_superdiagonal = ref.relative_positions(L, L) == 1
    np.testing.assert_array_equal(got[..., first_superdiagonal], 0)


@given(
    batch=batches,
    t_q=st.integers(0, 6),
    memory=st.integers(0, 5),
    dtype=dtypes,
    seed=st.integers(0, 99),
)
def test_rel_shift_equals_gather_on_causal_region(backend, batch, t_q, memory, dtype, seed):
    t_k = t_q + memory
    data, x = _relative(backend, batch, t_q, t_k, dtype, seed)
    out = rp.rel_shift(x)
    _check_meta(backend, x, out, (*batch, t_q, t_k))
    got = backend.to_numpy(out)
    want, _ = ref.relative_to_absolute(data, t_k, t_k - 1, memory)
    causal = ref.relative_positions(t_q, t_k, memory) <= 0
    np.testing.assert_array_equal(got[..., causal], want[..., causal])


def test_skew_and_rel_shift_agree_on_square_input(backend):
    _, x = _relative(backend, (3,), 6, 6, "float32", 1)
    np.testing.assert_array_equal(backend.to_numpy(rp.skew(x)), backend.to_numpy(rp.rel_shift(x)))


@given(
    batch=batches,
    t_max=st.integers(1, 6),
    data=st.data(),
    dtype=dtypes,
    order=st.sampled_from(["past_to_future", "future_to_past"]),
    seed=st.integers(0, 99),
)
def test_stacked_diagonals_equal_gather_everywhere(backend, batch, t_max, data, dtype, order, seed):
    t_q = data.draw(st.integers(0, t_max))
    t_k = data.draw(st.integers(0, t_max))
    q_offset = data.draw(st.integers(t_k - t_max, t_max - t_q))
    values, x = _relative(backend, batch, t_q, 2 * t_max - 1, dtype, seed)
    out = rp.stacked_diagonals(x, t_k, q_offset=q_offset, order=order)
    _check_meta(backend, x, out, (*batch, t_q, t_k))
    want, exists = ref.relative_to_absolute(
        values, t_k, t_max - 1, q_offset, reverse=order == "future_to_past"
    )
    assert exists.all()
    np.testing.assert_array_equal(backend.to_numpy(out), want)


def test_stacked_diagonals_worked_example_t_max_4(xp):
    # A table for t_max = 4 has 7 rows, r = -3 .. 3. Put r itself in each
    # row so the output shows which row every (i, j) reads.
    x = xp.asarray([[-3, -2, -1, 0, 1, 2, 3]] * 4)
    np.testing.assert_array_equal(
        np.asarray(rp.stacked_diagonals(x, 4)),
        [[0, 1, 2, 3], [-1, 0, 1, 2], [-2, -1, 0, 1], [-3, -2, -1, 0]],
    )
    # Cross attention, one query decoding at the end of four keys.
    np.testing.assert_array_equal(
        np.asarray(rp.stacked_diagonals(x[:1, :], 4, q_offset=3)), [[-3, -2, -1, 0]]
    )
    # The future-to-past table holds r = 3 .. -3; the layout flips it back.
    np.testing.assert_array_equal(
        np.asarray(rp.stacked_diagonals(xp.flip(x, axis=-1), 4, order="future_to_past")),
        np.asarray(rp.stacked_diagonals(x, 4)),
    )


def test_layout_errors(xp):
    x = xp.zeros((3, 5))
    with pytest.raises(ValueError, match="needs the table to cover every future distance"):
        rp.pad_flatten_reshape(x, 4, offset=2)
    with pytest.raises(ValueError, match=r"`x` must be square"):
        rp.skew(x)
    with pytest.raises(ValueError, match=r"t_k >= t_q"):
        rp.rel_shift(xp.zeros((4, 3)))
    with pytest.raises(ValueError, match="odd width"):
        rp.stacked_diagonals(xp.zeros((2, 4)), 2)
    with pytest.raises(ValueError, match=r"distance -3 is beyond the table \(t_max=3"):
        rp.stacked_diagonals(x, 3, q_offset=1)
    with pytest.raises(ValueError, match=r"`order` must be one of"):
        rp.stacked_diagonals(x, 3, order="backwards")
    with pytest.raises(ValueError, match=r"shape \(\.\.\., t_q, n_rel\)"):
        rp.gather(xp.zeros((3,)), 2, offset=0)
    with pytest.raises(ValueError, match="`t_k` must be >= 0, got -2"):
        rp.gather(x, -2, offset=0)
