"""CuPy on CUDA devices; unavailable (with the reason) where there is none."""

from __future__ import annotations

from typing import Any

from ._base import Backend


class CupyBackend(Backend):
    name = "cupy"
    module = "cupy"

    def unavailable_reason(self) -> str | None:
        missing = super().unavailable_reason()
        if missing is not None:
            return missing
        try:
            import cupy

            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # no driver, no runtime, no device
            return f"cupy is installed but no CUDA device is usable: {exc}"
        if count == 0:
            return "cupy is installed but no CUDA device was found"
        return None

    def namespace(self) -> Any:
        import array_api_compat.cupy as xp

        return xp

    def devices(self) -> list[str]:
        import cupy

        return [f"cuda:{i}" for i in range(cupy.cuda.runtime.getDeviceCount())]

    def from_numpy(self, a: Any, device: str | None = None) -> Any:
        import cupy

        index = int(self.check_device(device).split(":")[1])
        with cupy.cuda.Device(index):
            return cupy.array(a, copy=True)

    def to_numpy(self, x: Any) -> Any:
        import cupy

        return cupy.asnumpy(x)

    def synchronize(self, value: Any = None) -> Any:
        import cupy

        cupy.cuda.get_current_stream().synchronize()
        cupy.cuda.Device().synchronize()
        return value
