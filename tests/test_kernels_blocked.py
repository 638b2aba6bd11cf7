"""The blocked kernels equal the specification's `blocked_attention`, library by library.

`relpos_ref.blocked_attention` is `relpos_ref.blocked.blocked_attention` behind
the dispatcher. On NumPy arrays every scheme that takes ``q_offset`` runs its
NumPy kernel a tile of queries at a time (`relpos_ref.kernels._numpy_blocked`),
and on torch tensors its torch kernel (`relpos_ref.kernels.torch`: one SDPA call
per tile for plain attention, RoPE, absolute, bias, T5 and ALiBi, the block
engine for the others). The hypothesis calls are those of the
forward kernels' tests (`test_kernels.calls`: offsets, causality, masks with
empty rows and of every broadcast shape, options and policies, shared and
per-head tables, float32 and float64, scales of either sign) with a block size
drawn beside them; the kernel called directly returns what the
specification's loop returns, or the same error. Also checked: the rows each
call holds, 16-bit calls, gradients (torch), what a kernel hands back, and
that the schemes without one reach the specification.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_kernels import TOL, _declines, _errors_alike, calls

import relpos_ref as rp
from relpos_ref import kernels
from relpos_ref.blocked import blocked_attention as spec_blocked
from relpos_ref.kernels import _blocked_rows, _numpy_blocks
from relpos_ref.kernels import numpy as numpy_kernels

NUMPY = kernels.blocked_kernels("numpy")
try:
    import torch

    from relpos_ref.kernels import _torch_sdpa
    from relpos_ref.kernels import torch as torch_kernels
except ImportError:  # the NumPy tests run; the torch ones skip
    torch = torch_kernels = _torch_sdpa = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
BLOCKED = kernels.blocked_kernels("torch") if torch is not None else {}
_CUDA = pytest.mark.skipif(torch is None or not torch.cuda.is_available(),
                           reason="torch sees no CUDA device here")
#: (library, device, scheme) of every blocked kernel
CASES = [("numpy", "cpu", s) for s in sorted(NUMPY)] + [
    pytest.param("torch", device, s, marks=marks)
    for device, marks in (("cpu", []), ("cuda", [_CUDA]))
    for s in sorted(BLOCKED)]


def _on(device, args, kwargs):
    def tensor(x):
        return torch.from_numpy(np.ascontiguousarray(x)).to(device) \
            if isinstance(x, np.ndarray) else x
    return [tensor(a) for a in args], {n: tensor(a) for n, a in kwargs.items()}


def _blocked_call(scheme, args, kwargs, block):
    kwargs = {n: a for n, a in kwargs.items() if n not in ("return_weights", "position", "bias")}
    return args, {**kwargs, "scheme": scheme, "block_size": block}


def _spec(args, kwargs):
    with kernels.disabled():
        return rp.blocked_attention(*args, **kwargs)


def _assert_close(got, want):
    if isinstance(want, np.ndarray):
        assert type(got) is np.ndarray and got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, **TOL[str(want.dtype)])
        return
    assert isinstance(got, torch.Tensor) and got.dtype == want.dtype
    assert got.shape == want.shape and got.device == want.device
    np.testing.assert_allclose(got.cpu().double().numpy(), want.cpu().double().numpy(),
                               **TOL[str(want.dtype).removeprefix("torch.")])


def _numpy_declines(scheme, args, kwargs, block):
    """Whether the scheme's NumPy kernel may hand a tile's call back (`test_kernels._declines`).

    A tile's call sees the keys up to the end of a key tile, at least
    ``min(block, t_k)`` of them: Shaw's kernel declines a table wider than those.
    """
    if scheme == "shaw" and args[3].shape[-2] > min(block, args[1].shape[-2]):
        return True
    return _declines(scheme, args, kwargs)


@pytest.mark.parametrize(("library", "device", "scheme"), CASES)
@given(data=st.data(), block=st.integers(1, 7))
def test_blocked_kernel_equals_the_specification(library, device, scheme, block, data):
    drawn = data.draw(calls(scheme))
    table = NUMPY if library == "numpy" else BLOCKED
    declines = library == "numpy" and _numpy_declines(scheme, *drawn, block)
    if library == "torch":
        drawn = _on(device, *drawn)
    args, kwargs = _blocked_call(scheme, *drawn, block)
    with pytest.MonkeyPatch.context() as patch:  # small row blocks inside NumPy's kernels
        patch.setattr(_numpy_blocks, "BLOCK_BYTES", data.draw(st.sampled_from([64, 2**22])))
        direct = _errors_alike(lambda: table[scheme](*args, **kwargs))
        public = _errors_alike(lambda: rp.blocked_attention(*args, **kwargs))
    want = _errors_alike(lambda: _spec(args, kwargs))
    if want[0] != "ok":
        # the same error, or (a distance beyond a table, found tile by tile) handed back
        assert public == want and direct in (want, ("ok", NotImplemented))
        return
    empty = 0 in (args[0].shape[-2], args[1].shape[-2])
    if direct[1] is NotImplemented:  # finite calls: empty grids, and what the kernel declines
        assert empty or declines
    for got in (public[1],) if direct[1] is NotImplemented else (direct[1], public[1]):
        _assert_close(got, want[1])


def test_numpy_blocked_kernels_hold_a_tile_of_scores_per_call(monkeypatch):
    seen = []
    original = numpy_kernels.KERNELS["shaw"]

    def spy(q, k, v, *tables, **kw):
        seen.append((q.shape[-2], k.shape[-2], kw["q_offset"]))
        return original(q, k, v, *tables, **kw)

    monkeypatch.setitem(numpy_kernels.KERNELS, "shaw", spy)
    kernel = numpy_kernels.blocked_kernels(numpy_kernels.KERNELS)["shaw"]
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 300, 4)) for _ in range(3))
    key_table, value_table = rng.standard_normal((2, 9, 4))
    got = kernel(q, k, v, key_table, value_table, scheme="shaw", block_size=128, causal=True,
                 q_offset=-3)
    # tile 0 (queries 0..127, keys up to tile 0), then tiles 1 and 2 against more keys
    assert seen == [(128, 128, -3), (128, 256, 125), (44, 300, 253)]
    _assert_close(got, _spec((q, k, v, key_table, value_table),
                             {"scheme": "shaw", "block_size": 128, "causal": True,
                              "q_offset": -3}))
    seen.clear()
    got = kernel(q, k, v, key_table, value_table, scheme="shaw", block_size=64)
    # a tile of 64 queries is one call (128 rows at least)
    assert [rows for rows, _, _ in seen] == [64] * 4 + [44]
    assert {keys for _, keys, _ in seen} == {300}


@needs_torch
def test_the_blocked_kernels_and_the_dispatch():
    # every scheme that takes q_offset, as on NumPy (grid2d and Swin place queries on a grid)
    assert set(BLOCKED) == set(NUMPY)
    q = torch.eye(3)
    assert kernels.kernel_for("t5", (q, None), blocked=True) is BLOCKED["t5"]
    assert kernels.kernel_for("shaw", (q,), blocked=True) is BLOCKED["shaw"]
    assert kernels.kernel_for("swin", (q,), blocked=True) is None
    assert rp.blocked_attention.__wrapped__ is spec_blocked
    assert "blocked_attention" in dir(rp) and "blocked_attention" in rp.__all__
    with kernels.disabled():
        assert kernels.kernel_for("t5", (q,), blocked=True) is None


@needs_torch
def test_each_sdpa_call_holds_at_most_a_tile_of_mask(monkeypatch):
    # with a mask, the rows of a call are cut so that rows * keys <= 4 block ** 2 (but
    # MIN_ROWS at least); without one, a whole block of rows reads one row of distances
    seen = []
    original = _torch_sdpa.sdpa_terms

    def spy(q, k, v, call, **kw):
        seen.append((q.shape[-2], k.shape[-2], kw.get("mask") is not None))
        return original(q, k, v, call, **kw)

    monkeypatch.setattr(_torch_sdpa, "sdpa_terms", spy)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 300, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    table = torch.randn(2, 17, generator=gen, dtype=torch.float64)
    mask = torch.rand(300, 300, generator=gen) < 0.9
    got = BLOCKED["bias"](q, k, v, table, scheme="bias", block_size=40, mask=mask)
    assert seen and all(masked for _, _, masked in seen)
    assert [rows for rows, _, _ in seen] == [40] * 7 + [20]  # block 40 < MIN_ROWS: uncut
    seen.clear()
    monkeypatch.setattr(_blocked_rows, "MIN_ROWS", 8)
    got = BLOCKED["bias"](q, k, v, table, scheme="bias", block_size=40, mask=mask)
    assert [rows for rows, _, _ in seen] == [21, 19] * 7 + [20]  # 4 * 40 ** 2 // 300 = 21
    _assert_close(got, _spec((q, k, v, table), {"scheme": "bias", "block_size": 40,
                                                 "mask": mask}))
    seen.clear()
    got = BLOCKED["alibi"](q, k, v, scheme="alibi", block_size=128, causal=True)
    # causal: each block against the keys up to its last query
    assert seen == [(128, 128, False), (128, 256, False), (44, 300, False)]
    _assert_close(got, _spec((q, k, v), {"scheme": "alibi", "block_size": 128,
                                          "causal": True}))


@needs_torch
def test_a_lean_blocked_call_makes_no_array_of_terms(monkeypatch):
    # general (no values, not causal): with a mask each call's terms are made whole for SDPA
    # (rows cut to 4 block ** 2 / t_k); without one, the block engine, as the lean bound says
    from relpos_ref.kernels import torch as kernels_torch

    made = []
    original = kernels_torch.terms_attention
    monkeypatch.setattr(kernels_torch, "terms_attention",
                        lambda form, flipped=None: made.append(form.call.t_q)
                        or original(form, flipped))
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 90, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    table = torch.randn(179, 4, generator=gen, dtype=torch.float64)
    kwargs = {"scheme": "general", "block_size": 32}
    got = BLOCKED["general"](q, k, v, table, **kwargs)
    assert not made
    _assert_close(got, _spec((q, k, v, table), kwargs))
    mask = torch.rand(90, 90, generator=gen) < 0.9
    got = BLOCKED["general"](q, k, v, table, **kwargs, mask=mask)
    assert made
    _assert_close(got, _spec((q, k, v, table), {**kwargs, "mask": mask}))


@needs_torch
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_blocked_calls_compute_in_float32(dtype):
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 33, 8, generator=gen).to(getattr(torch, dtype)) for _ in range(3))
    table = torch.randn(2, 32, generator=gen).to(getattr(torch, dtype))
    kwargs = {"scheme": "t5", "block_size": 8, "causal": True}
    got = BLOCKED["t5"](q, k, v, table, **kwargs)
    want = _spec((q, k, v, table), kwargs)
    assert got.dtype == want.dtype == q.dtype
    np.testing.assert_allclose(got.float().numpy(), want.float().numpy(),
                               rtol=1e-2 if dtype == "bfloat16" else 2e-3, atol=1e-3)


@needs_torch
def test_gradients_through_the_blocked_kernel_equal_the_specifications():
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 13, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    table = torch.randn(2, 9, generator=gen, dtype=torch.float64)
    kwargs = {"scheme": "bias", "block_size": 4, "causal": True, "q_offset": -2}
    leaves = [a.clone().requires_grad_(True) for a in (q, k, v, table)]
    out = rp.blocked_attention(*leaves, **kwargs)
    assert torch.all(out[:, :2] == 0)  # queries 0 and 1 see no key
    got = torch.autograd.grad(out.sum(), leaves)
    spec_leaves = [a.clone().requires_grad_(True) for a in (q, k, v, table)]
    want = torch.autograd.grad(_spec(spec_leaves, kwargs).sum(), spec_leaves)
    for g, w in zip(got, want, strict=True):
        _assert_close(g, w)
    assert torch.autograd.gradcheck(lambda *xs: BLOCKED["bias"](*xs, **kwargs), leaves)


@needs_torch
def test_what_the_blocked_kernel_hands_back():
    q = torch.randn(2, 6, 4, dtype=torch.float64)
    nan_k = q.clone()
    nan_k[0, 0, 0] = float("nan")
    assert BLOCKED["plain"](q, nan_k, q, block_size=2) is NotImplemented
    assert BLOCKED["plain"](q, q, q, mask=np.ones((6, 6), dtype=bool)) is NotImplemented
    assert BLOCKED["plain"](q[:, :0], q, q) is NotImplemented
    assert BLOCKED["shaw"](q, nan_k, q, q[0, :5], scheme="shaw", block_size=2) is NotImplemented
    # grid2d and Swin have none: the specification's loop
    args = (q, q, q, torch.randn(2, 3, 4, dtype=torch.float64),
            torch.randn(2, 5, 4, dtype=torch.float64))
    got = rp.blocked_attention(*args, scheme="grid2d", block_size=4, height=2, width=3)
    with kernels.disabled():
        want = spec_blocked(*args, scheme="grid2d", block_size=4, height=2, width=3)
    _assert_close(got, want)


BAD = [
    ((), {"block_size": 0}),
    ((), {"scheme": "nope"}),
    ((), {"progress": "yes"}),
    ((), {"scheme": "t5", "max_distance": -1}),
    ((np.zeros(3),), {"scheme": "plain"}),
    ((), {"scheme": "alibi", "slopes": "steep"}),
    ((), {"scale": float("nan")}),
    ((), {"q_offset": 1.5}),
    ((), {"mask": "all"}),
]


@needs_torch
@pytest.mark.parametrize(("tables", "kwargs"), BAD)
def test_bad_blocked_input_gets_the_specifications_error(tables, kwargs):
    q = torch.zeros(2, 4, 3, dtype=torch.float64)
    tables = tuple(torch.from_numpy(t) for t in tables)
    scheme = kwargs.get("scheme", "plain")
    public = _errors_alike(lambda: rp.blocked_attention(q, q, q, *tables, **kwargs))
    want = _errors_alike(lambda: _spec((q, q, q, *tables), kwargs))
    assert want[0] != "ok" and public == want
    if scheme in BLOCKED:
        direct = _errors_alike(lambda: BLOCKED[scheme](q, q, q, *tables, **kwargs))
        assert direct in (want, ("ok", NotImplemented))


@needs_torch
def test_every_shape_of_batch_reaches_sdpa_with_four_axes(monkeypatch):
    # three axes or five: SDPA's fused kernels take (batch, heads, t, d)
    seen = []
    original = _torch_sdpa.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append(q.ndim)
        return original(q, k, v, **kw)

    monkeypatch.setattr(_torch_sdpa, "scaled_dot_product_attention", spy)
    gen = torch.Generator().manual_seed(5)
    for lead in [(), (3,), (2, 3), (2, 1, 3)]:
        q, k, v = (torch.randn(*lead, 7, 4, generator=gen, dtype=torch.float64)
                   for _ in range(3))
        table = torch.randn(9, generator=gen, dtype=torch.float64)
        got = rp.bias_attention(q, k, v, table, causal=True)
        with kernels.disabled():
            want = rp.bias_attention(q, k, v, table, causal=True)
        _assert_close(got, want)
    assert seen == [4, 4, 4, 4]


def test_a_kernel_called_for_another_scheme_hands_the_call_back():
    q = np.eye(4)
    assert NUMPY["plain"](q, q, q, scheme="alibi") is NotImplemented
    if torch is not None:
        qt = torch.eye(4, dtype=torch.float64)
        assert BLOCKED["plain"](qt, qt, qt, scheme="alibi") is NotImplemented
        assert BLOCKED["rope"](qt, qt, qt, causal=True) is NotImplemented  # scheme: plain


@needs_torch
@pytest.mark.parametrize("lead", [(2, 3, 0), (0, 2, 3), (2, 0)])
def test_batches_with_no_element_give_empty_outputs(lead):
    # three axes of batch or more reach SDPA as (n, h, t, d): n from the product, not -1
    q = torch.randn(*lead, 5, 4, dtype=torch.float64)
    for got in (rp.attention(q, q, q, causal=True), rp.rope_attention(q, q, q),
                rp.blocked_attention(q, q, q, causal=True, block_size=2)):
        assert got.shape == (*lead, 5, 4)


def _library_cases():
    yield "numpy", NUMPY, lambda a: a
    if torch is not None:
        yield "torch", BLOCKED, lambda a: torch.from_numpy(np.ascontiguousarray(a))


@pytest.mark.parametrize("mask_shape", [(), (11,), (9, 1), (1, 11), (2, 9, 11), (3, 1, 9, 11)])
@pytest.mark.parametrize("scheme", ["plain", "bias", "transformer_xl"])
def test_blocked_kernels_take_masks_of_every_broadcast_shape(scheme, mask_shape):
    rng = np.random.default_rng(len(mask_shape))
    q, k, v = rng.standard_normal((2, 9, 4)), *rng.standard_normal((2, 2, 11, 4))
    tables = {"plain": (), "bias": (rng.standard_normal((2, 7)),),
              "transformer_xl": (rng.standard_normal((4, 4)), rng.standard_normal(4),
                                 rng.standard_normal((2, 4)))}[scheme]
    mask = rng.random(mask_shape) < 0.8
    ran = 0
    for _, table, convert in _library_cases():
        if scheme not in table:
            continue
        args = [convert(a) for a in (q, k, v, *tables)]
        kwargs = {"scheme": scheme, "block_size": 4, "mask": convert(np.asarray(mask))}
        got = table[scheme](*args, **kwargs)  # transformer_xl: causal, end-aligned defaults
        assert got is not NotImplemented
        _assert_close(got, _spec(args, kwargs))
        ran += 1
    assert ran >= 1


@pytest.mark.parametrize("scheme", ["plain", "t5", "shaw"])
def test_numpy_blocked_kernels_in_float16(scheme):
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((2, 21, 8)).astype(np.float16) for _ in range(3))
    tables = {"plain": (), "t5": (rng.standard_normal((2, 32)).astype(np.float16),),
              "shaw": (rng.standard_normal((5, 8)).astype(np.float16),)}[scheme]
    kwargs = {"scheme": scheme, "block_size": 8, "causal": True}
    got = NUMPY[scheme](q, k, v, *tables, **kwargs)
    want = _spec((q, k, v, *tables), kwargs)
    assert got is not NotImplemented and got.dtype == want.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3,
                               atol=1e-3)
