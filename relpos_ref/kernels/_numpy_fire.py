r"""FIRE's NumPy forward: its bias added a block of query rows at a time, no ``(H, t_q, t_k)``.

FIRE's input is a row of distances over a column of normalisers
(`relpos_ref._fire_pieces.input_factors`): ``x[i, j] = logs[j - i + t_q - 1]
/ norms[i]``. The queries at positions up to ``|L|`` share one normaliser,
so their bias is a function of the distance: one row of ``t_q + t_k - 1``
values per head, added to a block's logits through a read-only Toeplitz view
(`relpos_ref.kernels._numpy_blocks.distance_view`). The other rows get
theirs per block: ``x`` from the view of the logs divided by each row's
normaliser (the specification's input, bit for bit), its segment among the
MLP's breakpoints and each head's ``A x + B`` (`relpos_ref._fire_pieces`).
The softmax is the NumPy kernels' own, which reaches only the keys a block's
causal rows may see, and masks after the bias is added.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._fire_pieces import call_options, input_factors, pieces, segments
from ..calls import Call
from ..schemes import fire
from ._numpy_blocks import AddRows, distance_view

__all__ = ["add_fire_rows"]


def add_fire_rows(named: dict[str, Any], call: Call, dtype: Any) -> AddRows | None:
    """`softmax_in_place`'s ``add_bias``: each block's rows of FIRE's bias, or ``None``.

    `named` holds the tables ``w1``, ``b1``, ``w2`` (finite, in `dtype`) and
    the options ``b2``, ``c``, ``L``, ``eps`` where given; ``t_q, t_k >= 1``.
    ``None`` where the MLP's input is not finite (the specification's).

    Examples
    --------
    >>> from relpos_ref.calls import resolve_call
    >>> w1, b1, w2 = np.ones((2, 1)), np.asarray([0.0, -0.5]), np.asarray([[1.0, -2.0]])
    >>> x = np.zeros((4, 2))
    >>> call = resolve_call(x, x, x, scale=None, mask=None, causal=False, q_offset=0)
    >>> add = add_fire_rows({"w1": w1, "b1": b1, "w2": w2, "L": 2.0}, call, np.float64)
    >>> rows = np.zeros((1, 3, 4))
    >>> add(rows, 1)  # queries 1, 2 (normalised by psi(2)) and 3 (its own)
    >>> np.array_equal(rows, fire.fire_bias(w1, b1, w2, 4, 4, L=2.0)[:, 1:, :])
    True
    """
    t_q, t_k = call.t_q, call.t_k
    c, big_l, eps = call_options(named)
    found = input_factors(t_q, t_k, c=c, L=big_l, eps=eps, q_offset=call.q_offset, xp=np,
                          dtype=dtype, device=None)
    if found is None:
        return None
    bounds, columns = pieces(named["w1"], named["b1"], named["w2"], named.get("b2"))
    heads = columns.shape[0] // 2
    one = fire._check_mlp(named["w1"], named["b1"], named["w2"], named.get("b2")) is None

    def evaluate(x: np.ndarray) -> np.ndarray:
        # (H, *x.shape), or x.shape for one MLP output shared by every head
        picked = np.take(columns, segments(np, bounds, x), axis=1)
        out = picked[:heads] * x
        out += picked[heads:]
        return out[0] if one else out

    shared = None
    if found.shared:
        shared = distance_view(evaluate((found.logs / found.norms[0]).astype(dtype)), t_q, t_k)
    logs = distance_view(found.logs, t_q, t_k)

    def add(live: np.ndarray, a: int) -> None:
        rows, width = live.shape[-2:]
        by_distance = min(max(found.shared - a, 0), rows)  # rows a .. a + by_distance - 1
        if by_distance:
            live[..., :by_distance, :] += shared[..., a:a + by_distance, :width]
        if by_distance < rows:
            i0, i1 = a + by_distance, a + rows
            x = (logs[i0:i1, :width] / found.norms[i0:i1, None]).astype(dtype)
            live[..., by_distance:, :] += evaluate(x)

    return add
