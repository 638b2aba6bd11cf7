"""T5, ALiBi, Swin and RoPE against loop definitions from the papers, on every backend."""

from __future__ import annotations

import _reference as ref
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import relpos_ref as rp

TOL = {"float32": {"rtol": 1e-4, "atol": 1e-5}, "float64": {"rtol": 1e-10, "atol": 1e-12}}
dtypes = st.sampled_from(["float32", "float64"])


def _normal(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


# -- T5 ---------------------------------------------------------------------------


@given(
    num_buckets=st.integers(4, 64),
    max_distance=st.integers(2, 400),
    bidirectional=st.booleans(),
)
def test_t5_bucket_matches_the_loop_definition(backend, num_buckets, max_distance, bidirectional):
    n = num_buckets // 2 if bidirectional else num_buckets
    if max_distance <= n // 2:
        with pytest.raises(ValueError, match="`max_distance` must exceed"):
            rp.t5_bucket_boundaries(num_buckets, max_distance, bidirectional)
        return
    r = np.arange(-3 * max_distance - 5, 3 * max_distance + 6)
    got = rp.t5_bucket(backend.asarray(r), num_buckets=num_buckets,
                       max_distance=max_distance, bidirectional=bidirectional)
    want = [ref.t5_bucket(int(x), num_buckets, max_distance, bidirectional) for x in r]
    assert backend.to_numpy(got).tolist() == want
    assert got.dtype == backend.asarray(r).dtype


def test_t5_bucket_values_of_the_t5_defaults(xp):
    r = xp.asarray([-129, -128, -91, -90, -12, -11, -8, -7, 0, 1, 7, 8, 128])
    got = rp.t5_bucket(r)
    assert [int(x) for x in got] == [15, 15, 15, 14, 9, 8, 8, 7, 0, 17, 23, 24, 31]


@given(
    t_q=st.integers(1, 7), t_k=st.integers(1, 9), q_offset=st.integers(-3, 6),
    heads=st.integers(1, 3), per_head=st.booleans(), bidirectional=st.booleans(),
    causal=st.booleans(), dtype=dtypes, seed=st.integers(0, 999),
)
def test_t5_attention_matches_the_reference(backend, t_q, t_k, q_offset, heads, per_head,
                                            bidirectional, causal, dtype, seed):
    rng = np.random.default_rng(seed)
    q, k, v = (_normal(rng, (2, heads, t, 4), dtype) for t in (t_q, t_k, t_k))
    table = _normal(rng, (heads, 8) if per_head else (8,), dtype)
    out, w = rp.t5_attention(*map(backend.asarray, (q, k, v, table)), q_offset=q_offset,
                             bidirectional=bidirectional, max_distance=6, causal=causal,
                             return_weights=True)

    def bias(h, i, j):
        b = ref.t5_bucket(j - (i + q_offset), 8, 6, bidirectional)
        return float(ref.table_row(table, h, b, scalar=True))

    want_out, want_w, _ = ref.relative_attention(q, k, v, bias_value=bias, scale=1.0,
                                                 causal=causal, q_offset=q_offset)
    np.testing.assert_allclose(backend.to_numpy(out), want_out, **TOL[dtype])
    np.testing.assert_allclose(backend.to_numpy(w), want_w, **TOL[dtype])
    assert out.dtype == getattr(backend.xp, dtype)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_buckets": 3}, r"`num_buckets` must be >= 4 \(bidirectional=True\), got 3"),
        ({"num_buckets": 1, "bidirectional": False}, "`num_buckets` must be >= 2"),
        ({"max_distance": 8}, "`max_distance` must exceed the 8 exact buckets"),
        ({"max_distance": 0}, "`max_distance` must be"),
    ],
)
def test_t5_bad_parameters(kwargs, match):
    import array_api_compat.numpy as xp

    with pytest.raises(ValueError, match=match):
        rp.t5_bucket(xp.asarray([0, 1]), **kwargs)


# -- ALiBi ------------------------------------------------------------------------


@pytest.mark.parametrize("heads", range(1, 20))
def test_alibi_slopes_match_the_paper(heads):
    assert rp.alibi_slopes(heads) == pytest.approx(ref.alibi_slopes(heads), rel=1e-15)


@given(
    t_q=st.integers(1, 7), t_k=st.integers(1, 9), q_offset=st.integers(-3, 6),
    heads=st.integers(1, 6), symmetric=st.booleans(), causal=st.booleans(),
    dtype=dtypes, seed=st.integers(0, 999),
)
def test_alibi_attention_matches_the_reference(backend, t_q, t_k, q_offset, heads, symmetric,
                                               causal, dtype, seed):
    rng = np.random.default_rng(seed)
    q, k, v = (_normal(rng, (2, heads, t, 4), dtype) for t in (t_q, t_k, t_k))
    out, w = rp.alibi_attention(*map(backend.asarray, (q, k, v)), q_offset=q_offset,
                                symmetric=symmetric, causal=causal, return_weights=True)
    m = np.asarray(ref.alibi_slopes(heads), dtype=dtype).astype(np.float64)

    def bias(h, i, j):
        r = j - (i + q_offset)
        return float(m[h] * (-abs(r) if symmetric else r))

    want_out, want_w, _ = ref.relative_attention(q, k, v, bias_value=bias, causal=causal,
                                                 q_offset=q_offset)
    np.testing.assert_allclose(backend.to_numpy(out), want_out, **TOL[dtype])
    np.testing.assert_allclose(backend.to_numpy(w), want_w, **TOL[dtype])


def test_alibi_forms_agree_under_a_causal_mask(xp):
    rng = np.random.default_rng(0)
    q, k, v = (xp.asarray(rng.standard_normal((3, 5, 4))) for _ in range(3))
    a = rp.alibi_attention(q, k, v, causal=True, symmetric=True)
    b = rp.alibi_attention(q, k, v, causal=True, symmetric=False)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-12)


def test_alibi_bad_input(xp):
    with pytest.raises(ValueError, match="`num_heads` must be >= 0, got -1"):
        rp.alibi_slopes(-1)
    with pytest.raises(ValueError, match="head axis at -3"):
        rp.alibi_attention(*(xp.zeros((3, 4)) for _ in range(3)))
    with pytest.raises(ValueError, match=r"`slopes` must have shape \(h,\)"):
        rp.alibi_bias(xp.zeros((2, 2)), 3, 3)


# -- Swin -------------------------------------------------------------------------


@given(wh=st.integers(1, 5), ww=st.integers(1, 5))
def test_swin_index_matches_the_loop_definition(xp, wh, ww):
    got = np.asarray(rp.swin_index(wh, ww, xp=xp))
    n = wh * ww
    want = [[ref.swin_row(wh, ww, a, b) for b in range(n)] for a in range(n)]
    assert got.tolist() == want
    assert (got.min() >= 0 and got.max() == (2 * wh - 1) * (2 * ww - 1) - 1) or n == 1


@given(
    wh=st.integers(1, 4), ww=st.integers(1, 4), heads=st.integers(1, 3), per_head=st.booleans(),
    use_mask=st.booleans(), dtype=dtypes, seed=st.integers(0, 999),
)
def test_swin_attention_matches_the_reference(backend, wh, ww, heads, per_head, use_mask, dtype,
                                              seed):
    rng = np.random.default_rng(seed)
    n = wh * ww
    q, k, v = (_normal(rng, (2, heads, n, 4), dtype) for _ in range(3))
    rows = (2 * wh - 1) * (2 * ww - 1)
    table = _normal(rng, (heads, rows) if per_head else (rows,), dtype)
    mask = rng.random((n, n)) < 0.7 if use_mask else None
    out, w = rp.swin_attention(*map(backend.asarray, (q, k, v, table)), window_height=wh,
                               window_width=ww, mask=None if mask is None else
                               backend.asarray(mask), return_weights=True)

    def bias(h, a, b):
        return float(ref.table_row(table, h, ref.swin_row(wh, ww, a, b), scalar=True))

    want_out, want_w, _ = ref.relative_attention(q, k, v, bias_value=bias, mask=mask)
    np.testing.assert_allclose(backend.to_numpy(out), want_out, **TOL[dtype])
    np.testing.assert_allclose(backend.to_numpy(w), want_w, **TOL[dtype])


def test_swin_bad_input(xp):
    with pytest.raises(ValueError, match=r"must have 15 rows = \(2Wh - 1\)\(2Ww - 1\), got 9"):
        rp.swin_bias(xp.zeros(9), 2, 3)
    with pytest.raises(ValueError, match="`q` must have Wh \\* Ww = 6 tokens"):
        rp.swin_attention(xp.zeros((4, 2)), xp.zeros((6, 2)), xp.zeros((6, 2)), xp.zeros(15),
                          window_height=2, window_width=3)


# -- RoPE -------------------------------------------------------------------------


@given(
    t=st.integers(1, 6), half_dim=st.integers(1, 4), extra=st.integers(0, 3),
    offset=st.integers(-5, 40), layout=st.sampled_from(rp.schemes.rope.ROPE_LAYOUTS),
    base=st.sampled_from([10000.0, 500.0, 1.0]), dtype=dtypes, seed=st.integers(0, 999),
)
def test_rope_rotate_matches_complex_multiplication(backend, t, half_dim, extra, offset, layout,
                                                    base, dtype, seed):
    rng = np.random.default_rng(seed)
    rd = 2 * half_dim
    x = _normal(rng, (2, t, rd + extra), dtype)
    got = rp.rope_rotate(backend.asarray(x), offset=offset, base=base, rotary_dim=rd,
                         layout=layout)
    want = ref.rope_rotate(x, offset, base, rd, layout)
    np.testing.assert_allclose(backend.to_numpy(got), want, rtol=1e-4 if dtype == "float32"
                               else 1e-9, atol=1e-4 if dtype == "float32" else 1e-10)
    assert got.dtype == getattr(backend.xp, dtype)


@given(shift=st.integers(-20, 20), q_offset=st.integers(-4, 4),
       layout=st.sampled_from(rp.schemes.rope.ROPE_LAYOUTS), seed=st.integers(0, 999))
def test_rope_logits_depend_only_on_the_distance(xp, shift, q_offset, layout, seed):
    rng = np.random.default_rng(seed)
    q, k = (xp.asarray(rng.standard_normal((3, 6))) for _ in range(2))

    def logits(offset_q, offset_k):
        a = rp.rope_rotate(q, offset=offset_q, layout=layout, base=100.0)
        b = rp.rope_rotate(k, offset=offset_k, layout=layout, base=100.0)
        return np.asarray(a @ xp.matrix_transpose(b))

    np.testing.assert_allclose(logits(q_offset + shift, shift), logits(q_offset, 0),
                               rtol=1e-9, atol=1e-9)


@given(t_q=st.integers(1, 5), t_k=st.integers(1, 7), q_offset=st.integers(-2, 5),
       causal=st.booleans(), layout=st.sampled_from(rp.schemes.rope.ROPE_LAYOUTS),
       dtype=dtypes, seed=st.integers(0, 999))
def test_rope_attention_matches_the_reference(backend, t_q, t_k, q_offset, causal, layout, dtype,
                                              seed):
    rng = np.random.default_rng(seed)
    q, k, v = (_normal(rng, (2, t, 6), dtype) for t in (t_q, t_k, t_k))
    out = rp.rope_attention(*map(backend.asarray, (q, k, v)), q_offset=q_offset, causal=causal,
                            layout=layout, rotary_dim=4, base=50.0)
    qr = ref.rope_rotate(q, q_offset, 50.0, 4, layout)
    kr = ref.rope_rotate(k, 0, 50.0, 4, layout)
    want, _, _ = ref.relative_attention(qr, kr, v, causal=causal, q_offset=q_offset)
    np.testing.assert_allclose(backend.to_numpy(out), want, **TOL[dtype])


def test_rope_bad_input(xp):
    x = xp.zeros((3, 6))
    msg = r"`rotary_dim` must be even and in 0 .. 6 \(the feature width\), got 5"
    with pytest.raises(ValueError, match=msg):
        rp.rope_rotate(x, rotary_dim=5)
    with pytest.raises(ValueError, match="`layout` must be one of"):
        rp.rope_rotate(x, layout="neox")
    with pytest.raises(ValueError, match="`base` must be > 0"):
        rp.rope_frequencies(4, base=0.0)


@pytest.mark.parametrize("scheme", ["alibi", "kerple", "sandwich"])
def test_no_head_is_an_empty_batch(backend, scheme):
    """Heads derived from q (slopes, ratios): none, as fire, cope and forgetting have it, gives
    an empty output and empty gradients, not an error naming `num_heads`."""
    q = backend.asarray(np.zeros((0, 4, 8)))
    out = getattr(rp, f"{scheme}_attention")(q, q, q)
    grads = getattr(rp, f"{scheme}_attention_vjp")(q, q, q, d_output=q)
    assert tuple(out.shape) == (0, 4, 8)
    assert all(0 in tuple(g.shape) for g in grads.values())
    assert rp.alibi_slopes(0) == () and rp.sandwich_ratios(0) == ()
