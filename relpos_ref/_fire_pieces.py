r"""FIRE's MLP as the piecewise-linear function it is, for the lowering (`relpos_ref._lowerings`).

One hidden layer of ReLUs on a scalar input is linear between its ``m``
breakpoints ``z_n = -b_{1n} / w_{1n}``:

.. math:: f_h(x) = A_{hk}\, x + B_{hk}, \qquad
          A_{hk} = \sum_{n \in S_k} w^{(h)}_{2n} w_{1n}, \quad
          B_{hk} = b^{(h)}_2 + \sum_{n \in S_k} w^{(h)}_{2n} b_{1n}

with ``S_k`` the units live on the ``k``-th interval and ``k`` found by a
binary search of the sorted breakpoints: a rising unit (``w_{1n} > 0``) is
live where ``z_n < x``, a falling one where ``z_n > x``, each strictly (at its
breakpoint a unit is 0 and passes no gradient, as the specification's). The specification
(`relpos_ref.schemes._fire_mlp`) evaluates the ``m`` hidden units of every
pair; this evaluates two coefficients, so the lowering's dense bias costs
``O(t_q t_k log m)`` instead of ``O(t_q t_k m)``. ``f`` is continuous (a
unit is 0 at its breakpoint); the sums by rank differ from the unit sums by
rounding only (tests/test_fire.py and tests/test_lowering.py prove it).
"""

from __future__ import annotations

from typing import Any

from . import _xp
from .schemes._fire_mlp import _tables, mlp_output

__all__ = ["mlp_by_pieces"]


def _prefix(xp: Any, x: Any) -> Any:
    # [0, x_0, x_0 + x_1, ...]: the sums of the first k entries, k = 0 .. n
    return xp.concat([xp.zeros((1,), dtype=x.dtype, device=_xp.device(x)),
                      xp.cumulative_sum(x)])


def _one_head(xp: Any, flat: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
    # f(x) for one head: the rising units (w1 > 0) live where z < x, the falling ones where
    # z > x, strictly (at its breakpoint a unit is 0 and passes no gradient, as the
    # specification's pre > 0 has it); sums over the live ones by rank, from prefix sums
    dev = _xp.device(w1)
    zero = xp.zeros((), dtype=w1.dtype, device=dev)
    one = zero + 1.0
    inf = xp.asarray(float("inf"), dtype=w1.dtype, device=dev)
    rise, fall = w1 > zero, w1 < zero
    moving = rise | fall
    z = xp.where(moving, -b1 / xp.where(moving, w1, one), zero)
    slope, intercept = w2 * w1, w2 * b1
    z_rise = xp.where(rise, z, inf)  # rising by breakpoint, the others after
    order = xp.argsort(z_rise)
    z_rise = xp.take(z_rise, order)
    a_rise = _prefix(xp, xp.take(xp.where(rise, slope, zero), order))
    b_rise = _prefix(xp, xp.take(xp.where(rise, intercept, zero), order))
    z_fall = xp.where(fall, z, -inf)  # the others first, then falling ones
    order = xp.argsort(z_fall)
    z_fall = xp.take(z_fall, order)
    a_fall = _prefix(xp, xp.take(xp.where(fall, slope, zero), order))
    b_fall = _prefix(xp, xp.take(xp.where(fall, intercept, zero), order))
    flat_units = (~moving) & (b1 > zero)  # slope 0: a constant where b1 > 0
    constant = xp.sum(xp.where(flat_units, intercept, zero)) + b2
    below = xp.searchsorted(z_rise, flat, side="left")  # rising units with z < x
    upto = xp.searchsorted(z_fall, flat, side="right")  # the others and falling, z <= x
    a = xp.take(a_rise, below) + (a_fall[-1] - xp.take(a_fall, upto))
    b = xp.take(b_rise, below) + (b_fall[-1] - xp.take(b_fall, upto))
    return a * flat + (b + constant)


def mlp_by_pieces(x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
    """FIRE's MLP output ``(H, t_q, t_k)`` at the inputs `x` ``(t_q, t_k)``, by its pieces.

    Tables that are not all finite are evaluated unit by unit
    (`relpos_ref.schemes._fire_mlp.mlp_output`): a NaN weight makes the bias NaN,
    as the specification's.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> x = xp.reshape(xp.arange(6.0), (2, 3)) / 4  # f(x) = relu(x - 1/2)
    >>> mlp_by_pieces(x, xp.ones((1, 1)), xp.asarray([-0.5]), xp.ones((1, 1)), None)
    Array([[[0.  , 0.  , 0.  ],
            [0.25, 0.5 , 0.75]]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(x, w1)
    tables = [t for t in (w1, b1, w2, b2) if t is not None]
    if not all(bool(xp.all(xp.isfinite(t))) for t in tables):
        return mlp_output(x, w1, b1, w2, b2)
    tw1, tb1, tw2, tb2 = _tables(w1, b1, w2, b2)
    heads = max(tw1.shape[0], tb1.shape[0], tw2.shape[0], tb2.shape[0])
    m = tw1.shape[-1]
    tw1, tb1, tw2 = (xp.broadcast_to(t, (heads, m)) for t in (tw1, tb1, tw2))
    tb2 = xp.broadcast_to(tb2, (heads,))
    flat = xp.reshape(x, (-1,))
    out = [_one_head(xp, flat, tw1[h, :], tb1[h, :], tw2[h, :], tb2[h]) for h in range(heads)]
    return xp.reshape(xp.stack(out), (heads, *x.shape))
