"""The blocked evaluation equals the unblocked functions for every scheme, on every backend."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import relpos_ref as rp
from relpos_ref.blocked import BLOCKED_SCHEMES, blocked_attention

H, D = 2, 4


def _case(name, rng, t_q, t_k):
    """(tables, params, unblocked function of (q, k, v, tables, **kw)) for one scheme."""
    def normal(*shape):
        return rng.standard_normal(shape)

    if name == "plain":
        return (), {}, lambda q, k, v, **kw: rp.attention(q, k, v, **kw)
    if name == "absolute":
        return (normal(t_k + 2, D),), {}, rp.absolute_attention
    if name == "shaw":
        return (normal(H, 7, D), normal(7, D)), {"beyond": "zero"}, rp.shaw_attention
    if name == "bias":
        return (normal(H, 5),), {}, rp.bias_attention
    if name == "music":  # the definition: the skew cannot take t_q > t_k
        return (normal(4, D), normal(4, D)), {}, \
            lambda *a, **kw: rp.music_attention(*a, method="definition", **kw)
    if name == "general":
        t_max = t_q + t_k + 8
        return (normal(2 * t_max - 1, D),), {"order": "future_to_past"}, rp.general_attention
    if name == "t5":
        return (normal(H, 16),), {"max_distance": 9}, rp.t5_attention
    if name == "alibi":
        return (), {"symmetric": False}, lambda q, k, v, **kw: rp.alibi_attention(q, k, v, **kw)
    if name == "forgetting":  # gates for every position a shifted query can take
        return (normal(H, t_q + t_k + 4),), {}, rp.forgetting_attention
    if name == "fire":  # L = 4: queries past the threshold are normalised by their position
        return (normal(5, 1), normal(5), normal(H, 5)), {"c": 0.3, "L": 4.0}, rp.fire_attention
    if name == "kerple":
        return (), {"kernel": "log"}, lambda q, k, v, **kw: rp.kerple_attention(q, k, v, **kw)
    if name == "sandwich":
        return (), {"d_bar": 16}, lambda q, k, v, **kw: rp.sandwich_attention(q, k, v, **kw)
    if name == "rope":
        return (), {"rotary_dim": 2}, lambda q, k, v, **kw: rp.rope_attention(q, k, v, **kw)
    if name == "xpos":
        return (), {"scale_base": 8.0}, lambda q, k, v, **kw: rp.xpos_attention(q, k, v, **kw)
    if name == "transformer_xl":
        return (normal(H, 6, D), normal(D), normal(H, D)), {"clamp_len": 4}, \
            rp.transformer_xl_attention
    if name == "deberta":
        return (normal(8, D), normal(8, D)), {"max_position": 6}, rp.deberta_attention
    raise AssertionError(name)


ONE_DIMENSIONAL = [s for s in BLOCKED_SCHEMES if s not in ("grid2d", "swin", "swinv2")]


@pytest.mark.parametrize("name", ONE_DIMENSIONAL)
@settings(max_examples=max(4, settings.default.max_examples // 3))
@given(
    t_q=st.integers(1, 9), t_k=st.integers(1, 9), shift=st.integers(-3, 3),
    block=st.integers(2, 6), causal=st.booleans(), masked=st.booleans(),
    dtype=st.sampled_from(["float32", "float64"]), seed=st.integers(0, 999),
)
def test_blocked_equals_unblocked(backend, name, t_q, t_k, shift, block, causal, masked, dtype,
                                  seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((H, t_q, D)).astype(dtype)
    k, v = (rng.standard_normal((H, t_k, D)).astype(dtype) for _ in range(2))
    tables, params, unblocked = _case(name, rng, t_q, t_k)
    q_offset = max(t_k - t_q, 0) + shift
    if name == "music":
        causal = True
        q_offset = t_k - t_q  # music's default path (the skew) needs end alignment
    if name == "forgetting":
        causal = True  # causal only
    mask = rng.random((t_q, t_k)) < 0.7 if masked else None
    arrays = [backend.asarray(a) for a in (q, k, v)]
    tabs = [backend.asarray(t.astype(dtype)) for t in tables]
    extra = {} if mask is None else {"mask": backend.asarray(mask)}
    want = unblocked(*arrays, *tabs, causal=causal, q_offset=q_offset, **params, **extra)
    got = blocked_attention(*arrays, *tabs, scheme=name, block_size=block, causal=causal,
                            q_offset=q_offset, **params, **extra)
    tol = {"float32": 2e-5, "float64": 1e-12}[dtype]
    np.testing.assert_allclose(backend.to_numpy(got), backend.to_numpy(want), rtol=tol,
                               atol=tol)
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape)


@pytest.mark.parametrize("block", [5, 64])
def test_blocked_grid_and_window_schemes(backend, block):
    rng = np.random.default_rng(block)
    q, k, v = (backend.asarray(rng.standard_normal((H, 12, D))) for _ in range(3))
    rows, cols = (backend.asarray(rng.standard_normal((H, n, D))) for n in (5, 7))
    want = rp.grid2d_attention(q, k, v, rows, cols, height=3, width=4)
    got = blocked_attention(q, k, v, rows, cols, scheme="grid2d", height=3, width=4,
                            block_size=block)
    np.testing.assert_allclose(backend.to_numpy(got), backend.to_numpy(want), rtol=1e-12)
    table = backend.asarray(rng.standard_normal((H, 5 * 7)))
    want = rp.swin_attention(q, k, v, table, window_height=3, window_width=4)
    got = blocked_attention(q, k, v, table, scheme="swin", window_height=3, window_width=4,
                            block_size=block)
    np.testing.assert_allclose(backend.to_numpy(got), backend.to_numpy(want), rtol=1e-12)
    w1, b1, w2 = (backend.asarray(rng.standard_normal(s)) for s in ((H, 5, 2), (H, 5), (5,)))
    mask = backend.asarray(rng.random((12, 12)) > 0.3)
    want = rp.swinv2_attention(q, k, v, w1, b1, w2, window_height=3, window_width=4, mask=mask)
    got = blocked_attention(q, k, v, w1, b1, w2, scheme="swinv2", window_height=3,
                            window_width=4, mask=mask, block_size=block)
    np.testing.assert_allclose(backend.to_numpy(got), backend.to_numpy(want), rtol=1e-12)


@pytest.mark.parametrize("name", ["logit_scale", "mask_penalty"])
def test_blocked_swinv2_refuses_cosine_attention_and_an_additive_mask(name):
    # a tile would read neither: the call is refused rather than evaluated without it
    x = np.zeros((4, 2))
    value = np.asarray(1.0) if name == "logit_scale" else -100.0
    with pytest.raises(ValueError, match=f"`{name}` must be None, got"):
        blocked_attention(x, x, x, np.zeros((3, 2)), np.zeros(3), np.zeros(3), scheme="swinv2",
                          window_height=2, window_width=2, block_size=2, **{name: value})


def test_blocked_defaults_follow_each_scheme(xp):
    rng = np.random.default_rng(3)
    q = xp.asarray(rng.standard_normal((3, 4)))
    k = v = xp.asarray(rng.standard_normal((7, 4)))
    w_r = xp.asarray(rng.standard_normal((6, 4)))
    # transformer_xl: causal, queries after the memory; t5: unscaled; music: causal
    got = blocked_attention(q, k, v, w_r, scheme="transformer_xl", block_size=2)
    np.testing.assert_allclose(np.asarray(got), np.asarray(rp.transformer_xl_attention(
        q, k, v, w_r)), rtol=1e-12)
    table = xp.asarray(rng.standard_normal(32))
    got = blocked_attention(q, k, v, table, scheme="t5", block_size=2)
    np.testing.assert_allclose(np.asarray(got), np.asarray(rp.t5_attention(q, k, v, table)),
                               rtol=1e-12)
    table = xp.asarray(rng.standard_normal((5, 4)))
    got = blocked_attention(q, k[:3, :], v[:3, :], table, scheme="music", block_size=2)
    np.testing.assert_allclose(np.asarray(got), np.asarray(rp.music_attention(
        q, k[:3, :], v[:3, :], table)), rtol=1e-12)


def test_rows_without_keys_are_zero(xp):
    q = k = v = xp.asarray(np.random.default_rng(0).standard_normal((6, 4)))
    mask = np.ones((6, 6), dtype=bool)
    mask[2] = False
    got = np.asarray(blocked_attention(q, k, v, block_size=4, mask=xp.asarray(mask)))
    assert np.all(got[2] == 0) and np.all(np.isfinite(got))
    empty = blocked_attention(q[:0, :], k, v, block_size=4)
    assert tuple(empty.shape) == (0, 4)


def test_masks_of_every_broadcastable_rank(backend):
    q = k = v = backend.asarray(np.random.default_rng(1).standard_normal((2, 5, 4)))
    for mask in (np.array(True), np.array([True, False, True, True, True]),
                 np.ones((1, 5), dtype=bool), np.ones((5, 1), dtype=bool)):
        m = backend.asarray(mask)
        got = blocked_attention(q, k, v, mask=m, block_size=2)
        want = rp.attention(q, k, v, mask=m)
        np.testing.assert_allclose(backend.to_numpy(got), backend.to_numpy(want), rtol=1e-12)


def test_blocked_memory_grows_with_the_block_not_with_t_squared():
    t, d, block = 4096, 16, 256
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((t, d)).astype(np.float32) for _ in range(3))
    tracemalloc.start()
    try:
        blocked_attention(q, k, v, block_size=block)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    logits = t * t * 4  # one float32 (t, t) matrix: what the unblocked path holds, and more
    assert peak < logits / 8, (peak, logits)


def test_blocked_bad_input(xp):
    q = k = v = xp.zeros((4, 2), dtype=xp.float64)
    with pytest.raises(ValueError, match=r"`scheme` must be one of .*got 'nope'"):
        blocked_attention(q, k, v, scheme="nope")
    with pytest.raises(TypeError, match=r"unknown parameter\(s\) K for scheme 'shaw'"):
        blocked_attention(q, k, v, xp.zeros((3, 2), dtype=xp.float64), scheme="shaw", K=1)
    with pytest.raises(ValueError, match=r"`block_size` must be .*got 0"):
        blocked_attention(q, k, v, block_size=0)
    with pytest.raises(TypeError, match=r"scheme 'bias' takes at most 1 table"):
        blocked_attention(q, k, v, xp.zeros(3, dtype=xp.float64), xp.zeros(3, dtype=xp.float64),
                          scheme="bias")
    with pytest.raises(TypeError, match=r"scheme 'general' needs `table`"):
        blocked_attention(q, k, v, scheme="general")
    with pytest.raises(ValueError, match=r"t_max = 2"):
        blocked_attention(q, k, v, xp.zeros((3, 2), dtype=xp.float64), scheme="general")
    with pytest.raises(ValueError, match=r"max_distance=1"):
        blocked_attention(q, k, v, xp.zeros((3, 2), dtype=xp.float64), scheme="shaw",
                          beyond="error")
    with pytest.raises(ValueError, match=r"`q` must have height \* width = 6 tokens"):
        blocked_attention(q, k, v, xp.zeros((3, 2), dtype=xp.float64),
                          xp.zeros((5, 2), dtype=xp.float64), scheme="grid2d", height=2, width=3)


@pytest.mark.parametrize("q_offset", [-2, -10])
def test_slopes_per_head_widen_every_tile_of_the_output(backend, q_offset):
    # ALiBi's slopes carry the head axis q lacks: tiles with no key (causal, a negative
    # offset) are zeros of the same (h, rows, d_v) shape, as alibi_attention returns
    rng = np.random.default_rng(7)
    q = backend.asarray(rng.standard_normal((6, 2)))
    slopes = backend.asarray(np.array([1.0, 0.5, 0.25]))
    got = blocked_attention(q, q, q, scheme="alibi", slopes=slopes, causal=True,
                            q_offset=q_offset, block_size=2)
    want = rp.alibi_attention(q, q, q, slopes=slopes, causal=True, q_offset=q_offset)
    assert tuple(got.shape) == tuple(want.shape) == (3, 6, 2)
    np.testing.assert_allclose(backend.to_numpy(got), backend.to_numpy(want), rtol=1e-12,
                               atol=1e-15)
