"""The backend registry and each adapter's round trip."""

from __future__ import annotations

import subprocess
import sys

import array_api_compat
import numpy as np
import pytest

from relpos_ref import _xp, backends


def test_round_trip_keeps_values_dtype_and_device(backend):
    for dtype in ("float32", "float64", "int64", "bool"):
        a = (np.arange(6).reshape(2, 3) % 2).astype(dtype)
        x = backend.asarray(a)
        assert array_api_compat.array_namespace(x) is not None
        assert array_api_compat.device(x) == backend.native_device()
        back = backend.to_numpy(backend.adapter.synchronize(x))
        assert back.dtype == a.dtype
        np.testing.assert_array_equal(back, a)


def test_index_dtype_is_the_namespace_default(backend, xp):
    idx = _xp.index_dtype(xp, backend.native_device())
    assert xp.isdtype(idx, "integral")
    assert xp.arange(3, dtype=idx).dtype == idx


def test_selection_by_environment(monkeypatch):
    monkeypatch.setenv(backends.ENV_VAR, "numpy, torch")
    assert [b.name for b in backends.selected()] == ["numpy", "torch"]
    monkeypatch.setenv(backends.ENV_VAR, "")
    assert [b.name for b in backends.selected()] == backends.names()
    assert backends.names() == ["numpy", "array_api_strict", "torch", "jax", "cupy", "dask"]


def test_unknown_backend_lists_the_known_ones(monkeypatch):
    monkeypatch.setenv(backends.ENV_VAR, "numpy,tensorflow")
    with pytest.raises(ValueError, match=r"unknown backend 'tensorflow'; known backends: numpy, "):
        backends.selected()
    with pytest.raises(ValueError, match="known backends: numpy, array_api_strict, torch, jax"):
        backends.get("mxnet")


def test_unknown_device_is_named():
    with pytest.raises(ValueError, match=r"`device` must be one of \['cpu'\].*got 'tpu:3'"):
        backends.get("numpy").from_numpy(np.zeros(2), device="tpu:3")


def test_cupy_reports_why_it_cannot_run():
    cupy = backends.get("cupy")
    reason = cupy.unavailable_reason()
    assert reason is None or "cupy" in reason
    assert cupy.is_available() == (reason is None)


def test_importing_the_registry_imports_no_array_library():
    code = (
        "import sys; from relpos_ref import backends; backends.available();"
        "heavy = {'torch', 'jax', 'cupy', 'dask', 'array_api_strict'} & set(sys.modules);"
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # cupy is imported only when installed, to ask for a GPU.
    assert out.stdout.strip() in ("[]", "['cupy']")


def test_jax_refuses_silent_narrowing():
    jax_backend = backends.get("jax")
    if not jax_backend.is_available():
        pytest.skip(jax_backend.unavailable_reason())
    import jax

    enabled = jax.config.jax_enable_x64
    try:
        jax.config.update("jax_enable_x64", False)
        with pytest.raises(TypeError, match="silently narrowed"):
            jax_backend.from_numpy(np.zeros(2))
    finally:
        jax.config.update("jax_enable_x64", enabled)
