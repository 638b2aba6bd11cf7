"""Dask arrays (lazy, chunked NumPy), through ``array_api_compat.dask.array``."""

from __future__ import annotations

import importlib.util
from typing import Any

from ._base import Backend


class DaskBackend(Backend):
    name = "dask"
    module = "dask"

    def unavailable_reason(self) -> str | None:
        missing = super().unavailable_reason()
        if missing is not None:
            return missing
        # dask.array needs extra packages; look for them without importing dask.
        if importlib.util.find_spec("toolz") is None:
            return "dask is installed without its array extra (pip install 'dask[array]')"
        return None

    def namespace(self) -> Any:
        import array_api_compat.dask.array as xp

        return xp

    def from_numpy(self, a: Any, device: str | None = None) -> Any:
        import dask.array as da

        self.check_device(device)
        return da.from_array(a.copy())

    def to_numpy(self, x: Any) -> Any:
        import numpy as np

        return np.asarray(x.compute())

    def synchronize(self, value: Any = None) -> Any:
        return None if value is None else value.persist()
