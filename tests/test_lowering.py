"""The distance form (`relpos_ref.lowering`) equals the specification, scheme by scheme.

Hypothesis draws calls of every catalog scheme (`_calls.calls`: shapes,
offsets, causality, masks with empty rows, policies, per-head tables,
scales); the form, evaluated on the whole grid (`form_attention`), must give
the scheme's ``*_attention`` outputs and weights. Each map is checked to
stay inside its table, and bad input is refused with the scheme's own
message.
"""

from __future__ import annotations

import numpy as np
import pytest
from _calls import calls
from hypothesis import given
from hypothesis import strategies as st

import relpos_ref as rp
from relpos_ref import catalog, kernels
from relpos_ref.lowering import BiasTerm, DistanceForm, form_attention, lower, pair_rows

TOL = {"float64": {"rtol": 1e-10, "atol": 1e-12}, "float32": {"rtol": 2e-4, "atol": 2e-5},
       "float16": {"rtol": 2e-2, "atol": 2e-3}}


def _public(scheme):
    return "attention" if scheme == "plain" else f"{scheme}_attention"


def _spec(scheme, args, kwargs):
    with kernels.disabled():
        return getattr(rp, _public(scheme))(*args, **kwargs)


def _lowered(scheme, args, kwargs):
    options = {n: a for n, a in kwargs.items() if n != "return_weights"}
    return lower(scheme, *args, **options)


def _outcome(function):
    try:
        return "ok", function()
    except (TypeError, ValueError) as exc:
        return type(exc), str(exc)


def _check_maps(form: DistanceForm):
    call = form.call
    for term in (*form.query_terms, *form.key_terms, *form.biases, *form.values):
        rows = pair_rows(term.index, call)
        assert rows.shape == (call.t_q, call.t_k)
        entries = term.table.shape[-1 if isinstance(term, BiasTerm) else -2]
        assert np.all((rows >= -1) & (rows < entries))


def test_every_catalog_scheme_lowers():
    assert all(catalog.get(n).lower is not None for n in catalog.names(plain=True))


@pytest.mark.parametrize("scheme", catalog.names(plain=True))
@given(data=st.data())
def test_form_equals_the_specification(scheme, data):
    args, kwargs = data.draw(calls(scheme, dtypes=("float64", "float32", "float16")))
    want = _outcome(lambda: _spec(scheme, args, kwargs))
    form = _outcome(lambda: _lowered(scheme, args, kwargs))
    if want[0] != "ok":
        assert form == want  # the scheme's own checks, word for word
        return
    assert form[0] == "ok", form
    _check_maps(form[1])
    out, weights = form_attention(form[1], return_weights=True)
    dtype = str(want[1][0].dtype)
    for got, expected in zip((out, weights), want[1], strict=True):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64),
                                   **TOL[dtype])


def test_a_two_sided_map_reads_rows_by_distance():
    q = k = v = np.zeros((3, 2))
    form = lower("shaw", q, k, v, np.zeros((5, 2)), beyond="zero", q_offset=1)
    (term,) = form.query_terms
    # distances -3 .. 1: r = -3 is beyond K = 2 and has no row under "zero"
    assert term.index.low == -3
    np.testing.assert_array_equal(term.index.rows, [-1, 0, 1, 2, 3])
    np.testing.assert_array_equal(pair_rows(term.index, form.call),
                                  [[1, 2, 3], [0, 1, 2], [-1, 0, 1]])


def test_grid_maps_read_coordinates():
    x = np.zeros((4, 2))
    form = lower("grid2d", x, x, x, np.zeros((3, 2)), np.zeros((3, 2)), height=2, width=2)
    rows, cols = form.query_terms
    np.testing.assert_array_equal(pair_rows(rows.index, form.call)[0], [1, 1, 2, 2])
    np.testing.assert_array_equal(pair_rows(cols.index, form.call)[0], [1, 2, 1, 2])
    swin = lower("swin", x, x, x, np.arange(9.0), window_height=2, window_width=2)
    np.testing.assert_array_equal(pair_rows(swin.biases[0].index, swin.call),
                                  rp.schemes.swin.swin_index(2, 2, xp=np))


def test_plain_terms_are_refused_for_a_scheme():
    x = np.zeros((2, 2))
    with pytest.raises(TypeError, match="`bias` and `position` are arguments of plain"):
        lower("t5", x, x, x, np.zeros(4), bias=np.zeros((2, 2)))


def test_unknown_scheme_and_options_are_named():
    x = np.zeros((2, 2))
    with pytest.raises(ValueError, match="`scheme` must be one of"):
        lower("relative", x, x, x)
    with pytest.raises(TypeError, match="unknown parameter"):
        lower("t5", x, x, x, np.zeros(4), buckets=3)


def _typical_call(scheme, backend):
    """A call of every scheme with per-head tables, a mask and an offset, on `backend`."""
    entry = catalog.get(scheme)
    rng = np.random.default_rng(1)
    grid = scheme in ("grid2d", "swin", "swinv2")
    t_q, t_k = (6, 6) if grid else (5, 7)
    sizes = {"hidden": 5, "K": 2, "M": 6, "t_max": 9, "height": 2, "width": 3, "buckets": 8,
             "d_model": 4,
             "span": 3, "rows": 8}
    include = {t.switch: True for t in entry.tables if t.switch}  # every optional table
    shapes = entry.table_shapes(entry.sizes_from({"t_q": t_q, "t_k": t_k, **sizes}), d=4,
                                d_v=3, heads=2, include=include)
    q, k, v = (backend.asarray(rng.standard_normal((2, t, w)))
               for t, w in ((t_q, 4), (t_k, 4), (t_k, 3)))
    tables = {n: backend.asarray(rng.standard_normal(s)) for n, s in shapes.items()}
    kwargs = {"mask": backend.asarray(rng.random((t_q, t_k)) < 0.8)}
    if not grid:
        kwargs["q_offset"] = 2
    options = {"grid2d": {"height": 2, "width": 3}, "swin": {"window_height": 2,
                                                              "window_width": 3},
               "swinv2": {"window_height": 2, "window_width": 3, "mask_penalty": -7.0},
               "t5": {"max_distance": 10}}.get(scheme, {})
    return (q, k, v, *entry.table_args(tables)), {**kwargs, **options}


@pytest.mark.parametrize("scheme", catalog.names(plain=True))
def test_form_equals_the_specification_on_every_backend(scheme, backend):
    args, kwargs = _typical_call(scheme, backend)
    form = lower(scheme, *args, **kwargs)
    got = form_attention(form)
    want = _spec(scheme, args, kwargs)
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape)
    np.testing.assert_allclose(backend.to_numpy(got), backend.to_numpy(want), rtol=1e-10,
                               atol=1e-12)


def _docs_table():
    """The rows of the table on docs/lowering.md, by scheme."""
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "lowering.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and cells[0] in catalog.SCHEMES:
            rows[cells[0]] = cells
    return rows


@pytest.mark.parametrize("scheme", catalog.names(plain=True))
def test_the_docs_table_states_each_form(scheme):
    from relpos_ref import backends

    numpy = backends.get("numpy")

    class Numpy:
        asarray = staticmethod(lambda a, dtype=None: numpy.from_numpy(np.asarray(a)))

    args, kwargs = _typical_call(scheme, Numpy)
    if scheme == "plain":
        kwargs["bias"] = np.zeros((5, 7))
    form = lower(scheme, *args, **kwargs)
    _, q_prime, k_prime, query, key, bias, values, _ = _docs_table()[scheme]

    def count(cell):
        return 0 if cell == "—" else len(cell.split(", "))

    assert count(query) == len(form.query_terms)
    assert count(key) == len(form.key_terms)
    assert count(bias) == len(form.biases)
    assert count(values) == len(form.values)
    assert (q_prime != "q") == (form.q is not args[0])
    assert (k_prime != "k") == (form.k is not args[1])
