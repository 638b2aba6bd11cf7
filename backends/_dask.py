"""Dask arrays (lazy, chunked NumPy), through ``array_api_compat.dask.array``."""

from __future__ import annotations

from typing import Any

from ._base import Backend


class DaskBackend(Backend):
    name = "dask"
    module = "dask"

    def unavailable_reason(self) -> str | None:
        import importlib.util

        missing = super().unavailable_reason()
        if missing is None and importlib.util.find_spec("dask.array") is None:
            return "dask is installed without dask.array (pip install 'dask[array]')"
        return missing

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
