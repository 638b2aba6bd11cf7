r"""FIRE's MLP backward pass by its pieces, for the NumPy and torch VJP kernels.

The bias is the lowering's (`relpos_ref._fire_pieces`: per pair, the segment
``s`` of its input ``x`` among every unit's breakpoint, and each head's
``A[h, s] x + B[h, s]``). Given its cotangent :math:`\bar b` ``(H, t_q, t_k)``
(from plain attention's backward pass with that bias), with no
``(H, t_q, t_k, m)`` hidden layer (the specification's, a block of rows at a
time):

.. math:: \bar x_p = \sum_h \bar b_{hp} A_{h s_p}, \qquad
          \bar A_{hs} = \sum_{p: s_p = s} \bar b_{hp} x_p, \qquad
          \bar B_{hs} = \sum_{p: s_p = s} \bar b_{hp}

(sums by segment, accumulated in float64 where the device has it), a unit's
slope ``w2 w1`` and intercept ``w2 b1`` get the sums of :math:`\bar A` and
:math:`\bar B` over the segments where it is live (after its own for a rising
unit, before it for a falling one, every one for a unit of slope 0 with
``b1 > 0``: a cumulative sum read at its own segment), and ``c`` and ``L``
get theirs from :math:`\bar x` as the specification's
(`relpos_ref.schemes.fire`).
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._fire_pieces import broadcast_tables, live_sums, segments, units
from ..gradients import sum_to_shape
from ..schemes import _fire_inputs
from ..schemes._fire_mlp import _tables

__all__ = ["ROW_PAIRS", "SUM_CHUNK", "mlp_vjp_by_pieces", "table_gradients",
           "tables_from_unit_gradients", "unit_gradients"]

#: Pairs summed by segment in the call's dtype (torch) before the sum goes on in float64.
SUM_CHUNK = 65536

#: Pairs of a chunk of rows whose (H, pairs) temporaries `mlp_vjp_by_pieces` holds at once.
ROW_PAIRS = 65536


def _sums_by_segment(xp: Any, segment: Any, weights: Any, n_seg: int) -> Any:
    # (H, n_seg) in float64 where it can: per head, the sum of weights (H, N) over the pairs
    # of each segment (N,). NumPy: one bincount per head (float64 sums). torch: an index_add
    # of each pair's H weights (a row of the chunk's transpose) in the weights' dtype over
    # each chunk of SUM_CHUNK pairs, the chunks' sums added in float64 (8 heads of 1M float32
    # pairs, one thread: 15 ms, against 26 for a scatter_add along the pairs and 34 for
    # bincounts). No other library calls it.
    if _xp.library_name(weights) == "torch":
        import torch

        wide = xp.float64 if _xp.has_float64(xp, _xp.device(weights)) else weights.dtype
        out = torch.zeros((n_seg, weights.shape[0]), dtype=wide, device=weights.device)
        part = torch.empty((n_seg, weights.shape[0]), dtype=weights.dtype,
                           device=weights.device)
        index = segment.to(torch.int64)
        for start in range(0, index.shape[0], SUM_CHUNK):
            part.zero_().index_add_(0, index[start:start + SUM_CHUNK],
                                    weights[:, start:start + SUM_CHUNK].mT)
            out += part
        return out.mT
    import numpy as np

    return np.stack([np.bincount(segment, weights=w, minlength=n_seg) for w in weights])


def _live_sums(xp: Any, found: Any, d_coefficient: Any) -> Any:
    # (H, n): for each unit, the sum of d_coefficient (H, 2n + 1) over the segments where the
    # unit is live
    zero = xp.zeros_like(d_coefficient[:, :1])
    before = xp.concat([zero, xp.cumulative_sum(d_coefficient, axis=1)], axis=1)  # s < j
    total = before[:, -1:]
    after = total - xp.take(before, found.own + 1, axis=1)  # s > own
    out = (xp.where(found.rise, after, zero) + xp.where(found.fall, xp.take(before, found.own,
                                                                           axis=1), zero))
    return out + xp.where(found.flat, total, zero)


def unit_gradients(found: Any, d_a: Any, d_b: Any, w1: Any, b1: Any, w2: Any
                   ) -> tuple[Any, Any, Any]:
    r"""``(d_w1, d_b1, d_w2)`` from the sums by segment of the slopes' and intercepts' cotangents.

    `found` is `relpos_ref._fire_pieces.units` of `w1`, `b1` ``(H', m)`` and
    `w2` ``(H, m)``; `d_a`, `d_b` ``(H, 2n + 1)``: per head and segment, the
    sum of :math:`\bar b x` and of :math:`\bar b` over its pairs. A unit's
    slope :math:`w_2 w_1` and intercept :math:`w_2 b_1` get :math:`\bar A` and
    :math:`\bar B` summed over the segments where it is live, so
    :math:`\bar w_1 = w_2 \sum \bar A`, :math:`\bar b_1 = w_2 \sum \bar B` and
    :math:`\bar w_2 = w_1 \sum \bar A + b_1 \sum \bar B`.

    Examples
    --------
    >>> import numpy as np
    >>> from relpos_ref._fire_pieces import units
    >>> w1, b1, w2 = np.ones((1, 1)), np.asarray([[-0.5]]), np.ones((1, 1))  # relu(x - 1/2)
    >>> d = np.asarray([[0.0, 0.0, 1.0]])  # one pair at x = 1, in the segment past 1/2
    >>> unit_gradients(units(w1, b1, w2), d, d, w1, b1, w2)
    (array([[1.]]), array([[1.]]), array([[0.5]]))
    """
    xp = _xp.array_namespace(d_a, w1)
    heads, hidden, m = w2.shape[0], w1.shape[0], w1.shape[1]
    d_slope = xp.reshape(_live_sums(xp, found, d_a), (heads, hidden, m))
    d_intercept = xp.reshape(_live_sums(xp, found, d_b), (heads, hidden, m))
    one = xp.ones((), dtype=d_a.dtype, device=_xp.device(d_a))
    linked = (xp.eye(heads, dtype=d_a.dtype, device=_xp.device(d_a))[:, :, None]
              if hidden > 1 else one)
    d_w2 = xp.sum((d_slope * w1[None, ...] + d_intercept * b1[None, ...]) * linked, axis=1)
    d_w1 = xp.sum(d_slope * w2[:, None, :] * linked, axis=0)
    d_b1 = xp.sum(d_intercept * w2[:, None, :] * linked, axis=0)
    return d_w1, d_b1, d_w2


def mlp_vjp_by_pieces(x: Any, d_out: Any, w1: Any, b1: Any, w2: Any
                      ) -> tuple[Any, Any, Any, Any]:
    """The MLP's VJP at `x` ``(t_q, t_k)`` for `d_out` ``(H, t_q, t_k)``, by segments.

    `w1`, `b1` ``(H', m)`` (``H'`` 1 or ``H``), `w2` ``(H, m)``, finite; NumPy
    or torch arrays. Returns ``(d_x, d_w1, d_b1, d_w2)``: ``d_x``
    ``(t_q, t_k)``, ``d_w1`` and ``d_b1`` ``(H', m)``, ``d_w2`` ``(H, m)``;
    equal to `relpos_ref.schemes._fire_mlp.mlp_vjp` summed to those shapes,
    up to rounding.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.asarray([[0.0, 1.0]])  # f(x) = relu(x - 1/2): slope 1 past 1/2
    >>> d_x, d_w1, d_b1, d_w2 = mlp_vjp_by_pieces(x, np.ones((1, 1, 2)), np.ones((1, 1)),
    ...                                           np.asarray([[-0.5]]), np.ones((1, 1)))
    >>> d_x, d_w2  # the unit is live at x = 1 only, where relu(1 - 1/2) = 1/2
    (array([[0., 1.]]), array([[0.5]]))
    """
    xp = _xp.array_namespace(x, d_out, w1)
    heads = w2.shape[0]
    found = units(w1, b1, w2)
    n_seg = found.segments.shape[0]
    a = live_sums(found, found.slope)  # each pair's slope A, as the forward reads it
    d_a = d_b = 0.0
    d_x = []
    # a chunk of rows at a time: (H, pairs) temporaries of ROW_PAIRS pairs, not of the grid
    # (one chunk, empty, where x has no row)
    step = max(1, ROW_PAIRS // max(1, x.shape[-1]))
    for start in range(0, max(1, x.shape[0]), step):
        flat = xp.reshape(x[start:start + step, ...], (-1,))
        segment = segments(xp, found.u, flat)
        d_flat = xp.reshape(d_out[:, start:start + step, ...], (heads, -1))
        d_x.append(xp.reshape(xp.sum(d_flat * xp.take(a, segment, axis=1), axis=0),
                              (-1, x.shape[-1])))
        sums = (_sums_by_segment(xp, segment, d_flat * flat, n_seg),
                _sums_by_segment(xp, segment, d_flat, n_seg))
        d_a, d_b = d_a + sums[0], d_b + sums[1]
    return (xp.concat(d_x, axis=0),
            *unit_gradients(found, xp.astype(d_a, x.dtype), xp.astype(d_b, x.dtype), w1, b1,
                            w2))


def tables_from_unit_gradients(d_w1: Any, d_b1: Any, d_w2: Any, tables: dict[str, Any]
                               ) -> dict[str, Any]:
    """``w1``, ``b1``, ``w2`` (and ``b2``: zeros) gradients in their tables' shapes.

    `d_w1`, `d_b1` ``(H', m)`` and `d_w2` ``(H, m)`` are of the broadcast tables
    (`relpos_ref._fire_pieces.broadcast_tables`); summed back to each table's
    shape. ``b2``'s is 0: softmax takes a row's constant away.

    Examples
    --------
    >>> import numpy as np
    >>> tables = {"w1": np.ones((1, 1)), "b1": np.zeros(1), "w2": np.ones((1, 1)),
    ...           "b2": np.zeros(1)}
    >>> out = tables_from_unit_gradients(np.ones((1, 1)), np.ones((1, 1)), np.ones((1, 1)) / 2,
    ...                                  tables)
    >>> {name: g.shape for name, g in out.items()}
    {'w1': (1, 1), 'b1': (1,), 'w2': (1, 1), 'b2': (1,)}
    """
    xp = _xp.array_namespace(d_w1)
    w1, b1, w2, b2 = (tables.get(n) for n in ("w1", "b1", "w2", "b2"))
    tw1, tb1, tw2, _ = _tables(w1, b1, w2, b2)
    out = {"w1": xp.reshape(sum_to_shape(d_w1, tw1.shape), w1.shape),
           "b1": xp.reshape(sum_to_shape(d_b1, tb1.shape), b1.shape),
           "w2": xp.reshape(sum_to_shape(d_w2, tw2.shape), w2.shape)}
    if b2 is not None:
        out["b2"] = xp.zeros(b2.shape, dtype=b2.dtype, device=_xp.device(b2))
    return out


def table_gradients(x: Any, d_bias: Any, tables: dict[str, Any], parts: dict[str, Any],
                    c: Any, L: Any, dtype: Any, *, keys_reversed: bool = False
                    ) -> dict[str, Any]:
    """The gradients of FIRE's tables, ``c`` and ``L`` from the bias's cotangent `d_bias`.

    `x` ``(t_q, t_k)`` is the MLP's input in the call's `dtype`, `d_bias` the
    cotangent of the bias as `relpos_ref.schemes.fire.fire_bias` shapes it
    (``(H, t_q, t_k)`` where a table has a head axis, else ``(t_q, t_k)``),
    `tables` ``w1``, ``b1``, ``w2`` and ``b2`` when given (finite), `parts` the
    specification's pieces of ``x`` in its wide dtype (`_fire_inputs._parts`). Returns
    ``w1``, ``b1``, ``w2``, ``b2`` (when given: zeros; softmax takes a row's
    constant away), ``c`` and ``L``, each of its argument's shape and dtype.
    With `keys_reversed`, `x` and `d_bias` hold key ``t_k - 1 - j`` in column
    ``j`` (sums over pairs do not depend on their order; `parts` stay in
    order).

    Examples
    --------
    >>> import numpy as np
    >>> from relpos_ref.schemes import _fire_inputs
    >>> parts = _fire_inputs._parts(np, 1, 2, 1.0, 1.0, 0.0, 1, np.float64, None)
    >>> x = parts["x"]  # keys at distances 1 and 0: log 2 / log 2, 0
    >>> tables = {"w1": np.ones((1, 1)), "b1": np.zeros(1), "w2": np.ones((1, 1))}
    >>> g = table_gradients(x, np.ones((1, 2)), tables, parts, 1.0, 1.0, np.float64)
    >>> g["w2"], g["b1"]  # relu(x) at x = 1: live; at x = 0: its breakpoint, no gradient
    (array([[1.]]), array([1.]))
    """
    xp = _xp.array_namespace(x, d_bias)
    d_out = d_bias if d_bias.ndim == 3 else d_bias[None, ...]
    w1, b1, w2, _ = broadcast_tables(*(tables.get(n) for n in ("w1", "b1", "w2", "b2")))
    d_x, d_w1, d_b1, d_w2 = mlp_vjp_by_pieces(x, d_out, w1, b1, w2)
    if keys_reversed:
        d_x = xp.flip(d_x, axis=-1)
    d_c, d_l = _fire_inputs._parameter_gradients(xp, parts, xp.astype(d_x, parts["x"].dtype), c, L)
    out = tables_from_unit_gradients(d_w1, d_b1, d_w2, tables)
    out["c"] = _fire_inputs._like(xp, d_c, c, dtype)
    out["L"] = _fire_inputs._like(xp, d_l, L, dtype)
    return out
