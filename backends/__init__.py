"""Backend adapters and their registry, installed as ``relpos_ref.backends``.

Each adapter says whether its library can run here (without importing
libraries that are not needed), gives its array API namespace and devices,
moves NumPy arrays in (`Backend.from_numpy`) and out (`Backend.to_numpy`),
and synchronizes for timing.

The environment variable ``RELPOS_BACKENDS`` (comma separated, e.g.
``numpy,torch``) selects a subset for the tests, the benchmarks and the CLI.

Examples
--------
>>> from relpos_ref import backends
>>> b = backends.get("numpy")
>>> b.to_numpy(b.from_numpy([1.0, 2.0]) * 2)
array([2., 4.])
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ._base import Backend
from ._cupy import CupyBackend
from ._dask import DaskBackend
from ._jax import JaxBackend
from ._numpy import NumpyBackend
from ._strict import StrictBackend
from ._torch import TorchBackend

__all__ = ["ENV_VAR", "REGISTRY", "Backend", "available", "get", "names", "selected"]

ENV_VAR = "RELPOS_BACKENDS"

REGISTRY: Mapping[str, Backend] = {
    b.name: b
    for b in (
        NumpyBackend(),
        StrictBackend(),
        TorchBackend(),
        JaxBackend(),
        CupyBackend(),
        DaskBackend(),
    )
}


def names() -> list[str]:
    """Names of every known backend, in registry order."""
    return list(REGISTRY)


def get(name: str) -> Backend:
    """The adapter called `name`; a `ValueError` listing the known names otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        msg = f"unknown backend {name!r}; known backends: {', '.join(REGISTRY)}"
        raise ValueError(msg) from None


def selected(spec: str | None = None) -> list[Backend]:
    """Backends chosen by `spec` or ``$RELPOS_BACKENDS`` (all when unset or empty).

    Parameters
    ----------
    spec : str, optional
        Comma-separated names, e.g. ``"numpy,torch"``. Defaults to the
        environment variable ``RELPOS_BACKENDS``.

    Raises
    ------
    ValueError
        For an unknown name; the message lists the known ones.
    """
    if spec is None:
        spec = os.environ.get(ENV_VAR, "")
    chosen = [s.strip() for s in spec.split(",") if s.strip()]
    if not chosen:
        return list(REGISTRY.values())
    return [get(name) for name in dict.fromkeys(chosen)]


def available(spec: str | None = None) -> list[Backend]:
    """The selected backends that can run on this machine."""
    return [b for b in selected(spec) if b.is_available()]
