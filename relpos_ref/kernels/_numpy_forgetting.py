r"""The forgetting bias's (FoX's) NumPy kernels: its forward and its VJP by blocks of rows.

Neither holds a ``(h, t_q, t_k)`` bias: each block of query rows gets its
bias from the gates' cumulative sum :math:`F` as the specification makes it
(`relpos_ref.schemes.forgetting`: :math:`b_{ij} = F_{p_i} - F_j` on the causal
region, in float64, rounded once to the call's dtype; `bias_rows`, one
subtraction into the call's dtype per block: 54 -> 7 ms for 8 heads and
1024 rows against `forgetting._bias_wide`). The
forward is `relpos_ref.kernels.numpy`'s softmax with that bias added block by
block (`add_bias_rows`); the VJP is plain attention's backward pass
(`relpos_ref.kernels._numpy_vjp.backward`) with it, and since the bias
reaches ``f`` only through the row sums and the column sums of its cotangent
:math:`\bar b` (the logits'), the blocks add those up in float64 and
`forgetting_f_gradient_from_sums` carries them to ``f``. What the VJP
covers, and hands back, is what `relpos_ref.kernels._numpy_vjps` says of
every kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..calls import Call
from ..gradients import check_d_output
from ..schemes import forgetting
from ._numpy_blocks import AddRows
from ._numpy_vjp import Block, Term, at, backward
from ._numpy_vjp_common import _covered, _grads, _ndarrays, _register

__all__ = ["ForgettingBias", "add_bias_rows", "bias_rows"]


def bias_rows(big_f: np.ndarray, q_offset: int, a: int, rows: int, width: int,
              dtype: Any) -> np.ndarray:
    """The bias of query rows ``a ..`` (``rows`` of them) at keys ``0 .. width - 1``.

    ``(..., rows, width)``, from `big_f` ``(..., n)`` (`forgetting_cumsum`,
    ``n >= 1``): :math:`F_{p_i} - F_j` computed in `big_f`'s dtype and rounded
    once to `dtype`, the specification's `forgetting_bias` on the causal
    region ``j <= p_i``. The other entries, which the causal mask drops, are
    :math:`F_{p_i} - F_j` too (the specification's 0 would cost a pass), and a
    query before position 0 reads :math:`F_0`.

    Examples
    --------
    >>> big_f = forgetting.forgetting_cumsum(np.zeros(3))  # gates 1/2
    >>> bias_rows(big_f, 0, 1, 2, 2, np.float64) / np.log(0.5)  # rows 1, 2, keys 0, 1
    array([[ 1., -0.],
           [ 2.,  1.]])
    """
    n = big_f.shape[-1]
    at_query = np.clip(np.arange(a, a + rows) + q_offset, 0, n - 1)
    out = np.empty((*big_f.shape[:-1], rows, width), dtype=dtype)
    np.subtract(big_f[..., at_query, None], big_f[..., None, :width], out=out, casting="unsafe")
    return out


def add_bias_rows(big_f: np.ndarray, q_offset: int, dtype: Any) -> AddRows:
    """`softmax_in_place`'s ``add_bias``: each block's rows of the forgetting bias."""

    def add(live: np.ndarray, a: int) -> None:
        live += bias_rows(big_f, q_offset, a, live.shape[-2], live.shape[-1], dtype)

    return add


class ForgettingBias(Term):
    """The forgetting bias of each block, made from ``F`` ``(..., n)``; its cotangent's sums.

    Attributes
    ----------
    row_sums, col_sums : float64 arrays ``(..., t_q)``, ``(..., t_k)``
        The bias cotangent's sums along the keys and along the queries, after
        `backward`.
    """

    def __init__(self, big_f: np.ndarray, call: Call, dtype: Any) -> None:
        self.big_f, self.call, self.dtype = big_f, call, dtype
        self.batch = big_f.shape[:-1]
        self.row_sums = np.zeros((*self.batch, call.t_q), dtype=np.float64)
        self.col_sums = np.zeros((*self.batch, call.t_k), dtype=np.float64)
        self.now: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def select(self, group: tuple[int, ...]) -> None:
        self.now = (at(self.big_f, group, 1), at(self.row_sums, group, 1),
                    at(self.col_sums, group, 1))

    def bias(self, block: Block, scores: np.ndarray) -> None:
        scores += bias_rows(self.now[0], self.call.q_offset, block.a, block.b - block.a,
                            block.width, self.dtype)

    def d_logits(self, block: Block, d_logits: np.ndarray) -> None:
        _, rows, cols = self.now
        rows[block.a:block.b] += d_logits.sum(axis=-1, dtype=np.float64)
        cols[:block.width] += d_logits.sum(axis=-2, dtype=np.float64)


@_register("forgetting")
def forgetting_attention_vjp(q, k, v, f, /, *, d_output, scale=None, mask=None, causal=None,
                             q_offset=None):
    if not _ndarrays(q, k, v, f, d_output, mask):
        return NotImplemented
    call = forgetting.forgetting_call(q, k, v, f, scale=scale, mask=mask, causal=causal,
                                      q_offset=q_offset)
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    if not _covered("forgetting", q, call, mask, k, v, d_output, f=f) or not np.isfinite(f).all():
        return NotImplemented  # a closed (-inf) or NaN gate: the specification reads each range
    term = ForgettingBias(forgetting.forgetting_cumsum(f), call, q.dtype)
    core = backward(q, k, v, d_output, call, mask=mask, term=term)
    d_f = forgetting.forgetting_f_gradient_from_sums(f, term.row_sums, term.col_sums, call.q_offset)
    return _grads(q, k, v, core, f=d_f)
