"""Numerics a user can rely on (issue 15, category 6).

- 16-bit inputs compute in float32 and return their dtype: no overflow where
  a float32 accumulation has none, for every scheme, NumPy and torch;
- NaN or inf in a masked-out key, or in a table row no pair reads, never
  reaches the output, and ``efficient`` equals ``definition`` for them, with
  the kernels and without;
- booleans must be booleans, integers must fit int64 distances, an index
  must be in range, a distance must be an integer;
- before NumPy allocates scores beyond the machine, the call says how much it
  needs and points to `blocked_attention`.

Each case asserts the exact error type and the name it reports, or the exact
correct result.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math

import numpy as np
import pytest

import relpos_ref as rp
from relpos_ref import catalog, golden, kernels
from relpos_ref.blocked import blocked_attention

SCHEMES = catalog.names(plain=True)
SIZES = {"K": 2, "M": 4, "t_max": 8, "height": 2, "width": 3, "buckets": 8, "d_model": 4,
         "rows": 6, "span": 3}


def _call(scheme, q, k, v, rng, *, dtype, make, **extra):
    """``<scheme>_attention`` on arrays made by `make` from NumPy, at golden-like sizes."""
    entry = catalog.get(scheme)
    shapes = entry.table_shapes(entry.sizes_from({"t_q": 6, "t_k": 6, **SIZES}), d=4, d_v=4,
                                heads=2)
    tables = [make(rng.standard_normal(shapes[t.name]).astype(dtype))
              for t in entry.tables if t.name in shapes]
    options = entry.options_from({**SIZES, "height": 2, "width": 3})
    if scheme == "t5":
        options["max_distance"] = 6
    function = rp.attention if scheme == "plain" else getattr(rp, f"{scheme}_attention")
    return function(q, k, v, *tables, **options, **extra)


# -- 16-bit -------------------------------------------------------------------------


def _sixteen_bit_targets():
    out = [pytest.param("numpy", "float16", id="numpy-float16")]
    if importlib.util.find_spec("torch") is not None:
        out += [pytest.param("torch", "float16", id="torch-float16"),
                pytest.param("torch", "bfloat16", id="torch-bfloat16")]
    return out


def _library(name, dtype):
    if name == "numpy":
        return (lambda a: a.astype(np.float16)), np.float16, (lambda x: np.asarray(x, float))
    import torch

    dt = getattr(torch, dtype)
    return (lambda a: torch.from_numpy(np.asarray(a, np.float32)).to(dt)), dt, \
        (lambda x: x.float().numpy().astype(float))


@pytest.mark.parametrize(("library", "dtype"), _sixteen_bit_targets())
@pytest.mark.parametrize("scheme", SCHEMES)
def test_sixteen_bit_inputs_do_not_overflow_and_keep_their_dtype(scheme, library, dtype):
    make, dt, back = _library(library, dtype)
    rng = np.random.default_rng(0)
    big = np.full((2, 6, 4), 255.0)  # q . k = 260100 > float16's 65504
    q = k = v = make(big)
    out = _call(scheme, q, k, v, rng, dtype=np.float32, make=make)
    assert out.dtype == dt
    assert np.all(np.isfinite(back(out)))
    # the same call made in float32 from the same (rounded) inputs, rounded once at the end
    wide = _library(library, "float32")[0] if library == "torch" else (lambda a: a.astype(
        np.float32))
    rng = np.random.default_rng(0)
    want = _call(scheme, wide(back(q)), wide(back(k)), wide(back(v)), rng, dtype=np.float32,
                 make=lambda a: wide(back(make(a))))
    np.testing.assert_array_equal(back(out), back(make(back(want))))


def test_the_reported_float16_case_is_exact():
    q = k = np.full((3, 4), 255.0, dtype=np.float16)
    out = rp.attention(q, k, k)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, np.full((3, 4), 255.0, dtype=np.float16))


# -- NaN and inf behind masks and in rows no pair reads ------------------------------


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "spec"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_non_finite_value_at_a_masked_key_never_reaches_the_output(scheme, bad, use_kernels):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 6, 4)) for _ in range(3))
    mask = np.ones((6, 6), dtype=bool)
    mask[:, 3] = False  # key 3 is masked for every query
    dirty = v.copy()
    dirty[:, 3] = bad
    clean = v.copy()
    clean[:, 3] = 0.0

    def run(values):
        with kernels.disabled() if not use_kernels else contextlib.nullcontext():
            return _call(scheme, q, k, values, np.random.default_rng(2), dtype=np.float64,
                         make=np.asarray, mask=mask)

    got, want = run(dirty), run(clean)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("scheme", ["plain", "shaw", "bias", "t5", "alibi", "rope"])
def test_a_non_finite_value_in_a_key_masked_for_one_query_only(scheme, bad):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 6, 4)) for _ in range(3))
    v[:, 5, 1] = bad
    # causal: key 5 is in the future of queries 0 .. 4 (masked there), allowed for query 5
    out = _call(scheme, q, k, v, rng, dtype=np.float64, make=np.asarray, causal=True)
    assert np.all(np.isfinite(out[:, :5]))
    if np.isnan(bad):
        assert np.all(np.isnan(out[:, 5, 1]))
    else:
        assert np.all(out[:, 5, 1] == np.inf)


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "spec"])
@pytest.mark.parametrize(("scheme", "table"), [
    ("shaw", 0), ("shaw", 1), ("music", 0), ("music", 1), ("general", 0),
])
def test_non_finite_rows_no_pair_reads_never_reach_the_output(scheme, table, use_kernels):
    # t_q = t_k = 3 reach distances -2 .. 2 only: the tables' outer rows are never read
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 3, 4)) for _ in range(3))
    tables = {
        "shaw": [rng.standard_normal((11, 4)), rng.standard_normal((11, 4))],  # K = 5
        "music": [rng.standard_normal((7, 4)), rng.standard_normal((7, 4))],  # M = 7
        "general": [rng.standard_normal((15, 4))],  # t_max = 8
    }[scheme]
    unread = {"shaw": [0, 1, 9, 10], "music": [0, 1, 2, 3], "general": [0, 1, 13, 14]}[scheme]
    dirty = [t.copy() for t in tables]
    dirty[table][unread] = np.nan
    function = getattr(rp, f"{scheme}_attention")
    with kernels.disabled() if not use_kernels else contextlib.nullcontext():
        got = function(q, k, v, *dirty)
        slow = function(q, k, v, *dirty, method="definition")
        want = function(q, k, v, *tables)
    assert np.all(np.isfinite(got)) and np.all(np.isfinite(slow))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(slow, want, rtol=1e-12)


@pytest.mark.parametrize("method", ["efficient", "definition"])
def test_shaw_value_rows_reached_only_through_masked_keys_contribute_nothing(method):
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((4, 4)) for _ in range(3))
    key_table, value_table = rng.standard_normal((2, 5, 4))  # K = 2
    mask = np.ones((4, 4), dtype=bool)
    mask[0, 2:] = False  # query 0 reaches rows 4 (r = 2, 3 clipped) only through these keys
    dirty = value_table.copy()
    dirty[4] = np.inf
    out = rp.shaw_attention(q, k, v, key_table, dirty, mask=mask, method=method)
    assert np.all(np.isfinite(out[0]))
    assert np.all(np.isinf(out[1]))  # query 1 reaches row 4 (r = 2) through key 3, allowed
    assert np.all(np.isfinite(out[2:]))  # queries 2 and 3 never reach r >= 2


def test_weighted_sum_follows_ieee_for_used_pairs_only():
    w = np.array([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    v = np.array([[1.0, np.inf], [2.0, -np.inf], [np.nan, 3.0]])
    used = np.array([[True, True, False], [True, False, False]])
    from relpos_ref.attention import weighted_sum

    out = weighted_sum(w, v, used=used)
    assert out[0, 0] == 1.5 and math.isnan(out[0, 1])  # inf - inf
    np.testing.assert_array_equal(out[1], [1.0, np.inf])
    zero_weight = np.array([[0.0, 1.0, 0.0]])
    out = weighted_sum(zero_weight, v, used=np.array([[True, True, False]]))
    assert math.isnan(out[0, 1])  # 0 * inf for a used pair, as IEEE says


def test_blocked_attention_keeps_masked_non_finite_values_out():
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 8, 4)) for _ in range(3))
    mask = np.ones((8, 8), dtype=bool)
    mask[:, 6] = False
    v[:, 6] = np.nan
    out = blocked_attention(q, k, v, mask=mask, block_size=3)
    clean = v.copy()
    clean[:, 6] = 0
    np.testing.assert_allclose(out, rp.attention(q, k, clean, mask=mask), rtol=1e-12)


# -- booleans, integers, indices, distances -------------------------------------------

Q = np.zeros((2, 3, 4))
BAD = [
    # (call, error type, text it reports)
    (lambda: rp.attention(Q, Q, Q, causal="no"), ValueError, "`causal` must be True or False"),
    (lambda: rp.attention(Q, Q, Q, causal=1), ValueError, "`causal` must be True or False"),
    (lambda: rp.attention(Q, Q, Q, return_weights="yes"), ValueError, "`return_weights`"),
    (lambda: rp.shaw_attention(Q, Q, Q, np.zeros((3, 4)), return_weights=0), ValueError,
     "`return_weights`"),
    (lambda: rp.t5_attention(Q, Q, Q, np.zeros(8), bidirectional="no", max_distance=6),
     ValueError, "`bidirectional` must be True or False"),
    (lambda: rp.t5_bucket(np.arange(3), bidirectional=1), ValueError, "`bidirectional`"),
    (lambda: rp.alibi_attention(Q, Q, Q, symmetric="no"), ValueError, "`symmetric`"),
    (lambda: rp.alibi_bias(np.ones(2), 2, 2, symmetric=None), ValueError, "`symmetric`"),
    (lambda: blocked_attention(Q, Q, Q, progress="yes"), ValueError, "`progress`"),
    (lambda: rp.allowed_keys(2, 2, causal="no", xp=np), ValueError, "`causal`"),
    (lambda: rp.attention(Q, Q, Q, q_offset=2**63 - 2), ValueError, "`q_offset` must be"),
    (lambda: rp.attention(Q, Q, Q, q_offset=-(2**62)), ValueError, "`q_offset` must be"),
    (lambda: rp.attention(Q, Q, Q, causal=True, q_offset=2**62), ValueError, "`q_offset`"),
    (lambda: rp.relative_positions(2, 2, q_offset=2**63 - 2, xp=np), ValueError,
     "`q_offset` must be"),
    (lambda: rp.shaw_index(2, 2, max_distance=2**64, xp=np), ValueError, "`max_distance`"),
    (lambda: rp.t5_bucket(np.arange(3), max_distance=2**70), ValueError, "`max_distance`"),
    (lambda: rp.deberta_bucket(np.arange(3), bucket_size=4, max_position=2**63), ValueError,
     "`max_position`"),
    (lambda: rp.rope_rotate(Q, offset=2**62), ValueError, "`offset`"),
    (lambda: rp.default_scale(-4), ValueError, "`d` must be >= 0"),
    (lambda: rp.default_scale(2.5), ValueError, "`d` must be an integer"),
    (lambda: rp.default_scale(True), ValueError, "`d` must be an integer"),
    (lambda: rp.default_scale(4, float("inf")), ValueError, "`scale` must be finite"),
    (lambda: rp.take_per_row(np.zeros((2, 3)), np.array([[-1, 0], [0, 0]])), ValueError,
     "`index` must lie in [0, 3)"),
    (lambda: rp.take_per_row(np.zeros((2, 3)), np.array([[0, 3], [0, 0]])), ValueError,
     "`index` must lie in [0, 3)"),
    (lambda: rp.take_per_row(np.zeros((2, 3)), np.zeros((2, 2))), TypeError,
     "`index` must have an integer dtype"),
    (lambda: rp.deberta_bucket(np.array([1.5, -2.0]), bucket_size=4, max_position=8), TypeError,
     "`r` must have an integer dtype"),
    (lambda: rp.t5_bucket(np.array([1.0])), TypeError, "`r` must have an integer dtype"),
    (lambda: rp.table_index(np.array([0.5]), 2), TypeError, "`r` must have an integer dtype"),
    (lambda: rp.deberta_rows(np.array([0.5]), span=2), TypeError, "`r` must have an integer"),
    (lambda: golden.Case.make("shaw", "x", masked=1), ValueError, "`masked` must be True or"),
    (lambda: golden.Case.make("shaw", "x", per_head="yes"), ValueError, "`per_head`"),
    (lambda: golden.Case.make("shaw", "x", values=0), ValueError, "`values`"),
    (lambda: golden.Case.make("shaw", "x", causal="no"), ValueError, "`causal` must be True"),
    (lambda: golden.Case.make("shaw", "x", q_offset=2**62), ValueError, "`q_offset`"),
]


@pytest.mark.parametrize(("call", "kind", "text"), BAD, ids=[f"bad{n}" for n in range(len(BAD))])
def test_bad_numbers_and_flags_are_refused_by_name(call, kind, text):
    with pytest.raises(kind) as info:
        call()
    assert text in str(info.value)


def test_the_memory_a_call_needs_is_said_before_it_is_allocated(monkeypatch):
    monkeypatch.setattr(kernels, "available_memory", lambda: 2**30)
    q = np.zeros((8, 8192, 4), dtype=np.float32)  # 2 GiB of float32 scores, twice
    for use_kernels in (True, False):
        with (kernels.disabled() if not use_kernels else contextlib.nullcontext(),
              pytest.raises(MemoryError, match=r"needs at least 4\.0 GiB .* 1\.0 GiB "
                                               r"available; relpos_ref\.blocked")):
            rp.attention(q, q, q)
    q = np.zeros((1, 512, 4), dtype=np.float32)
    assert rp.attention(q, q, q).shape == (1, 512, 4)  # 2 MiB is fine
