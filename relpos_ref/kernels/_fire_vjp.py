r"""FIRE's MLP backward pass by its pieces: the parts the NumPy and torch VJP kernels share.

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
(`relpos_ref.schemes.fire`). Each kernel walks the pairs its own way, a
block of rows at a time (`relpos_ref.kernels._numpy_vjp_fire`,
`relpos_ref.kernels._torch_fire.mlp_vjp_by_blocks`); here are the sums by
segment and what the units and tables get from them.
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from ..gradients import sum_to_shape
from ..schemes._fire_mlp import _tables

__all__ = ["SUM_CHUNK", "sums_by_segment", "tables_from_unit_gradients", "unit_gradients"]

#: Pairs summed by segment in the call's dtype (torch) before the sum goes on in float64.
SUM_CHUNK = 65536


def sums_by_segment(xp: Any, segment: Any, weights: Any, n_seg: int) -> Any:
    """``(H, n_seg)``, float64 where the device has it: per head, the sum of `weights`
    ``(H, N)`` over the pairs of each segment (`segment` ``(N,)``).

    NumPy: one ``bincount`` per head (float64 sums). torch: an ``index_add_``
    of each pair's ``H`` weights (a row of the chunk's transpose) in the
    weights' dtype over each chunk of `SUM_CHUNK` pairs, the chunks' sums
    added in float64 (8 heads of 1M float32 pairs, one thread: 15 ms,
    against 26 for a ``scatter_add_`` along the pairs and 34 for bincounts).
    No other library calls it.

    Examples
    --------
    >>> import numpy as np
    >>> sums_by_segment(np, np.asarray([0, 2, 0]), np.asarray([[1.0, 2.0, 3.0]]), 3)
    array([[4., 0., 2.]])
    """
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
