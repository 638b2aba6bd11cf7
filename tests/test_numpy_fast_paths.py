"""NumPy fast paths equal the standard array-API forms.

Bit for bit where they do the same operations (`softmax_of_terms`), to
rounding where they reorder them (the fused Shaw softmax, the blocked
general logits, the clipped bins): float64 inputs, ``rtol = 1e-12``.
"""

from __future__ import annotations

from unittest import mock

import array_api_compat.numpy as xp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import relpos_ref as rp
from relpos_ref import _numpy_softmax
from relpos_ref._numpy_softmax import clipped_table_softmax, softmax_of_terms
from relpos_ref.layouts import _numpy_clipped_bins
from relpos_ref.schemes._tables import bias_by_distance, numpy_block_logits


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


def _blocks_of(nbytes: int):
    # Row blocks of about `nbytes` (the library uses 1 MiB): several blocks in small tests.
    return mock.patch.object(_numpy_softmax, "_BLOCK_BYTES", nbytes)


def _standard_softmax(content, *, scale, position=None, bias=None, allowed=None):
    logits = rp.compose_logits(content, scale=scale, position=position, bias=bias)
    return rp.masked_softmax(logits, allowed=allowed)


@given(
    batch=st.sampled_from([(), (3,), (2, 3)]),
    t_q=st.integers(0, 12),
    t_k=st.integers(0, 12),
    terms=st.sampled_from(["none", "position", "bias", "both", "row position"]),
    mask=st.sampled_from(["none", "full", "shared", "causal with empty rows"]),
    block_bytes=st.sampled_from([1, 40, 2**20]),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 99),
)
def test_softmax_of_terms_equals_the_standard_forms_bit_for_bit(
    batch, t_q, t_k, terms, mask, block_bytes, dtype, seed
):
    rng = np.random.default_rng(seed)
    shape = (*batch, t_q, t_k)
    content = rng.standard_normal(shape).astype(dtype)
    content[..., ::5, ::3] = -np.inf  # masked-looking logits must behave the same
    position = rng.standard_normal(shape).astype(dtype)
    if terms == "row position":  # broadcast along the batch
        position = position[(0,) * len(batch)]
    bias = rng.standard_normal(shape[-2:]).astype(dtype)
    position = position if terms in ("position", "both", "row position") else None
    bias = bias if terms in ("bias", "both") else None
    allowed = {
        "none": None,
        "full": rng.random(shape) < 0.7,
        "shared": rng.random((t_q, t_k)) < 0.5,
        "causal with empty rows": np.arange(t_k)[None, :] <= np.arange(t_q)[:, None] - 2,
    }[mask]
    want = _standard_softmax(content, scale=0.3, position=position, bias=bias, allowed=allowed)
    with _blocks_of(block_bytes):
        got = softmax_of_terms(
            content.copy(), scale=0.3, position=position, bias=bias, allowed=allowed
        )
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)


def test_softmax_of_terms_position_rows_are_asked_for_block_by_block():
    rng = np.random.default_rng(2)
    content = rng.standard_normal((2, 9, 5))
    position = rng.standard_normal((2, 9, 5))
    asked = []

    def rows(a, b):
        asked.append((a, b))
        return position[..., a:b, :]

    with _blocks_of(2 * 5 * 8 * 4):  # four rows of both batch entries
        got = softmax_of_terms(content.copy(), scale=0.5, position_rows=rows)
    assert asked == [(0, 4), (4, 8), (8, 9)]
    np.testing.assert_array_equal(got, _standard_softmax(content, scale=0.5, position=position))


def test_softmax_of_terms_declines_what_it_cannot_overwrite():
    x = np.zeros((3, 4))
    read_only = x.copy()
    read_only.flags.writeable = False
    assert softmax_of_terms(read_only, scale=1.0) is None
    assert softmax_of_terms(np.asfortranarray(np.zeros((3, 4))), scale=1.0) is None
    assert softmax_of_terms([[0.0]], scale=1.0) is None
    # a term that would broadcast the scores to a larger shape
    assert softmax_of_terms(x.copy(), scale=1.0, bias=np.zeros((2, 3, 4))) is None
    assert softmax_of_terms(x.copy(), scale=1.0, allowed=np.ones((2, 3, 4), bool)) is None


def _standard_shaw(content, x, *, k_max, q_offset, scale, allowed):
    t_q, t_k = content.shape[-2:]
    index = rp.table_index(rp.relative_positions(t_q, t_k, q_offset=q_offset, xp=xp), k_max)
    position = rp.take_per_row(x, index.index)
    weights = _standard_softmax(content, scale=scale, position=position, allowed=allowed)
    r = np.arange(t_k)[None, :] - (np.arange(t_q)[:, None] + q_offset)
    n = 2 * k_max + 1
    bins = np.asarray(rp.to_relative(weights, n, offset=k_max, q_offset=q_offset)).copy()
    bins[..., 0] += np.sum(np.where(r < -k_max, weights, 0.0), axis=-1)
    bins[..., n - 1] += np.sum(np.where(r > k_max, weights, 0.0), axis=-1)
    return weights, bins


@given(
    batch=st.sampled_from([(), (2,), (2, 3)]),
    shared_table=st.booleans(),
    t_q=st.integers(1, 30),
    t_k=st.integers(1, 30),
    q_offset=st.integers(-40, 40),
    k_max=st.integers(0, 6),
    mask=st.sampled_from(["none", "random", "causal"]),
    block_bytes=st.sampled_from([1, 300, 2**20]),
    scale=st.sampled_from([0.25, 1.0, -0.5]),
    seed=st.integers(0, 99),
)
def test_clipped_table_softmax_equals_the_standard_composition_and_bins(
    batch, shared_table, t_q, t_k, q_offset, k_max, mask, block_bytes, scale, seed
):
    n = 2 * k_max + 1
    rng = np.random.default_rng(seed)
    content = rng.standard_normal((*batch, t_q, t_k)) * 3
    x = rng.standard_normal((*batch[-1:], t_q, n) if not shared_table else (t_q, n)) * 3
    allowed = {
        "none": None,
        "random": rng.random((t_q, t_k)) < 0.6,
        "causal": rp.allowed_keys(t_q, t_k, causal=True, q_offset=q_offset, xp=xp),
    }[mask]
    with _blocks_of(block_bytes):
        fused = clipped_table_softmax(
            content.copy(),
            x,
            max_distance=k_max,
            q_offset=q_offset,
            scale=scale,
            allowed=allowed,
            bins=True,
        )
    if n > t_k:  # a band wider than the keys: the caller takes the standard path
        assert fused is None
        return
    weights, bins = fused
    want_w, want_bins = _standard_shaw(
        content, x, k_max=k_max, q_offset=q_offset, scale=scale, allowed=allowed
    )
    np.testing.assert_allclose(weights, want_w, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(bins, want_bins, rtol=1e-12, atol=1e-15)
    if allowed is not None:  # no weight, and nothing binned, where a key is masked
        assert not np.any(weights[..., ~allowed])


def test_clipped_table_softmax_without_bins_and_in_float32():
    rng = np.random.default_rng(3)
    content = rng.standard_normal((8, 100, 90)).astype(np.float32)
    x = rng.standard_normal((8, 100, 9)).astype(np.float32)
    weights, bins = clipped_table_softmax(
        content.copy(), x, max_distance=4, q_offset=-5, scale=0.125
    )
    assert bins is None
    assert weights.dtype == np.float32
    want, _ = _standard_shaw(content, x, k_max=4, q_offset=-5, scale=0.125, allowed=None)
    np.testing.assert_allclose(weights, want, rtol=2e-6, atol=1e-8)


def test_clipped_table_softmax_declines_and_leaves_the_scores_alone():
    content = np.zeros((4, 6))
    x = np.zeros((4, 5))  # K = 2
    kwargs = {"max_distance": 2, "q_offset": 0, "scale": 1.0}
    assert clipped_table_softmax(content[:, :4].copy(), x, **kwargs) is None  # 5 > t_k = 4
    assert clipped_table_softmax(content, np.full((4, 5), np.inf), **kwargs) is None
    assert clipped_table_softmax(content, np.full((4, 5), 1e308), **kwargs) is None  # overflow
    assert clipped_table_softmax(np.asfortranarray(np.zeros((6, 4)).T), x, **kwargs) is None
    assert clipped_table_softmax(content, x, allowed=np.ones((2, 4, 6), bool), **kwargs) is None
    assert clipped_table_softmax(content, np.zeros((4, 7)), **kwargs) is None  # not 2K + 1
    assert not content.any()


@given(
    batch=st.sampled_from([(), (3,), (2, 3)]),
    shared_table=st.booleans(),
    t_q=st.integers(1, 20),
    t_k=st.integers(1, 20),
    q_offset=st.integers(-10, 10),
    extra=st.integers(0, 5),
    order=st.sampled_from(["past_to_future", "future_to_past"]),
    seed=st.integers(0, 99),
)
def test_block_logits_equal_general_logits(
    batch, shared_table, t_q, t_k, q_offset, extra, order, seed
):
    # the smallest table general_logits accepts here, plus `extra` rows each side
    reach = max(abs(-(t_q - 1) - q_offset), abs(t_k - 1 - q_offset))
    t_max = max(reach + 1, t_q, t_k) + extra
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((*batch, t_q, 4))
    heads = batch[-1:] if batch else (1,)
    table = rng.standard_normal((2 * t_max - 1, 4) if shared_table else (*heads, 2 * t_max - 1, 4))
    if not shared_table and not batch:
        q = q[None]
    want = rp.general_logits(q, table, t_k, q_offset=q_offset, order=order)
    # past to future: row c holds r = c - (t_max - 1); the other order, reversed
    ordered = table if order == "past_to_future" else table[..., ::-1, :]
    rows = numpy_block_logits(q, ordered, t_k, q_offset=q_offset, low=1 - t_max)
    for a, b in ((0, t_q), (0, 1), (t_q - 1, t_q), (t_q // 2, t_q)):
        np.testing.assert_allclose(rows(a, b), want[..., a:b, :], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    ("t_q", "t_k", "q_offset", "causal", "k_max"),
    [(17, 17, 0, False, 4), (9, 30, 21, True, 4), (12, 5, -3, False, 4), (40, 70, -50, False, 2)],
)
@pytest.mark.parametrize("per_head", [False, True])
def test_shaw_attention_fast_path_equals_standard_composition(
    t_q, t_k, q_offset, causal, k_max, per_head
):
    # (12, 5): the band of 9 is wider than the 5 keys, so the fused softmax declines and
    # shaw_attention composes the standard way on its own scores.
    rng = np.random.default_rng(0)
    n = 2 * k_max + 1
    q = rng.standard_normal((2, 3, t_q, 8))
    k = rng.standard_normal((2, 3, t_k, 8))
    v = rng.standard_normal((2, 3, t_k, 4))
    key_table = rng.standard_normal((3, n, 8) if per_head else (n, 8))
    value_table = rng.standard_normal((3, n, 4) if per_head else (n, 4))
    position = rp.shaw_logits(q, key_table, t_k, q_offset=q_offset)
    want_out, want_w = rp.attention(
        q, k, v, position=position, causal=causal, q_offset=q_offset, return_weights=True
    )
    want_out = want_out + rp.shaw_values(want_w, value_table, q_offset=q_offset)
    out, w = rp.shaw_attention(
        q, k, v, key_table, value_table, causal=causal, q_offset=q_offset, return_weights=True
    )
    np.testing.assert_allclose(w, want_w, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("order", ["past_to_future", "future_to_past"])
@pytest.mark.parametrize("per_head", [False, True])
def test_general_attention_fast_path_equals_standard_composition(order, per_head):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 3, 11, 8))
    k = rng.standard_normal((2, 3, 14, 8))
    v = rng.standard_normal((2, 3, 14, 4))
    table = rng.standard_normal((3, 2 * 16 - 1, 8) if per_head else (2 * 16 - 1, 8))
    position = rp.general_logits(q, table, 14, q_offset=2, order=order)
    want = rp.attention(q, k, v, position=position, q_offset=2, causal=True)
    got = rp.general_attention(q, k, v, table, q_offset=2, causal=True, order=order)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


@given(
    t_q=st.integers(0, 12),
    t_k=st.integers(0, 12),
    q_offset=st.integers(-15, 15),
    heads=st.sampled_from([None, 3]),
    scheme=st.sampled_from(["bias clip", "bias zero", "t5", "t5 causal", "alibi", "alibi causal"]),
    seed=st.integers(0, 99),
)
def test_bias_by_distance_lays_out_the_full_evaluation_bit_for_bit(
    t_q, t_k, q_offset, heads, scheme, seed
):
    rng = np.random.default_rng(seed)
    lead = () if heads is None else (heads,)
    table = rng.standard_normal((*lead, 7))
    slopes = rng.random(heads or 2)

    def of_grid(t_q, t_k, offset):
        name, _, variant = scheme.partition(" ")
        if name == "bias":
            return rp.bias_logits(table, t_q, t_k, q_offset=offset, beyond=variant)
        if name == "t5":
            return rp.t5_bias(
                table, t_q, t_k, q_offset=offset, max_distance=6, bidirectional=not variant
            )
        return rp.alibi_bias(slopes, t_q, t_k, q_offset=offset, symmetric=not variant)

    got = bias_by_distance(of_grid, table, t_q, t_k, q_offset)
    want = of_grid(t_q, t_k, q_offset)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    if t_q > 1 and t_k > 0:  # a view of one row of distances, not a (t_q, t_k) array
        assert got.strides[-2] < 0 and not got.flags.writeable


def test_bias_by_distance_keeps_the_error_policy_and_other_libraries():
    table = np.zeros(5)  # K = 2

    def of_grid(t_q, t_k, offset):
        return rp.bias_logits(table, t_q, t_k, q_offset=offset, beyond="error")

    with pytest.raises(ValueError, match=r"distance -3 is beyond the table \(max_distance=2"):
        bias_by_distance(of_grid, table, 4, 4, 0)
    calls = []

    def of_list_grid(t_q, t_k, offset):
        calls.append((t_q, t_k, offset))
        return [[0.0] * t_k] * t_q

    assert bias_by_distance(of_list_grid, [0.0], 2, 3, 1) == [[0.0] * 3] * 2
    assert calls == [(2, 3, 1)]  # not NumPy: the full grid, evaluated once


@given(
    t_q=st.integers(1, 14),
    extra_keys=st.integers(0, 6),
    length=st.integers(1, 20),
    causal=st.booleans(),
    per_head=st.booleans(),
    beyond=st.sampled_from(["clip", "zero"]),
    seed=st.integers(0, 99),
)
def test_music_window_path_equals_standard_composition(
    t_q, extra_keys, length, causal, per_head, beyond, seed
):
    # End-aligned queries (the scheme's efficient path); the window path runs when the
    # table covers at least half the keys, the skew otherwise: both must agree.
    t_k = t_q + extra_keys
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, 3, t_q, 8))
    k = rng.standard_normal((2, 3, t_k, 8))
    v = rng.standard_normal((2, 3, t_k, 4))
    table = rng.standard_normal((3, length, 8) if per_head else (length, 8))
    position = rp.music_logits(q, table, t_k, q_offset=t_k - t_q, beyond=beyond)
    want = rp.attention(q, k, v, position=position, causal=causal, q_offset=t_k - t_q)
    got = rp.music_attention(q, k, v, table, causal=causal, q_offset=t_k - t_q, beyond=beyond)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


@given(
    t_q=st.integers(1, 10),
    memory=st.integers(0, 6),
    shift=st.integers(-3, 3),
    causal=st.booleans(),
    per_head=st.booleans(),
    biases=st.sampled_from(["both", "content", "position", "none"]),
    clamp_len=st.sampled_from([None, 0, 3]),
    seed=st.integers(0, 99),
)
def test_transformer_xl_block_path_equals_standard_composition(
    t_q, memory, shift, causal, per_head, biases, clamp_len, seed
):
    t_k = t_q + memory
    q_offset = memory + shift
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, 3, t_q, 8))
    k = rng.standard_normal((2, 3, t_k, 8))
    v = rng.standard_normal((2, 3, t_k, 4))
    w_r = rng.standard_normal((3, 6, 8) if per_head else (6, 8))
    u = rng.standard_normal((3, 8)) if biases in ("both", "content") else None
    bv = rng.standard_normal(8) if biases in ("both", "position") else None
    terms = rp.transformer_xl_logits(q, k, w_r, u, bv, q_offset=q_offset, clamp_len=clamp_len)
    want = rp.attention(q, k, v, position=terms, causal=causal, q_offset=q_offset)
    got = rp.transformer_xl_attention(
        q, k, v, w_r, u, bv, causal=causal, q_offset=q_offset, clamp_len=clamp_len
    )
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
