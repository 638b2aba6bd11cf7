"""Transformer-XL and DeBERTa against loop definitions from the papers, on every backend."""

from __future__ import annotations

import math

import _reference as ref
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import relpos_ref as rp

TOL = {"float32": {"rtol": 2e-4, "atol": 2e-5}, "float64": {"rtol": 1e-10, "atol": 1e-11}}
dtypes = st.sampled_from(["float32", "float64"])
methods = st.sampled_from(["efficient", "definition"])


def _normal(rng, shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


# -- Transformer-XL ---------------------------------------------------------------


@given(d_model=st.integers(1, 8).map(lambda m: 2 * m), base=st.sampled_from([10000.0, 100.0]))
def test_transformer_xl_embedding_matches_the_loop_definition(backend, d_model, base):
    delta = np.arange(-9, 40)
    got = rp.transformer_xl_embedding(backend.asarray(delta), d_model, dtype=backend.xp.float64,
                                      base=base)
    want = np.stack([ref.sinusoid(int(x), d_model, base) for x in delta])
    np.testing.assert_allclose(backend.to_numpy(got), want, **TOL["float64"])


def test_transformer_xl_distance_is_query_minus_key_clamped(xp):
    got = rp.transformer_xl_distance(2, 6, clamp_len=3, xp=xp)
    assert np.asarray(got).tolist() == [[3, 3, 2, 1, 0, -1], [3, 3, 3, 2, 1, 0]]
    got = rp.transformer_xl_distance(2, 3, q_offset=0, xp=xp)
    assert np.asarray(got).tolist() == [[0, -1, -2], [1, 0, -1]]


@given(
    t_q=st.integers(1, 6), mem=st.integers(0, 6), q_shift=st.one_of(st.none(), st.integers(-3, 3)),
    heads=st.integers(1, 3), per_head=st.booleans(), biases=st.sampled_from(["uv", "u", "v", ""]),
    clamp_len=st.one_of(st.none(), st.integers(0, 5)), causal=st.booleans(), dtype=dtypes,
    method=methods, seed=st.integers(0, 999),
)
def test_transformer_xl_attention_matches_the_reference(
    backend, t_q, mem, q_shift, heads, per_head, biases, clamp_len, causal, dtype, method, seed
):
    rng = np.random.default_rng(seed)
    t_k = t_q + mem
    d, d_model = 4, 6
    q = _normal(rng, (2, heads, t_q, d), dtype)
    k, v = (_normal(rng, (2, heads, t_k, d), dtype) for _ in range(2))
    head = (heads,) if per_head else ()
    w_r = _normal(rng, (*head, d_model, d), dtype, 0.5)
    u = _normal(rng, (*head, d), dtype) if "u" in biases else None
    bv = _normal(rng, (*head, d), dtype) if "v" in biases else None
    q_offset = None if q_shift is None else mem + q_shift
    arrays = [backend.asarray(a) for a in (q, k, v, w_r)]
    extra = [None if a is None else backend.asarray(a) for a in (u, bv)]
    out, w = rp.transformer_xl_attention(
        *arrays, *extra, clamp_len=clamp_len, causal=causal, q_offset=q_offset, method=method,
        return_weights=True,
    )
    offset = mem if q_offset is None else q_offset
    position = ref.transformer_xl_position(q, k, w_r, u, bv, offset, clamp_len)
    s = 1 / math.sqrt(d)
    want_out, want_w = ref.attention(q, k, v, scale=s, bias=s * position, causal=causal,
                                     q_offset=offset)
    np.testing.assert_allclose(backend.to_numpy(w), want_w, **TOL[dtype])
    np.testing.assert_allclose(backend.to_numpy(out), want_out, **TOL[dtype])
    assert out.dtype == getattr(backend.xp, dtype)
    got_position = rp.transformer_xl_logits(*arrays[:2], arrays[3], *extra, q_offset=q_offset,
                                            clamp_len=clamp_len, method=method)
    np.testing.assert_allclose(backend.to_numpy(got_position), position,
                               rtol=TOL[dtype]["rtol"], atol=10 * TOL[dtype]["atol"])


def test_transformer_xl_efficient_path_goes_through_rel_shift(xp, monkeypatch):
    from relpos_ref.schemes import transformer_xl as module

    calls = []
    real = module.rel_shift

    def spy(x):
        calls.append(tuple(x.shape))
        return real(x)

    monkeypatch.setattr(module, "rel_shift", spy)
    rng = np.random.default_rng(0)
    q, k = xp.asarray(rng.standard_normal((3, 4))), xp.asarray(rng.standard_normal((8, 4)))
    rp.transformer_xl_logits(q, k, xp.asarray(rng.standard_normal((6, 4))))
    assert calls == [(3, 3 + 8 - 1)]  # one column per distance, shifted once


def test_transformer_xl_default_is_a_causal_memory(xp):
    rng = np.random.default_rng(3)
    q = xp.asarray(rng.standard_normal((3, 4)))
    k = v = xp.asarray(rng.standard_normal((7, 4)))
    _, w = rp.transformer_xl_attention(q, k, v, xp.asarray(rng.standard_normal((4, 4))),
                                       return_weights=True)
    w = np.asarray(w)
    for i in range(3):  # query i sits at position 4 + i: it sees keys 0 .. 4 + i
        assert np.all(w[i, 5 + i:] == 0) and np.all(w[i, : 5 + i] > 0)


def test_transformer_xl_without_positions_is_plain_attention(xp):
    rng = np.random.default_rng(4)
    q, k, v = (xp.asarray(rng.standard_normal((2, t, 4))) for t in (3, 5, 5))
    got = rp.transformer_xl_attention(q, k, v, xp.zeros((8, 4), dtype=xp.float64), causal=False)
    np.testing.assert_allclose(np.asarray(got), np.asarray(rp.attention(q, k, v)), rtol=1e-13)


@given(shift=st.integers(0, 5), seed=st.integers(0, 99))
def test_transformer_xl_position_terms_depend_only_on_the_distance(xp, shift, seed):
    # Put `shift` extra keys in front and move the queries back by as many positions: every
    # (query, original key) pair keeps its distance, so its terms are unchanged.
    rng = np.random.default_rng(seed)
    q = xp.asarray(rng.standard_normal((4, 4)))
    k = xp.asarray(rng.standard_normal((6, 4)))
    w_r = xp.asarray(rng.standard_normal((6, 4)))
    u, bv = (xp.asarray(rng.standard_normal(4)) for _ in range(2))
    base = rp.transformer_xl_logits(q, k, w_r, u, bv, q_offset=2)
    front = xp.asarray(rng.standard_normal((shift, 4)))
    moved = rp.transformer_xl_logits(q, xp.concat([front, k], axis=0), w_r, u, bv,
                                     q_offset=2 + shift)
    np.testing.assert_allclose(np.asarray(moved[:, shift:]), np.asarray(base), rtol=1e-12,
                               atol=1e-12)


def test_transformer_xl_bad_input(xp):
    q = xp.zeros((2, 4))
    k = v = xp.zeros((3, 4))
    with pytest.raises(ValueError, match=r"`w_r` must have an even, positive number of rows"):
        rp.transformer_xl_attention(q, k, v, xp.zeros((5, 4)))
    with pytest.raises(ValueError, match=r"`w_r` must have width 4"):
        rp.transformer_xl_attention(q, k, v, xp.zeros((6, 3)))
    with pytest.raises(ValueError, match=r"`content_bias` must have 4 rows \(the feature width"):
        rp.transformer_xl_attention(q, k, v, xp.zeros((6, 4)), xp.zeros(3))
    with pytest.raises(ValueError, match=r"`position_bias` has 2 heads"):
        rp.transformer_xl_attention(q, k, v, xp.zeros((6, 4)), None, xp.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"`clamp_len` must be .*, got -1"):
        rp.transformer_xl_attention(q, k, v, xp.zeros((6, 4)), clamp_len=-1)
    with pytest.raises(ValueError, match=r"`method` must be one of"):
        rp.transformer_xl_attention(q, k, v, xp.zeros((6, 4)), method="fast")
    with pytest.raises(ValueError, match=r"`d_model` must be even and positive, got 3"):
        rp.transformer_xl_embedding(xp.asarray([0]), 3, dtype=xp.float64)
    with pytest.raises(TypeError, match=r"`dtype` must be a real floating dtype"):
        rp.transformer_xl_embedding(xp.asarray([0]), 4, dtype=xp.int64)
    q64, k64 = xp.zeros((2, 4), dtype=xp.float64), xp.zeros((3, 4), dtype=xp.float64)
    with pytest.raises(TypeError, match="w_r"):
        rp.transformer_xl_attention(q64, k64, k64, xp.zeros((6, 4), dtype=xp.float32))


def test_transformer_xl_empty_and_single(xp):
    rng = np.random.default_rng(5)
    w_r = xp.asarray(rng.standard_normal((4, 2)))
    q = xp.asarray(rng.standard_normal((1, 2)))
    k = v = xp.asarray(rng.standard_normal((1, 2)))
    out = rp.transformer_xl_attention(q, k, v, w_r)
    np.testing.assert_allclose(np.asarray(out), np.asarray(v), rtol=1e-14)
    none = rp.transformer_xl_attention(xp.zeros((0, 2), dtype=xp.float64), k, v, w_r)
    assert tuple(none.shape) == (0, 2)


# -- DeBERTa ----------------------------------------------------------------------


@given(bucket_size=st.integers(2, 80), extra=st.integers(1, 300))
def test_deberta_bucket_matches_the_loop_definition(backend, bucket_size, extra):
    max_position = bucket_size // 2 + 1 + extra
    r = np.arange(-2 * max_position - 3, 2 * max_position + 4)
    got = rp.deberta_bucket(backend.asarray(r), bucket_size=bucket_size,
                            max_position=max_position)
    want = [ref.deberta_bucket(int(x), bucket_size, max_position) for x in r]
    want = np.clip(want, -bucket_size, bucket_size)
    assert backend.to_numpy(got).tolist() == want.tolist()


def test_deberta_bucket_of_the_v2_defaults(xp):
    r = xp.asarray([-1000, -511, -300, -129, -128, -1, 0, 1, 127, 128, 129, 200, 511, 512])
    got = rp.deberta_bucket(r, bucket_size=256, max_position=512)
    want = [ref.deberta_bucket(int(x), 256, 512) for x in np.asarray(r)]
    assert np.asarray(got).tolist() == np.clip(want, -256, 256).tolist()
    assert np.asarray(got).tolist()[4:10] == [-128, -1, 0, 1, 127, 128]


@given(
    t_q=st.integers(1, 7), t_k=st.integers(1, 9), q_offset=st.integers(-4, 6),
    heads=st.integers(1, 3), per_head=st.booleans(), span=st.integers(1, 6),
    buckets=st.booleans(), terms=st.sampled_from(["both", "c2p", "p2c"]), causal=st.booleans(),
    dtype=dtypes, method=methods, seed=st.integers(0, 999),
)
def test_deberta_attention_matches_the_reference(
    backend, t_q, t_k, q_offset, heads, per_head, span, buckets, terms, causal, dtype, method,
    seed,
):
    rng = np.random.default_rng(seed)
    d = 4
    q = _normal(rng, (2, heads, t_q, d), dtype)
    k, v = (_normal(rng, (2, heads, t_k, d), dtype) for _ in range(2))
    head = (heads,) if per_head else ()
    key_table = _normal(rng, (*head, 2 * span, d), dtype) if terms != "p2c" else None
    query_table = _normal(rng, (*head, 2 * span, d), dtype) if terms != "c2p" else None
    max_position = span // 2 + 3 if buckets and span >= 2 else None
    tables = [None if t is None else backend.asarray(t) for t in (key_table, query_table)]
    out, w = rp.deberta_attention(
        *(backend.asarray(a) for a in (q, k, v)), *tables, max_position=max_position,
        causal=causal, q_offset=q_offset, method=method, return_weights=True,
    )
    position = ref.deberta_position(q, k, key_table, query_table, q_offset, max_position)
    s = 1 / math.sqrt(d * (2 if terms != "both" else 3))
    want_out, want_w = ref.attention(q, k, v, scale=s, bias=s * position, causal=causal,
                                     q_offset=q_offset)
    np.testing.assert_allclose(backend.to_numpy(w), want_w, **TOL[dtype])
    np.testing.assert_allclose(backend.to_numpy(out), want_out, **TOL[dtype])
    assert out.dtype == getattr(backend.xp, dtype)


def test_deberta_index_rows(xp):
    # S = 2: canonical rows for u = -1, 0, 1, 2, read at u = clamp(r) by c2p and p2c alike
    index = rp.deberta_index(3, 4, span=2, xp=xp)
    assert np.asarray(index).tolist() == [[1, 2, 3, 3], [0, 1, 2, 3], [0, 0, 1, 2]]
    index = rp.deberta_index(1, 40, span=8, max_position=32, q_offset=20, xp=xp)
    want = [min(max(ref.deberta_bucket(j - 20, 8, 32), -7), 8) + 7 for j in range(40)]
    assert np.asarray(index)[0].tolist() == want


def test_deberta_default_scale_counts_the_terms(xp):
    rng = np.random.default_rng(6)
    q, k, v = (xp.asarray(rng.standard_normal((4, 8))) for _ in range(3))
    table = xp.asarray(rng.standard_normal((6, 8)))
    for tables, factor in (((table, table), 3), ((table, None), 2), ((None, table), 2)):
        got = rp.deberta_attention(q, k, v, *tables)
        position = rp.deberta_logits(q, k, *tables)
        want = rp.attention(q, k, v, position=position, scale=1 / math.sqrt(8 * factor))
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-13)
    plain = rp.deberta_attention(q, k, v)
    np.testing.assert_allclose(np.asarray(plain), np.asarray(rp.attention(q, k, v)), rtol=1e-13)


def test_deberta_bad_input(xp):
    q = k = v = xp.zeros((3, 4))
    with pytest.raises(ValueError, match=r"`key_table` must have 2 S rows \(even, S >= 1\)"):
        rp.deberta_attention(q, k, v, xp.zeros((5, 4)))
    with pytest.raises(ValueError, match=r"same number of rows, got shapes \(4, 4\) and \(6, 4\)"):
        rp.deberta_attention(q, k, v, xp.zeros((4, 4)), xp.zeros((6, 4)))
    with pytest.raises(ValueError, match=r"`query_table` must have width 4"):
        rp.deberta_attention(q, k, v, None, xp.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"`bucket_size` must be >= 2 for log buckets, got 1"):
        rp.deberta_bucket(xp.asarray([0]), bucket_size=1, max_position=8)
    with pytest.raises(ValueError, match=r"`max_position` must exceed bucket_size // 2 \+ 1 = 3"):
        rp.deberta_attention(q, k, v, xp.zeros((8, 4)), max_position=3)
    with pytest.raises(ValueError, match=r"`method` must be one of"):
        rp.deberta_attention(q, k, v, xp.zeros((8, 4)), method="slow")
