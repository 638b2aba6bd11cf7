"""KERPLE and Sandwich against their peers, and their kernels against the specification.

- NeMo (``nemo_toolkit`` is not installed: too heavy for CI): the forward
  passes of ``KERPLERelativePositionEmbedding`` and
  ``SandwichRelativePositionEmbedding`` transcribed as formulas from
  NVIDIA/NeMo @ 8cfedd7 (``nemo/collections/nlp/modules/common/megatron/
  position_embedding``), compared bias for bias;
- attention-gym's ``generate_sandwich_bias`` (the attn-gym package), evaluated
  on index tensors;
- the dispatched kernels (NumPy, torch) against the specification by hypothesis:
  masks, offsets, per-head parameters, both kernels, dtypes, forward and VJP.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _calls import draw_mask
from hypothesis import given, settings
from hypothesis import strategies as st

import relpos_ref as rp
from relpos_ref import kernels
from relpos_ref.presets import PRESETS


def nemo_relative_position(t: int) -> np.ndarray:
    """NeMo ``build_relative_position(t, full=True)``: ``abs(m - n)`` with ``m = n = t-1 .. 0``."""
    memory = -np.arange(1 - t, 1)
    return np.abs(memory[:, None] - memory[None, :])


def nemo_kerple_bias(b, a, p, t_q, t_k, *, bidirectional):
    """NeMo ``KERPLERelativePositionEmbedding.forward``: ``-b log(1 + a rel^p)``, (h, t_q, t_k)."""
    rel = nemo_relative_position(max(t_q, t_k))[-t_q:, -t_k:].astype(np.float64)
    if not bidirectional:
        rel = np.tril(rel)
    return -b[:, None, None] * np.log(1 + a[:, None, None] * rel ** p[:, None, None])


def nemo_sandwich_bias(heads, hidden, t_q, t_k, *, bidirectional):
    """NeMo ``SandwichRelativePositionEmbedding.forward``, (h, t_q, t_k)."""
    rel = nemo_relative_position(max(t_q, t_k))[-t_q:, -t_k:].astype(np.float64)
    if not bidirectional:
        rel = np.tril(rel)
    inv_freq = 1.0 / 10000 ** (2 * np.arange(1, hidden / 2 + 1) / hidden)
    bias = np.cos(rel[:, :, None] * inv_freq).sum(axis=2)
    scales = np.arange(1, heads + 1)[:, None, None] * 8 / heads
    return (bias[None] - hidden / 2) / scales


@pytest.mark.peers
@pytest.mark.parametrize(("t_q", "t_k"), [(6, 6), (3, 8)])
def test_nemo_kerple_bidirectional_equals_ours_end_aligned(t_q, t_k):
    heads = 5
    b = np.asarray(rp.alibi_slopes(heads))  # NeMo's initialization
    a = np.linspace(0.5, 2.0, heads)
    theirs = nemo_kerple_bias(b, a, np.ones(heads), t_q, t_k, bidirectional=True)
    ours = rp.kerple_bias(b, a, t_q, t_k, q_offset=t_k - t_q,
                          **PRESETS["nemo-kerple"].params)
    np.testing.assert_allclose(ours, theirs, rtol=1e-15, atol=1e-15)
    # before NVIDIA-NeMo PR #6666 kerple_a was a constant 0: no bias at all
    assert not nemo_kerple_bias(b, 0 * a, np.ones(heads), t_q, t_k, bidirectional=True).any()


def _causal_pair(bias, heads, t_q, t_k, **ours):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((heads, t, 4)) for t in (t_q, t_k, t_k))
    with kernels.disabled():
        theirs = rp.attention(q, k, v, bias=bias, causal=True, q_offset=t_k - t_q)
        mine = rp.kerple_attention(q, k, v, causal=True, q_offset=t_k - t_q, **ours)
    return theirs, mine


@pytest.mark.peers
def test_nemo_kerple_causal_attention_equals_ours_when_t_q_equals_t_k():
    # tril zeroes the future distances, which the causal mask never reads
    heads = 3
    rng = np.random.default_rng(1)
    b, a = rng.random(heads) + 0.1, rng.random(heads) + 0.5
    bias = nemo_kerple_bias(b, a, np.ones(heads), 6, 6, bidirectional=False)
    theirs, ours = _causal_pair(bias, heads, 6, 6, r1=b, r2=a)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-14)
    converted = PRESETS["nemo-kerple"].to_canonical(b.reshape(1, heads, 1, 1))
    assert np.array_equal(converted, b)


@pytest.mark.peers
def test_nemo_causal_tril_is_start_aligned_when_queries_follow_a_cache():
    # NeMo slices the end-aligned distances, then tril()s the (t_q, t_k) slice: that zeroes
    # j > i, which with t_q < t_k are the t_k - t_q - 1 most recent past keys of a query
    heads, t_q, t_k = 2, 3, 7
    b, a = np.asarray(rp.alibi_slopes(heads)), np.ones(heads)
    bias = nemo_kerple_bias(b, a, np.ones(heads), t_q, t_k, bidirectional=False)
    ours = rp.kerple_bias(b, a, t_q, t_k, q_offset=t_k - t_q)
    past = np.arange(t_k)[None, :] < np.arange(t_q)[:, None] + t_k - t_q  # r < 0
    zeroed = past & (np.arange(t_k)[None, :] > np.arange(t_q)[:, None])
    assert zeroed.sum() == t_q * (t_k - t_q - 1)
    assert np.all(bias[:, zeroed] == 0) and np.all(ours[:, zeroed] < 0)
    theirs, mine = _causal_pair(bias, heads, t_q, t_k, r1=b, r2=a)
    assert np.abs(theirs - mine).max() > 1e-3


@pytest.mark.peers
@pytest.mark.parametrize(("t_q", "t_k"), [(5, 5), (2, 7)])
def test_nemo_sandwich_equals_ours_end_aligned(t_q, t_k):
    heads, hidden = 6, 16
    theirs = nemo_sandwich_bias(heads, hidden, t_q, t_k, bidirectional=True)
    ratios = np.asarray(rp.sandwich_ratios(heads))
    ours = rp.sandwich_bias(ratios, t_q, t_k, q_offset=t_k - t_q, d_bar=hidden,
                            **PRESETS["nemo-sandwich"].params)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-13)
    other = rp.sandwich_bias(ratios, t_q, t_k, q_offset=t_k - t_q, d_bar=hidden, start=0)
    assert np.abs(other - theirs).max() > 1e-3  # the first frequency matters


@pytest.mark.peers
@pytest.mark.parametrize("heads", [1, 3, 8])
def test_attention_gym_sandwich_differs_by_a_constant_per_head(heads):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    mods = pytest.importorskip("attn_gym.mods", reason="attn-gym is not installed")
    t, d_bar = 9, 128
    mod = mods.generate_sandwich_bias(heads, t, d_bar=d_bar)
    h = torch.arange(heads)[:, None, None]
    i, j = torch.arange(t)[None, :, None], torch.arange(t)[None, None, :]
    theirs = mod(torch.zeros(()), 0, h, i, j).double().numpy()
    ratios = np.asarray(rp.sandwich_ratios(heads))
    ours = rp.sandwich_bias(ratios, t, t, **PRESETS["attention-gym-sandwich"].params)
    constant = (d_bar / 2) / ratios[:, None, None]  # their sum has no - d_bar / 2
    np.testing.assert_allclose(theirs - constant, ours, rtol=0, atol=2e-5)  # float32 sums


def test_power_kernel_with_unit_exponent_is_alibi():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((4, t, 4)) for t in (5, 8, 8))
    slopes = np.asarray(rp.alibi_slopes(4))
    with kernels.disabled():
        want = rp.alibi_attention(q, k, v, slopes=slopes, q_offset=2)
        got = rp.kerple_attention(q, k, v, kernel="power", q_offset=2)  # r1 = slopes, r2 = 1
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-14)


def test_bad_parameters_name_themselves():
    q = k = v = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match="`kernel` must be one of 'log', 'power', got 'exp'"):
        rp.kerple_attention(q, k, v, kernel="exp")
    with pytest.raises(ValueError, match=r"`r1` has 3 entries \(shape \(3,\)\)"):
        rp.kerple_attention(q, k, v, r1=np.ones(3))
    with pytest.raises(TypeError, match="`r2`"):
        rp.kerple_attention(q, k, v, r2=np.ones(2, dtype=np.float32))
    with pytest.raises(ValueError, match=r"`d_bar` must be even .* got 7"):
        rp.sandwich_attention(q, k, v, d_bar=7)
    with pytest.raises(ValueError, match="`start` must be >= 0, got -1"):
        rp.sandwich_attention(q, k, v, start=-1)
    with pytest.raises(ValueError, match="`q` must have a head axis"):
        rp.sandwich_attention(np.zeros((3, 4)), np.zeros((3, 4)), np.zeros((3, 4)))


# -- the dispatched kernels equal the specification ------------------------------------

@st.composite
def _calls(draw, library):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    scheme = draw(st.sampled_from(["kerple", "sandwich"]))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    heads, t_q, t_k = draw(st.integers(1, 3)), draw(st.integers(1, 9)), draw(st.integers(1, 9))
    lead = draw(st.sampled_from([(heads,), (2, heads)]))
    q, k, v = (rng.standard_normal((*lead, t, w)).astype(dtype)
               for t, w in ((t_q, 4), (t_k, 4), (t_k, 3)))
    kwargs = {"q_offset": draw(st.integers(-4, 8)), "causal": draw(st.booleans()),
              "mask": draw_mask(draw, rng, t_q, t_k), "scale": draw(st.sampled_from([None, 0.7]))}
    if kwargs["mask"] is not None and kwargs["mask"].ndim > 2:
        kwargs["mask"] = None  # the VJPs refuse masks that widen the batch
    if scheme == "kerple":
        kwargs["kernel"] = draw(st.sampled_from(["log", "power"]))
        for name in ("r1", "r2"):
            if draw(st.booleans()):  # per-head parameters, else the defaults
                size = draw(st.sampled_from([1, heads]))
                kwargs[name] = (rng.random(size) * 1.5 + 0.1).astype(dtype)
    else:
        kwargs["d_bar"] = draw(st.sampled_from([2, 16, 128]))
        kwargs["start"] = draw(st.sampled_from([0, 1]))
    d_output = rng.standard_normal((*lead, t_q, 3)).astype(dtype)
    if library == "torch":
        import torch

        def convert(a):
            return torch.from_numpy(a) if isinstance(a, np.ndarray) else a

        q, k, v, d_output = map(convert, (q, k, v, d_output))
        kwargs = {n: convert(a) for n, a in kwargs.items()}
    return scheme, (q, k, v), kwargs, d_output


def _close(got, want, dtype):
    tol = 2e-4 if "32" in str(dtype) else 1e-10
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)


@pytest.mark.parametrize("library", ["numpy", "torch"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_dispatched_kernels_equal_the_specification(library, data):
    if library == "torch":
        pytest.importorskip("torch", reason="torch is not installed")
    scheme, (q, k, v), kwargs, d_output = data.draw(_calls(library))
    forward = getattr(rp, f"{scheme}_attention")
    vjp = getattr(rp, f"{scheme}_attention_vjp")
    assert kernels.kernel_for(scheme, (q, k, v)) is not None
    got = forward(q, k, v, **kwargs)
    got_grads = vjp(q, k, v, d_output=d_output, **kwargs)
    with kernels.disabled():
        want = forward(q, k, v, **kwargs)
        want_grads = vjp(q, k, v, d_output=d_output, **kwargs)
    assert got.dtype == want.dtype
    _close(got, want, q.dtype)
    assert sorted(got_grads) == sorted(want_grads)
    for name, g in want_grads.items():
        assert tuple(got_grads[name].shape) == tuple(g.shape), name
        scale = max(1.0, float(np.abs(np.asarray(g)).max(initial=0.0)))
        _close(np.asarray(got_grads[name]) / scale, np.asarray(g) / scale, q.dtype)


def test_sixteen_bit_calls_return_their_dtype():
    q = k = v = np.random.default_rng(2).standard_normal((2, 5, 4)).astype(np.float16)
    for f in (rp.kerple_attention, rp.sandwich_attention):
        out = f(q, k, v, causal=True)
        with kernels.disabled():
            want = f(q, k, v, causal=True)
        assert out.dtype == np.float16
        np.testing.assert_allclose(out.astype(np.float32), want.astype(np.float32), atol=2e-3)
    assert math.isclose(rp.sandwich_ratios(3)[2], 8.0)
