r"""FIRE's MLP as the piecewise-linear function it is, for the lowering (`relpos_ref._lowerings`).

One hidden layer of ReLUs on a scalar input is linear between its ``m``
breakpoints ``z_n = -b_{1n} / w_{1n}``:

.. math:: f_h(x) = A_{hk}\, x + B_{hk}, \qquad
          A_{hk} = \sum_{n \in S_k} w^{(h)}_{2n} w_{1n}, \quad
          B_{hk} = b^{(h)}_2 + \sum_{n \in S_k} w^{(h)}_{2n} b_{1n}

with ``S_k`` the units live on the ``k``-th interval and ``k`` found by a
binary search of the sorted breakpoints. The specification
(`relpos_ref.schemes._fire_mlp`) evaluates the ``m`` hidden units of every
pair; this evaluates two coefficients, so the lowering's dense bias costs
``O(t_q t_k log m)`` instead of ``O(t_q t_k m)``. ``f`` is continuous (a
unit is 0 at its breakpoint), so a pair exactly at a breakpoint reads
either side's line; the two differ from the unit sums by rounding only
(tests/test_lowering.py proves the lowered calls equal to the specification).
"""

from __future__ import annotations

from typing import Any

from . import _xp
from .schemes._fire_mlp import _tables

__all__ = ["mlp_by_pieces"]


def _pieces(w1: Any, b1: Any, w2: Any, b2: Any) -> tuple[Any, Any, Any]:
    # per head: the sorted breakpoints (H, m) and each interval's A, B (H, m + 1)
    xp = _xp.array_namespace(w1)
    dev = _xp.device(w1)
    w1, b1, w2, b2 = _tables(w1, b1, w2, b2)
    heads = max(w1.shape[0], b1.shape[0], w2.shape[0], b2.shape[0])
    m = w1.shape[-1]
    w1, b1, w2 = (xp.broadcast_to(t, (heads, m)) for t in (w1, b1, w2))
    b2 = xp.broadcast_to(b2, (heads,))
    moving = w1 != 0
    one = xp.ones((), dtype=w1.dtype, device=dev)
    z = xp.where(moving, -b1 / xp.where(moving, w1, one), xp.zeros_like(w1))
    z_sorted = xp.sort(z, axis=-1)
    # a point inside each interval: before the first breakpoint, between two, after the last
    inner = (z_sorted[:, :-1] + z_sorted[:, 1:]) / 2
    points = xp.concat([z_sorted[:, :1] - 1, inner, z_sorted[:, -1:] + 1], axis=-1)  # (H, m+1)
    live = (w1[:, None, :] * points[:, :, None] + b1[:, None, :]) > 0  # (H, m + 1, m)
    zero = xp.zeros((), dtype=w1.dtype, device=dev)
    slope = xp.sum(xp.where(live, (w2 * w1)[:, None, :], zero), axis=-1)
    intercept = xp.sum(xp.where(live, (w2 * b1)[:, None, :], zero), axis=-1) + b2[:, None]
    return z_sorted, slope, intercept


def mlp_by_pieces(x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
    """FIRE's MLP output ``(H, t_q, t_k)`` at the inputs `x` ``(t_q, t_k)``, by its pieces.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> x = xp.reshape(xp.arange(6.0), (2, 3)) / 4  # f(x) = relu(x - 1/2)
    >>> mlp_by_pieces(x, xp.ones((1, 1)), xp.asarray([-0.5]), xp.ones((1, 1)), None)
    Array([[[0.  , 0.  , 0.  ],
            [0.25, 0.5 , 0.75]]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(x, w1)
    z, slope, intercept = _pieces(w1, b1, w2, b2)
    flat = xp.reshape(x, (-1,))
    out = []
    for h in range(z.shape[0]):
        k = xp.searchsorted(z[h, :], flat, side="right")  # breakpoints at or below x
        out.append(xp.take(slope[h, :], k) * flat + xp.take(intercept[h, :], k))
    return xp.reshape(xp.stack(out), (z.shape[0], *x.shape))
