"""FIRE's direct torch evaluation (`relpos_ref.kernels._torch_fire`).

A call no gradient is taken of makes FIRE's bias row by row (the rows
normalised by ``psi(|L|)`` read from one row of distances, the others a block
at a time, a causal block's unseen keys not made), keys reversed, and the
block engine evaluates the call with it; the VJP kernel runs the engine's
backward pass with that bias and carries its cotangent back through the MLP
a block of rows at a time. Each is compared with the specification on torch under
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
torch_fire = pytest.importorskip("relpos_ref.kernels._torch_fire")


@pytest.fixture
def direct_calls(monkeypatch):
    return counted(monkeypatch, torch_kernels.DIRECT, "fire")


@pytest.fixture
def direct_vjps(monkeypatch):
    return counted(monkeypatch, torch_kernels.DIRECT_VJP, "fire")


@pytest.fixture(autouse=True)
def few_rows(monkeypatch):
    # blocks of 2 rows: a call of a few queries runs several blocks, a partial one last
    monkeypatch.setattr(torch_fire, "ROWS", 2)


@st.composite
def fire_calls(draw):
    """Batches that broadcast, one MLP for every head or one per head, an output bias, a
    threshold L that puts the rows normalised by psi(|L|) anywhere (none, some, all),
    offsets before position 0, causal or not, masks with empty rows, any scale."""
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    heads = draw(st.integers(1, 3))
    t_q, t_k, d, d_v, m = (draw(st.integers(1, n)) for n in (7, 7, 4, 3, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))

    def tensor(*shape, scale=1.0):
        return torch.from_numpy(scale * rng.standard_normal(shape)).to(dtype)

    q = tensor(*draw(st.sampled_from([(heads,), (2, heads)])), t_q, d)
    k = tensor(*draw(st.sampled_from([(heads,), (1, heads)])), t_k, d)
    v = tensor(*draw(st.sampled_from([(heads,), (1,)])), t_k, d_v)
    per_head = draw(st.booleans())
    w1 = tensor(*((heads,) if per_head else ()), m, 1, scale=4.0)
    b1 = tensor(*((heads,) if per_head else ()), m)
    w2 = tensor(heads, m) if per_head or draw(st.booleans()) else tensor(m)
    kwargs = {"q_offset": draw(st.integers(-3, 4)), "causal": draw(st.booleans()),
              "scale": draw(st.sampled_from([None, 0.7, -0.4, 0.0])),
              "L": draw(st.sampled_from([0.5, 2.0, 3.0, -4.0, 100.0, torch.tensor(2.5)])),
              "c": draw(st.sampled_from([0.1, 1.0, -0.5, torch.tensor(0.3)]))}
    for name in ("L", "c"):
        if isinstance(kwargs[name], torch.Tensor):
            kwargs[name] = kwargs[name].to(dtype)
    if draw(st.booleans()):
        kwargs["b2"] = tensor(heads) if w2.ndim == 2 else tensor(1)
    if draw(st.booleans()):
        shape = draw(st.sampled_from([(t_q, t_k), (t_q, 1), (heads, t_q, t_k)]))
        kwargs["mask"] = torch.from_numpy(rng.random(shape) < 0.6)
    return (q, k, v, w1, b1, w2), kwargs


@given(call=fire_calls())
def test_the_direct_evaluation_equals_the_specification(call, direct_calls):
    args, kwargs = call
    direct_calls.clear()
    out = rp.fire_attention(*args, **kwargs)
    with kernels.disabled():
        want = rp.fire_attention(*args, **kwargs)
    assert len(direct_calls) == 1, "the call did not reach the direct evaluation"
    assert out.dtype == want.dtype and out.shape == want.shape
    np.testing.assert_allclose(out.numpy(), want.numpy(), **TOL[str(want.dtype)[6:]])


@given(call=fire_calls(), causal=st.booleans())
def test_the_reversed_bias_equals_the_specification_s(call, causal):
    # the bias itself, keys reversed, every block size; a causal call's keys no row of a block
    # sees are not made (the engine masks them)
    (q, _k, _v, w1, b1, w2), kwargs = call
    t_q, t_k = q.shape[-2], _k.shape[-2]
    q_offset = kwargs["q_offset"]
    named = {"w1": w1, "b1": b1, "w2": w2, "c": kwargs["c"], "L": kwargs["L"]}
    if "b2" in kwargs:
        named["b2"] = kwargs["b2"]
    fake = torch.zeros(t_q, 1, dtype=q.dtype)
    keys = torch.zeros(t_k, 1, dtype=q.dtype)
    from relpos_ref.calls import resolve_call

    call_ = resolve_call(fake, keys, keys, scale=None, mask=None, causal=causal,
                         q_offset=q_offset)
    got = torch_fire.fire_bias_keys_reversed(named, call_)
    want = rp.fire_bias(w1, b1, w2, t_q, t_k, b2=kwargs.get("b2"), c=kwargs["c"],
                        L=kwargs["L"], q_offset=q_offset)
    want = want if want.ndim == 3 else want[None]
    assert got.dtype == want.dtype and got.shape == want.shape
    got = got.flip(-1)
    made = torch.ones(t_q, t_k, dtype=torch.bool)
    if causal:  # made: the keys up to the last query of the row's block of ROWS
        shared = int((torch.arange(t_q) + q_offset <= abs(kwargs["L"])).sum())
        ends = torch.where(torch.arange(t_q) < shared, shared,
                           torch.minimum(shared + ((torch.arange(t_q) - shared) // torch_fire.ROWS
                                                   + 1) * torch_fire.ROWS, torch.tensor(t_q)))
        made = torch.arange(t_k)[None, :] < (ends + q_offset)[:, None]
        seen = torch.arange(t_k)[None, :] <= torch.arange(t_q)[:, None] + q_offset
        assert bool((made | ~seen).all())  # every key a query sees is made
    np.testing.assert_allclose(got[:, made].numpy(), want[:, made].numpy(),
                               **TOL[str(q.dtype)[6:]])


@given(call=fire_calls(), seed=st.integers(0, 2**16))
def test_the_direct_vjp_equals_the_specifications(call, seed, direct_vjps):
    args, kwargs = call
    with kernels.disabled():
        out = rp.fire_attention(*args, **kwargs)
    rng = np.random.default_rng(seed)
    kwargs["d_output"] = torch.from_numpy(rng.standard_normal(out.shape)).to(out.dtype)
    direct_vjps.clear()
    got = rp.fire_attention_vjp(*args, **kwargs)
    with kernels.disabled():
        want = rp.fire_attention_vjp(*args, **kwargs)
    assert len(direct_vjps) == 1, "the call did not reach the direct VJP"
    assert sorted(got) == sorted(want)
    tol = TOL[str(out.dtype)[6:]]
    for name, grad in want.items():
        assert got[name].dtype == grad.dtype and got[name].shape == grad.shape, name
        scale = max(1.0, float(grad.abs().max()))  # gradients summed over many pairs
        np.testing.assert_allclose(got[name].numpy(), grad.numpy(), rtol=tol["rtol"],
                                   atol=tol["atol"] * scale, err_msg=name)


def test_a_long_call_reads_the_shared_rows_and_blocks_of_the_others(monkeypatch, direct_calls):
    # 40 queries, L = 16: 17 rows by distance, 23 in blocks of the module's size
    monkeypatch.setattr(torch_fire, "ROWS", 64)
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 2, 40, 8, generator=g).unbind(0)
    w1, b1, w2 = torch.randn(6, 1, generator=g), torch.randn(6, generator=g), torch.randn(2, 6)
    out = rp.fire_attention(q, k, v, w1, b1, w2, L=16.0)
    with kernels.disabled():
        want = rp.fire_attention(q, k, v, w1, b1, w2, L=16.0)
    assert len(direct_calls) == 1
    np.testing.assert_allclose(out.numpy(), want.numpy(), **TOL["float32"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_calls_run_in_float32_and_return_their_dtype(dtype, direct_calls):
    q, k, v = torch.randn(3, 2, 6, 4).unbind(0)
    w1, b1, w2 = torch.randn(3, 1), torch.randn(3), torch.randn(2, 3)
    args = [x.to(dtype) for x in (q, k, v, w1, b1, w2)]
    out = rp.fire_attention(*args, L=2.0)
    assert len(direct_calls) == 1 and direct_calls[0][0].dtype == torch.float32
    with kernels.disabled():
        want = rp.fire_attention(*(x.float() for x in args), L=2.0)
    assert out.dtype == dtype
    np.testing.assert_allclose(out.float().numpy(), want.to(dtype).float().numpy(),
                               rtol=0, atol=float(torch.finfo(dtype).eps) * 4)


def test_an_input_beyond_the_dtype_goes_to_the_specification(direct_calls):
    # L = 0, eps = 1e-310 (a normaliser of 0 is refused with eps = 0): query 0 (position 0)
    # divides by 1e-310, its inputs overflow to inf, where the specification's relu(1 - x)
    # and relu(x - 1) are 0 and inf; the direct path hands the call back
    q, k, v = (torch.randn(2, 4, 3, dtype=torch.float64) for _ in range(3))
    w1, b1, w2 = (torch.randn(s, dtype=torch.float64) for s in ((3, 1), (3,), (2, 3)))
    out = rp.fire_attention(q, k, v, w1, b1, w2, L=0.0, eps=1e-310)
    with kernels.disabled():
        want = rp.fire_attention(q, k, v, w1, b1, w2, L=0.0, eps=1e-310)
    assert len(direct_calls) == 1
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)


def test_a_differentiated_call_goes_through_the_lowering(direct_calls):
    q, k, v = (torch.randn(2, 5, 4, dtype=torch.float64) for _ in range(3))
    w1 = torch.randn(3, 1, dtype=torch.float64, requires_grad=True)
    b1, w2 = torch.randn(3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    rp.fire_attention(q, k, v, w1, b1, w2).sum().backward()
    assert not direct_calls and w1.grad is not None and torch.isfinite(w1.grad).all()


@pytest.mark.parametrize("causal", [False, True])
def test_the_vjp_sums_by_chunks_of_pairs_and_of_rows(monkeypatch, direct_vjps, causal):
    # chunks of 3 pairs for the sums by segment and blocks of 2 rows for the bias and the
    # MLP's backward (a causal block skips the keys after its last query)
    from relpos_ref.kernels import _fire_vjp

    monkeypatch.setattr(_fire_vjp, "SUM_CHUNK", 3)
    monkeypatch.setattr(torch_fire, "ROWS", 2)
    g = torch.Generator().manual_seed(1)
    q, k, v, d_output = torch.randn(4, 2, 9, 4, generator=g, dtype=torch.float64).unbind(0)
    w1, b1 = torch.randn(2, 5, 1, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)
    w2 = torch.randn(2, 5, dtype=torch.float64)
    got = rp.fire_attention_vjp(q, k, v, w1, b1, w2, d_output=d_output, L=4.0, causal=causal)
    with kernels.disabled():
        want = rp.fire_attention_vjp(q, k, v, w1, b1, w2, d_output=d_output, L=4.0,
                                     causal=causal)
    assert len(direct_vjps) == 1
    for name, grad in want.items():
        np.testing.assert_allclose(got[name].numpy(), grad.numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_vjps_run_in_float32_and_return_their_dtypes(dtype, direct_vjps):
    g = torch.Generator().manual_seed(2)
    q, k, v, d_output = torch.randn(4, 2, 6, 4, generator=g).unbind(0)
    w1, b1, w2 = torch.randn(3, 1, generator=g), torch.randn(3, generator=g), torch.randn(2, 3)
    args = [x.to(dtype) for x in (q, k, v, w1, b1, w2)]
    got = rp.fire_attention_vjp(*args, d_output=d_output.to(dtype), L=2.0)
    assert len(direct_vjps) == 1 and direct_vjps[0][0].dtype == torch.float32
    with kernels.disabled():
        want = rp.fire_attention_vjp(*(x.float() for x in args), d_output=d_output.to(dtype)
                                     .float(), L=2.0)
    for name, grad in want.items():
        assert got[name].dtype == dtype, name
        np.testing.assert_allclose(got[name].float().numpy(), grad.to(got[name].dtype)
                                   .float().numpy(), rtol=2e-2, atol=2e-2, err_msg=name)


@pytest.mark.parametrize("library", ["numpy", "torch"])
@pytest.mark.parametrize("options", [{"L": 0.0, "eps": 1e-300, "causal": False},
                                     {"L": 1e-300, "eps": 0.0, "q_offset": -1}])
def test_an_input_that_overflows_is_the_specifications(library, options):
    # a normaliser tiny but not 0 makes x infinite in float32: relu(1 - x) is 0 there in the
    # specification, where A x + B would be NaN; the kernels hand such a call back
    rng = np.random.default_rng(0)
    q, k, v, d_output = (rng.standard_normal((1, 4, 3)).astype(np.float32) for _ in range(4))
    mlp = [np.asarray(a, np.float32) for a in ([[-1.0]], [1.0], [[1.0]])]
    args = [q, k, v, *mlp]
    if library == "torch":
        args, d_output = [torch.from_numpy(a) for a in args], torch.from_numpy(d_output)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # the specification
        with kernels.disabled():
            want = rp.fire_attention(*args, **options)
            want_g = rp.fire_attention_vjp(*args, d_output=d_output, **options)
        got = rp.fire_attention(*args, **options)
        got_g = rp.fire_attention_vjp(*args, d_output=d_output, **options)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    for name, grad in want_g.items():
        np.testing.assert_allclose(np.asarray(got_g[name]), np.asarray(grad), rtol=1e-5,
                                   atol=1e-6, err_msg=name)


@pytest.mark.parametrize("causal", [False, True])
def test_a_row_whose_bias_is_minus_infinity_at_every_key_gets_zeros(causal, direct_calls,
                                                                      direct_vjps):
    # w2 w1 = -1e40 overflows float32: every pair at x > 0 has a bias of -inf, so the queries
    # past every key (q_offset 5) see none; zeros, forward and VJP, as the specification's
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 2), torch.randn(1, 3, 2), torch.randn(1, 3, 2)
    w1, b1, w2 = torch.tensor([[1e20]]), torch.tensor([0.0]), torch.tensor([[-1e20]])
    kwargs = {"q_offset": 5, "causal": causal}
    d_output = torch.ones(1, 2, 2)
    out = rp.fire_attention(q, k, v, w1, b1, w2, **kwargs)
    got = rp.fire_attention_vjp(q, k, v, w1, b1, w2, d_output=d_output, **kwargs)
    with kernels.disabled():
        want = rp.fire_attention(q, k, v, w1, b1, w2, **kwargs)
        want_vjp = rp.fire_attention_vjp(q, k, v, w1, b1, w2, d_output=d_output, **kwargs)
    assert direct_calls and direct_vjps, "the calls did not reach the direct paths"
    assert torch.equal(want, torch.zeros_like(want)) and torch.equal(out, want)
    for name in ("q", "k", "v"):
        assert torch.equal(got[name], want_vjp[name]), name
