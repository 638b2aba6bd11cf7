"""CoPE, contextual positions: the specification against loops, its VJP, its kernels.

- a loop over the pairs in Python floats (`_reference.cope_value`, written
  from the paper) against `cope_term` and `cope_attention`: masks, causal or
  not, offsets, shared and per-head tables, the clamp at ``max_pos - 1``;
- the VJP against central differences (q, k, v and the table, away from
  integer positions and the clamp) and against torch autograd of the
  specification; the gradient at an integer position and under the clamp
  as torch's ``floor``, ``ceil`` and ``clamp`` give it;
- the dispatched kernels (NumPy, torch) against the specification by
  hypothesis, forward and VJP, float32 and float64;
- decoding one query at a time against a cache equal to the full call;
- properties: a zero table is plain attention, the term of a pair not
  allowed is 0, 16-bit inputs keep their dtype; bad input names the
  parameter; blocked attention refuses the scheme with its reason.
"""

from __future__ import annotations

from unittest import mock

import _reference as ref
import numpy as np
import pytest
from _calls import draw_mask
from hypothesis import given, settings
from hypothesis import strategies as st

import relpos_ref as rp
from relpos_ref import kernels
from relpos_ref.schemes import cope


def _allowed(t_q, t_k, mask, causal, q_offset):
    allowed = np.ones((t_q, t_k), dtype=bool)
    if causal:
        allowed &= np.arange(t_k)[None, :] <= np.arange(t_q)[:, None] + q_offset
    if mask is not None:
        allowed = allowed & np.broadcast_to(mask, (t_q, t_k))
    return allowed


def loop_term(q, k, table, scale, mask, causal, q_offset):
    """The term of every pair of one head, ``q (t_q, d)``, ``k (t_k, d)``, ``table (n, d)``."""
    t_q, t_k = q.shape[0], k.shape[0]
    allowed = _allowed(t_q, t_k, mask, causal, q_offset)
    out = np.zeros((t_q, t_k))
    for i in range(t_q):
        for j in range(t_k):
            out[i, j] = ref.cope_value(q[i], k, table, list(allowed[i]), j, scale)
    return out


def loop_attention(q, k, v, table, scale, mask, causal, q_offset):
    t_q, t_k = q.shape[0], k.shape[0]
    allowed = _allowed(t_q, t_k, mask, causal, q_offset)
    logits = scale * q @ k.T + loop_term(q, k, table, scale, mask, causal, q_offset)
    logits = np.where(allowed, logits, -np.inf)
    top = np.max(logits, axis=-1, keepdims=True) if t_k else np.zeros((t_q, 1))
    w = np.exp(logits - np.where(np.isfinite(top), top, 0))
    total = w.sum(-1, keepdims=True)
    w = np.where(total > 0, w / np.where(total > 0, total, 1), 0)
    return w @ v


@settings(deadline=None, max_examples=30)
@given(t_q=st.integers(0, 5), t_k=st.integers(0, 6), npos=st.integers(1, 6),
       heads=st.integers(1, 2), per_head=st.booleans(), causal=st.booleans(),
       seed=st.integers(0, 2**16), data=st.data())
def test_the_term_and_the_attention_equal_the_loops(t_q, t_k, npos, heads, per_head, causal,
                                                    seed, data):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((heads, t, 3)) * 1.5 for t in (t_q, t_k, t_k))
    table = rng.standard_normal((heads, npos, 3) if per_head else (npos, 3))
    mask = draw_mask(data.draw, rng, t_q, t_k)
    mask = None if mask is None or mask.ndim > 2 else mask
    q_offset = data.draw(st.integers(-2, 4))
    scale = data.draw(st.sampled_from([None, 0.7]))
    s = 3**-0.5 if scale is None else scale
    kw = {"mask": mask, "causal": causal, "q_offset": q_offset, "scale": scale}
    term = rp.cope_term(q, k, table, scale=s, mask=mask, causal=causal, q_offset=q_offset)
    with kernels.disabled():
        out = rp.cope_attention(q, k, v, table, **kw)
    for h in range(heads):
        e = table[h] if per_head else table
        np.testing.assert_allclose(term[h], loop_term(q[h], k[h], e, s, mask, causal, q_offset),
                                   rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(out[h], loop_attention(q[h], k[h], v[h], e, s, mask, causal,
                                                          q_offset), rtol=1e-10, atol=1e-12)


def test_positions_are_a_reverse_cumulative_sum_of_the_gates():
    q = k = np.zeros((3, 2))
    gates, _ = rp.cope_gates(q, k, scale=1.0)
    np.testing.assert_array_equal(gates, np.tril(np.full((3, 3), 0.5)))
    np.testing.assert_array_equal(rp.cope_positions(gates),
                                  [[0.5, 0, 0], [1.0, 0.5, 0], [1.5, 1.0, 0.5]])
    # a key mask: the masked key's gate is 0, the positions before it skip it
    mask = np.array([True, False, True])
    gates, _ = rp.cope_gates(q, k, scale=1.0, mask=mask, causal=False)
    np.testing.assert_array_equal(rp.cope_positions(gates)[0], [1.0, 0.5, 0.5])


def test_the_clamp_and_integer_positions():
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((2, 6, 4)) * 8  # saturated gates: positions near integers
    table = rng.standard_normal((2, 4))  # max_pos = 2: most positions clamp to 1
    term = rp.cope_term(q, k, table)
    p = np.minimum(rp.cope_positions(rp.cope_gates(q, k, scale=0.5)[0]), 1.0)
    z = q @ table.T
    want = z[:, 1:2] * p + z[:, 0:1] * (1 - p)
    np.testing.assert_allclose(term, np.where(np.tril(np.ones((6, 6), bool)), want, 0),
                               rtol=1e-12, atol=1e-12)


def test_a_zero_table_is_plain_attention():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 5, 4)) for _ in range(3))
    mask = rng.random((5, 5)) < 0.8
    out = rp.cope_attention(q, k, v, np.zeros((3, 4)), mask=mask)
    np.testing.assert_allclose(out, rp.attention(q, k, v, mask=mask, causal=True),
                               rtol=1e-12, atol=1e-12)


def _finite_differences(fun, x, eps=1e-6):
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += eps
        down[idx] -= eps
        grad[idx] = (fun(up) - fun(down)) / (2 * eps)
    return grad


@pytest.mark.parametrize(("causal", "npos"), [(True, 8), (False, 8), (True, 2)])
def test_vjp_equals_finite_differences_and_torch_autograd(causal, npos):
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, t, 3)) for t in (4, 5, 5))
    table = rng.standard_normal((2, npos, 3))
    mask = rng.random((4, 5)) < 0.8
    d_out = rng.standard_normal((2, 4, 3))
    kw = {"mask": mask, "q_offset": 1, "scale": 0.7, "causal": causal}
    args = {"q": q, "k": k, "v": v, "table": table}
    with kernels.disabled():
        grads = rp.cope_attention_vjp(q, k, v, table, d_output=d_out, **kw)
        p = rp.cope_positions(rp.cope_gates(q, k, scale=0.7, mask=mask, causal=causal,
                                            q_offset=1)[0])
        used = np.broadcast_to(_allowed(4, 5, mask, causal, 1), p.shape)
        free = p[used & (p < npos - 1)]  # away from integers (the clamp's pairs are flat)
        assert np.min(np.abs(free - np.round(free))) > 1e-4
        for name in args:
            def loss(x, name=name):
                call = {**args, name: x}
                return float(np.sum(rp.cope_attention(*call.values(), **kw) * d_out))
            np.testing.assert_allclose(grads[name], _finite_differences(loss, args[name]),
                                       rtol=1e-6, atol=1e-8, err_msg=name)
    torch = pytest.importorskip("torch")
    leaves = {n: torch.tensor(a, requires_grad=True) for n, a in args.items()}
    with kernels.disabled():
        out = rp.cope_attention(*leaves.values(), **{**kw, "mask": torch.tensor(mask)})
    out.backward(torch.tensor(d_out))
    for name, leaf in leaves.items():
        np.testing.assert_allclose(leaf.grad.numpy(), grads[name], rtol=1e-12, atol=1e-12,
                                   err_msg=name)


def test_gradients_at_integer_positions_and_the_clamp_match_torch():
    torch = pytest.importorskip("torch")
    # q = 0: every gate is 1/2, positions 0.5, 1, 1.5, 2 (integers among them); max_pos 2
    # clamps the positions above 1 (the gradient passes at the max, as torch.clamp's does)
    q = np.zeros((1, 4, 2))
    k = np.random.default_rng(6).standard_normal((1, 4, 2))
    v = np.random.default_rng(7).standard_normal((1, 4, 2))
    table = np.array([[0.3, -1.0], [2.0, 0.5]])
    d_out = np.ones((1, 4, 2))
    with kernels.disabled():
        grads = rp.cope_attention_vjp(q, k, v, table, d_output=d_out)
        leaves = [torch.tensor(a, requires_grad=True) for a in (q, k, v, table)]
        rp.cope_attention(*leaves).backward(torch.tensor(d_out))
    for name, leaf in zip(("q", "k", "v", "table"), leaves, strict=True):
        np.testing.assert_allclose(leaf.grad.numpy(), grads[name], rtol=1e-12, atol=1e-14,
                                   err_msg=name)


@st.composite
def _calls(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    heads, t_q, t_k = draw(st.integers(1, 3)), draw(st.integers(0, 6)), draw(st.integers(0, 7))
    lead = draw(st.sampled_from([(heads,), (2, heads)]))
    q, k, v = (rng.standard_normal((*lead, t, 4)).astype(dtype) for t in (t_q, t_k, t_k))
    npos = draw(st.integers(1, 6))
    table = rng.standard_normal(draw(st.sampled_from([(npos, 4), (heads, npos, 4)])))
    kwargs = {"mask": draw_mask(draw, rng, t_q, t_k), "q_offset": draw(st.integers(-2, 5)),
              "causal": draw(st.sampled_from([None, True, False])),
              "scale": draw(st.sampled_from([None, 0.7]))}
    d_out = rng.standard_normal((*lead, t_q, 4)).astype(dtype)
    return (q, k, v, table.astype(dtype)), kwargs, d_out


def _same(got, want, dtype):
    tol = {"float32": 5e-5, "float64": 1e-12}[str(dtype)]
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
        want = rp.cope_attention(*args, **kwargs, return_weights=True)
        want_g = rp.cope_attention_vjp(*args, **kwargs, d_output=d_out)
    got = rp.cope_attention(*args, **kwargs)
    got_g = rp.cope_attention_vjp(*args, **kwargs, d_output=d_out)
    dtype = str(args[0].dtype).removeprefix("torch.")
    assert type(got) is type(want[0]) and got.dtype == want[0].dtype
    assert got.shape == want[0].shape
    _same(got, want[0], dtype)
    for name, w in want_g.items():
        assert got_g[name].dtype == w.dtype and got_g[name].shape == w.shape, name
        _same(got_g[name], w, dtype)


def test_the_torch_kernels_run_and_reach_the_gates():
    torch = pytest.importorskip("torch")
    from relpos_ref.kernels import torch as kt

    rng = np.random.default_rng(8)
    q, k, v = (torch.from_numpy(rng.standard_normal((2, 6, 4))) for _ in range(3))
    table = torch.from_numpy(rng.standard_normal((5, 4)))
    d_out = torch.from_numpy(rng.standard_normal((2, 6, 4)))
    assert kt.KERNELS["cope"](q, k, v, table) is not NotImplemented
    got = kt.VJP_KERNELS["cope"](q, k, v, table, d_output=d_out)
    assert got is not NotImplemented
    with kernels.disabled():
        want = rp.cope_attention_vjp(q, k, v, table, d_output=d_out)
    for name in want:  # k's gradient comes from q.k and from the gates: both must arrive
        np.testing.assert_allclose(got[name].numpy(), want[name].numpy(), rtol=1e-12,
                                   atol=1e-12, err_msg=name)


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_decode_against_a_cache_equals_the_full_call(library):
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((2, 9, 4)) for _ in range(3))
    table = rng.standard_normal((2, 6, 4))
    if library == "torch":
        torch = pytest.importorskip("torch")
        q, k, v, table = (torch.from_numpy(a) for a in (q, k, v, table))
    full = np.asarray(rp.cope_attention(q, k, v, table))
    prefill = np.asarray(rp.cope_attention(q[:, :5], k[:, :5], v[:, :5], table))
    np.testing.assert_allclose(prefill, full[:, :5], rtol=1e-12, atol=1e-12)
    for step in range(5, 9):  # end-aligned: the query sits at the cache's last key
        out = rp.cope_attention(q[:, step:step + 1], k[:, :step + 1], v[:, :step + 1], table)
        np.testing.assert_allclose(np.asarray(out), full[:, step:step + 1], rtol=1e-12,
                                   atol=1e-12)
    # a chunk of queries after a cache, q_offset given
    chunk = rp.cope_attention(q[:, 6:8], k, v, table, q_offset=6)
    np.testing.assert_allclose(np.asarray(chunk), full[:, 6:8], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_dtype_is_kept(dtype):
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((2, 5, 4)).astype(dtype) for _ in range(3))
    table = rng.standard_normal((3, 4)).astype(dtype)
    out = rp.cope_attention(q, k, v, table)
    grads = rp.cope_attention_vjp(q, k, v, table, d_output=np.ones((2, 5, 4), dtype=dtype))
    assert out.dtype == np.dtype(dtype)
    assert all(g.dtype == np.dtype(dtype) for g in grads.values())
    want = rp.cope_attention(*(x.astype(np.float64) for x in (q, k, v, table)))
    np.testing.assert_allclose(out, want, rtol=2e-2 if dtype == "float16" else 1e-5, atol=2e-3)


@pytest.mark.parametrize(("table", "message"), [
    (np.zeros((3, 5)), "`table` must have width 4 to match the features, got shape (3, 5)"),
    (np.zeros((3, 3, 4)), "`table` has 3 heads (shape (3, 3, 4))"),
    (np.zeros((0, 4)), "`table` must have at least one row (max_pos >= 1), got shape (0, 4)"),
    (np.zeros(4), "`table` must have shape (n, d) or (h, n, d), got shape (4,)"),
])
def test_bad_tables_are_named(table, message):
    x = np.zeros((2, 5, 4))
    for function in (rp.cope_attention, cope.cope_attention):
        with pytest.raises(ValueError, match=__import__("re").escape(message)):
            function(x, x, x, table)


def test_blocked_attention_refuses_cope():
    x = np.zeros((5, 4))
    with pytest.raises(ValueError, match="blocked attention cannot evaluate `scheme` 'cope'"):
        rp.blocked_attention(x, x, x, np.zeros((3, 4)), scheme="cope")


def test_the_triton_kernels_take_cope_and_reach_the_gates():
    # interpreted on the CPU: the fused forward reads the dense term; the backward kernels
    # give its gradient, and autograd carries it through the lowering to q and k
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    kt = pytest.importorskip("relpos_ref.kernels.triton")
    gen = torch.Generator().manual_seed(0)
    q, k, v, d_out = (torch.randn(2, 2, 20, 8, generator=gen, dtype=torch.float64)
                      for _ in range(4))
    table = torch.randn(2, 6, 8, generator=gen, dtype=torch.float64)
    mask = torch.rand(20, 20, generator=gen) < 0.8
    with kt.interpreted():
        out = kt.KERNELS["cope"](q, k, v, table, mask=mask, q_offset=3)
        grads = kt.VJP_KERNELS["cope"](q, k, v, table, mask=mask, q_offset=3, d_output=d_out)
    assert out is not NotImplemented and grads is not NotImplemented
    with kernels.disabled():
        want = rp.cope_attention(q, k, v, table, mask=mask, q_offset=3)
        want_g = rp.cope_attention_vjp(q, k, v, table, mask=mask, q_offset=3, d_output=d_out)
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)
    for name, w in want_g.items():
        np.testing.assert_allclose(grads[name].numpy(), w.numpy(), rtol=1e-9, atol=1e-11,
                                   err_msg=name)


def test_the_numpy_kernel_s_weights_leave_out_the_batch_only_v_has():
    # v with more leading axes than q, k and the table widens the output, not the weights
    # (the kernel's weights once took v's batch)
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 2, 3, 4))
    v, table = rng.standard_normal((5, 2, 3, 1)), rng.standard_normal((3, 4))
    out, weights = rp.cope_attention(q, k, v, table, return_weights=True)
    with kernels.disabled():
        want_out, want_weights = rp.cope_attention(q, k, v, table, return_weights=True)
    assert weights.shape == want_weights.shape == (2, 3, 3)
    np.testing.assert_allclose(weights, want_weights, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-14)


@settings(deadline=None, max_examples=40)
@given(call=_calls(), rows=st.integers(1, 3))
def test_the_numpy_kernels_run_a_causal_call_by_blocks_of_queries(call, rows):
    # causal, no mask, q_offset >= 0: blocks of `rows` queries against their keys only, the
    # forward and the VJP
    from relpos_ref.kernels import _numpy_cope

    args, kwargs, d_out = call
    kwargs.update(mask=None, causal=True, q_offset=abs(kwargs["q_offset"]))
    with kernels.disabled():
        want = rp.cope_attention(*args, **kwargs)
        want_g = rp.cope_attention_vjp(*args, **kwargs, d_output=d_out)
    with mock.patch.object(_numpy_cope, "ROWS", rows), \
            mock.patch.object(_numpy_cope, "_forward", side_effect=AssertionError("whole grid")):
        got = rp.cope_attention(*args, **kwargs)
        got_g = rp.cope_attention_vjp(*args, **kwargs, d_output=d_out)
    assert type(got) is type(want) and got.dtype == want.dtype and got.shape == want.shape
    _same(got, want, str(args[0].dtype))
    for name, w in want_g.items():
        assert got_g[name].dtype == w.dtype and got_g[name].shape == w.shape, name
        _same(got_g[name], w, str(args[0].dtype))


def test_the_numpy_kernel_runs_a_long_causal_call_by_blocks():
    # 300 queries after 20 cached keys: three blocks of the module's size, the last partial
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 300, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, 320, 8)).astype(np.float32) for _ in range(2))
    table = rng.standard_normal((16, 8)).astype(np.float32)
    with kernels.disabled():
        want = rp.cope_attention(q, k, v, table)
    _same(rp.cope_attention(q, k, v, table), want, "float32")
