"""The torch kernels (SDPA) equal the specification on torch, scheme by scheme.

The same hypothesis calls as the NumPy kernels' tests (`test_kernels.calls`:
shapes with empty grids, offsets, causality, masks with empty rows and
broadcast ones, every policy and option, shared and per-head tables, float32
and float64), as torch tensors on each device torch has: the kernel, called
directly, returns what the specification returns on torch under
`relpos_ref.kernels.disabled`, or hands the call back only where its module
says it does. 16-bit calls, non-finite values behind a mask, rows with no
key (forward and gradient), transforms that must reach the specification,
and bad input (the specification's error, word for word) are checked
separately. On a machine without CUDA the CUDA cases skip.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kernels import BAD_CALLS, TOL, _errors_alike, _public, calls
from test_kernels_vjp import RTOL, vjp_calls

import relpos_ref as rp
from relpos_ref import catalog, kernels

torch = pytest.importorskip("torch")

KERNELS = kernels.kernels("torch")
VJP_KERNELS = kernels.vjp_kernels("torch")
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="torch sees no CUDA device here")),
]
VALUE_TABLES = {(s, t.name) for s in catalog.names() for t in catalog.get(s).tables
                if t.width == "d_v"}


def _tensor(x, device):
    if not isinstance(x, np.ndarray):
        return x
    return torch.from_numpy(np.ascontiguousarray(x)).to(device)


def _on(device, args, kwargs):
    return ([_tensor(a, device) for a in args],
            {name: _tensor(a, device) for name, a in kwargs.items()})


def _spec(scheme, args, kwargs):
    with kernels.disabled():
        return getattr(rp, _public(scheme))(*args, **kwargs)


def _declines(scheme, args, kwargs=None):
    """Whether the torch kernel may hand this call back: an empty grid, nothing else (value
    tables included: the block engine bins them), but Swin v2's additive mask."""
    q, k = args[0], args[1]
    penalty = scheme == "swinv2" and kwargs is not None and kwargs.get("mask") is not None \
        and kwargs.get("mask_penalty") is not None
    return q.shape[-2] == 0 or k.shape[-2] == 0 or penalty


def _assert_close(got, want):
    assert isinstance(got, torch.Tensor) and got.dtype == want.dtype
    assert got.shape == want.shape and got.device == want.device
    np.testing.assert_allclose(got.cpu().double().numpy(), want.cpu().double().numpy(),
                               **TOL[str(want.dtype).removeprefix("torch.")])


def test_every_catalog_scheme_has_a_torch_kernel():
    assert set(KERNELS) == set(VJP_KERNELS) == set(catalog.names(plain=True))
    q = torch.eye(3)
    assert kernels.kernel_for("bias", (q, None, 2)) is KERNELS["bias"]
    assert kernels.kernel_for("bias", (q, np.eye(3))) is None  # two libraries: the spec says so


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scheme", catalog.names(plain=True))
@given(data=st.data())
def test_torch_kernel_equals_the_specification(scheme, device, data):
    args, kwargs = data.draw(calls(scheme))
    kwargs["return_weights"] = False
    args, kwargs = _on(device, args, kwargs)
    direct = _errors_alike(lambda: KERNELS[scheme](*args, **kwargs))
    public = _errors_alike(lambda: getattr(rp, _public(scheme))(*args, **kwargs))
    want = _errors_alike(lambda: _spec(scheme, args, kwargs))
    if direct[1] is NotImplemented:
        assert _declines(scheme, args, kwargs), "the kernel declined a call it covers"
    elif want[0] == "ok":
        _assert_close(direct[1], want[1])
    else:  # the kernel refuses what the specification refuses, word for word
        assert direct == want
    if want[0] == "ok":
        _assert_close(public[1], want[1])
    else:
        assert public == want


@pytest.mark.parametrize(("scheme", "case"), [(s, c) for s, cs in BAD_CALLS.items() for c in cs])
def test_bad_input_gets_the_specifications_error_on_torch(scheme, case):
    (t, table_rows), kwargs = case
    q = k = v = torch.zeros((2, t, 4), dtype=torch.float64)
    tables = {"shaw": [torch.zeros((table_rows + 1, 4), dtype=torch.float64)],
              "t5": [torch.zeros(table_rows, dtype=torch.float64)],
              "music": [torch.zeros((table_rows, 4), dtype=torch.float64)],
              "general": [torch.zeros((7, 4), dtype=torch.float64)],
              "deberta": [torch.zeros((table_rows, 4), dtype=torch.float64)]}
    args = (q, k, v, *tables.get(scheme, []))
    kwargs = {name: _tensor(a, "cpu") for name, a in kwargs.items()}
    with_kernels = _errors_alike(lambda: getattr(rp, _public(scheme))(*args, **kwargs))
    direct = _errors_alike(lambda: KERNELS[scheme](*args, **kwargs))
    without = _errors_alike(lambda: _spec(scheme, args, kwargs))
    assert with_kernels[0] in (TypeError, ValueError)
    assert with_kernels == without
    assert direct == without or direct == ("ok", NotImplemented)


def test_unknown_keywords_and_the_definition_method_go_to_the_specification():
    q = k = v = torch.randn(2, 5, 4, dtype=torch.float64)
    table = torch.randn(5, 4, dtype=torch.float64)
    assert KERNELS["shaw"](q, k, v, table, bogus=1) is NotImplemented
    assert KERNELS["shaw"](q, k, v, table, method="definition") is NotImplemented
    assert KERNELS["plain"](q, k, v, return_weights=True) is NotImplemented
    with pytest.raises(TypeError, match="bogus"):
        rp.shaw_attention(q, k, v, table, bogus=1)
    out = KERNELS["shaw"](q, k, v, table, method="efficient")
    _assert_close(out, _spec("shaw", (q, k, v, table), {}))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("scheme", ["plain", "bias", "t5", "alibi", "shaw", "deberta", "rope"])
def test_16_bit_calls_compute_in_float32_and_return_their_dtype(scheme, dtype, device):
    args, kwargs = _typical(scheme)
    mask = torch.rand(9, 11, generator=torch.Generator().manual_seed(1)) < 0.8
    args = [a.to(device=device, dtype=getattr(torch, dtype)) for a in args]
    kwargs["mask"] = mask.to(device)
    direct = KERNELS[scheme](*args, **kwargs)
    want = _spec(scheme, args, kwargs)
    assert direct is not NotImplemented and direct.dtype == want.dtype == args[0].dtype
    # both round one float32 result: at most a unit in the last place apart
    np.testing.assert_allclose(direct.float().cpu().numpy(), want.float().cpu().numpy(),
                               rtol=1e-2 if dtype == "bfloat16" else 2e-3, atol=1e-3)


def _typical(scheme):
    """A call of `scheme` in float64: 2 heads, 9 queries, 11 keys, per-head tables."""
    gen = torch.Generator().manual_seed(0)

    def normal(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q, k, v = normal(2, 9, 4), normal(2, 11, 4), normal(2, 11, 4)
    tables = {"plain": [], "alibi": [], "rope": [], "bias": [normal(2, 21)],
              "t5": [normal(2, 8)], "shaw": [normal(2, 7, 4)],
              "deberta": [normal(2, 8, 4), normal(2, 8, 4)]}[scheme]
    options = {"t5": {"max_distance": 6}, "deberta": {"max_position": 7}}.get(scheme, {})
    return [q, k, v, *tables], {"q_offset": 1, "causal": True, **options}


@pytest.mark.parametrize("scheme", ["plain", "bias", "deberta"])
def test_non_finite_values_behind_a_mask_go_to_the_specification(scheme):
    args, kwargs = _typical(scheme)
    k = args[1].clone()
    k[:, 10] = float("nan")  # key 10: masked for every query below
    v = args[2].clone()
    v[:, 10] = float("inf")
    args[1], args[2] = k, v
    mask = torch.ones(9, 11, dtype=torch.bool)
    mask[:, 10] = False
    kwargs.update(mask=mask, causal=False)
    assert KERNELS[scheme](*args, **kwargs) is NotImplemented
    out = getattr(rp, _public(scheme))(*args, **kwargs)
    assert torch.isfinite(out).all()
    _assert_close(out, _spec(scheme, args, kwargs))


@pytest.mark.parametrize("scheme", ["plain", "bias", "deberta"])
def test_rows_with_no_key_are_zero_and_their_gradients_finite(scheme):
    args, kwargs = _typical(scheme)
    mask = torch.ones(9, 11, dtype=torch.bool)
    mask[3] = False  # query 3 sees no key
    kwargs.update(mask=mask, causal=True, q_offset=-2)  # and queries 0 and 1 none either
    leaves = [a.clone().requires_grad_(True) for a in args]
    out = KERNELS[scheme](*leaves, **kwargs)
    assert out is not NotImplemented
    assert torch.all(out[:, [0, 1, 3]] == 0)
    d_output = torch.randn(out.shape, generator=torch.Generator().manual_seed(2),
                           dtype=out.dtype)
    got = torch.autograd.grad(out, leaves, d_output)
    spec_leaves = [a.clone().requires_grad_(True) for a in args]
    want_out = _spec(scheme, spec_leaves, kwargs)
    _assert_close(out.detach(), want_out.detach())
    want = torch.autograd.grad(want_out, spec_leaves, d_output)
    for g, w in zip(got, want, strict=True):
        assert torch.isfinite(g).all()
        _assert_close(g, w)


def test_gradients_through_the_kernel_pass_gradcheck():
    args, kwargs = _typical("deberta")
    leaves = [a.clone().requires_grad_(True) for a in args]
    assert torch.autograd.gradcheck(lambda *xs: KERNELS["deberta"](*xs, **kwargs), leaves)


def test_torch_func_transforms_reach_the_specification():
    # a torch.func transform wraps the tensors: the kernel hands them back (its finiteness
    # check reads a value), and the specification traces as it is
    args, kwargs = _typical("bias")
    q, k, v, table = args
    batched = torch.stack([q, q + 1])
    got = torch.func.vmap(lambda x: rp.bias_attention(x, k, v, table, **kwargs))(batched)
    for i in range(2):
        _assert_close(got[i], _spec("bias", (batched[i], k, v, table), kwargs))
    calls_seen = []
    original = KERNELS["bias"]

    def spy(*a, **kw):
        out = original(*a, **kw)
        calls_seen.append(out is NotImplemented)
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(kernels.kernels("torch"), "bias", spy)
        grad = torch.func.grad(lambda x: rp.bias_attention(x, k, v, table, **kwargs).sum())(q)
    assert calls_seen and all(calls_seen)
    leaf = q.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(_spec("bias", (leaf, k, v, table), kwargs).sum(), leaf)
    _assert_close(grad, want)


@settings(max_examples=10)
@given(seed=st.integers(0, 99))
def test_results_are_fresh_tensors(seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 6, 4, generator=gen)
    table = torch.randn(11, generator=gen)
    out = KERNELS["bias"](q, q, q, table)
    assert out is not NotImplemented
    assert not any(out.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
                   for a in (q, table))


# -- the backward passes: autograd through the kernels -----------------------------


def _spec_vjp(scheme, args, kwargs):
    with kernels.disabled():
        return getattr(rp, f"{_public(scheme)}_vjp")(*args, **kwargs)


def _assert_gradients_close(got, want):
    assert isinstance(got, dict) and list(got) == list(want)
    rtol = RTOL[str(next(iter(want.values())).dtype).removeprefix("torch.")]
    size = max((float(w.abs().max()) for w in want.values() if w.numel()), default=0)
    for name, w in want.items():
        g = got[name]
        assert isinstance(g, torch.Tensor) and g.dtype == w.dtype, name
        assert g.shape == w.shape and g.device == w.device, name
        assert not g.requires_grad, name
        np.testing.assert_allclose(g.cpu().numpy(), w.cpu().numpy(), rtol=rtol,
                                   atol=rtol * max(size, 1e-3), err_msg=name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scheme", catalog.names(plain=True))
@given(data=st.data())
def test_torch_vjp_kernel_equals_the_specification(scheme, device, data):
    args, kwargs = data.draw(vjp_calls(scheme))
    args, kwargs = _on(device, args, kwargs)
    direct = _errors_alike(lambda: VJP_KERNELS[scheme](*args, **kwargs))
    public = _errors_alike(lambda: getattr(rp, f"{_public(scheme)}_vjp")(*args, **kwargs))
    want = _errors_alike(lambda: _spec_vjp(scheme, args, kwargs))
    if direct[1] is NotImplemented:
        assert _declines(scheme, args, kwargs), "the kernel declined a call it covers"
    elif want[0] == "ok":
        _assert_gradients_close(direct[1], want[1])
    else:  # the specification's error, word for word
        assert direct == want
    if want[0] == "ok":
        _assert_gradients_close(public[1], want[1])
    else:
        assert public == want


def test_torch_vjp_kernel_returns_the_derived_alibi_slopes_gradient():
    # slopes not given: the specification returns the gradient of the ones it derived
    args, kwargs = _typical("alibi")
    d_output = torch.randn(2, 9, 4, dtype=torch.float64)
    got = VJP_KERNELS["alibi"](*args, d_output=d_output, **kwargs)
    want = _spec_vjp("alibi", args, {"d_output": d_output, **kwargs})
    assert list(want) == ["q", "k", "v", "slopes"]
    _assert_gradients_close(got, want)


def test_torch_vjp_kernel_leaves_the_callers_graph_and_grad_mode_alone():
    args, kwargs = _typical("bias")
    leaves = [a.clone().requires_grad_(True) for a in args]
    d_output = torch.randn(2, 9, 4, dtype=torch.float64)
    with torch.no_grad():
        got = VJP_KERNELS["bias"](*leaves, d_output=d_output, **kwargs)
    assert all(g.grad_fn is None for g in got.values())
    assert all(a.grad is None for a in leaves)
    _assert_gradients_close(got, _spec_vjp("bias", args, {"d_output": d_output, **kwargs}))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_vjp_kernel_in_16_bits(dtype):
    args, kwargs = _typical("deberta")
    args = [a.to(getattr(torch, dtype)) for a in args]
    d_output = torch.randn(2, 9, 4).to(args[0].dtype)
    got = VJP_KERNELS["deberta"](*args, d_output=d_output, **kwargs)
    want = _spec_vjp("deberta", args, {"d_output": d_output, **kwargs})
    assert got is not NotImplemented and list(got) == list(want)
    for name, w in want.items():
        assert got[name].dtype == w.dtype == args[0].dtype, name
        np.testing.assert_allclose(got[name].float().numpy(), w.float().numpy(),
                                   rtol=2e-2, atol=2e-2 * float(w.abs().max()), err_msg=name)


# -- SDPA's fused kernels: what they do not do, the kernels do not ask of them ------


def _batched(args):
    """(batch, heads, t, d) copies of `_typical`'s arrays: the shape that takes SDPA's
    fused kernels (its CPU flash loop here), where 3-D calls take its math backend."""
    return [a[None] for a in args[:3]] + list(args[3:])


@pytest.mark.parametrize("scale", [-0.5, 0.0, -0.0, 0.3])
@pytest.mark.parametrize("scheme", ["plain", "rope", "bias", "alibi"])
def test_causal_calls_with_any_scale_on_the_fused_kernels(scheme, scale):
    # SDPA's CPU flash loop returned NaN for is_causal at a negative or zero scale
    args, kwargs = _typical(scheme)
    args = _batched(args)
    for q_offset in (0, 2):
        kwargs.update(causal=True, q_offset=q_offset, scale=scale)
        got = KERNELS[scheme](*args, **kwargs)
        assert got is not NotImplemented
        _assert_close(got, _spec(scheme, args, kwargs))


@pytest.mark.parametrize("scheme", ["plain", "bias", "deberta"])
# torch's forward mode scripts its own decompositions the first time, which warns in 2.13
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_second_order_and_forward_mode_gradients_equal_the_specifications(scheme):
    # the fused kernels' backward passes are not differentiable: a call autograd records
    # runs SDPA's math backend, as differentiable as the specification
    args, kwargs = _typical(scheme)
    args = _batched(args)
    kwargs["mask"] = torch.rand(9, 11, generator=torch.Generator().manual_seed(4)) < 0.8

    def second_order(use_kernels):
        leaves = [a.clone().requires_grad_(True) for a in args]
        with (kernels.disabled() if not use_kernels else torch.enable_grad()):
            out = getattr(rp, _public(scheme))(*leaves, **kwargs)
            (g,) = torch.autograd.grad((out * out).sum(), leaves[0], create_graph=True)
            return torch.autograd.grad(g.square().sum(), leaves)

    for got, want in zip(second_order(True), second_order(False), strict=True):
        _assert_close(got, want)
    fwd = torch.autograd.forward_ad
    tangent = torch.randn(args[0].shape, generator=torch.Generator().manual_seed(5),
                          dtype=args[0].dtype)

    def forward_mode(use_kernels):
        with fwd.dual_level(), (kernels.disabled() if not use_kernels else torch.no_grad()):
            dual = fwd.make_dual(args[0], tangent)
            out = getattr(rp, _public(scheme))(dual, *args[1:], **kwargs)
            return fwd.unpack_dual(out).tangent

    _assert_close(forward_mode(True), forward_mode(False))


def test_the_vjp_kernel_leaves_differentiable_calls_to_the_specification():
    args, kwargs = _typical("bias")
    leaves = [a.clone().requires_grad_(True) for a in args]
    d_output = torch.randn(2, 9, 4, dtype=torch.float64)
    assert VJP_KERNELS["bias"](*leaves, d_output=d_output, **kwargs) is NotImplemented
    grads = rp.bias_attention_vjp(*leaves, d_output=d_output, **kwargs)
    assert grads["q"].grad_fn is not None  # the specification's, differentiable
    with torch.no_grad():
        assert VJP_KERNELS["bias"](*leaves, d_output=d_output, **kwargs) is not NotImplemented


def test_calls_under_torch_compile_go_to_the_specification(monkeypatch):
    args, kwargs = _typical("bias")
    assert KERNELS["bias"](*args, **kwargs) is not NotImplemented
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert KERNELS["bias"](*args, **kwargs) is NotImplemented
    assert VJP_KERNELS["bias"](*args, d_output=torch.ones(2, 9, 4, dtype=torch.float64),
                               **kwargs) is NotImplemented


@pytest.mark.parametrize(("scheme", "bad"), [
    ("shaw", {"method": "fast", "return_weights": "no"}),
    ("bias", {"beyond": "error", "return_weights": "no"}),
    ("plain", {"return_weights": "no"}),
])
def test_several_bad_arguments_get_the_specifications_first_error(scheme, bad):
    args, kwargs = _typical(scheme)
    if scheme == "shaw":
        args[3] = args[3][0]
    if scheme == "bias":
        args[3] = args[3][:, :3]  # K = 1: distances beyond it, an error with beyond="error"
    kwargs.update(bad)
    with_kernels = _errors_alike(lambda: getattr(rp, _public(scheme))(*args, **kwargs))
    assert with_kernels[0] in (TypeError, ValueError)
    assert with_kernels == _errors_alike(lambda: _spec(scheme, args, kwargs))


@pytest.mark.parametrize("shape", [(), (11,), (1, 11), (9, 1), (9, 11), (3, 1, 9, 11)])
@pytest.mark.parametrize("scheme", ["bias", "t5", "alibi", "plain"])
def test_masks_of_every_shape_with_the_keys_reversed(scheme, shape):
    # the distance-only schemes reverse the keys: a mask's key axis must turn with them
    args, kwargs = _typical(scheme)
    gen = torch.Generator().manual_seed(sum(shape) + 7)
    kwargs.update(causal=False, mask=torch.rand(shape, generator=gen) < 0.6)
    if shape == ():
        kwargs["mask"] = torch.tensor(True)
    direct = _errors_alike(lambda: KERNELS[scheme](*args, **kwargs))
    want = _errors_alike(lambda: _spec(scheme, args, kwargs))
    if want[0] != "ok":
        assert direct == want
        return
    assert direct[1] is not NotImplemented
    _assert_close(direct[1], want[1])
    d_output = torch.randn(want[1].shape, generator=gen, dtype=want[1].dtype)
    got = VJP_KERNELS[scheme](*args, d_output=d_output, **kwargs)
    assert got is not NotImplemented
    _assert_gradients_close(got, _spec_vjp(scheme, args, {"d_output": d_output, **kwargs}))


@pytest.mark.parametrize("d_output", [
    torch.zeros(2, 9, 5, dtype=torch.float64),  # d_v is 4
    torch.zeros(3, 9, 4, dtype=torch.float64),  # a batch the output does not have
    torch.zeros(2, 9, 4, dtype=torch.float32),  # another dtype
    None,
])
def test_bad_d_output_gets_the_specifications_error_on_torch(d_output):
    args, kwargs = _typical("bias")
    direct = _errors_alike(lambda: VJP_KERNELS["bias"](*args, d_output=d_output, **kwargs))
    public = _errors_alike(lambda: rp.bias_attention_vjp(*args, d_output=d_output, **kwargs))
    want = _errors_alike(lambda: _spec_vjp("bias", args, {"d_output": d_output, **kwargs}))
    assert want[0] in (TypeError, ValueError) and "d_output" in want[1]
    assert direct == want and public == want


def test_non_finite_d_output_and_inference_mode_go_to_the_specification():
    args, kwargs = _typical("plain")
    mask = torch.ones(9, 11, dtype=torch.bool)
    mask[1] = False  # query 1 sees no key: the specification's dv carries 0 * NaN
    kwargs.update(mask=mask, causal=False)
    d_output = torch.randn(2, 9, 4, dtype=torch.float64)
    d_output[:, 1, 0] = float("nan")
    assert VJP_KERNELS["plain"](*args, d_output=d_output, **kwargs) is NotImplemented
    got = rp.attention_vjp(*args, d_output=d_output, **kwargs)
    want = _spec_vjp("plain", args, {"d_output": d_output, **kwargs})
    assert torch.isnan(want["v"]).any()
    for name in want:
        assert torch.equal(torch.isnan(got[name]), torch.isnan(want[name])), name
    d_output = torch.randn(2, 9, 4, dtype=torch.float64)
    with torch.inference_mode():
        assert VJP_KERNELS["plain"](*args, d_output=d_output, **kwargs) is NotImplemented
        inside = rp.attention_vjp(*args, d_output=d_output, **kwargs)
        made_inside = [a.clone() for a in args]
    _assert_gradients_close(inside, _spec_vjp("plain", args, {"d_output": d_output, **kwargs}))
    assert VJP_KERNELS["plain"](*made_inside, d_output=d_output, **kwargs) is NotImplemented
    _assert_gradients_close(rp.attention_vjp(*made_inside, d_output=d_output, **kwargs),
                            _spec_vjp("plain", args, {"d_output": d_output, **kwargs}))
