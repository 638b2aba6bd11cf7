"""PyTorch on the CPU and, where present, CUDA devices."""

from __future__ import annotations

from typing import Any

from ._base import Backend


class TorchBackend(Backend):
    name = "torch"
    module = "torch"

    def namespace(self) -> Any:
        import array_api_compat.torch as xp

        return xp

    def devices(self) -> list[str]:
        import torch

        cuda = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        return ["cpu", *cuda]

    def from_numpy(self, a: Any, device: str | None = None) -> Any:
        import numpy as np
        import torch

        device = self.check_device(device)
        a = np.asarray(a)
        if a.dtype.name == "bfloat16":  # ml_dtypes' bfloat16: NumPy knows it, torch does not
            bits = torch.from_numpy(np.ascontiguousarray(a).view(np.int16).copy())
            return bits.view(torch.bfloat16).to(device)
        return torch.asarray(a, device=device, copy=True)

    def to_numpy(self, x: Any) -> Any:
        import torch

        x = x.detach().to("cpu")
        if x.dtype == torch.bfloat16:
            import ml_dtypes

            return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return x.numpy().copy()

    def synchronize(self, value: Any = None) -> Any:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return value
