r"""FIRE's NumPy VJP kernel: the MLP's backward pass by its pieces, beside `_numpy_vjps`.

The bias is the lowering's (`relpos_ref._fire_pieces`: per pair, the segment
``s`` of its input ``x`` among every unit's breakpoint, and each head's
``A[h, s] x + B[h, s]``); plain attention's backward pass with that dense bias
(`relpos_ref.kernels._numpy_vjp.backward`) gives its cotangent :math:`\bar b`
``(H, t_q, t_k)``. Then, with no ``(H, t_q, t_k, m)`` hidden layer (the
specification's, a block of rows at a time):

.. math:: \bar x_p = \sum_h \bar b_{hp} A_{h s_p}, \qquad
          \bar A_{hs} = \sum_{p: s_p = s} \bar b_{hp} x_p, \qquad
          \bar B_{hs} = \sum_{p: s_p = s} \bar b_{hp}

(sums by segment: one ``bincount`` per head), a unit's slope ``w2 w1`` and
intercept ``w2 b1`` get the sums of :math:`\bar A` and :math:`\bar B` over
the segments where it is live (after its own for a rising unit, before it
for a falling one, every one for a unit of slope 0 with ``b1 > 0``: a
cumulative sum read at its own segment), and ``c`` and ``L`` get theirs from
:math:`\bar x` as the specification's (`relpos_ref.schemes.fire`). What it
covers, and hands back, is what `relpos_ref.kernels._numpy_vjps` says of
every kernel, and an input ``x`` that is not finite (``c`` or ``L`` out of
range).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._fire_pieces import _segments, live_sums, mlp_by_pieces, units
from ..gradients import check_d_output
from ..schemes import fire
from ..schemes._fire_mlp import _check_mlp, _tables
from ._numpy_vjp import backward, sum_to
from ._numpy_vjp_common import _covered, _FullTerms, _grads, _ndarrays, _register

__all__ = ["mlp_vjp_by_pieces"]


def _live_sums(found: Any, d_coefficient: np.ndarray) -> np.ndarray:
    # (H, n): for each unit, the sum of d_coefficient (H, 2n + 1) over the segments where the
    # unit is live
    before = np.concatenate([np.zeros_like(d_coefficient[:, :1]),
                             np.cumsum(d_coefficient, axis=1)], axis=1)  # sum over s < j
    total = before[:, -1:]
    after = total - before[:, found.own + 1]  # s > own
    out = np.where(found.rise, after, 0.0) + np.where(found.fall, before[:, found.own], 0.0)
    return out + np.where(found.flat, total, 0.0)


def mlp_vjp_by_pieces(x: np.ndarray, d_out: np.ndarray, w1: np.ndarray, b1: np.ndarray,
                      w2: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The MLP's VJP at `x` ``(t_q, t_k)`` for `d_out` ``(H, t_q, t_k)``, by segments.

    `w1`, `b1` ``(H', m)`` (``H'`` 1 or ``H``), `w2` ``(H, m)``, finite. Returns
    ``(d_x, d_w1, d_b1, d_w2)``: ``d_x`` ``(t_q, t_k)``, ``d_w1`` and ``d_b1``
    ``(H', m)``, ``d_w2`` ``(H, m)``; equal to
    `relpos_ref.schemes._fire_mlp.mlp_vjp` summed to those shapes, up to
    rounding.

    Examples
    --------
    >>> x = np.asarray([[0.0, 1.0]])  # f(x) = relu(x - 1/2): slope 1 past 1/2
    >>> d_x, d_w1, d_b1, d_w2 = mlp_vjp_by_pieces(x, np.ones((1, 1, 2)), np.ones((1, 1)),
    ...                                           np.asarray([[-0.5]]), np.ones((1, 1)))
    >>> d_x, d_w2  # the unit is live at x = 1 only, where relu(1 - 1/2) = 1/2
    (array([[0., 1.]]), array([[0.5]]))
    """
    heads, hidden, m = w2.shape[0], w1.shape[0], w1.shape[1]
    found = units(w1, b1, w2)
    flat = x.reshape(-1)
    segment = _segments(np, found.u, flat)
    n_seg = found.segments.shape[0]
    zero = np.zeros((), dtype=x.dtype)
    d_flat = d_out.reshape(heads, -1)
    a = live_sums(found, found.slope)  # each pair's slope A, as the forward reads it
    d_x = np.einsum("hp,hp->p", d_flat, a[:, segment]).reshape(x.shape)
    d_a = np.stack([np.bincount(segment, weights=d_flat[h] * flat, minlength=n_seg)
                    for h in range(heads)]).astype(x.dtype)
    d_b = np.stack([np.bincount(segment, weights=d_flat[h], minlength=n_seg)
                    for h in range(heads)]).astype(x.dtype)
    d_slope = _live_sums(found, d_a).reshape(heads, hidden, m)
    d_intercept = _live_sums(found, d_b).reshape(heads, hidden, m)
    linked = np.eye(heads, dtype=x.dtype)[:, :, None] if hidden > 1 else zero + 1.0
    d_w2 = ((d_slope * w1[None] + d_intercept * b1[None]) * linked).sum(axis=1)
    d_w1 = (d_slope * w2[:, None, :] * linked).sum(axis=0)
    d_b1 = (d_intercept * w2[:, None, :] * linked).sum(axis=0)
    return d_x, d_w1, d_b1, d_w2


@_register("fire")
def fire_attention_vjp(
    q, k, v, w1, b1, w2, /, *, d_output, b2=None, c=0.1, L=512.0, eps=fire.EPS, scale=None,
    mask=None, causal=None, q_offset=None,
):
    if not _ndarrays(q, k, v, w1, b1, w2, b2, d_output, mask,
                     *(x for x in (c, L) if hasattr(x, "shape"))):
        return NotImplemented
    call = fire.fire_call(q, k, v, w1, b1, w2, b2=b2, c=c, L=L, eps=eps, scale=scale,
                          mask=mask, causal=causal, q_offset=q_offset)
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    tables = {"w1": w1, "b1": b1, "w2": w2, **({} if b2 is None else {"b2": b2})}
    if not _covered("fire", q, call, mask, k, v, d_output, **tables):
        return NotImplemented
    heads = _check_mlp(w1, b1, w2, b2)
    wide = fire._wide(np, q.dtype, None, call.t_q, call.t_k, call.q_offset)
    parts = fire._parts(np, call.t_q, call.t_k, c, L, float(eps), call.q_offset, wide, None)
    x = parts["x"].astype(q.dtype)
    if not np.isfinite(x).all():
        return NotImplemented  # c or L out of range: the specification's NaNs
    bias = mlp_by_pieces(x, w1, b1, w2, b2)  # (H, t_q, t_k)
    term = _FullTerms(None, bias if heads is not None else bias[0], call.scale)
    core = backward(q, k, v, d_output, call, mask=mask, term=term)
    d_bias = term.gradients(call.scale)["bias"]
    d_out = d_bias if heads is not None else d_bias[None]
    tw1, tb1, tw2, _ = _tables(w1, b1, w2, b2)
    hidden = max(tw1.shape[0], tb1.shape[0])
    d_x, d_w1, d_b1, d_w2 = mlp_vjp_by_pieces(
        x, d_out, *(np.broadcast_to(t, (hidden, tw1.shape[1])) for t in (tw1, tb1)),
        np.broadcast_to(tw2, (d_out.shape[0], tw2.shape[1])))
    d_c, d_l = fire._parameter_gradients(np, parts, d_x.astype(wide), c, L)
    more = {"w1": sum_to(d_w1, tw1.shape).reshape(w1.shape),
            "b1": sum_to(d_b1, tb1.shape).reshape(b1.shape),
            "w2": sum_to(d_w2, tw2.shape).reshape(w2.shape)}
    if b2 is not None:  # softmax takes a row's constant away: exactly 0
        more["b2"] = np.zeros(b2.shape, dtype=b2.dtype)
    more["c"] = fire._like(np, d_c, c, q.dtype)
    more["L"] = fire._like(np, d_l, L, q.dtype)
    return _grads(q, k, v, core, **more)
