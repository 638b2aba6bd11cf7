"""NumPy, through ``array_api_compat.numpy``."""

from __future__ import annotations

from typing import Any

from ._base import Backend


class NumpyBackend(Backend):
    name = "numpy"
    module = "numpy"

    def namespace(self) -> Any:
        import array_api_compat.numpy as xp

        return xp

    def from_numpy(self, a: Any, device: str | None = None) -> Any:
        import numpy as np

        self.check_device(device)
        return np.array(a, copy=True)

    def to_numpy(self, x: Any) -> Any:
        import numpy as np

        return np.asarray(x)
