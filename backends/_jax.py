"""JAX on its available platforms (the CPU here)."""

from __future__ import annotations

from typing import Any

from ._base import Backend


class JaxBackend(Backend):
    name = "jax"
    module = "jax"

    def namespace(self) -> Any:
        import jax.numpy as jnp

        return jnp

    def devices(self) -> list[str]:
        import jax

        found = jax.devices()
        if jax.default_backend() != "cpu":
            found = [*found, *jax.devices("cpu")]
        return [f"{d.platform}:{d.id}" for d in found]

    def _device(self, device: str | None) -> Any:
        import jax

        platform, _, index = self.check_device(device).partition(":")
        return next(d for d in jax.devices(platform) if d.id == int(index))

    def from_numpy(self, a: Any, device: str | None = None) -> Any:
        import jax

        if jax.dtypes.canonicalize_dtype(a.dtype) != a.dtype:
            msg = (
                f"JAX runs with 32-bit types only, so a {a.dtype} array would be "
                "silently narrowed; enable them with "
                "jax.config.update('jax_enable_x64', True)"
            )
            raise TypeError(msg)
        return jax.device_put(a, self._device(device))

    def to_numpy(self, x: Any) -> Any:
        import numpy as np

        return np.array(x, copy=True)

    def synchronize(self, value: Any = None) -> Any:
        import jax

        if value is None:
            jax.effects_barrier()
            return None
        return jax.block_until_ready(value)
