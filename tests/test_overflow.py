"""Overflow is never silent (issue 26, item 3).

The rule (docs/conventions.md, "overflow"): a logit is ``-inf`` only where its
bias is ``-inf`` (an additive mask); any other non-finite logit, an overflow
of ``s (q . k + P) + B`` of either sign, makes its query's output and weights
NaN, and the gradients through them. A row reads as empty (zeros) only when
it has no allowed key or every allowed key's bias is ``-inf``.

- the reported case (float32 ``q = 1e20``, keys ``-1e20 .. -3e20``: every
  ``q . k`` is ``-inf``, the float64 definition is ``v[0]``) and its positive
  twin, on every backend, with the kernels and without;
- a finite wrong answer that used to come out (an overflowed key that is the
  largest logit in exact arithmetic, once scaled);
- every scheme of the catalog, on NumPy and torch, through the forward
  kernels, the VJP kernels and the blocked kernels, and the specification;
- the empty rows that stay zeros (no allowed key, a ``-inf`` bias), and the
  additive masks that keep the kernels (``finfo.min``);
- `compose_logits` and the kernels' bound one case at a time.

Each case asserts the exact result: NaN where the rule says so, zeros where
it says so, the specification's values elsewhere.
"""

from __future__ import annotations

import contextlib
import importlib.util

import numpy as np
import pytest

import relpos_ref as rp
from relpos_ref import catalog, kernels

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                        "ignore:invalid value encountered:RuntimeWarning")

SCHEMES = catalog.names(plain=True)
HAS_TORCH = importlib.util.find_spec("torch") is not None
LIBRARIES = ["numpy", *(["torch"] if HAS_TORCH else [])]


def _kernels(use: bool):
    return contextlib.nullcontext() if use else kernels.disabled()


def _reported(dtype=np.float32, sign=-1.0):
    q = np.full((1, 2, 4), 1e20)
    k = sign * np.stack([np.full(4, 1e20), np.full(4, 2e20), np.full(4, 3e20)])[None]
    v = np.arange(1.0, 7.0).reshape(1, 3, 2)
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


# -- the reported case, every backend ------------------------------------------------


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "spec"])
@pytest.mark.parametrize("sign", [-1.0, 1.0], ids=["negative", "positive"])
def test_the_reported_overflow_gives_nan_never_zeros(backend, sign, use_kernels):
    q, k, v = (backend.asarray(a) for a in _reported(sign=sign))
    with _kernels(use_kernels):
        out, weights = rp.attention(q, k, v, return_weights=True)
    out, weights = backend.to_numpy(out), backend.to_numpy(weights)
    assert out.dtype == np.float32 and out.shape == (1, 2, 2)
    assert np.isnan(out).all() and np.isnan(weights).all()


def test_the_reported_case_is_v0_in_float64():
    # the definition the NaN stands for: float64 holds these logits
    q, k, v = (a.astype(np.float64) for a in _reported())
    np.testing.assert_array_equal(rp.attention(q, k, v), np.broadcast_to(v[:, :1], (1, 2, 2)))


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "spec"])
def test_an_overflow_that_used_to_give_a_finite_wrong_answer_is_nan(backend, use_kernels):
    # key 0: q . k = -4e40 overflows to -inf, but scaled by 1e-10 it is -4e30, the largest
    # logit (float64 gives v[0]); key 1: 4e20 * 1e-10 - 1e31 = -1e31. Read as a masked key,
    # the overflow used to give v[1] exactly: a finite wrong answer.
    q = np.full((1, 4), 1e20, dtype=np.float32)
    k = np.stack([np.full(4, -1e20), np.ones(4)]).astype(np.float32)
    v = np.array([[1.0], [2.0]], dtype=np.float32)
    bias = np.array([[0.0, -1e31]], dtype=np.float32)
    exact = rp.attention(*(a.astype(np.float64) for a in (q, k, v)), scale=1e-10,
                         bias=bias.astype(np.float64))
    np.testing.assert_array_equal(exact, [[1.0]])
    with _kernels(use_kernels):
        out = rp.attention(*(backend.asarray(a) for a in (q, k, v)), scale=1e-10,
                           bias=backend.asarray(bias))
    assert np.isnan(backend.to_numpy(out)).all()


# -- every scheme, every kernel ------------------------------------------------------


SIZES = {"K": 2, "M": 4, "t_max": 6, "height": 2, "width": 3, "buckets": 8, "d_model": 4,
         "rows": 6, "span": 3}


def _scheme_call(scheme, make, *, overflow=True, values=True):
    """(q, k, v, tables, options) of a 6-token call whose query 0 overflows against every key."""
    rng = np.random.default_rng(7)
    entry = catalog.get(scheme)
    shapes = entry.table_shapes(entry.sizes_from({"t_q": 6, "t_k": 6, **SIZES}), d=4, d_v=4,
                                heads=2)
    if not values:  # no relative-value table (torch's kernels hand those back anyway)
        shapes = {n: s for n, s in shapes.items() if n != "value_table"}
    q, k, v = (rng.standard_normal((2, 6, 4)).astype(np.float32) for _ in range(3))
    if overflow:
        q[:, 0] = 1e20
        k[:] = -1e20 + k  # every key: q_0 . k = -4e40, -inf in float32
    tables = [make(rng.standard_normal(shapes[t.name]).astype(np.float32) / 4)
              for t in entry.tables if t.name in shapes]
    options = entry.options_from({**SIZES, "height": 2, "width": 3})
    if scheme == "t5":
        options["max_distance"] = 6
    return make(q), make(k), make(v), tables, options


def _public(scheme, vjp=False):
    name = ("attention" if scheme == "plain" else f"{scheme}_attention") + ("_vjp" if vjp else "")
    return getattr(rp, name)


def _make(library):
    if library == "numpy":
        return np.asarray, np.asarray
    import torch

    return torch.from_numpy, lambda x: x.numpy()


@pytest.mark.parametrize("path", ["forward", "vjp", "blocked"])
@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_and_kernel_makes_an_overflowed_row_nan(scheme, library, path):
    if path == "blocked" and scheme == "cope":
        pytest.skip("blocked attention refuses cope (a tile of keys has no term of its own)")
    make, back = _make(library)
    q, k, v, tables, options = _scheme_call(scheme, make)
    if path == "forward":
        out = back(_public(scheme)(q, k, v, *tables, **options))
    elif path == "blocked":
        out = back(rp.blocked_attention(q, k, v, *tables, scheme=scheme, block_size=4, **options))
    else:
        grads = _public(scheme, vjp=True)(q, k, v, *tables, d_output=make(np.ones((2, 6, 4),
                                          dtype=np.float32)), **options)
        assert np.isnan(back(grads["q"])[:, 0]).all()  # the overflowed query's own gradient
        assert np.isnan(back(grads["v"])).any()
        return
    assert np.isnan(out[:, 0]).all()  # query 0: every key overflowed
    assert np.isfinite(out[:, 1:]).all()  # the others: finite, as in float64


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_kernels_hand_an_overflowing_call_to_the_specification(scheme, library):
    # the forward kernel itself returns NotImplemented (the specification runs); on the
    # same call without the overflow it answers
    make, _ = _make(library)
    table = kernels.kernels(library)
    for overflow, handed_back in ((True, True), (False, False)):
        q, k, v, tables, options = _scheme_call(scheme, make, overflow=overflow, values=False)
        out = table[scheme](q, k, v, *tables, **options)
        assert (out is NotImplemented) == handed_back


# -- what stays empty ----------------------------------------------------------------


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "spec"])
def test_rows_left_empty_by_a_mask_or_a_minus_inf_bias_stay_zeros(backend, use_kernels):
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((n, 4)).astype(np.float32) for n in (3, 4, 4))
    mask = np.ones((3, 4), dtype=bool)
    mask[0] = False  # query 0: no allowed key
    bias = np.zeros((3, 4), dtype=np.float32)
    bias[1] = -np.inf  # query 1: every key left out by the additive mask
    with _kernels(use_kernels):
        out, w = rp.attention(*(backend.asarray(a) for a in (q, k, v)),
                              mask=backend.asarray(mask), bias=backend.asarray(bias),
                              return_weights=True)
    out, w = backend.to_numpy(out), backend.to_numpy(w)
    np.testing.assert_array_equal(out[:2], 0.0)
    np.testing.assert_array_equal(w[:2], 0.0)
    assert np.isfinite(out[2]).all() and w[2].sum() == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_finfo_min_additive_mask_keeps_the_kernel_and_its_answer(library):
    # HF's mask value: no overflow (|s q.k| is far below half an ulp of the largest float),
    # so the kernel takes the call, and masks exactly as -inf would
    make, back = _make(library)
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((2, 5, 4)).astype(np.float32) for _ in range(3))
    bias = np.zeros((5, 5), dtype=np.float32)
    bias[:, 3:] = np.finfo(np.float32).min
    kernel = kernels.kernels(library)["plain"]
    got = kernel(make(q), make(k), make(v), bias=make(bias))
    assert got is not NotImplemented
    want = rp.attention(q[:, :, :], k[:, :3], v[:, :3])
    np.testing.assert_allclose(back(got), want, rtol=2e-6, atol=2e-7)


# -- the pieces ------------------------------------------------------------------------


@pytest.mark.parametrize(("content", "bias", "want"), [
    ([-np.inf, 1.0], None, [np.nan, 0.5]),  # an overflow, no bias
    ([-np.inf, 1.0], [0.0, 0.0], [np.nan, 0.5]),  # an overflow, a finite bias
    ([1.0, 1.0], [-np.inf, 0.0], [-np.inf, 0.5]),  # an additive mask
    ([-np.inf, 1.0], [-np.inf, 0.0], [-np.inf, 0.5]),  # masked: its score does not count
    ([-3e38, 1.0], [-3e38, 0.0], [np.nan, 0.5]),  # finite terms whose sum overflows
    ([np.inf, 1.0], None, [np.inf, 0.5]),  # +inf stays (masked_softmax makes its row NaN)
], ids=["overflow", "overflow-bias", "mask", "masked-overflow", "sum", "positive"])
def test_compose_logits_makes_only_an_overflow_nan(content, bias, want):
    content = np.array([content], dtype=np.float32)
    bias = None if bias is None else np.array([bias], dtype=np.float32)
    got = rp.compose_logits(content, scale=0.5, bias=bias)
    np.testing.assert_array_equal(got, np.array([want], dtype=np.float32))


def test_masked_softmax_makes_a_row_with_nan_nan_and_an_all_minus_inf_row_zeros():
    logits = np.array([[np.nan, 0.0], [np.inf, 0.0], [-np.inf, -np.inf]])
    w = rp.masked_softmax(logits)
    assert np.isnan(w[:2]).all()
    np.testing.assert_array_equal(w[2], [0.0, 0.0])


@pytest.mark.parametrize(("scheme", "magnitude", "want"), [
    ("plain", {"q": 1.0, "k": 2.0}, 4 * 2.0 + 3.0),
    ("rope", {"q": 1.0, "k": 1.0}, 4 * 4.0 + 4.0),
    ("absolute", {"q": 1.0, "k": 1.0, "table": 1.0}, 4 * 2.0 + 3.0),
    ("shaw", {"q": 1.0, "k": 1.0, "key_table": 3.0}, 4 + 12.0 + 2.0),
    ("deberta", {"q": 1.0, "k": 2.0, "key_table": 1.0, "query_table": 1.0}, 8 + 12.0 + 3.0),
    ("transformer_xl", {"q": 1.0, "k": 1.0, "w_r": 1.0, "position_bias": 1.0},
     4 * 2.0 + 4 * 2.0 * 6 + 3.0),
    ("t5", {"q": 1.0, "k": 1.0, "table": 1e38}, 4.0 + 2.0),  # a bias needs no bound
])
def test_the_logit_bound_of_each_kind_of_term(scheme, magnitude, want):
    from relpos_ref.kernels import _overflow

    assert _overflow.logit_bound(scheme, magnitude, d=4, scale=0.5, d_model=6) == want


def test_the_bound_is_half_an_ulp_of_the_largest_float32():
    from relpos_ref.kernels import _overflow

    info = np.finfo(np.float32)
    assert _overflow.limit(float(info.max), float(info.eps)) == 2.0**103
    # at that bound, any finite bias added to a finite score cannot overflow
    x = np.float32(2.0**103) * np.float32(0.99)
    assert np.isfinite(np.float32(info.max) + x) and np.isfinite(np.float32(info.min) - x)
