"""The kernels wing equals the specification, scheme by scheme, and the dispatcher is honest.

For every scheme of the catalog, hypothesis draws shapes, offsets, causality,
masks (random, broadcast, with empty rows), the scheme's policies and
options, shared or per-head tables, dtypes and row-block sizes; the NumPy
kernel (called directly) must return what the specification returns under
`relpos_ref.kernels.disabled`, outputs and weights, to the rounding of a
reordered sum. Where a kernel hands a call back (``NotImplemented``) the
test says which cases may, so a kernel that silently declines everything
fails. Bad input gets the same error with and without kernels.
"""

from __future__ import annotations

from unittest import mock

import array_api_compat.numpy as xp
import numpy as np
import pytest
from _calls import calls
from hypothesis import given, settings
from hypothesis import strategies as st

import relpos_ref as rp
from relpos_ref import catalog, kernels
from relpos_ref.kernels import _numpy_blocks
from relpos_ref.kernels._numpy_blocks import (
    block_logits,
    clipped_table_softmax,
    distance_view,
    softmax_in_place,
)

KERNELS = kernels.kernels("numpy")
TOL = {"float64": {"rtol": 1e-11, "atol": 1e-12}, "float32": {"rtol": 2e-4, "atol": 2e-5}}


def test_every_catalog_scheme_has_a_numpy_kernel():
    assert set(KERNELS) == set(catalog.names(plain=True))


def _declines(scheme, args, kwargs):
    """Whether the NumPy kernel may hand this call back to the specification."""
    q, k = args[0], args[1]
    empty = q.shape[-2] == 0 or k.shape[-2] == 0
    if scheme == "shaw":
        return kwargs.get("beyond") != "clip" or args[3].shape[-2] > k.shape[-2] or empty
    if scheme in ("music", "general", "transformer_xl", "deberta"):
        return empty
    if scheme == "swinv2":  # an additive mask goes to the specification
        return kwargs.get("mask") is not None and kwargs.get("mask_penalty") is not None
    return False


def _spec(scheme, args, kwargs):
    with kernels.disabled():
        return getattr(rp, f"{'' if scheme == 'plain' else scheme + '_'}attention")(
            *args, **kwargs
        )


def _assert_equal(got, want):
    for g, w in zip(got, want, strict=True):
        assert type(g) is np.ndarray and g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, **TOL[str(w.dtype)])


def _errors_alike(call):
    try:
        return ("ok", call())
    except (TypeError, ValueError) as exc:
        return (type(exc), str(exc))


@pytest.mark.parametrize("scheme", catalog.names(plain=True))
@given(data=st.data(), block=st.sampled_from([64, 700, 2**22]))
def test_kernel_equals_the_specification(scheme, data, block):
    args, kwargs = data.draw(calls(scheme))
    with mock.patch.object(_numpy_blocks, "BLOCK_BYTES", block):
        direct = _errors_alike(lambda: KERNELS[scheme](*args, **kwargs))
        public = _errors_alike(lambda: getattr(rp, _public(scheme))(*args, **kwargs))
    want = _errors_alike(lambda: _spec(scheme, args, kwargs))
    if direct[1] is NotImplemented:
        assert _declines(scheme, args, kwargs), "the kernel declined a call it covers"
    elif want[0] == "ok":
        _assert_equal(direct[1], want[1])
    else:  # the kernel refuses what the specification refuses, word for word
        assert direct == want
    if want[0] == "ok":
        _assert_equal(public[1], want[1])
    else:
        assert public == want


@pytest.mark.parametrize("scheme", catalog.names(plain=True))
def test_kernel_runs_on_a_typical_call_and_returns_fresh_arrays(scheme):
    entry = catalog.get(scheme)
    rng = np.random.default_rng(0)
    sizes = {"hidden": 5, "K": 2, "M": 6, "t_max": 8, "height": 2, "width": 3, "buckets": 8,
             "d_model": 4,
             "span": 3, "rows": 8}
    params = {"t_q": 6, "t_k": 6, **sizes}
    shapes = entry.table_shapes(entry.sizes_from(params), d=4, d_v=4, heads=2)
    q, k, v = (rng.standard_normal((2, 6, 4)) for _ in range(3))
    tables = [rng.standard_normal(shapes[t.name]) for t in entry.tables if t.name in shapes]
    options = entry.options_from(params)
    if scheme == "t5":
        options["max_distance"] = 6
    out, weights = KERNELS[scheme](q, k, v, *tables, return_weights=True, **options)
    want = _spec(scheme, (q, k, v, *tables), {"return_weights": True, **options})
    _assert_equal((out, weights), want)
    for result in (out, weights):
        assert result.flags.writeable
        for given_array in (q, k, v, *tables):
            assert not np.shares_memory(result, given_array)


BAD_CALLS = {
    "plain": [((3, 4), {"causal": "no"}), ((3, 4), {"q_offset": 1.5}),
              ((3, 4), {"mask": np.ones((3, 3), dtype=np.int8)}),
              ((3, 4), {"mask": np.ones((3, 3, 3), dtype=bool)}),  # 3 leading against 2
              ((3, 4), {"bias": np.zeros((2, 3))}), ((3, 4), {"bias": np.zeros((5, 3, 3))}),
              ((3, 4), {"return_weights": "yes"})],
    "shaw": [((3, 4), {"beyond": "wrap"}), ((3, 4), {"method": "fast"}),
             ((4, 4), {"scale": float("nan")}), ((3, 4), {"return_weights": "no"})],
    "music": [((3, 4), {"return_weights": "no"}), ((3, 4), {"beyond": "wrap"})],
    "t5": [((3, 4), {"bidirectional": 1}), ((3, 4), {"max_distance": 1})],
    "general": [((3, 4), {"order": "backwards"}), ((9, 4), {})],
    "alibi": [((3, 4), {"slopes": np.ones((2, 2))}), ((3, 4), {"slopes": np.ones(3)})],
    "deberta": [((3, 4), {"max_position": 2})],
}


@pytest.mark.parametrize(("scheme", "case"), [(s, c) for s, cs in BAD_CALLS.items() for c in cs])
def test_bad_input_gets_the_specifications_error(scheme, case):
    (t, table_rows), kwargs = case
    q = k = v = np.zeros((2, t, 4))
    tables = {"shaw": [np.zeros((table_rows + 1, 4))], "t5": [np.zeros(table_rows)],
              "music": [np.zeros((table_rows, 4))],
              "general": [np.zeros((7, 4))], "deberta": [np.zeros((table_rows, 4))]}
    args = (q, k, v, *tables.get(scheme, []))
    with_kernels = _errors_alike(lambda: getattr(rp, _public(scheme))(*args, **kwargs))
    without = _errors_alike(lambda: _spec(scheme, args, kwargs))
    assert with_kernels[0] in (TypeError, ValueError)
    assert with_kernels == without


def test_per_head_value_tables_broadcast_with_a_mask_that_widens_the_batch():
    rng = np.random.default_rng(0)
    q = k = v = rng.standard_normal((1, 8, 4))
    key_table, value_table = rng.standard_normal((2, 1, 5, 4))
    mask = rng.random((3, 8, 8)) < 0.8
    for scheme in ("shaw", "music"):
        table = key_table if scheme == "shaw" else key_table[:, :4]
        values = value_table if scheme == "shaw" else value_table[:, :4]
        args = (q, k, v, table, values)
        got = getattr(rp, f"{scheme}_attention")(*args, mask=mask, causal=False)
        want = _spec(scheme, args, {"mask": mask, "causal": False})
        assert got.shape == (3, 8, 4)
        np.testing.assert_allclose(got, want, rtol=1e-12)


def _public(scheme):
    return "attention" if scheme == "plain" else f"{scheme}_attention"


def test_dispatch_picks_the_kernel_only_for_plain_numpy_arrays(monkeypatch):
    q = np.eye(3)
    assert kernels.kernel_for("plain", (q,)) is KERNELS["plain"]
    assert kernels.kernel_for("plain", (np.ma.masked_array(q),)) is KERNELS["plain"]
    assert KERNELS["plain"](np.ma.masked_array(q), q, q) is NotImplemented  # a subclass
    with kernels.disabled():
        assert kernels.kernel_for("plain", (q,)) is None
        with kernels.disabled():
            assert not kernels.enabled()
        assert not kernels.enabled()
    assert kernels.enabled()
    monkeypatch.setenv(kernels.ENV_VAR, "0")
    assert kernels.kernel_for("plain", (q,)) is None
    monkeypatch.setenv(kernels.ENV_VAR, "1")
    assert kernels.kernel_for("plain", (q,)) is not None
    import array_api_strict

    assert kernels.kernel_for("plain", (array_api_strict.asarray(q),)) is None


def test_public_functions_are_the_specification_behind_the_dispatcher():
    from relpos_ref import schemes

    for scheme in catalog.names(plain=True):
        public = getattr(rp, _public(scheme))
        assert public.__wrapped__ is catalog.get(scheme).attention
        assert public.__doc__ == catalog.get(scheme).attention.__doc__
    assert rp.shaw_attention.__wrapped__ is schemes.shaw_attention


def test_the_specification_runs_when_kernels_are_disabled():
    calls_made = []
    original = KERNELS["bias"]
    with mock.patch.dict(KERNELS, {"bias": lambda *a, **k: calls_made.append(1) or original(
            *a, **k)}):
        q = np.eye(3)
        rp.bias_attention(q, q, q, np.zeros(5))
        with kernels.disabled():
            rp.bias_attention(q, q, q, np.zeros(5))
    assert calls_made == [1]


# -- the building blocks ----------------------------------------------------------


def _standard(content, *, scale, position=None, bias=None, mask=None, causal=False,
              q_offset=0):
    t_q, t_k = content.shape[-2:]
    allowed = rp.allowed_keys(t_q, t_k, mask=mask, causal=causal, q_offset=q_offset, xp=xp)
    logits = rp.compose_logits(content, scale=scale, position=position, bias=bias)
    return rp.masked_softmax(logits, allowed=allowed)


@given(
    batch=st.sampled_from([(), (3,), (2, 3)]),
    t_q=st.integers(0, 12),
    t_k=st.integers(0, 12),
    terms=st.sampled_from(["none", "position", "bias", "both", "row position"]),
    mask=st.sampled_from(["none", "full", "shared"]),
    causal=st.booleans(),
    q_offset=st.integers(-5, 5),
    block_bytes=st.sampled_from([1, 40, 2**20]),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 99),
)
def test_softmax_in_place_equals_the_standard_forms_bit_for_bit(
    batch, t_q, t_k, terms, mask, causal, q_offset, block_bytes, dtype, seed
):
    rng = np.random.default_rng(seed)
    shape = (*batch, t_q, t_k)
    content = rng.standard_normal(shape).astype(dtype)
    position = rng.standard_normal(shape).astype(dtype)
    if terms == "row position":  # broadcast along the batch
        position = position[(0,) * len(batch)]
    bias = rng.standard_normal(shape[-2:]).astype(dtype)
    # an additive mask must behave the same (a -inf in q . k is an overflow, which the
    # specification makes NaN: the kernels never pass one here, `bounded` refuses the call)
    bias[::5, ::3] = -np.inf
    position = position if terms in ("position", "both", "row position") else None
    bias = bias if terms in ("bias", "both") else None
    allowed = {"none": None, "full": rng.random(shape) < 0.7,
               "shared": rng.random((t_q, t_k)) < 0.5}[mask]
    want = _standard(content, scale=0.3, position=position, bias=bias, mask=allowed,
                     causal=causal, q_offset=q_offset)
    with mock.patch.object(_numpy_blocks, "BLOCK_BYTES", block_bytes):
        got = softmax_in_place(content.copy(), scale=0.3, position=position, bias=bias,
                               mask=allowed, causal=causal, q_offset=q_offset)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)


def test_softmax_in_place_asks_for_terms_block_by_block_and_only_for_visible_keys():
    rng = np.random.default_rng(2)
    content = rng.standard_normal((2, 9, 5))
    position = rng.standard_normal((2, 9, 5))
    asked = []

    def add(live, a):
        asked.append((a, *live.shape[-2:]))
        live += position[..., a : a + live.shape[-2], : live.shape[-1]]

    with mock.patch.object(_numpy_blocks, "BLOCK_BYTES", 2 * 5 * 8 * 4):  # four rows a block
        got = softmax_in_place(content.copy(), scale=0.5, add_position=add, causal=True,
                               q_offset=-2)
    assert asked == [(0, 4, 2), (4, 4, 5), (8, 1, 5)]  # rows 0..3 see keys 0..1 at most
    want = _standard(content, scale=0.5, position=position, causal=True, q_offset=-2)
    np.testing.assert_array_equal(got, want)


def _standard_shaw(content, x, *, k_max, q_offset, scale, mask, causal, past=None):
    t_q, t_k = content.shape[-2:]
    past = k_max if past is None else past
    index = rp.table_index(rp.relative_positions(t_q, t_k, q_offset=q_offset, xp=xp), k_max,
                           max_past=past)
    position = rp.take_per_row(x, index.index)
    weights = _standard(content, scale=scale, position=position, mask=mask, causal=causal,
                        q_offset=q_offset)
    n = past + k_max + 1
    r = np.arange(t_k)[None, :] - (np.arange(t_q)[:, None] + q_offset)
    bins = np.asarray(rp.to_relative(weights, n, offset=past, q_offset=q_offset)).copy()
    bins[..., 0] += np.sum(np.where(r < -past, weights, 0.0), axis=-1)
    bins[..., n - 1] += np.sum(np.where(r > k_max, weights, 0.0), axis=-1)
    return weights, bins


@given(
    batch=st.sampled_from([(), (2,), (2, 3)]),
    shared_table=st.booleans(),
    t_q=st.integers(1, 30),
    t_k=st.integers(1, 30),
    q_offset=st.integers(-40, 40),
    k_max=st.integers(0, 6),
    past=st.sampled_from([None, 0, 2, 5]),
    mask=st.sampled_from(["none", "random"]),
    causal=st.booleans(),
    block_bytes=st.sampled_from([1, 300, 2**20]),
    scale=st.sampled_from([0.25, 1.0, -0.5]),
    seed=st.integers(0, 99),
)
def test_clipped_table_softmax_equals_the_standard_composition_and_bins(
    batch, shared_table, t_q, t_k, q_offset, k_max, past, mask, causal, block_bytes, scale, seed
):
    n = (k_max if past is None else past) + k_max + 1
    rng = np.random.default_rng(seed)
    content = rng.standard_normal((*batch, t_q, t_k)) * 3
    x = rng.standard_normal((*batch[-1:], t_q, n) if not shared_table else (t_q, n)) * 3
    allowed = None if mask == "none" else rng.random((t_q, t_k)) < 0.6
    with mock.patch.object(_numpy_blocks, "BLOCK_BYTES", block_bytes):
        fused = clipped_table_softmax(content.copy(), x, max_distance=k_max, max_past=past,
                                      q_offset=q_offset, scale=scale, mask=allowed,
                                      causal=causal, bins=True)
    if n > t_k:  # a band wider than the keys: the kernel hands the call back
        assert fused is None
        return
    weights, bins = fused
    want_w, want_bins = _standard_shaw(content, x, k_max=k_max, q_offset=q_offset,
                                       scale=scale, mask=allowed, causal=causal, past=past)
    np.testing.assert_allclose(weights, want_w, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(bins, want_bins, rtol=1e-12, atol=1e-15)


def test_clipped_table_softmax_declines_and_leaves_the_scores_alone():
    content = np.zeros((4, 6))
    x = np.zeros((4, 5))  # K = 2
    kwargs = {"max_distance": 2, "q_offset": 0, "scale": 1.0}
    assert clipped_table_softmax(content[:, :4].copy(), x, **kwargs) is None  # 5 > t_k = 4
    assert clipped_table_softmax(content, np.full((4, 5), np.inf), **kwargs) is None
    assert clipped_table_softmax(content, np.full((4, 5), 1e308), **kwargs) is None  # overflow
    assert clipped_table_softmax(content, np.zeros((4, 7)), **kwargs) is None  # not 2K + 1
    assert not content.any()


@given(
    batch=st.sampled_from([(), (3,), (2, 3)]),
    shared_table=st.booleans(),
    t_q=st.integers(1, 20),
    t_k=st.integers(1, 20),
    q_offset=st.integers(-10, 10),
    extra=st.integers(0, 5),
    seed=st.integers(0, 99),
)
def test_block_logits_equal_the_general_term(batch, shared_table, t_q, t_k, q_offset, extra,
                                             seed):
    reach = max(abs(-(t_q - 1) - q_offset), abs(t_k - 1 - q_offset))
    t_max = max(reach + 1, t_q, t_k) + extra
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((*batch, t_q, 4))
    heads = batch[-1:] if batch else (1,)
    table = rng.standard_normal((2 * t_max - 1, 4) if shared_table else (*heads, 2 * t_max - 1, 4))
    if not shared_table and not batch:
        q = q[None]
    with kernels.disabled():
        want = rp.general_logits(q, table, t_k, q_offset=q_offset)
    add = block_logits(q, table, q_offset=q_offset, low=1 - t_max)
    for a, b, width in ((0, t_q, t_k), (0, 1, 1), (t_q - 1, t_q, t_k), (t_q // 2, t_q, 1)):
        live = np.zeros((*want.shape[:-2], b - a, width))
        add(live, a)
        np.testing.assert_allclose(live, want[..., a:b, :width], rtol=1e-12, atol=1e-14)


@given(t_q=st.integers(1, 9), t_k=st.integers(1, 9), heads=st.sampled_from([(), (2,)]))
def test_distance_view_is_the_toeplitz_layout(t_q, t_k, heads):
    row = np.arange(np.prod(heads, dtype=int) * (t_q + t_k - 1)).reshape(*heads, -1)
    view = distance_view(row, t_q, t_k)
    r = np.arange(t_k)[None, :] - np.arange(t_q)[:, None]  # distance index j - i + t_q - 1
    np.testing.assert_array_equal(view, row[..., r + t_q - 1])
    assert not view.flags.writeable


@settings(max_examples=5)
@given(seed=st.integers(0, 99))
def test_rows_without_keys_are_zero_on_the_kernel_path(seed):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((4, 3)) for _ in range(3))
    mask = np.ones((4, 4), dtype=bool)
    mask[1] = False
    out, w = rp.shaw_attention(q, k, v, np.zeros((3, 3)), np.zeros((3, 3)), mask=mask,
                               return_weights=True)
    assert np.all(out[1] == 0) and np.all(w[1] == 0) and np.all(np.isfinite(out))


def test_long_double_calls_go_to_the_specification():
    """The NumPy kernels compute in float16, float32 and float64; long doubles are the
    specification's (the kernels' limits raised a math domain error)."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 4, 3)).astype(np.longdouble) for _ in range(3))
    mlp = (np.ones((2, 1), np.longdouble), np.zeros(2, np.longdouble),
           np.ones((2, 2), np.longdouble))
    calls = {"attention": (), "alibi_attention": (), "fire_attention": mlp,
             "shaw_attention": (np.zeros((5, 3), np.longdouble),)}
    for name, tables in calls.items():
        got = getattr(rp, name)(q, k, v, *tables)
        with kernels.disabled():
            want = getattr(rp, name)(q, k, v, *tables)
        assert got.dtype == np.longdouble
        np.testing.assert_array_equal(got, want)
    blocked = rp.blocked_attention(q, k, v, block_size=2)
    assert blocked.dtype == np.longdouble
    np.testing.assert_allclose(blocked, rp.attention(q, k, v), rtol=1e-15)
    grads = rp.attention_vjp(q, k, v, d_output=q)
    assert all(g.dtype == np.longdouble for g in grads.values())
