"""The forgetting bias (FoX): the specification against loops, its VJP, its kernels, its peer.

- a loop over ``t = j+1 .. i + q_offset`` of ``log(1 / (1 + exp(-f_t)))`` in
  Python floats, written from the paper, against `forgetting_bias`;
- the VJP against central differences (q, k, v and f) and torch autograd;
- the dispatched kernels (NumPy, torch) against the specification by
  hypothesis: masks, offsets, gates past the last key, per-head and shared
  gates, dtypes, forward and VJP;
- decoding one query at a time against a cache equal to the full call;
- numerics: saturated gates, long sums that cancel;
- x-transformers' ``DataDependentAlibi`` (the peers extra): its bias and the
  attention it gives.
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
from relpos_ref.schemes import forgetting as fg


def loop_bias(f: np.ndarray, t_q: int, t_k: int, q_offset: int) -> np.ndarray:
    """``b[.., i, j] = sum_{t=j+1}^{i+q_offset} log sigma(f_t)`` for ``j <= i + q_offset``."""
    out = np.zeros((*f.shape[:-1], t_q, t_k))
    for lead in np.ndindex(f.shape[:-1]):
        for i in range(t_q):
            for j in range(min(t_k, i + q_offset + 1)):
                out[(*lead, i, j)] = math.fsum(
                    -math.log1p(math.exp(-x)) if x > -30 else x - math.log1p(math.exp(x))
                    for x in (float(f[(*lead, t)]) for t in range(j + 1, i + q_offset + 1)))
    return out


def loop_attention(q, k, v, f, q_offset, scale, mask=None):
    t_q, t_k = q.shape[-2], k.shape[-2]
    logits = scale * q @ np.swapaxes(k, -1, -2) + loop_bias(f, t_q, t_k, q_offset)
    allowed = np.arange(t_k)[None, :] <= np.arange(t_q)[:, None] + q_offset
    if mask is not None:
        allowed = allowed & mask
    logits = np.where(allowed, logits, -np.inf)
    top = np.max(logits, axis=-1, keepdims=True)
    w = np.exp(logits - np.where(np.isfinite(top), top, 0))
    total = w.sum(-1, keepdims=True)
    w = np.where(total > 0, w / np.where(total > 0, total, 1), 0)
    return w @ v


@settings(deadline=None, max_examples=25)
@given(t_q=st.integers(0, 5), t_k=st.integers(0, 6), extra=st.sampled_from([0, 2]),
       heads=st.integers(1, 3), seed=st.integers(0, 2**16), data=st.data())
def test_the_bias_is_the_sum_of_the_log_gates_after_the_key(t_q, t_k, extra, heads, seed,
                                                            data):
    n = t_k + extra
    q_offset = data.draw(st.integers(-2, n - t_q) if n >= t_q else st.just(n - t_q))
    rng = np.random.default_rng(seed)
    f = rng.standard_normal((heads, n)) * 4
    if n and t_q and t_q - 1 + q_offset >= n:
        return
    got = rp.forgetting_bias(f, t_q, t_k, q_offset=q_offset)
    np.testing.assert_allclose(got, loop_bias(f, t_q, t_k, q_offset), rtol=1e-12, atol=1e-12)


def test_attention_equals_the_loop_definition_with_a_mask():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 3, t, 4)) for t in (4, 7, 7))
    f = rng.standard_normal((3, 7)) * 3
    mask = rng.random((4, 7)) < 0.7
    mask[1] = False
    with kernels.disabled():
        got = rp.forgetting_attention(q, k, v, f, mask=mask)
    want = loop_attention(q, k, v, np.broadcast_to(f, (2, 3, 7)), 3, 0.5, mask)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_the_rule_is_fox_and_x_transformers_not_the_key_s_own_gate():
    # b_ij holds the gates of j+1 .. i: the key's own gate f_j is not read, the query's is
    f = np.asarray([0.0, 10.0, -10.0])
    b = rp.forgetting_bias(f, 3)
    ls = -np.log1p(np.exp(-f))
    assert b[2, 1] == pytest.approx(ls[2]) and b[2, 0] == pytest.approx(ls[1] + ls[2])
    assert (np.diag(b) == 0).all()


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"causal": False}, "`causal` must be True"),
    ({"q_offset": 4}, "`q_offset` = 4"),
    ({"f": np.zeros((2, 5))}, "`f` must have a forget-gate logit for each of the 7 keys"),
    ({"f": np.zeros((5, 7))}, "does not broadcast"),
    ({"f": np.zeros((2, 7), dtype=np.float32)}, "f"),
])
def test_bad_calls_name_the_parameter(kwargs, needle):
    q, k, v = np.zeros((2, 4, 3)), np.zeros((2, 7, 3)), np.zeros((2, 7, 3))
    f = kwargs.pop("f", np.zeros((2, 7)))
    with pytest.raises((ValueError, TypeError), match=needle):
        rp.forgetting_attention(q, k, v, f, **kwargs)  # the kernels hand bad calls back
    with kernels.disabled(), pytest.raises((ValueError, TypeError), match=needle):
        rp.forgetting_attention(q, k, v, f, **kwargs)


def test_saturated_gates_stay_finite_and_long_sums_cancel():
    f = np.asarray([-1000.0, 1000.0, -1000.0, 0.0])
    b = rp.forgetting_bias(f, 4)
    assert np.isfinite(b).all() and b[3, 2] == pytest.approx(-math.log(2))
    assert b[2, 0] == pytest.approx(-1000.0) and b[1, 0] == 0.0
    # 200000 gates near 0: F reaches -1.4e5, yet the bias near the diagonal is exact in float32
    t = 200_000
    f32 = np.zeros(t, dtype=np.float32)
    big = fg.forgetting_cumsum(f32)
    assert big.dtype == np.float64
    near = fg.forgetting_tile(f32, 1, 3, q_offset=t - 1, j0=t - 3)
    np.testing.assert_array_equal(near[0], np.float32([-2 * math.log(2), -math.log(2), 0.0]))


def _loop_log_sigmoid(x: float) -> float:
    if math.isnan(x) or x == -math.inf:
        return x  # log sigma(-inf) = -inf: a closed gate
    return -math.log1p(math.exp(-x)) if x > -30 else x - math.log1p(math.exp(x))


def _loop_bias_reading_each_range(f, t_q, q_offset):
    # every pair sums the gates of its own range (j, p_i] only: one sum per pair
    t_k = f.shape[-1]
    out = np.zeros((*f.shape[:-1], t_q, t_k))
    for lead in np.ndindex(f.shape[:-1]):
        for i in range(t_q):
            for j in range(min(t_k, i + q_offset + 1)):
                terms = [_loop_log_sigmoid(float(f[(*lead, t)]))
                         for t in range(j + 1, i + q_offset + 1)]
                out[(*lead, i, j)] = (math.nan if any(map(math.isnan, terms)) else
                                      -math.inf if -math.inf in terms else math.fsum(terms))
    return out


def test_a_closed_gate_masks_the_pairs_that_read_it_and_no_other(backend):
    """sigma(f_t) = 0 (f_t = -inf) forgets every key before t: those pairs get -inf, a mask.

    The bias's cumulative sums would make ``-inf - (-inf) = NaN`` of every pair after
    the gate; a NaN gate makes NaN only of the pairs whose range holds it.
    """
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 6, 4)) for _ in range(3))
    f = rng.standard_normal((2, 6))
    f[:, 2] = -np.inf
    f[1, 4] = np.nan
    want_bias = _loop_bias_reading_each_range(f, 6, 0)
    got_bias = backend.to_numpy(rp.forgetting_bias(backend.asarray(f), 6))
    np.testing.assert_array_equal(np.isnan(got_bias), np.isnan(want_bias))
    np.testing.assert_allclose(got_bias, want_bias, rtol=1e-12, atol=1e-12)
    assert (got_bias[0, 2:, :2] == -np.inf).all() and np.isfinite(got_bias[0, 3:, 2:]).all()

    closed = f.copy()
    closed[1, 4] = 0.5
    want = loop_attention(q, k, v, closed, 0, 0.5)
    args = [backend.asarray(a) for a in (q, k, v, closed)]
    got = backend.to_numpy(rp.forgetting_attention(*args, q_offset=0))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    grads = rp.forgetting_attention_vjp(*args, d_output=backend.asarray(np.ones((2, 6, 4))),
                                        q_offset=0)
    assert all(np.isfinite(backend.to_numpy(g)).all() for g in grads.values())
    # the closed gate's own gradient: the pairs reading it have weight 0 (up to the
    # rounding of the suffix sums it is read from)
    np.testing.assert_allclose(backend.to_numpy(grads["f"])[:, 2], 0, atol=1e-12)
    nan_out = backend.to_numpy(rp.forgetting_attention(*args[:3], backend.asarray(f),
                                                       q_offset=0))
    assert np.isnan(nan_out[1, 4:]).all() and not np.isnan(np.delete(nan_out[1], [4, 5], 0)).any()
    np.testing.assert_allclose(nan_out[0], want[0], rtol=1e-10, atol=1e-12)


def test_a_closed_gate_blocked_and_on_torch_autograd_is_the_same():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 7, 4)) for _ in range(3))
    f = rng.standard_normal((2, 7))
    f[0, 3] = -np.inf
    want = loop_attention(q, k, v, f, 0, 0.5)
    tensors = [torch.tensor(a, requires_grad=True) for a in (q, k, v, f)]
    out = rp.forgetting_attention(*tensors, q_offset=0)
    out.sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-10, atol=1e-12)
    assert all(torch.isfinite(t.grad).all() for t in tensors)
    blocked = rp.blocked_attention(*(torch.tensor(a) for a in (q, k, v, f)), scheme="forgetting",
                                   block_size=2, q_offset=0)
    np.testing.assert_allclose(blocked.numpy(), want, rtol=1e-10, atol=1e-12)


def _finite_differences(fun, x, eps=1e-6):
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += eps
        down[idx] -= eps
        grad[idx] = (fun(up) - fun(down)) / (2 * eps)
    return grad


def test_vjp_equals_finite_differences_and_torch_autograd():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, t, 3)) for t in (3, 5, 5))
    f = rng.standard_normal((2, 5)) * 2
    mask = rng.random((3, 5)) < 0.8
    d_out = rng.standard_normal((2, 3, 3))
    kw = {"mask": mask, "q_offset": 1, "scale": 0.7}
    with kernels.disabled():
        grads = rp.forgetting_attention_vjp(q, k, v, f, d_output=d_out, **kw)
        args = {"q": q, "k": k, "v": v, "f": f}
        for name in args:
            def loss(x, name=name):
                call = {**args, name: x}
                return float(np.sum(rp.forgetting_attention(
                    call["q"], call["k"], call["v"], call["f"], **kw) * d_out))
            np.testing.assert_allclose(grads[name], _finite_differences(loss, args[name]),
                                       rtol=1e-6, atol=1e-8, err_msg=name)
    torch = pytest.importorskip("torch")
    leaves = {n: torch.tensor(a, requires_grad=True) for n, a in args.items()}
    with kernels.disabled():
        out = rp.forgetting_attention(*leaves.values(), mask=torch.tensor(mask), q_offset=1,
                                      scale=0.7)
    out.backward(torch.tensor(d_out))
    for name, leaf in leaves.items():
        np.testing.assert_allclose(leaf.grad.numpy(), grads[name], rtol=1e-12, atol=1e-12)


@st.composite
def _calls(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    heads, t_q, t_k = draw(st.integers(1, 3)), draw(st.integers(0, 6)), draw(st.integers(0, 7))
    n = t_k + draw(st.sampled_from([0, 2]))
    q_offset = draw(st.sampled_from([t_k - t_q, min(draw(st.integers(-3, 7)), n - t_q)]))
    lead = draw(st.sampled_from([(heads,), (2, heads)]))
    q, k, v = (rng.standard_normal((*lead, t, 4)).astype(dtype) for t in (t_q, t_k, t_k))
    f_lead = draw(st.sampled_from([(heads,), (), lead]))
    f = (rng.standard_normal((*f_lead, n)) * 3).astype(dtype)
    kwargs = {"mask": draw_mask(draw, rng, t_q, t_k), "q_offset": q_offset,
              "scale": draw(st.sampled_from([None, 0.7]))}
    d_out = rng.standard_normal((*lead, t_q, 4)).astype(dtype)
    return (q, k, v, f), kwargs, d_out


def _same(got, want, dtype):
    tol = {"float32": 2e-5, "float64": 1e-12}[str(dtype)]
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64),
                               np.asarray(want, dtype=np.float64), rtol=tol, atol=tol)


@settings(deadline=None, max_examples=40)
@given(call=_calls(), library=st.sampled_from(["numpy", "torch"]))
def test_kernels_equal_the_specification(call, library):
    args, kwargs, d_out = call
    if library == "torch":
        torch = pytest.importorskip("torch")
        args = tuple(torch.from_numpy(a) for a in args)
        kwargs = {n: torch.from_numpy(a) if isinstance(a, np.ndarray) else a
                  for n, a in kwargs.items()}
        d_out = torch.from_numpy(d_out)
    with kernels.disabled():
        want = rp.forgetting_attention(*args, **kwargs, return_weights=True)
        want_g = rp.forgetting_attention_vjp(*args, **kwargs, d_output=d_out)
    got = rp.forgetting_attention(*args, **kwargs, return_weights=True)
    got_g = rp.forgetting_attention_vjp(*args, **kwargs, d_output=d_out)
    dtype = str(args[0].dtype).removeprefix("torch.")
    for g, w in zip(got, want, strict=True):
        assert type(g) is type(w) and g.dtype == w.dtype and g.shape == w.shape
        _same(g, w, dtype)
    for name, w in want_g.items():
        assert got_g[name].dtype == w.dtype and got_g[name].shape == w.shape, name
        _same(got_g[name], w, dtype)


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_decode_against_a_cache_equals_the_full_call(library):
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((2, 9, 4)) for _ in range(3))
    f = rng.standard_normal((2, 9)) * 2
    if library == "torch":
        torch = pytest.importorskip("torch")
        q, k, v, f = (torch.from_numpy(a) for a in (q, k, v, f))
    full = np.asarray(rp.forgetting_attention(q, k, v, f))
    prefill = np.asarray(rp.forgetting_attention(q[:, :5], k[:, :5], v[:, :5], f[:, :5]))
    np.testing.assert_allclose(prefill, full[:, :5], rtol=1e-12, atol=1e-12)
    for step in range(5, 9):  # f covers every key of the cache; the query reads its own
        out = rp.forgetting_attention(q[:, step:step + 1], k[:, :step + 1], v[:, :step + 1],
                                      f[:, :step + 1])
        np.testing.assert_allclose(np.asarray(out), full[:, step:step + 1], rtol=1e-12,
                                   atol=1e-12)
    # a cache allocated ahead: gates past the last key are not read
    ahead = rp.forgetting_attention(q[:, 6:7], k[:, :7], v[:, :7], f, q_offset=6)
    np.testing.assert_allclose(np.asarray(ahead), full[:, 6:7], rtol=1e-12, atol=1e-12)


@pytest.mark.peers
def test_x_transformers_data_dependent_alibi():
    torch = pytest.importorskip("torch")
    xt = pytest.importorskip("x_transformers.x_transformers")
    torch.manual_seed(0)
    b, n, dim, heads, d = 2, 11, 16, 4, 8
    module = xt.DataDependentAlibi(dim, heads).double()
    torch.nn.init.normal_(module.to_forget_gates[0].bias, std=2.0)  # gates far from 1
    x = torch.randn(b, n, dim, dtype=torch.float64)
    with torch.no_grad():
        theirs = module(x)  # (b, h, n, n), F_i - F_j everywhere
        f = module.to_forget_gates[0](x).transpose(1, 2)  # the logits, (b, h, n)
    ours = rp.forgetting_bias(f, n)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    bias_diff = float((ours - theirs).abs().where(causal, 0).max())
    assert bias_diff < 1e-12, bias_diff  # measured 8.9e-16 (float64)
    q, k, v = (torch.randn(b, heads, n, d, dtype=torch.float64) for _ in range(3))
    attend = xt.Attend(causal=True)
    with torch.no_grad():
        out_theirs = attend(q, k, v, attn_bias=theirs)[0]
    out_ours = rp.forgetting_attention(q, k, v, f)
    out_diff = float((out_ours - out_theirs).abs().max())
    # measured 2.0e-7: Attend's softmax is float32 (softmax(dtype=torch.float32))
    assert out_diff < 1e-6, out_diff
