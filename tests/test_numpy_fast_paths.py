"""NumPy fast paths equal the standard array-API forms bit for bit."""

from __future__ import annotations

import array_api_compat.numpy as xp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import relpos_ref as rp
from relpos_ref.attention import _compose_in_place, attention
from relpos_ref.layouts import _numpy_add_clipped, _numpy_clipped_bins


@given(
    t_q=st.integers(0, 40),
    t_k=st.integers(0, 40),
    q_offset=st.integers(-45, 45),
    K=st.integers(0, 6),
    block=st.sampled_from([1, 3, 7, 128]),
    batch=st.sampled_from([(), (2,), (2, 3)]),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 99),
)
def test_add_clipped_equals_gather_by_table_index(t_q, t_k, q_offset, K, block, batch, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*batch, t_q, 2 * K + 1)).astype(dtype)
    content = rng.standard_normal((*batch, t_q, t_k)).astype(dtype)
    index = rp.table_index(rp.relative_positions(t_q, t_k, q_offset=q_offset, xp=xp), K).index
    want = content + rp.take_per_row(x, index)
    got = content.copy()
    assert _numpy_add_clipped(got, x, max_distance=K, q_offset=q_offset, block=block)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)


def test_add_clipped_works_on_views_and_declines_what_it_cannot_write():
    x = np.arange(15.0).reshape(3, 5)
    base = np.zeros((3, 8))
    assert _numpy_add_clipped(base[:, ::2], x, max_distance=2, q_offset=0)
    index = rp.table_index(rp.relative_positions(3, 4, xp=xp), 2).index
    np.testing.assert_array_equal(base[:, ::2], rp.take_per_row(x, index))
    assert not base[:, 1::2].any()
    read_only = np.zeros((3, 4))
    read_only.flags.writeable = False
    assert not _numpy_add_clipped(read_only, x, max_distance=2, q_offset=0)
    assert not _numpy_add_clipped([[0.0]], x, max_distance=2, q_offset=0)


@pytest.mark.parametrize(
    ("t_q", "t_k", "q_offset", "causal"),
    [(17, 17, 0, False), (9, 30, 21, True), (12, 5, -3, False)],
)
@pytest.mark.parametrize("per_head", [False, True])
def test_shaw_attention_fast_path_equals_standard_composition(t_q, t_k, q_offset, causal, per_head):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, t_q, 8)).astype(np.float32)
    k = rng.standard_normal((2, 3, t_k, 8)).astype(np.float32)
    v = rng.standard_normal((2, 3, t_k, 4)).astype(np.float32)
    table = rng.standard_normal((3, 9, 8) if per_head else (9, 8)).astype(np.float32)
    position = rp.shaw_logits(q, table, t_k, q_offset=q_offset)
    want_out, want_w = attention(
        q, k, v, position=position, causal=causal, q_offset=q_offset, return_weights=True
    )
    out, w = rp.shaw_attention(
        q, k, v, table, causal=causal, q_offset=q_offset, return_weights=True
    )
    np.testing.assert_array_equal(w, want_w)
    np.testing.assert_array_equal(out, want_out)


@given(
    t_q=st.integers(0, 40),
    t_k=st.integers(0, 40),
    q_offset=st.integers(-45, 45),
    low=st.integers(-6, 0),
    high=st.integers(0, 6),
    block=st.sampled_from([1, 3, 7, 32]),
    batch=st.sampled_from([(), (2,), (2, 3)]),
    fortran=st.booleans(),
    seed=st.integers(0, 99),
)
def test_clipped_bins_equal_the_standard_bins(
    t_q, t_k, q_offset, low, high, block, batch, fortran, seed
):
    rng = np.random.default_rng(seed)
    weights = rng.random((*batch, t_q, t_k))
    if fortran:  # not C-contiguous: the band goes through to_relative
        weights = np.asfortranarray(weights)
    got = _numpy_clipped_bins(weights, low=low, high=high, q_offset=q_offset, block=block)
    # The standard form, written out: to_relative for the band, masked sums for the ends.
    n = high - low + 1
    r = np.arange(t_k)[None, :] - (np.arange(t_q)[:, None] + q_offset)
    want = np.asarray(rp.to_relative(weights, n, offset=-low, q_offset=q_offset)).copy()
    want[..., 0] += np.sum(np.where(r < low, weights, 0.0), axis=-1)
    want[..., n - 1] += np.sum(np.where(r > high, weights, 0.0), axis=-1)
    assert got.shape == (*batch, t_q, n)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_clipped_bins_decline_other_libraries():
    assert _numpy_clipped_bins([[0.5]], low=-1, high=1, q_offset=0) is None


@pytest.mark.parametrize("terms", ["position", "bias", "both", "none"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_blockwise_in_place_composition_equals_compose_logits(terms, dtype):
    # 300 rows of 2 x 1000 entries: several row blocks of about 1 MiB.
    rng = np.random.default_rng(1)
    content = rng.standard_normal((2, 300, 1000)).astype(dtype)
    position = rng.standard_normal(content.shape).astype(dtype)
    bias = rng.standard_normal(content.shape).astype(dtype)
    position = position if terms in ("position", "both") else None
    bias = bias if terms in ("bias", "both") else None
    want = rp.compose_logits(content, scale=0.125, position=position, bias=bias)
    got = _compose_in_place(content.copy(), scale=0.125, position=position, bias=bias)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)
