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
        import torch

        return torch.asarray(a, device=self.check_device(device), copy=True)

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
