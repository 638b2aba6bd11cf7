"""The NumPy backward-pass kernels equal the specification's VJPs, and the dispatcher uses them.

For every scheme with a VJP kernel, hypothesis draws shapes (``t_q != t_k``,
empty grids, batch and heads broadcast between ``q``, ``k`` and ``v``; an
``h x w`` grid for grid2d and Swin), offsets, causality, masks (random,
empty rows, broadcast leading axes), the scheme's policies and options
(optional tables switched on and off), shared and per-head tables, dtypes,
row blocks, tile sub-blocks, DeBERTa's distance groups, run sizes and
heads per pass, and the
exponential with and without its row maxima; the kernel called directly
must return the specification's gradients (``relpos_ref.kernels.disabled``)
to the rounding of a reordered sum, or
``NotImplemented`` where it documents that it may (`_may_decline`). Bad input
gets the specification's error word for word; non-finite input goes to the
specification; the public ``*_attention_vjp`` runs the kernel on an ordinary
NumPy call and the specification when kernels are disabled. The skewed
tile's building blocks, and DeBERTa's sums by table row, are checked against
their definitions.
"""

from __future__ import annotations

import inspect
from unittest import mock

import numpy as np
import pytest
from _calls import draw_mask as _mask
from hypothesis import given, settings
from hypothesis import strategies as st

import relpos_ref as rp
from relpos_ref import catalog, kernels
from relpos_ref.kernels import _numpy_vjp, _numpy_vjp_deberta, _numpy_vjp_tiles
from relpos_ref.kernels._numpy_vjp_tiles import band_view, skew_view, tile_products, tile_rows

VJP_KERNELS = kernels.vjp_kernels("numpy")
COVERED = ["plain", "absolute", "alibi", "bias", "cope", "deberta", "fire", "forgetting",
           "general", "grid2d", "kerple", "music", "rope", "sandwich", "shaw", "swin", "swinv2",
           "t5", "transformer_xl", "xpos"]
GRIDS = ("grid2d", "swin", "swinv2")  # self-attention over a row-major grid of h x w tokens
RTOL = {"float64": 1e-10, "float32": 2e-4}


def _public(scheme):
    return "attention_vjp" if scheme == "plain" else f"{scheme}_attention_vjp"


def _spec_function(scheme):
    return getattr(rp, _public(scheme)).__wrapped__


def _accepts(scheme, name):
    return name in inspect.signature(_spec_function(scheme)).parameters


def test_the_vjp_kernels_are_those_of_the_covered_schemes():
    assert sorted(VJP_KERNELS) == sorted(COVERED)
    assert set(VJP_KERNELS) <= set(catalog.names(plain=True))


# -- drawing calls ------------------------------------------------------------------


def _options(draw, scheme, t_q, t_k, q_offset):
    """The scheme's sizes (for its tables) and options; q_offset may change."""
    sizes, options = {}, {}
    if scheme in ("shaw", "bias"):
        sizes["K"] = draw(st.integers(0, 4))
        options["beyond"] = draw(st.sampled_from(["clip", "zero", "error"]))
    elif scheme == "music":
        sizes["M"] = draw(st.integers(1, 12))
        options["beyond"] = draw(st.sampled_from(["clip", "zero", "error"]))
        q_offset = draw(st.sampled_from([t_k - t_q, q_offset]))
    elif scheme == "general":
        reach = max(abs(t_q - 1 + q_offset), abs(t_k - 1 - q_offset))
        sizes["t_max"] = max(t_q, t_k, reach + 1, 1) + draw(st.integers(0, 3))
        options["order"] = draw(st.sampled_from(["past_to_future", "future_to_past"]))
    elif scheme == "t5":
        sizes["buckets"] = draw(st.sampled_from([4, 8, 16]))
        options["bidirectional"] = draw(st.booleans())
        options["max_distance"] = draw(st.integers(sizes["buckets"] // 2, 20))
    elif scheme == "alibi":
        options["symmetric"] = draw(st.booleans())
    elif scheme == "rope":
        options["layout"] = draw(st.sampled_from(["half", "interleaved"]))
        options["rotary_dim"] = draw(st.sampled_from([None, 2]))
    elif scheme == "absolute":
        sizes["rows"] = t_k + draw(st.integers(0, 3))
    elif scheme == "forgetting":  # a gate per key (or more); every query has its own
        sizes["T"] = t_k + draw(st.sampled_from([0, 2]))
        q_offset = draw(st.sampled_from([t_k - t_q, min(q_offset, sizes["T"] - t_q)]))
    elif scheme == "fire":  # thresholds below, at and above the positions; c of either sign
        sizes["hidden"] = draw(st.sampled_from([1, 5]))
        options["c"] = draw(st.sampled_from([0.1, -0.7, 0.0]))
        options["L"] = draw(st.sampled_from([512.0, 3.0, 4.0, -2.0, 0.0]))
        options["eps"] = draw(st.sampled_from([1e-6, 0.5]))
    elif scheme == "cope":  # a few rows: the clamp is reached
        sizes["npos"] = draw(st.integers(1, 6))
    elif scheme == "transformer_xl":
        sizes["d_model"] = draw(st.sampled_from([2, 4, 6]))
        options["clamp_len"] = draw(st.sampled_from([None, 0, 1, 3]))
        options["base"] = draw(st.sampled_from([10000.0, 7.0]))
        q_offset = draw(st.sampled_from([None, q_offset]))  # None: after the memory
    elif scheme == "xpos":
        options["scale_base"] = draw(st.sampled_from([4.0, 512.0]))
        options["center"] = draw(st.sampled_from(["middle", "middle_up", 0]))
    elif scheme == "deberta":
        sizes["span"] = draw(st.integers(1, 5))
        options["max_position"] = (None if sizes["span"] < 2 or draw(st.booleans())
                                   else sizes["span"] // 2 + draw(st.integers(2, 6)))
    return sizes, options, q_offset


def _grid(draw, scheme, sizes, options):
    """A grid scheme's h x w (its t_q = t_k) into `sizes` and `options`; returns h w."""
    height, width = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sizes.update(height=height, width=width)
    prefix = "window_" if scheme in ("swin", "swinv2") else ""
    options.update({f"{prefix}height": height, f"{prefix}width": width})
    if scheme == "swinv2":
        sizes["hidden"] = draw(st.sampled_from([1, 5]))
        options["pretrained_window"] = draw(st.sampled_from([None, (3, 2)]))
        options["mask_penalty"] = draw(st.sampled_from([None, -7.0]))
    return height * width


@st.composite
def vjp_calls(draw, scheme):
    """(args, kwargs) of one ``*_attention_vjp`` call on NumPy arrays."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    heads, d, d_v = draw(st.integers(1, 3)), 4, 3
    t_q, t_k = draw(st.integers(0, 9)), draw(st.integers(0, 9))
    sizes, options, q_offset = _options(draw, scheme, t_q, t_k, draw(st.integers(-4, 8)))
    if scheme in GRIDS:
        t_q = t_k = _grid(draw, scheme, sizes, options)
    per_head = draw(st.booleans())

    def normal(*shape):
        return (rng.standard_normal(shape) * 2).astype(dtype)

    # leading axes: q, k, v each (heads,) or (2, heads) or a broadcast (1, heads) or none
    leads = [(heads,), (2, heads), (1, heads), ()]
    lead_q, lead_k, lead_v = (draw(st.sampled_from(leads)) for _ in range(3))
    q, k, v = normal(*lead_q, t_q, d), normal(*lead_k, t_k, d), normal(*lead_v, t_k, d_v)
    mask = _mask(draw, rng, t_q, t_k)
    batch = np.broadcast_shapes(lead_q, lead_k, lead_v,
                                mask.shape[:-2] if mask is not None and mask.ndim > 2 else ())
    d_lead = draw(st.sampled_from([batch, batch[-1:], ()]))
    kwargs = dict(options, mask=mask, d_output=normal(*d_lead, t_q, d_v),
                  scale=draw(st.sampled_from([None, 0.7, -0.3])), q_offset=q_offset,
                  causal=draw(st.sampled_from([None, True] if scheme == "forgetting"
                                              else [None, True, False])))
    kwargs = {name: x for name, x in kwargs.items()
              if name not in ("q_offset", "causal") or _accepts(scheme, name)}
    tables = ()
    if scheme == "plain":
        if draw(st.booleans()):
            kwargs["position"] = normal(*draw(st.sampled_from([(t_q, t_k), (t_k,)])))
        if draw(st.booleans()):
            kwargs["bias"] = normal(*draw(st.sampled_from([(heads, t_q, t_k),
                                                           (heads, t_q, 1)])))
    else:
        entry = catalog.get(scheme)
        switches = {t.switch: draw(st.booleans()) for t in entry.tables if t.switch}
        shapes = entry.table_shapes(sizes, d=d, d_v=d_v, heads=heads if per_head else None,
                                    include=switches)
        if scheme == "transformer_xl" and shapes.keys() > {"w_r"}:  # u or v alone, or both
            shapes.pop(draw(st.sampled_from(["content_bias", "position_bias", None])), None)
        tables = entry.table_args({name: normal(*shape) for name, shape in shapes.items()})
    if scheme == "swinv2" and draw(st.booleans()):  # cosine attention, tau per head or one
        kwargs["scale"] = None
        kwargs["logit_scale"] = np.asarray(rng.random(draw(st.sampled_from([(), (heads,)]))) * 6,
                                           dtype=dtype)
    if scheme == "alibi" and draw(st.booleans()):
        kwargs["slopes"] = (rng.random(heads) + 0.1).astype(dtype)
    if scheme == "fire" and draw(st.booleans()):  # c and L as arrays of the call's dtype
        kwargs.update({n: np.asarray(kwargs[n], dtype=dtype) for n in ("c", "L")})
    if scheme == "fire" and draw(st.booleans()):  # the output layer's bias
        kwargs["b2"] = normal(heads)
    return (q, k, v, *tables), kwargs


def _may_decline(scheme, args, kwargs):
    """Whether the kernel may hand this call to the specification (see its docstring)."""
    mask, t_q, t_k = kwargs.get("mask"), args[0].shape[-2], args[1].shape[-2]
    if mask is not None and (mask.ndim < 2 or mask.shape[-2:] != (t_q, t_k)):
        return True  # a mask broadcast along queries or keys: the specification refuses it
    if scheme == "music":
        return len(args) > 4 and args[4] is not None  # a relative value table
    if scheme == "swinv2":  # an additive mask: a dense bias
        return mask is not None and kwargs.get("mask_penalty") is not None
    if scheme == "shaw" and len(args) > 4 and args[4] is not None:
        return _v_widens_the_output(args, kwargs)
    return False


def _v_widens_the_output(args, kwargs):
    q, k, v = args[:3]
    mask = kwargs.get("mask")
    mask_batch = mask.shape[:-2] if mask is not None and mask.ndim > 2 else ()
    without_v = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], mask_batch,
                                    kwargs["d_output"].shape[:-2])
    return np.broadcast_shapes(without_v, v.shape[:-2]) != without_v


def _errors_alike(call):
    try:
        return ("ok", call())
    except (TypeError, ValueError) as exc:
        return (type(exc), str(exc))


def _assert_gradients_equal(got, want):
    assert isinstance(got, dict) and list(got) == list(want)
    rtol = RTOL[str(next(iter(want.values())).dtype)]
    size = max((float(np.max(np.abs(w), initial=0)) for w in want.values()), default=0)
    for name, w in want.items():
        g = got[name]
        assert type(g) is np.ndarray and g.dtype == w.dtype and g.shape == w.shape, name
        # atol: a gradient's rounding scales with the largest entries of the call
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * max(size, 1e-3), err_msg=name)


def _spec(scheme, args, kwargs):
    with kernels.disabled():
        return getattr(rp, _public(scheme))(*args, **kwargs)


@pytest.mark.parametrize("scheme", COVERED)
@settings(max_examples=max(60, settings.default.max_examples))  # small calls: cheap
@given(data=st.data(), block=st.sampled_from([64, 700, 2**21]),
       group=st.sampled_from([1, 3, 64]), sub=st.sampled_from([1, 2, 32]),
       run=st.sampled_from([1, 2, 16]), runs=st.sampled_from([1, 5, 64]),
       single=st.sampled_from([1, 4]), heads=st.sampled_from([1, 45_000, 2**24]),
       limit=st.sampled_from([None, {}]))
def test_vjp_kernel_equals_the_specification(scheme, data, block, group, sub, run, runs, single,
                                              heads, limit):
    args, kwargs = data.draw(vjp_calls(scheme))
    limits = _numpy_vjp.EXP_LIMIT if limit is None else limit  # {}: always subtract
    with mock.patch.object(_numpy_vjp, "VJP_BLOCK_BYTES", block), \
            mock.patch.object(_numpy_vjp_deberta, "GROUP_ROWS", group), \
            mock.patch.object(_numpy_vjp_tiles, "TILE_ROWS", sub), \
            mock.patch.object(_numpy_vjp_deberta, "END_RUN", run), \
            mock.patch.object(_numpy_vjp_deberta, "RUN_ROWS", runs), \
            mock.patch.object(_numpy_vjp_deberta, "SINGLE_ROWS", single), \
            mock.patch.object(_numpy_vjp_deberta, "DIAGONAL_BYTES", heads), \
            mock.patch.object(_numpy_vjp, "EXP_LIMIT", limits):
        direct = _errors_alike(lambda: VJP_KERNELS[scheme](*args, **kwargs))
    want = _errors_alike(lambda: _spec(scheme, args, kwargs))
    if direct[1] is NotImplemented:
        assert _may_decline(scheme, args, kwargs), "the kernel declined a call it covers"
    elif want[0] == "ok":
        _assert_gradients_equal(direct[1], want[1])
    else:  # the kernel refuses what the specification refuses, word for word
        assert direct == want


def _typical(scheme, dtype=np.float64, t_q=6, t_k=7):
    """A per-head call with every table, a mask and an offset, as (args, kwargs).

    A grid scheme's grid is 2 x 3 (5 x 8 for a long call), its t_q = t_k.
    """
    rng = np.random.default_rng(1)
    entry = None if scheme == "plain" else catalog.get(scheme)
    height, width = (2, 3) if t_q <= 6 else (5, 8)
    if scheme in GRIDS:
        t_q = t_k = height * width
    q = rng.standard_normal((2, t_q, 4)).astype(dtype)
    k = rng.standard_normal((2, t_k, 4)).astype(dtype)
    v = rng.standard_normal((2, t_k, 3)).astype(dtype)
    kwargs = {"d_output": rng.standard_normal((2, t_q, 3)).astype(dtype),
              "mask": rng.random((t_q, t_k)) < 0.8}
    tables = ()
    if entry is not None:
        params = {"t_q": t_q, "t_k": t_k, "K": 2, "M": 6, "t_max": max(t_q, t_k) + 2,
                  "buckets": 8, "rows": t_k + 1, "height": height, "width": width,
                  "d_model": 6, "span": 3, "max_position": 5}
        shapes = entry.table_shapes(entry.sizes_from(params), d=4, d_v=3, heads=2)
        tables = tuple(rng.standard_normal(shapes[t.name]).astype(dtype)
                       for t in entry.tables if t.name in shapes)
        kwargs.update(entry.options_from(params))
        if scheme == "t5":
            kwargs["max_distance"] = 6
        if scheme == "music":
            tables = tables[:1]
    if scheme != "music" and _accepts(scheme, "q_offset"):
        kwargs["q_offset"] = 1
    return (q, k, v, *tables), kwargs


@pytest.mark.parametrize("scheme", COVERED)
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_vjp_kernel_runs_a_typical_call_and_returns_fresh_arrays(scheme, dtype):
    args, kwargs = _typical(scheme, dtype)
    got = VJP_KERNELS[scheme](*args, **kwargs)
    assert got is not NotImplemented
    want = _spec(scheme, args, kwargs)
    if dtype == np.float16:  # both in float32 inside, rounded to float16 at the end
        assert all(g.dtype == np.float16 for g in got.values())
        for name, w in want.items():
            np.testing.assert_allclose(got[name].astype(np.float32), w.astype(np.float32),
                                       rtol=1e-2, atol=1e-2, err_msg=name)
    else:
        _assert_gradients_equal(got, want)
    for g in got.values():
        assert g.flags.writeable
        assert not any(np.shares_memory(g, a) for a in (*args, kwargs["d_output"]))


@pytest.mark.parametrize("scheme", COVERED)
def test_vjp_kernel_covers_long_causal_calls_block_by_block(scheme):
    # many row blocks, the causal width growing block by block, t_q != t_k
    args, kwargs = _typical(scheme, np.float64, t_q=37, t_k=45)
    if _accepts(scheme, "causal"):
        kwargs["causal"] = True
    with mock.patch.object(_numpy_vjp, "VJP_BLOCK_BYTES", 8 * 45 * 5), \
            mock.patch.object(_numpy_vjp_deberta, "GROUP_ROWS", 7), \
            mock.patch.object(_numpy_vjp_tiles, "TILE_ROWS", 2), \
            mock.patch.object(_numpy_vjp_deberta, "END_RUN", 3), \
            mock.patch.object(_numpy_vjp_deberta, "RUN_ROWS", 4), \
            mock.patch.object(_numpy_vjp_deberta, "DIAGONAL_BYTES", 1):
        got = VJP_KERNELS[scheme](*args, **kwargs)
    _assert_gradients_equal(got, _spec(scheme, args, kwargs))


@pytest.mark.parametrize("max_position", [None, 12, 17, 40])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("constants", [
    {},  # the defaults: every head in one pass, groups of 64 distances
    {"GROUP_ROWS": 5, "RUN_ROWS": 3, "SINGLE_ROWS": 2, "END_RUN": 4, "DIAGONAL_BYTES": 1},
    {"GROUP_ROWS": 1, "RUN_ROWS": 64, "DIAGONAL_BYTES": 30_000},  # two heads a pass
    {"DIAGONAL_BYTES": 45_000},  # four heads, then the last two when the block finishes
])
def test_deberta_vjp_kernel_sums_log_buckets_by_table_row(max_position, causal, constants):
    # every kind of run at once: exact distances, logarithmic buckets (P = 12 and 17 skip
    # table rows, 40 does not), clipped ends; row blocks of 16 queries, heads of two batch
    # entries with per-head tables, a mask, an offset
    rng = np.random.default_rng(7)
    q, k = rng.standard_normal((2, 3, 50, 4)), rng.standard_normal((2, 3, 70, 4))
    v, d_output = rng.standard_normal((2, 3, 70, 3)), rng.standard_normal((2, 3, 50, 3))
    key_table, query_table = rng.standard_normal((2, 3, 32, 4))
    kwargs = {"d_output": d_output, "max_position": max_position, "causal": causal,
              "q_offset": 5, "mask": rng.random((50, 70)) < 0.9}
    patches = [mock.patch.object(_numpy_vjp_deberta, name, value)
               for name, value in constants.items()]
    with mock.patch.object(_numpy_vjp, "VJP_BLOCK_BYTES", 16 * 70 * 8):
        for patch in patches:
            patch.start()
        try:
            got = VJP_KERNELS["deberta"](q, k, v, key_table, query_table, **kwargs)
        finally:
            for patch in patches:
                patch.stop()
    _assert_gradients_equal(got, _spec("deberta", (q, k, v, key_table, query_table), kwargs))


def test_deberta_row_sums_are_kept_across_calls_and_follow_the_constants():
    # the table rows and the sums' plans are made once per geometry; a plan made under
    # other constants (patched here) is not reused, so every patched test runs its own
    rng = np.random.default_rng(3)
    q, k, v, d_output = rng.standard_normal((4, 2, 30, 4))
    key_table, query_table = rng.standard_normal((2, 24, 4))
    args = (q, k, v, key_table, query_table)
    kwargs = {"d_output": d_output, "max_position": 20}
    _numpy_vjp_deberta._deberta_row_sums.cache_clear()
    first = VJP_KERNELS["deberta"](*args, **kwargs)
    sums = _numpy_vjp_deberta._deberta_row_sums(12, 20, -29, 59)
    assert _numpy_vjp_deberta._deberta_row_sums.cache_info().hits >= 1  # the kernel's own entry
    assert not sums.row_of.flags.writeable
    assert all(key[3:] == (_numpy_vjp_deberta.END_RUN, _numpy_vjp_deberta.SINGLE_ROWS,
                           _numpy_vjp_deberta.RUN_ROWS) for key in sums.plans)
    made = len(sums.plans)
    assert made and VJP_KERNELS["deberta"](*args, **kwargs) and len(sums.plans) == made
    with mock.patch.object(_numpy_vjp_deberta, "END_RUN", 3), \
            mock.patch.object(_numpy_vjp_deberta, "RUN_ROWS", 2):
        patched = VJP_KERNELS["deberta"](*args, **kwargs)
    assert any(key[3] == 3 and key[5] == 2 for key in sums.plans)
    _assert_gradients_equal(patched, first)
    _assert_gradients_equal(first, _spec("deberta", args, kwargs))


@pytest.mark.parametrize("scheme", COVERED)
def test_vjp_kernel_returns_zeros_for_an_empty_batch(scheme):
    # a batch axis of length 0 (no head runs a block): zeros of every argument's shape
    args, kwargs = _typical(scheme, np.float64)
    q, k, v, *tables = args
    args = (q[None][:0], k[None][:0], v[None][:0], *tables)
    kwargs["d_output"] = kwargs["d_output"][None][:0]
    got = VJP_KERNELS[scheme](*args, **kwargs)
    want = _spec(scheme, args, kwargs)
    _assert_gradients_equal(got, want)
    assert all(not g.any() for g in got.values())


@pytest.mark.parametrize("scheme", COVERED)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_vjp_kernel_subtracts_the_row_maxima_of_large_logits(scheme, dtype):
    # logits far beyond EXP_LIMIT (rows whose largest logit is about +-60 and more), no
    # mask: the exponential subtracts each row's maximum, as the specification does
    args, kwargs = _typical(scheme, dtype, t_q=9, t_k=11)
    kwargs["mask"] = None
    kwargs["scale"] = 40.0 if scheme != "t5" else None
    if scheme == "t5":  # unscaled: large queries instead
        args = (args[0] * 40, *args[1:])
    got = VJP_KERNELS[scheme](*args, **kwargs)
    want = _spec(scheme, args, kwargs)
    assert all(np.isfinite(w).all() for w in want.values())
    _assert_gradients_equal(got, want)


# -- what the kernels hand back, and errors -----------------------------------------


@pytest.mark.parametrize("scheme", COVERED)
@pytest.mark.parametrize("where", ["q", "k", "v", "d_output"])
def test_non_finite_input_goes_to_the_specification(scheme, where):
    # NaN or inf where only masked pairs read it (a masked key's k and v, the queries of
    # an empty row): the specification's guarantee, so the kernel hands the call over
    args, kwargs = _typical(scheme)
    mask = np.ones((args[0].shape[-2], args[1].shape[-2]), dtype=bool)
    mask[:, 1] = False
    mask[2] = False
    arrays = {"q": args[0], "k": args[1], "v": args[2], "d_output": kwargs["d_output"]}
    bad = arrays[where] = arrays[where].copy()
    bad[..., 2 if where in ("q", "d_output") else 1, :] = np.inf if where == "v" else np.nan
    args = (arrays["q"], arrays["k"], arrays["v"], *args[3:])
    kwargs = dict(kwargs, d_output=arrays["d_output"], mask=mask)
    assert VJP_KERNELS[scheme](*args, **kwargs) is NotImplemented
    public = getattr(rp, _public(scheme))(*args, **kwargs)
    want = _spec(scheme, args, kwargs)
    for name, w in want.items():
        np.testing.assert_array_equal(public[name], w, err_msg=name)
    if where != "d_output":
        assert all(np.isfinite(g).all() for name, g in want.items() if name != where)


def test_shaw_hands_over_value_tables_whose_term_v_broadcasts():
    # v with more leading axes than q, k, the mask and d_output: the specification sums
    # the value table's gradient over the latter's batch only (each broadcast copy of the
    # value term once, half the finite difference here); the kernel hands the call over,
    # so that the public function gives the specification's answer with kernels or not
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(shape) for shape in ((1, 3, 4), (1, 3, 4), (2, 1, 3, 3)))
    key_table, value_table = rng.standard_normal((5, 4)), rng.standard_normal((5, 3))
    d_output = rng.standard_normal((1, 3, 3))
    args = (q, k, v, key_table, value_table)
    assert VJP_KERNELS["shaw"](*args, d_output=d_output) is NotImplemented
    assert VJP_KERNELS["shaw"](*args[:4], d_output=d_output) is not NotImplemented
    wide = rng.standard_normal((2, 1, 3, 3))  # d_output of v's batch: covered
    _assert_gradients_equal(VJP_KERNELS["shaw"](*args, d_output=wide),
                            _spec("shaw", args, {"d_output": wide}))
    public = rp.shaw_attention_vjp(*args, d_output=d_output)
    want = _spec("shaw", args, {"d_output": d_output})
    for name, w in want.items():
        np.testing.assert_array_equal(public[name], w)


@pytest.mark.parametrize("scheme", COVERED)
def test_non_numpy_arrays_and_other_dtypes_go_to_the_specification(scheme):
    args, kwargs = _typical(scheme)
    subclass = (np.ma.masked_array(args[0]), *args[1:])
    assert VJP_KERNELS[scheme](*subclass, **kwargs) is NotImplemented
    if hasattr(np, "longdouble") and np.dtype(np.longdouble) != np.dtype(np.float64):
        wide = tuple(a.astype(np.longdouble) for a in args)
        wide_kwargs = dict(kwargs, d_output=kwargs["d_output"].astype(np.longdouble))
        assert VJP_KERNELS[scheme](*wide, **wide_kwargs) is NotImplemented


def _bad_d_outputs(args, kwargs):
    q = args[0]
    good = kwargs["d_output"]
    return [
        None,
        good[..., :1, :].repeat(3, axis=-2),  # the wrong number of queries
        np.zeros((5, *good.shape)),  # a batch the output does not have
        good.astype(np.float32),  # q is float64
        good.astype(np.int64),
        np.zeros(q.shape[-2]),  # one dimension
    ]


@pytest.mark.parametrize("scheme", COVERED)
def test_bad_input_gets_the_specifications_error_word_for_word(scheme):
    args, kwargs = _typical(scheme)
    cases = [dict(kwargs, d_output=bad) for bad in _bad_d_outputs(args, kwargs)]
    cases += [dict(kwargs, mask=np.ones((3, 3), dtype=bool)), dict(kwargs, scale=float("nan"))]
    if _accepts(scheme, "causal"):
        cases.append(dict(kwargs, causal="yes"))
    if scheme in ("bias", "shaw", "music"):
        cases.append(dict(kwargs, beyond="error", q_offset=40))
    if scheme in GRIDS:  # a grid of other tokens, of a bad size
        prefix = "window_" if scheme == "swin" else ""
        cases += [dict(kwargs, **{f"{prefix}width": 2}), dict(kwargs, **{f"{prefix}height": 0})]
    if scheme == "transformer_xl":
        cases += [dict(kwargs, clamp_len=-1), dict(kwargs, q_offset=1.5)]
    if scheme == "deberta":
        cases += [dict(kwargs, max_position=2), dict(kwargs, max_position=0)]
    bad_args = [(args[0].astype(np.float32), *args[1:])]  # q float32, k float64
    if scheme == "transformer_xl":  # d_model odd, u of the wrong width
        bad_args += [(*args[:3], args[3][..., :5, :], *args[4:]),
                     (*args[:4], args[4][..., :3], *args[5:])]
    if scheme == "deberta":  # tables of different spans
        bad_args.append((*args[:3], args[3], args[4][..., :4, :]))
    calls = [(args, c) for c in cases] + [(a, kwargs) for a in bad_args]
    for call_args, call_kwargs in calls:
        direct = _errors_alike(lambda a=call_args, c=call_kwargs: VJP_KERNELS[scheme](*a, **c))
        public = _errors_alike(lambda a=call_args, c=call_kwargs: getattr(
            rp, _public(scheme))(*a, **c))
        want = _errors_alike(lambda a=call_args, c=call_kwargs: _spec(scheme, a, c))
        assert want[0] in (TypeError, ValueError), call_kwargs
        assert direct == want
        assert public == want


# -- dispatch -----------------------------------------------------------------------


@pytest.mark.parametrize("scheme", COVERED)
def test_the_public_vjp_runs_the_kernel_and_the_specification_when_disabled(scheme):
    args, kwargs = _typical(scheme)
    assert kernels.kernel_for(scheme, (*args, *kwargs.values()), vjp=True) is VJP_KERNELS[
        scheme]
    seen = []
    original = VJP_KERNELS[scheme]

    def spy(*a, **k):
        seen.append(1)
        return original(*a, **k)

    spec = _spec_function(scheme)
    spec_calls = []
    with mock.patch.dict(VJP_KERNELS, {scheme: spy}):
        public = getattr(rp, _public(scheme))(*args, **kwargs)
        assert seen == [1]
        with kernels.disabled():
            assert kernels.kernel_for(scheme, args, vjp=True) is None
            without = getattr(rp, _public(scheme))(*args, **kwargs)
        assert seen == [1]
    with mock.patch.dict(VJP_KERNELS, {scheme: lambda *a, **k: spec_calls.append(1)
                                       or NotImplemented}):
        handed = getattr(rp, _public(scheme))(*args, **kwargs)
    assert spec_calls == [1]
    want = spec(*args, **kwargs)
    for name, w in want.items():
        np.testing.assert_array_equal(without[name], w)
        np.testing.assert_array_equal(handed[name], w)
        np.testing.assert_allclose(public[name], w, rtol=1e-10, atol=1e-12)


def test_the_public_vjps_are_the_specification_behind_the_dispatcher():
    from relpos_ref import gradients

    for scheme in catalog.names(plain=True):
        public = getattr(rp, _public(scheme))
        spec = gradients.attention_vjp if scheme == "plain" else catalog.get(scheme).vjp
        assert public.__wrapped__ is spec
        assert public.__name__ == spec.__name__ and public.__doc__ == spec.__doc__
        assert inspect.signature(public) == inspect.signature(spec)
        if scheme != "plain":
            assert catalog.get(scheme).vjp.__module__.startswith("relpos_ref.schemes")


def test_vjp_kernels_only_for_numpy_and_not_the_forward_table():
    import array_api_strict

    q = np.eye(3)
    assert kernels.kernel_for("shaw", (q,), vjp=True) is VJP_KERNELS["shaw"]
    assert kernels.kernel_for("shaw", (q,)) is kernels.kernels("numpy")["shaw"]
    assert kernels.kernel_for("shaw", (array_api_strict.asarray(q),), vjp=True) is None
    assert kernels.kernel_for("nothing", (q,), vjp=True) is None  # the specification runs
    assert dict(kernels.vjp_kernels("array_api_strict")) == {}


def test_the_environment_variable_turns_the_vjp_kernels_off(monkeypatch):
    monkeypatch.setenv(kernels.ENV_VAR, "0")
    assert kernels.kernel_for("plain", (np.eye(3),), vjp=True) is None


# -- building blocks ------------------------------------------------------------------


@given(rows=st.integers(1, 7), width=st.integers(0, 9), batch=st.sampled_from([(), (2,)]))
def test_skew_view_is_the_skewed_layout_and_writes_nothing_else(rows, width, batch):
    tile = np.zeros((*batch, rows, width + rows - 1))
    view = skew_view(tile, width)
    values = np.arange(np.prod((*batch, rows, width)), dtype=float).reshape(*batch, rows, width)
    view[...] = values + 1
    inside = np.zeros(tile.shape[-2:], dtype=bool)
    for i in range(rows):
        for j in range(width):
            assert np.array_equal(tile[..., i, j + rows - 1 - i], values[..., i, j] + 1)
        inside[i, rows - 1 - i : rows - 1 - i + width] = True
    assert not tile[..., ~inside].any()  # the triangles stay zero
    assert np.array_equal(view, values + 1)


@given(rows=st.integers(1, 7), n=st.integers(1, 5), extra=st.integers(0, 3))
def test_band_view_is_the_band_of_a_skewed_tile(rows, n, extra):
    tile = np.arange(rows * (rows - 1 + n + extra), dtype=float).reshape(rows, -1)
    band = band_view(tile, n)
    for i in range(rows):
        assert np.array_equal(band[i], tile[i, i : i + n])
    band[...] = -1  # writeable, and it writes the band alone
    assert (tile == -1).sum() == rows * n


@given(rows=st.integers(1, 9), width=st.integers(1, 8), d=st.integers(1, 3),
       sub=st.sampled_from([1, 2, 3, 64]), first=st.integers(0, 3))
def test_tile_rows_and_products_follow_their_definitions(rows, width, d, sub, first):
    rng = np.random.default_rng(rows * 100 + width * 10 + d)
    length = width + rows - 1
    table = rng.standard_normal((first + length + 2, d))
    side = rng.standard_normal((rows, d))
    # tile_rows: the band of side . table[first + c]
    with mock.patch.object(_numpy_vjp_tiles, "TILE_ROWS", sub):
        tile = np.full((rows, length), np.nan)
        tile_rows(tile, side, table, first)
    for i in range(rows):
        for j in range(width):
            c = j + rows - 1 - i
            np.testing.assert_allclose(tile[i, c], side[i] @ table[first + c])
    # tile_products: its transposes, from a skewed tile of zero triangles
    values = rng.standard_normal((rows, width))
    tile = np.zeros((rows, length))
    skew_view(tile, width)[...] = values
    d_side, d_table = np.ones((rows, d)), np.ones(table.shape)
    with mock.patch.object(_numpy_vjp_tiles, "TILE_ROWS", sub):
        tile_products(tile, table, first, side, d_side, d_table)
    want_side, want_table = np.ones((rows, d)), np.ones(table.shape)
    for i in range(rows):
        for j in range(width):
            c = j + rows - 1 - i
            want_side[i] += values[i, j] * table[first + c]
            want_table[first + c] += values[i, j] * side[i]
    np.testing.assert_allclose(d_side, want_side)
    np.testing.assert_allclose(d_table, want_table)


@st.composite
def _runs(draw):
    """A non-decreasing table row per distance: runs of 1 to 20 distances, rows skipped."""
    rows, row = [], 0
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["single", "short", "long"]))
        size = {"single": 1, "short": draw(st.integers(2, 6)),
                "long": draw(st.integers(7, 20))}[kind]
        rows += [row] * size
        row += draw(st.sampled_from([1, 1, 1, 2]))
    return np.array(rows)


@given(row_of=_runs(), data=st.data(), run=st.sampled_from([1, 3, 8, 16]),
       runs=st.sampled_from([1, 4, 64]), single=st.sampled_from([1, 2, 8]),
       lead=st.sampled_from([(), (2,)]), assign=st.booleans())
def test_row_sums_add_each_row_to_its_table_row(row_of, data, run, runs, single, lead, assign):
    first = data.draw(st.integers(0, row_of.size - 1))
    length = data.draw(st.integers(1, row_of.size - first))
    rng = np.random.default_rng(first * 1000 + length)
    x = rng.standard_normal((*lead, length, 3))
    n_rows = int(row_of[-1]) + 2
    out = np.full((*lead, n_rows, 3), 0.5)
    with mock.patch.object(_numpy_vjp_deberta, "END_RUN", run), \
            mock.patch.object(_numpy_vjp_deberta, "RUN_ROWS", runs), \
            mock.patch.object(_numpy_vjp_deberta, "SINGLE_ROWS", single):
        sums = _numpy_vjp_deberta._RowSums(row_of)
        sums.add(x, first, out, assign=assign)
        again = np.full_like(out, 0.5)
        sums.add(x, first, again, assign=assign)  # the plan, made once, used again
        lo, hi = sums.span(first, length)
    assert (lo, hi) == (row_of[first], row_of[first + length - 1] + 1)
    want = np.full((*lead, n_rows, 3), 0.5)
    if assign:  # rows lo .. hi - 1 replaced (zeros where no distance reads them)
        want[..., lo:hi, :] = 0
    for u in range(length):
        want[..., row_of[first + u], :] += x[..., u, :]
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(again, out)
