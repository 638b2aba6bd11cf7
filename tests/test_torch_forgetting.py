"""The forgetting bias's direct torch evaluation (`relpos_ref.kernels._torch_forgetting`).

A call no gradient is taken of runs the block engine with the bias rounded
once into the call's dtype, keys reversed (no float64 ``(h, t_q, t_k)``
arrays), and the VJP kernel the engine's backward pass, carrying the bias's
row and column sums to ``f``. Each is compared with the specification on torch under
`relpos_ref.kernels.disabled`, and the tests check which path ran.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_kernels import TOL
from test_torch_cope import counted

import relpos_ref as rp
from relpos_ref import kernels

torch = pytest.importorskip("torch")
torch_kernels = pytest.importorskip("relpos_ref.kernels.torch")


@pytest.fixture
def direct_calls(monkeypatch):
    return counted(monkeypatch, torch_kernels.DIRECT, "forgetting")


@pytest.fixture
def direct_vjps(monkeypatch):
    return counted(monkeypatch, torch_kernels.DIRECT_VJP, "forgetting")


@st.composite
def forgetting_calls(draw):
    """Batches that broadcast, gates per head or per batch entry and head, gates past the
    last key, masks with empty rows, offsets that put queries before position 0, any scale,
    gates of large magnitude."""
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    heads = draw(st.integers(1, 3))
    t_k, d, d_v = (draw(st.integers(1, n)) for n in (7, 4, 3))
    n = t_k + draw(st.integers(0, 2))  # gates past the last key
    t_q = draw(st.integers(1, min(6, n + 3)))  # every query after position -4 has a gate
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    size = draw(st.sampled_from([1.0, 30.0]))

    def tensor(*shape, scale=2.0):
        return torch.from_numpy(scale * rng.standard_normal(shape)).to(dtype)

    q = tensor(*draw(st.sampled_from([(heads,), (2, heads)])), t_q, d)
    k = tensor(*draw(st.sampled_from([(heads,), (1, heads)])), t_k, d)
    v = tensor(*draw(st.sampled_from([(heads,), (1,)])), t_k, d_v)
    f = tensor(*draw(st.sampled_from([(heads,), tuple(q.shape[:-2]), (1,)])), n, scale=size)
    q_offset = draw(st.integers(-3, n - t_q))
    kwargs = {"q_offset": q_offset, "scale": draw(st.sampled_from([None, 0.7, -0.4, 0.0]))}
    if draw(st.booleans()):
        shape = draw(st.sampled_from([(t_q, t_k), (t_q, 1), (heads, t_q, t_k)]))
        kwargs["mask"] = torch.from_numpy(rng.random(shape) < 0.6)
    return (q, k, v, f), kwargs


@given(call=forgetting_calls())
def test_the_direct_evaluation_equals_the_specification(call, direct_calls):
    args, kwargs = call
    direct_calls.clear()
    out = rp.forgetting_attention(*args, **kwargs)
    with kernels.disabled():
        want = rp.forgetting_attention(*args, **kwargs)
    assert len(direct_calls) == 1, "the call did not reach the direct evaluation"
    assert out.dtype == want.dtype and out.shape == want.shape
    np.testing.assert_allclose(out.numpy(), want.numpy(), **TOL[str(want.dtype)[6:]])


@given(call=forgetting_calls(), seed=st.integers(0, 2**16))
def test_the_direct_vjp_equals_the_specifications(call, seed, direct_vjps):
    args, kwargs = call
    with kernels.disabled():
        out = rp.forgetting_attention(*args, **kwargs)
    rng = np.random.default_rng(seed)
    kwargs["d_output"] = torch.from_numpy(rng.standard_normal(out.shape)).to(out.dtype)
    direct_vjps.clear()
    got = rp.forgetting_attention_vjp(*args, **kwargs)
    with kernels.disabled():
        want = rp.forgetting_attention_vjp(*args, **kwargs)
    assert len(direct_vjps) == 1, "the call did not reach the direct VJP"
    assert sorted(got) == sorted(want) == ["f", "k", "q", "v"]
    tol = TOL[str(out.dtype)[6:]]
    for name, grad in want.items():
        assert got[name].dtype == grad.dtype and got[name].shape == grad.shape, name
        scale = max(1.0, float(grad.abs().max()))  # gradients summed over broadcast batches
        np.testing.assert_allclose(got[name].numpy(), grad.numpy(), rtol=tol["rtol"],
                                   atol=tol["atol"] * scale, err_msg=name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_calls_run_in_float32_and_return_their_dtype(dtype, direct_calls):
    q, k, v = torch.randn(3, 2, 6, 4).unbind(0)
    f = torch.randn(2, 6)
    out = rp.forgetting_attention(*(x.to(dtype) for x in (q, k, v, f)))
    assert len(direct_calls) == 1 and direct_calls[0][0].dtype == torch.float32
    with kernels.disabled():
        want = rp.forgetting_attention(*(x.to(dtype).float() for x in (q, k, v, f)))
    assert out.dtype == dtype
    np.testing.assert_allclose(out.float().numpy(), want.to(dtype).float().numpy(),
                               rtol=0, atol=float(torch.finfo(dtype).eps) * 4)


def test_a_differentiated_call_goes_through_the_lowering(direct_calls):
    q, k, v = (torch.randn(2, 5, 4, dtype=torch.float64) for _ in range(3))
    f = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    out = rp.forgetting_attention(q, k, v, f)
    out.sum().backward()
    assert not direct_calls and f.grad is not None and torch.isfinite(f.grad).all()


def test_the_gates_are_read_under_vmap_as_under_torch_func_transforms():
    """vmap wraps f: the bias's check for closed gates reads no value there, and a closed
    gate inside a vmapped call still masks exactly its pairs."""
    f = torch.randn(3, 2, 5, dtype=torch.float64)
    f[1, 0, 2] = -torch.inf
    got = torch.func.vmap(lambda x: rp.forgetting_bias(x, 5))(f)
    for i in range(3):
        torch.testing.assert_close(got[i], rp.forgetting_bias(f[i], 5), rtol=0, atol=0)
    assert (got[1, 0, 2:, :2] == -torch.inf).all() and torch.isfinite(got[0]).all()
    q = torch.randn(2, 5, 4, dtype=torch.float64)
    out = torch.func.vmap(lambda x: rp.forgetting_attention(q, q, q, x))(f)
    for i in range(3):
        torch.testing.assert_close(out[i], rp.forgetting_attention(q, q, q, f[i]))


def test_a_row_whose_bias_is_minus_infinity_at_every_key_gets_zeros(direct_calls):
    # gates of -3e38 (finite): F_p - F_j rounds to -inf for the queries past the keys, so the
    # bias masks every key of those rows; the specification gives them zeros, as the kernels
    # must (forward and VJP), not the softmax's NaN
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 1, 2), torch.randn(1, 2, 2), torch.randn(1, 2, 2)
    f = torch.full((1, 4), -3e38)
    d_output = torch.ones(1, 1, 2)
    out = rp.forgetting_attention(q, k, v, f, q_offset=3)
    got = rp.forgetting_attention_vjp(q, k, v, f, q_offset=3, d_output=d_output)
    with kernels.disabled():
        want = rp.forgetting_attention(q, k, v, f, q_offset=3)
        want_vjp = rp.forgetting_attention_vjp(q, k, v, f, q_offset=3, d_output=d_output)
    assert direct_calls, "the call did not reach the direct evaluation"
    assert torch.equal(want, torch.zeros_like(want)) and torch.equal(out, want)
    for name, grad in want_vjp.items():
        assert torch.equal(got[name], grad), name
