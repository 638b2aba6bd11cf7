"""The adapter interface every backend implements."""

from __future__ import annotations

import importlib.util
from typing import Any

__all__ = ["Backend"]


class Backend:
    """One array library as the tests, the benchmarks and the CLI see it.

    Subclasses set `name` (the public name, used in ``RELPOS_BACKENDS``) and
    `module` (the import name whose presence is checked without importing
    it), and implement the library-specific methods. Nothing here imports
    the library until a method that needs it is called.
    """

    name: str = ""
    module: str = ""

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run here, or ``None`` if it can.

        The default checks only that the library is installed, without
        importing it.
        """
        if importlib.util.find_spec(self.module) is None:
            return f"{self.module} is not installed (pip install 'relpos-ref[{self.name}]')"
        return None

    def is_available(self) -> bool:
        """Whether the library is installed and usable here."""
        return self.unavailable_reason() is None

    def namespace(self) -> Any:
        """The array API namespace (an ``array_api_compat`` wrapper where needed)."""
        raise NotImplementedError

    def devices(self) -> list[str]:
        """Names of the devices this backend can place arrays on, default first."""
        return ["cpu"]

    def from_numpy(self, a: Any, device: str | None = None) -> Any:
        """Copy NumPy array `a` into this library, on `device` (default first)."""
        raise NotImplementedError

    def to_numpy(self, x: Any) -> Any:
        """Copy array `x` of this library back to a NumPy array on the host."""
        raise NotImplementedError

    def synchronize(self, value: Any = None) -> Any:
        """Wait until `value` (and queued device work) is computed; return it.

        For timing: asynchronous libraries (CUDA streams, JAX dispatch, dask
        graphs) would otherwise be timed while work is still pending.
        """
        return value

    def check_device(self, device: str | None) -> str:
        """`device`, or the default device; a `ValueError` for an unknown one."""
        known = self.devices()
        if device is None:
            return known[0]
        if device not in known:
            msg = f"`device` must be one of {known} for backend {self.name!r}, got {device!r}"
            raise ValueError(msg)
        return device

    def __repr__(self) -> str:
        return f"<relpos_ref backend {self.name!r}>"
