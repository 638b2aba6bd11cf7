"""No subnormal weight reaches a NumPy kernel's products, and results stay the specification's.

Issue 30: ALiBi's steepest heads give weights below the smallest normal number
(``tiny``), which made ``weights @ v`` three times slower on an Intel CPU. The
kernels set the exponents whose weight could be subnormal to ``-inf``
(`relpos_ref.kernels._numpy_blocks.flush_subnormals`). Here: the same calls
carry subnormal weights into the products when that function does nothing
(patched out), and none with it, on each path that exponentiates (the
softmax in place, Shaw's fused softmax, the backward passes' engine, whose
exponentials a spy reads where the products take them); hypothesis draws
calls of every scheme with logits steep enough to have such weights, and the
kernels, forward and backward, must still return the specification's results
(`relpos_ref.kernels.disabled`) within the kernel tests' tolerances, with zero
where the specification's weight is subnormal. Against the same kernel without
the step, the weights are equal to the last place but for those below
``e n tiny``, which are zero.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _calls import calls
from hypothesis import given, settings
from hypothesis import strategies as st

import relpos_ref as rp
from relpos_ref import catalog, kernels
from relpos_ref.kernels import _numpy_blocks, _numpy_vjp
from relpos_ref.kernels._numpy_blocks import flush_subnormals

KERNELS = kernels.kernels("numpy")
VJP_KERNELS = kernels.vjp_kernels("numpy")
TOL = {"float64": {"rtol": 1e-11, "atol": 1e-12}, "float32": {"rtol": 2e-4, "atol": 2e-5}}


def _subnormal(x):
    tiny = np.finfo(x.dtype).tiny
    return int(np.count_nonzero((x > 0) & (x < tiny)))


def _no_flush(monkeypatch):
    # the kernels as they were before issue 30: every exponent goes to the exponential
    monkeypatch.setattr(_numpy_blocks, "flush_subnormals", lambda exponents, keys, least=None: None)
    monkeypatch.setattr(_numpy_vjp, "flush_subnormals", lambda exponents, keys, least=None: None)


def _alibi_call(dtype=np.float32, t=256):
    # ALiBi's two steepest slopes of 8 heads (1/2, 1/4): weights down to e^-127 of a row's
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, t, 16)).astype(dtype) for _ in range(3))
    return (q, k, v), {"slopes": np.array([0.5, 0.25], dtype=dtype)}


def _shaw_call(dtype=np.float32, t=64):
    # a key table whose farthest past row puts those keys 95 below the rest
    rng = np.random.default_rng(1)
    q = np.zeros((2, t, 4), dtype=dtype)
    q[..., 0] = 1
    k, v = (rng.standard_normal((2, t, 4)).astype(dtype) * 0.1 for _ in range(2))
    key_table = np.zeros((5, 4), dtype=dtype)
    key_table[0, 0] = -95 / 0.5  # scaled by 1 / sqrt(4)
    return (q, k, v, key_table, rng.standard_normal((5, 4)).astype(dtype)), {}


@pytest.mark.parametrize("causal", [False, True])
def test_a_masked_softmax_reads_its_scores_before_the_mask_and_flushes_only_if_it_must(
        monkeypatch, causal):
    # masked keys are -inf, below any cut: the bound comes from the block before the mask
    args, kwargs = _alibi_call()
    bounds = []
    original = _numpy_blocks.flush_subnormals

    def spy(exponents, keys, *, least=None):
        bounds.append((least, math.log(np.finfo(exponents.dtype).tiny) + math.log(keys) + 1))
        return original(exponents, keys, least=least)

    monkeypatch.setattr(_numpy_blocks, "flush_subnormals", spy)
    mask = {"causal": True} if causal else {"mask": np.tri(256, dtype=bool)}
    KERNELS["plain"](*args[:3], **mask)
    # logits within 20 of each other: every block's bound clears the cut, no pass at all
    assert bounds and all(least is not None and least >= cut for least, cut in bounds)
    bounds.clear()
    _, steep = KERNELS["alibi"](*args, **kwargs, **mask, return_weights=True)
    assert any(least < cut for least, cut in bounds) and _subnormal(steep) == 0
    with kernels.disabled():
        want = rp.alibi_attention(*args, **kwargs, **mask, return_weights=True)[1]
    assert _subnormal(want) > 0.005 * want.size
    assert np.all(steep[want < np.finfo(steep.dtype).tiny] == 0)
    np.testing.assert_allclose(steep, want, **TOL["float32"])


@given(spread=st.floats(0, 900), n=st.integers(1, 4096),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 99))
def test_a_bound_read_before_the_mask_flushes_what_a_read_after_it_would(spread, n, dtype,
                                                                        seed):
    rng = np.random.default_rng(seed)
    scores = (rng.random((4, 6)) * -spread).astype(dtype)
    allowed = rng.random((4, 6)) < 0.6
    allowed[1] = False  # a row with no allowed key
    low = float(np.min(scores))  # before the mask
    x = np.where(allowed, scores, -np.inf)
    row_max = np.max(x, axis=-1, keepdims=True)
    row_max[row_max == -np.inf] = 0
    x -= row_max
    read_after, bounded = x.copy(), x.copy()
    flush_subnormals(read_after, n)
    flush_subnormals(bounded, n, least=low - float(np.max(row_max)))
    np.testing.assert_array_equal(bounded, read_after)


#: float64's subnormals lie 708 to 744 below a row's largest logit (float32's 87 to 103)
STEEPER = {np.float32: 1.0, np.float64: 7.5}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("scheme", "case"), [("alibi", _alibi_call), ("shaw", _shaw_call)])
def test_forward_weights_hold_subnormals_only_without_the_flush(monkeypatch, scheme, case,
                                                                 dtype):
    # the weights a kernel returns are the array it multiplied by v (`weights @ v`)
    args, kwargs = case(dtype)
    factor = dtype(STEEPER[dtype])
    args = (*args[:3], *(t * factor for t in args[3:]))
    kwargs = {name: x * factor for name, x in kwargs.items()}
    _, flushed = KERNELS[scheme](*args, **kwargs, return_weights=True)
    with monkeypatch.context() as patch:
        _no_flush(patch)
        _, before = KERNELS[scheme](*args, **kwargs, return_weights=True)
    assert _subnormal(before) > 0.005 * before.size  # the product took them before
    assert _subnormal(flushed) == 0
    # the same weights to the last place, but for those below e n tiny: zero
    n, tiny = before.shape[-1], np.finfo(dtype).tiny
    kept = flushed != 0
    np.testing.assert_array_max_ulp(flushed[kept], before[kept], maxulp=1)
    assert np.all(before[~kept] < math.e * n * tiny)
    assert np.all(flushed[before < tiny] == 0)


@pytest.mark.parametrize("masked", [False, True])
def test_the_backward_passes_exponentials_hold_subnormals_only_without_the_flush(monkeypatch,
                                                                                 masked):
    # backward() multiplies the exponentials _exp_rows leaves in its buffer: e^T dO, e * g;
    # masked: causal, so that the check reads the scores before their -inf
    args, kwargs = _alibi_call()
    kwargs["causal"] = masked
    d_output = np.random.default_rng(2).standard_normal(args[0].shape).astype(np.float32)
    seen = []
    original = _numpy_vjp._exp_rows

    def spy(scores, *rest):
        total = original(scores, *rest)
        seen.append(_subnormal(scores))
        return total

    monkeypatch.setattr(_numpy_vjp, "_exp_rows", spy)
    flushed = VJP_KERNELS["alibi"](*args, d_output=d_output, **kwargs)
    counts, seen[:] = list(seen), []
    with monkeypatch.context() as patch:
        _no_flush(patch)
        before = VJP_KERNELS["alibi"](*args, d_output=d_output, **kwargs)
    assert sum(seen) > 1000 and sum(counts) == 0
    for name, want in before.items():
        np.testing.assert_allclose(flushed[name], want, rtol=1e-6, atol=1e-7, err_msg=name)


@given(n=st.integers(1, 5000), dtype=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 99))
def test_flush_subnormals_leaves_every_weight_zero_or_normal(n, dtype, seed):
    # exponents <= 0 over the range where exp turns subnormal, rows of n keys; any row
    # sum between 1 (the row maximum's own term) and n keeps the weights normal
    rng = np.random.default_rng(seed)
    low = math.log(np.finfo(dtype).tiny) - 30
    x = (rng.random((3, n)) * low).astype(dtype)
    x[:, 0] = 0
    x[0, 1::7] = -np.inf  # masked keys
    kept = x >= math.log(np.finfo(dtype).tiny) + math.log(n) + 1
    original = x.copy()
    flush_subnormals(x, n)
    np.testing.assert_array_equal(x[kept], original[kept])
    assert np.all(x[~kept] == -np.inf)
    e = np.exp(x)
    for total in (np.ones(1, dtype=dtype), np.sum(e, axis=-1, keepdims=True),
                  np.full(1, n, dtype=dtype)):
        assert _subnormal(e) == 0 and _subnormal(e / total) == 0


def _spec(scheme, args, kwargs, *, vjp=False):
    # the specification's result, or None where it refuses the call
    name = "attention" if scheme == "plain" else f"{scheme}_attention"
    try:
        with kernels.disabled():
            return getattr(rp, name + ("_vjp" if vjp else ""))(*args, **kwargs)
    except (TypeError, ValueError):
        return None


def _steep(args, factor):
    # q times `factor` (ten times that in float64): logits spread by hundreds over a few
    # keys, some weights subnormal; steeper float32 logits leave the tolerances behind
    q = args[0]
    return (q * q.dtype.type(factor * (10 if q.dtype == np.float64 else 1)), *args[1:])


@pytest.mark.parametrize("scheme", catalog.names(plain=True))
@settings(max_examples=max(30, settings.default.max_examples))
@given(data=st.data(), factor=st.sampled_from([10, 30]))
def test_kernels_with_flushed_weights_equal_the_specification(scheme, data, factor):
    args, kwargs = data.draw(calls(scheme, longest=12))
    args = _steep(args, factor)
    want = _spec(scheme, args, kwargs)
    if want is None:
        return  # bad input: test_kernels.py compares the errors
    got = KERNELS[scheme](*args, **kwargs)
    if got is NotImplemented:
        return  # the specification runs (test_kernels.py says which calls may)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, **TOL[str(w.dtype)])
    weights = got[1]
    assert _subnormal(weights) == 0
    assert np.all(weights[want[1] < np.finfo(weights.dtype).tiny] == 0)


@pytest.mark.parametrize("scheme", sorted(VJP_KERNELS))
@settings(max_examples=max(30, settings.default.max_examples))
@given(data=st.data(), factor=st.sampled_from([10, 30]))
def test_backward_kernels_with_flushed_weights_equal_the_specification(scheme, data, factor):
    args, kwargs = data.draw(calls(scheme, longest=12))
    args = _steep(args, factor)
    kwargs = {name: x for name, x in kwargs.items() if name != "return_weights"}
    out = _spec(scheme, args, kwargs)
    if out is None:
        return  # bad input: test_kernels_vjp.py compares the errors
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    kwargs["d_output"] = rng.standard_normal(out.shape).astype(out.dtype)
    got = VJP_KERNELS[scheme](*args, **kwargs)
    if got is NotImplemented:
        return  # a value table whose term v widens, a mask the specification refuses
    want = _spec(scheme, args, kwargs, vjp=True)
    rtol = TOL[str(out.dtype)]["rtol"]
    size = max((float(np.max(np.abs(w), initial=0)) for w in want.values()), default=0)
    assert list(got) == list(want)
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=rtol, atol=rtol * max(size, 1e-3),
                                   err_msg=name)
