"""Softmax attention against the loop definition, on every backend."""

from __future__ import annotations

import _reference as ref
import array_api_compat
import numpy as np
import pytest
from conftest import FLOAT_TOLERANCE
from hypothesis import given
from hypothesis import strategies as st

import relpos_ref as rp

batches = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)


def _floats(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


@given(
    batch=batches,
    t_q=st.integers(0, 6),
    t_k=st.integers(0, 6),
    d=st.integers(1, 5),
    d_v=st.integers(1, 4),
    causal=st.booleans(),
    q_offset=st.integers(-3, 5),
    use_mask=st.booleans(),
    use_bias=st.booleans(),
    scale=st.sampled_from([None, 1.0, 0.3]),
    dtype=st.sampled_from(["float32", "float64"]),
    seed=st.integers(0, 999),
)
def test_attention_matches_definition(
    backend, batch, t_q, t_k, d, d_v, causal, q_offset, use_mask, use_bias, scale, dtype, seed
):
    rng = np.random.default_rng(seed)
    q = _floats(rng, (*batch, t_q, d), dtype)
    k = _floats(rng, (t_k, d), dtype)  # shared across the batch: broadcasting
    v = _floats(rng, (*batch, t_k, d_v), dtype)
    mask = rng.random((t_q, t_k)) < 0.7 if use_mask else None
    bias = _floats(rng, (t_q, t_k), dtype) if use_bias else None
    out, weights = rp.attention(
        backend.asarray(q),
        backend.asarray(k),
        backend.asarray(v),
        scale=scale,
        mask=None if mask is None else backend.asarray(mask),
        causal=causal,
        q_offset=q_offset,
        bias=None if bias is None else backend.asarray(bias),
        return_weights=True,
    )
    want_out, want_w = ref.attention(
        q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset, bias=bias
    )
    xp = backend.xp
    assert out.dtype == getattr(xp, dtype) and weights.dtype == getattr(xp, dtype)
    assert array_api_compat.device(out) == backend.native_device()
    assert out.shape == (*batch, t_q, d_v)
    tol = FLOAT_TOLERANCE[dtype]
    np.testing.assert_allclose(backend.to_numpy(out), want_out, **tol)
    np.testing.assert_allclose(backend.to_numpy(weights), want_w, **tol)


def test_empty_rows_are_zero_not_nan(backend, xp):
    q = backend.asarray(np.ones((3, 2)))
    k = backend.asarray(np.ones((4, 2)))
    v = backend.asarray(np.arange(8.0).reshape(4, 2))
    mask = np.ones((3, 4), dtype=bool)
    mask[1] = False
    out, w = rp.attention(q, k, v, mask=backend.asarray(mask), return_weights=True)
    out, w = backend.to_numpy(out), backend.to_numpy(w)
    assert np.isfinite(out).all() and np.isfinite(w).all()
    np.testing.assert_array_equal(out[1], 0.0)
    np.testing.assert_array_equal(w[1], 0.0)
    np.testing.assert_allclose(w[[0, 2]].sum(axis=-1), 1.0)
    # A query before every key (causal, q_offset = -1) has nothing to attend to.
    out = backend.to_numpy(rp.attention(q, k, v, causal=True, q_offset=-1))
    np.testing.assert_array_equal(out[0], 0.0)
    # All allowed logits -inf through the bias: also an empty row.
    bias = np.zeros((3, 4))
    bias[2] = -np.inf
    out = backend.to_numpy(rp.attention(q, k, v, bias=backend.asarray(bias)))
    np.testing.assert_array_equal(out[2], 0.0)


def test_no_keys_gives_zero_output(backend):
    q = backend.asarray(np.ones((2, 3, 4), dtype=np.float32))
    k = backend.asarray(np.ones((2, 0, 4), dtype=np.float32))
    v = backend.asarray(np.ones((2, 0, 5), dtype=np.float32))
    out = rp.attention(q, k, v)
    assert out.shape == (2, 3, 5)
    np.testing.assert_array_equal(backend.to_numpy(out), 0.0)


def test_large_logits_are_stable(backend):
    q = backend.asarray(np.full((2, 1), 1000.0, dtype=np.float32))
    k = backend.asarray(np.asarray([[1000.0], [999.0]], dtype=np.float32))
    v = backend.asarray(np.asarray([[1.0], [0.0]], dtype=np.float32))
    out = backend.to_numpy(rp.attention(q, k, v, scale=1.0))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, 1.0)


def test_float16_keeps_dtype(backend, xp):
    if not hasattr(xp, "float16"):
        pytest.skip(f"{backend.id} has no float16 (it is not in the array API standard)")
    rng = np.random.default_rng(0)
    q, k, v = (_floats(rng, (4, 8), "float16") for _ in range(3))
    out = rp.attention(backend.asarray(q), backend.asarray(k), backend.asarray(v), causal=True)
    assert out.dtype == xp.float16
    want, _ = ref.attention(q, k, v, causal=True)
    np.testing.assert_allclose(
        backend.to_numpy(out).astype(np.float64), want, **FLOAT_TOLERANCE["float16"]
    )


def test_bad_input(backend, xp):
    f = backend.asarray(np.ones((3, 4)))
    with pytest.raises(TypeError, match="`q` must have a real floating dtype"):
        rp.attention(backend.asarray(np.ones((3, 4), dtype=np.int64)), f, f)
    with pytest.raises(TypeError, match="no silent upcast"):
        rp.attention(backend.asarray(np.ones((3, 4), dtype=np.float32)), f, f)
    with pytest.raises(ValueError, match="share the feature size"):
        rp.attention(f, backend.asarray(np.ones((3, 5))), f)
    with pytest.raises(ValueError, match="same number of keys"):
        rp.attention(f, f, backend.asarray(np.ones((2, 4))))
    with pytest.raises(ValueError, match="shapes do not broadcast"):
        rp.attention(backend.asarray(np.ones((2, 3, 4))), backend.asarray(np.ones((3, 3, 4))), f)
    with pytest.raises(TypeError, match="`mask` must be a bool array"):
        rp.attention(f, f, f, mask=backend.asarray(np.ones((3, 3))))
    with pytest.raises(ValueError, match="`scale` must be a real number"):
        rp.attention(f, f, f, scale="0.5")
    with pytest.raises(ValueError, match="`q_offset` must be an integer"):
        rp.attention(f, f, f, causal=True, q_offset=0.5)
    with pytest.raises(ValueError, match=r"shapes do not broadcast: `bias` \(2, 3\)"):
        rp.attention(f, f, f, bias=backend.asarray(np.ones((2, 3))))
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        rp.attention(backend.asarray(np.ones(4)), f, f)


def test_mixed_namespaces_are_named():
    torch = pytest.importorskip("torch")
    q = np.ones((3, 4))
    with pytest.raises(TypeError, match=r"different libraries: `q` \(numpy\), `k` \(torch\), "
                                        r"`v` \(numpy\); convert"):
        rp.attention(q, torch.ones((3, 4), dtype=torch.float64), q)
    with pytest.raises(TypeError, match=r"different libraries: .*`mask` \(torch\)"):
        rp.attention(q, q, q, mask=torch.ones((3, 3), dtype=torch.bool))
    with pytest.raises(TypeError, match=r"different libraries: .*`table` \(torch\)"):
        rp.bias_attention(q, q, q, torch.zeros(3, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"`r1` must be an array of the call's library, got 1.0 "
                                        r"of type float"):
        rp.kerple_attention(q[None], q[None], q[None], r1=1.0)


def test_compose_logits_scales_content_and_position_not_bias(xp):
    content = xp.asarray([[2.0, 4.0]])
    position = xp.asarray([[1.0, 1.0]])
    bias = xp.asarray([[10.0, 20.0]])
    got = rp.compose_logits(content, scale=0.5, position=position, bias=bias)
    np.testing.assert_allclose(np.asarray(got), [[11.5, 22.5]])
