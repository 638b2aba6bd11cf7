r"""FIRE's NumPy VJP kernel: plain attention's backward pass with its bias, a block at a time.

No ``(H, t_q, t_k)`` array: each block of query rows gets FIRE's input ``x``
from the row of the distances' logs over each row's normaliser
(`relpos_ref._fire_pieces.input_factors`, the forward's), its segment among
the MLP's breakpoints, and each head's bias ``A x + B`` (`FireBias`, a
`relpos_ref.kernels._numpy_vjp.Term`). From each head's block of the bias's
cotangent :math:`\bar b` it keeps, by segment, the sums of :math:`\bar b x`
and :math:`\bar b` (one ``bincount`` each, in float64), and the input's
cotangent :math:`\bar x = \sum_h \bar b_h A_h`, whose sums along each row
against :math:`\partial A / \partial c` and against :math:`A` carry it to
``c`` and ``L`` (`relpos_ref.schemes._fire_inputs._gradients_from_row_sums`).
`relpos_ref.kernels._fire_vjp` takes the sums by segment to the tables. What
it covers, and hands back, is what `relpos_ref.kernels._numpy_vjps` says of
every kernel, and an input ``x`` that is not finite (``c`` or ``L`` out of
range).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._fire_pieces import broadcast_tables, input_factors, pieces, segments, units
from ..calls import Call
from ..gradients import check_d_output
from ..schemes import _fire_inputs, fire
from ._fire_vjp import tables_from_unit_gradients, unit_gradients
from ._numpy_blocks import distance_view
from ._numpy_vjp import Block, Term, backward
from ._numpy_vjp_common import _covered, _grads, _ndarrays, _register

__all__ = ["FireBias"]


class FireBias(Term):
    r"""FIRE's bias of each block, and what its cotangent's gradients need, kept as sums.

    Attributes
    ----------
    d_a, d_b : float64 arrays ``(H, 2n + 1)``
        Per head and segment, the sums of :math:`\bar b x` and :math:`\bar b`.
    by_da, by_a : float64 arrays ``(t_q,)``
        Per row, :math:`\sum_j \bar x_{ij} \partial A_{ij} / \partial c` and
        :math:`\sum_j \bar x_{ij} A_{ij}`.
    """

    def __init__(self, factors: Any, tables: dict[str, Any], call: Call, c: Any,
                 dtype: Any) -> None:
        self.factors, self.dtype = factors, dtype
        t_q, t_k = call.t_q, call.t_k
        self.bounds, columns = pieces(tables["w1"], tables["b1"], tables["w2"], tables.get("b2"))
        self.heads = columns.shape[0] // 2
        self.slopes, self.intercepts = columns[:self.heads], columns[self.heads:]
        one = fire._check_mlp(tables["w1"], tables["b1"], tables["w2"], tables.get("b2"))
        self.batch = () if one is None else (one,)
        n_seg = columns.shape[1]
        self.d_a = np.zeros((self.heads, n_seg))
        self.d_b = np.zeros((self.heads, n_seg))
        self.by_da, self.by_a = np.zeros(t_q), np.zeros(t_q)
        rows = factors.rows
        self.logs = distance_view(factors.logs, t_q, t_k)
        da = _fire_inputs._distance_derivative(np, factors.distances, rows["u"], c)
        self.da = distance_view(da, t_q, t_k)
        self.head = 0
        self.rows_now: tuple[int, int, int] | None = None
        self.slope_now: np.ndarray | None = None

    def select(self, group: tuple[int, ...]) -> None:
        self.head = group[-1] if self.heads > 1 else 0

    def _inputs(self, block: Block) -> None:
        # the block's x, segments and (zeroed) input cotangent, once per block of rows
        key = (block.a, block.b, block.width)
        if self.rows_now != key:
            a, b, width = key
            x = self.logs[a:b, :width] / self.factors.norms[a:b, None]
            self.x = x.astype(self.dtype)
            self.segment = segments(np, self.bounds, self.x)
            self.d_x = np.zeros(self.x.shape, dtype=self.dtype)
            self.rows_now = key

    def bias(self, block: Block, scores: np.ndarray) -> None:
        self._inputs(block)
        self.slope_now = np.take(self.slopes[self.head], self.segment)
        scores += self.slope_now * self.x
        scores += np.take(self.intercepts[self.head], self.segment)

    def d_logits(self, block: Block, d_logits: np.ndarray) -> None:
        flat = self.segment.reshape(-1)
        n_seg = self.d_a.shape[1]
        self.d_a[self.head] += np.bincount(flat, weights=(d_logits * self.x).reshape(-1),
                                           minlength=n_seg)
        self.d_b[self.head] += np.bincount(flat, weights=d_logits.reshape(-1), minlength=n_seg)
        self.d_x += d_logits * self.slope_now

    def finish(self, a: int, b: int, width: int) -> None:
        if self.rows_now == (a, b, width):
            self.by_da[a:b] += np.sum(self.d_x * self.da[a:b, :width], axis=1)
            self.by_a[a:b] += np.sum(self.d_x * self.logs[a:b, :width], axis=1)
        self.rows_now = None


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
    factors = input_factors(call.t_q, call.t_k, c=c, L=L, eps=float(eps),
                            q_offset=call.q_offset, xp=np, dtype=q.dtype, device=None)
    if factors is None:
        return NotImplemented  # c or L out of range: the specification's NaNs
    term = FireBias(factors, tables, call, c, q.dtype)
    core = backward(q, k, v, d_output, call, mask=mask, term=term)
    bw1, bb1, bw2, _ = broadcast_tables(w1, b1, w2, b2)
    found = units(bw1, bb1, bw2)
    d_w1, d_b1, d_w2 = unit_gradients(found, term.d_a.astype(q.dtype),
                                      term.d_b.astype(q.dtype), bw1, bb1, bw2)
    more = tables_from_unit_gradients(d_w1, d_b1, d_w2, tables)
    d_c, d_l = _fire_inputs._gradients_from_row_sums(np, factors.rows, term.by_da, term.by_a, c, L)
    more["c"] = _fire_inputs._like(np, d_c, c, q.dtype)
    more["L"] = _fire_inputs._like(np, d_l, L, q.dtype)
    return _grads(q, k, v, core, **more)
