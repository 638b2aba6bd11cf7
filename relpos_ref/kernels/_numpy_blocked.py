"""NumPy's blocked kernels: `blocked_attention` as the scheme's NumPy kernel, a tile at a time.

The specification's blocked loop (`relpos_ref.blocked`) computes each
``(block, block)`` tile's terms, logits and online-softmax update as separate
array operations. Here each tile of queries (`relpos_ref.kernels._blocked_rows`)
is one call of the scheme's NumPy kernel (`relpos_ref.kernels.numpy.KERNELS`:
one GEMM for ``q k^T``, the scheme's term and softmax fused by row blocks)
against the keys that tile visits, with the call's resolved ``scale``,
``causal`` and ``q_offset`` moved to the tile (``q_offset + i0``: relative
positions depend on ``r = j - (i + q_offset)`` alone). Its rows are cut so
that a call's ``(rows, t_k)`` scores stay within ``4 block^2`` per head, to
no fewer than 128 rows (`relpos_ref.kernels._blocked_rows.rows_per_call`).

Every scheme whose ``*_attention`` takes ``q_offset`` has one (grid2d and
Swin place queries on a 2-D grid: the specification's loop runs). A call
goes to the specification where the scheme's kernel does (it returns
``NotImplemented``), for arrays that are not all ``numpy.ndarray``, for an
empty grid, and for any non-finite value (the specification's rules for
them hold tile by tile); a tile whose logits could overflow hands the whole
call back (the scheme's kernel refuses it, `relpos_ref.kernels._overflow`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .. import catalog
from ..blocked import mask_tile
from ..calls import computes_in_float32
from ._blocked_rows import (
    blocked_arguments,
    blocked_rows,
    check_blocked_arguments,
)
from ._numpy_blocks import kernel_arrays

__all__ = ["blocked_kernels"]


def blocked_kernels(forward: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """Scheme name -> its blocked kernel, for every scheme of `forward` that takes ``q_offset``.

    Examples
    --------
    >>> from relpos_ref.kernels.numpy import KERNELS
    >>> sorted(set(KERNELS) - set(blocked_kernels(KERNELS)))
    ['grid2d', 'swin']
    """
    return {name: _blocked_kernel(name, kernel, forward.get("plain"))
            for name, kernel in forward.items()
            if "q_offset" in inspect.signature(catalog.get(name).attention).parameters}


def _blocked_kernel(name: str, forward: Callable[..., Any],
                    plain: Callable[..., Any] | None = None) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        arguments = blocked_arguments(args, kwargs, scheme=name)
        if arguments is None:
            return NotImplemented  # the specification says what is wrong
        given, arrays = arguments
        if not kernel_arrays(*arrays):
            return NotImplemented
        checked = check_blocked_arguments(given)
        call = checked.call
        q, k, v, mask = given["q"], given["k"], given["v"], given["mask"]
        tables, params = given["tables"], given["params"]
        if 0 in (call.t_q, call.t_k, q.shape[-1]) or not all(
                bool(np.isfinite(a).all()) for a in arrays if a.dtype.kind == "f"):
            return NotImplemented

        tile_kernel = forward
        if checked.entry.rotate is not None and plain is not None:
            # RoPE: q and k rotated once, for the whole call (its length and scale: a
            # tile's own would differ), then plain attention tile by tile
            q, k = checked.entry.rotate(q, k, q_offset=call.q_offset, options=checked.options)
            tile_kernel, tables, params = plain, (), {}

        def attend(i0: int, i1: int, j1: int) -> Any:
            return tile_kernel(q[..., i0:i1, :], k[..., :j1, :], v[..., :j1, :], *tables,
                               scale=call.scale, mask=mask_tile(mask, i0, i1, 0, j1),
                               causal=call.causal, q_offset=call.q_offset + i0, **params)

        return blocked_rows(checked, q, v, name=name, lean=False, attend=attend)

    kernel.__name__ = kernel.__qualname__ = f"{name}_blocked_attention_numpy"
    kernel.__doc__ = (f"`blocked_attention(..., scheme={name!r})` by the scheme's NumPy kernel, "
                      "a tile of queries at a time (see the module docstring).")
    return computes_in_float32(kernel)
