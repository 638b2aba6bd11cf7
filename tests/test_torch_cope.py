"""CoPE's direct torch evaluation (`relpos_ref.kernels._torch_cope`) equals the specification.

The torch kernel evaluates a CoPE call no gradient is taken of without the
lowering (one product of ``q`` and ``k``), and its VJP kernel runs its own
backward pass; a call autograd records goes through the lowering, whose
autograd carries the gates' gradient. Each is compared here with the
specification on torch under `relpos_ref.kernels.disabled`, and the tests
check which path ran.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_kernels import TOL

import relpos_ref as rp
from relpos_ref import kernels

torch = pytest.importorskip("torch")
torch_kernels = pytest.importorskip("relpos_ref.kernels.torch")
_torch_cope = pytest.importorskip("relpos_ref.kernels._torch_cope")


def counted(monkeypatch, table, scheme="cope"):
    """The calls `table`'s entry for `scheme` receives from now on (`DIRECT`, `DIRECT_VJP`)."""
    seen = []
    inner = table[scheme]

    def counting(*args):
        seen.append(args)
        return inner(*args)

    monkeypatch.setitem(table, scheme, counting)
    return seen


@pytest.fixture
def direct_calls(monkeypatch):
    """The calls the direct evaluation received, counted."""
    return counted(monkeypatch, torch_kernels.DIRECT)


@pytest.fixture
def direct_vjps(monkeypatch):
    """The calls the direct VJP received, counted."""
    return counted(monkeypatch, torch_kernels.DIRECT_VJP)


def _spec(*args, **kwargs):
    with kernels.disabled():
        return rp.cope_attention(*args, **kwargs)


@st.composite
def cope_calls(draw):
    """CoPE calls: batches that broadcast, shared or per-head tables, few or many positions
    (the clamp), masks with empty rows, causal or not, any offset and scale."""
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    heads = draw(st.integers(1, 3))
    t_q, t_k, d, d_v = (draw(st.integers(1, n)) for n in (6, 7, 4, 3))
    max_pos = draw(st.integers(1, 9))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))

    def tensor(*shape):
        return torch.from_numpy(2 * rng.standard_normal(shape)).to(dtype)

    q = tensor(*draw(st.sampled_from([(heads,), (2, heads)])), t_q, d)
    k = tensor(*draw(st.sampled_from([(heads,), (1, heads)])), t_k, d)
    v = tensor(*draw(st.sampled_from([(heads,), (1,)])), t_k, d_v)
    table = tensor(*draw(st.sampled_from([(), (heads,)])), max_pos, d)
    kwargs = {"causal": draw(st.booleans()), "q_offset": draw(st.integers(-3, 4)),
              "scale": draw(st.sampled_from([None, 0.7, -0.4, 0.0]))}
    if draw(st.booleans()):
        shape = draw(st.sampled_from([(t_q, t_k), (t_q, 1), (heads, t_q, t_k)]))
        kwargs["mask"] = torch.from_numpy(rng.random(shape) < 0.6)
    return (q, k, v, table), kwargs


@given(call=cope_calls())
def test_the_direct_evaluation_equals_the_specification(call, direct_calls):
    args, kwargs = call
    direct_calls.clear()
    out = rp.cope_attention(*args, **kwargs)
    want = _spec(*args, **kwargs)
    assert len(direct_calls) == 1, "the call did not reach the direct evaluation"
    assert out.dtype == want.dtype and out.shape == want.shape
    np.testing.assert_allclose(out.numpy(), want.numpy(), **TOL[str(want.dtype)[6:]])


@given(call=cope_calls(), rows=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_a_causal_call_by_blocks_of_queries_equals_the_specification(call, rows, seed,
                                                                     direct_calls, direct_vjps):
    # causal, no mask, q_offset >= 0: blocks of `rows` queries against their keys only, the
    # forward and the VJP
    args, kwargs = call
    kwargs.pop("mask", None)
    kwargs.update(causal=True, q_offset=abs(kwargs["q_offset"]))
    want = _spec(*args, **kwargs)
    rng = np.random.default_rng(seed)
    d_output = torch.from_numpy(rng.standard_normal(want.shape)).to(want.dtype)
    with kernels.disabled():
        want_g = rp.cope_attention_vjp(*args, **kwargs, d_output=d_output)
    whole = mock.patch.object(_torch_cope, "_forward", side_effect=AssertionError("whole grid"))
    with mock.patch.object(_torch_cope, "ROWS", rows), whole:
        direct_calls.clear()
        direct_vjps.clear()
        out = rp.cope_attention(*args, **kwargs)
        got_g = rp.cope_attention_vjp(*args, **kwargs, d_output=d_output)
    assert len(direct_calls) == 1, "the call did not reach the direct evaluation"
    assert len(direct_vjps) == 1, "the call did not reach the direct VJP"
    assert out.dtype == want.dtype and out.shape == want.shape
    tol = TOL[str(want.dtype)[6:]]
    np.testing.assert_allclose(out.numpy(), want.numpy(), **tol)
    for name, grad in want_g.items():
        assert got_g[name].dtype == grad.dtype and got_g[name].shape == grad.shape, name
        scale = max(1.0, float(grad.abs().max()))
        np.testing.assert_allclose(got_g[name].numpy(), grad.numpy(), rtol=tol["rtol"],
                                   atol=tol["atol"] * scale, err_msg=name)


def test_a_long_causal_call_runs_its_blocks(direct_calls):
    # 300 queries after 20 cached keys: three blocks of the module's size, the last partial
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 300, 8, generator=g)
    k, v = torch.randn(2, 2, 320, 8, generator=g).unbind(0)
    table = torch.randn(16, 8, generator=g)
    out = rp.cope_attention(q, k, v, table)
    assert len(direct_calls) == 1
    np.testing.assert_allclose(out.numpy(), _spec(q, k, v, table).numpy(), **TOL["float32"])


@given(call=cope_calls(), seed=st.integers(0, 2**16))
def test_the_direct_vjp_equals_the_specifications(call, seed, direct_vjps):
    args, kwargs = call
    out = _spec(*args, **kwargs)
    rng = np.random.default_rng(seed)
    kwargs["d_output"] = torch.from_numpy(rng.standard_normal(out.shape)).to(out.dtype)
    direct_vjps.clear()
    got = rp.cope_attention_vjp(*args, **kwargs)
    with kernels.disabled():
        want = rp.cope_attention_vjp(*args, **kwargs)
    assert len(direct_vjps) == 1, "the call did not reach the direct VJP"
    assert sorted(got) == sorted(want) == ["k", "q", "table", "v"]
    tol = TOL[str(out.dtype)[6:]]
    for name, grad in want.items():
        assert got[name].dtype == grad.dtype and got[name].shape == grad.shape, name
        scale = max(1.0, float(grad.abs().max()))  # gradients summed over broadcast batches
        np.testing.assert_allclose(got[name].numpy(), grad.numpy(), rtol=tol["rtol"],
                                   atol=tol["atol"] * scale, err_msg=name)


def test_rows_with_no_key_are_zero(direct_calls):
    q, k, v = torch.randn(3, 2, 4, 3, dtype=torch.float64).unbind(0)
    mask = torch.tensor([[True, False, True, False], [False, False, False, False]] * 2)
    out = rp.cope_attention(q, k, v, torch.randn(5, 3, dtype=torch.float64), mask=mask,
                            causal=False)
    assert len(direct_calls) == 1
    assert torch.equal(out[:, [1, 3]], torch.zeros_like(out[:, [1, 3]]))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_calls_run_in_float32_and_return_their_dtype(dtype, direct_calls):
    q, k, v = torch.randn(3, 2, 6, 4).unbind(0)
    table = torch.randn(4, 4)
    out = rp.cope_attention(*(x.to(dtype) for x in (q, k, v, table)))
    assert len(direct_calls) == 1 and direct_calls[0][0].dtype == torch.float32
    want = _spec(*(x.to(dtype).float() for x in (q, k, v, table)))
    assert out.dtype == dtype
    np.testing.assert_allclose(out.float().numpy(), want.to(dtype).float().numpy(),
                               rtol=0, atol=float(torch.finfo(dtype).eps) * 4)


def test_a_differentiated_call_goes_through_the_lowering_and_its_gradients(direct_calls,
                                                                          direct_vjps):
    # autograd needs the lowering's differentiable term: the direct evaluation works in place
    q, k, v = (torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    table = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    out = rp.cope_attention(q, k, v, table, causal=False)
    assert not direct_calls
    grads = torch.autograd.grad(out.sum(), (q, k, v, table))
    with kernels.disabled():
        want = torch.autograd.grad(rp.cope_attention(q, k, v, table, causal=False).sum(),
                                   (q, k, v, table))
    for got, expected in zip(grads, want, strict=True):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-10, atol=1e-12)
    d_output = torch.randn(2, 5, 3, dtype=torch.float64)
    found = rp.cope_attention_vjp(*(x.detach() for x in (q, k, v, table)), d_output=d_output)
    assert not direct_calls and len(direct_vjps) == 1  # the VJP's own backward pass
    with kernels.disabled():
        spec = rp.cope_attention_vjp(*(x.detach() for x in (q, k, v, table)),
                                     d_output=d_output)
    for name, grad in spec.items():
        np.testing.assert_allclose(found[name].numpy(), grad.numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=name)


def test_the_vjp_passes_no_gradient_to_a_position_at_an_integer(direct_vjps):
    # k = 0: every gate is 1/2, so every second position is an integer, where the term's
    # derivative by the position is 0 (ceil = floor), and the clamp holds from max_pos - 1
    rng = np.random.default_rng(3)
    q, v, d_output = (torch.from_numpy(rng.standard_normal((2, 9, 4))) for _ in range(3))
    k = torch.zeros(2, 9, 4, dtype=torch.float64)
    table = torch.from_numpy(rng.standard_normal((3, 4)))
    got = rp.cope_attention_vjp(q, k, v, table, d_output=d_output)
    with kernels.disabled():
        want = rp.cope_attention_vjp(q, k, v, table, d_output=d_output)
    assert len(direct_vjps) == 1
    for name, grad in want.items():
        np.testing.assert_allclose(got[name].numpy(), grad.numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=name)
