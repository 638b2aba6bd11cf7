"""The namespace helpers: mixed libraries, non-arrays, dtype checks."""

from __future__ import annotations

import numpy as np
import pytest

from relpos_ref import _xp
from relpos_ref._validate import as_float, broadcast_shapes, nonnegative_int


def test_namespace_skips_none(backend, xp):
    a = backend.asarray(np.zeros(2))
    assert _xp.array_namespace(a, None) is _xp.array_namespace(a)


def test_mixed_libraries_name_both():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"different libraries \(numpy, torch\)"):
        _xp.array_namespace(np.zeros(2), torch.zeros(2))


def test_non_arrays_are_refused():
    with pytest.raises(TypeError, match="expected an array, got an object of type 'list'"):
        _xp.array_namespace([1.0, 2.0])
    with pytest.raises(TypeError, match="at least one array"):
        _xp.array_namespace(None)


def test_mixed_dtypes_are_named(xp):
    with pytest.raises(TypeError, match=r"`a` is \S*float32, `b` is \S*float64"):
        _xp.check_same_dtype(a=xp.zeros(1, dtype=xp.float32), b=xp.zeros(1, dtype=xp.float64))


def test_validators():
    assert nonnegative_int("n", np.int64(3)) == 3
    with pytest.raises(ValueError, match="`n` must be >= 0, got -1"):
        nonnegative_int("n", -1)
    with pytest.raises(ValueError, match="`s` must be finite, got nan"):
        as_float("s", float("nan"))
    assert broadcast_shapes(a=(2, 1, 3), b=(4, 1)) == (2, 4, 3)
    with pytest.raises(ValueError, match=r"shapes do not broadcast: `a` \(2,\), `b` \(3,\)"):
        broadcast_shapes(a=(2,), b=(3,))


def test_a_dtype_the_namespace_does_not_know_is_refused_by_name():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    import relpos_ref as rp

    q = np.ones((2, 4), dtype=ml_dtypes.bfloat16)
    with pytest.raises(TypeError, match=r"^`q` has dtype bfloat16, which this array library"):
        rp.attention(q, q, q)
    with pytest.raises(TypeError, match=r"^`q` has dtype bfloat16"):
        rp.shaw_attention_vjp(q, q, q, np.ones((3, 4), dtype=ml_dtypes.bfloat16), d_output=q)
