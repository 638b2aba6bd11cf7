"""array-api-strict: the standard and nothing more, with a pinned version.

Two profiles: ``"pinned"`` (the pinned API version with its default
extensions) and ``"strictest"`` (no optional extensions and no
data-dependent output shapes). The core must pass on both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ._base import Backend

#: The oldest standard version the core is written against.
API_VERSION = "2023.12"

PROFILES: dict[str, dict[str, Any]] = {
    "pinned": {"api_version": API_VERSION},
    "strictest": {
        "api_version": API_VERSION,
        "boolean_indexing": False,
        "data_dependent_shapes": False,
        "enabled_extensions": (),
    },
}


class StrictBackend(Backend):
    name = "array_api_strict"
    module = "array_api_strict"

    def namespace(self) -> Any:
        import array_api_strict

        return array_api_strict

    def _device(self, device: str | None) -> Any:
        xp = self.namespace()
        name = self.check_device(device)
        return next(d for d in xp.__array_namespace_info__().devices() if _name(d) == name)

    def devices(self) -> list[str]:
        xp = self.namespace()
        return [_name(d) for d in xp.__array_namespace_info__().devices()]

    def from_numpy(self, a: Any, device: str | None = None) -> Any:
        xp = self.namespace()
        return xp.asarray(a, copy=True, device=self._device(device))

    def to_numpy(self, x: Any) -> Any:
        import numpy as np

        cpu = self._device(None)
        if x.device != cpu:  # "device1", say, refuses NumPy as a GPU's memory does
            x = x.to_device(cpu)
        return np.from_dlpack(x).copy()

    @contextlib.contextmanager
    def profile(self, name: str) -> Iterator[None]:
        """Set the flags of profile `name` for the duration of a ``with`` block."""
        import array_api_strict

        if name not in PROFILES:
            msg = f"`name` must be one of {sorted(PROFILES)}, got {name!r}"
            raise ValueError(msg)
        previous = array_api_strict.get_array_api_strict_flags()
        array_api_strict.set_array_api_strict_flags(**PROFILES[name])
        try:
            yield
        finally:
            array_api_strict.reset_array_api_strict_flags()
            array_api_strict.set_array_api_strict_flags(**previous)


def _name(device: Any) -> str:
    # array_api_strict.Device('CPU_DEVICE') -> "CPU_DEVICE"
    return str(device).split("'")[1] if "'" in str(device) else str(device)
