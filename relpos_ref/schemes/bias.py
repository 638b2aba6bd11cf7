r"""A learned scalar per distance, added to the logits after scaling.

.. math:: \text{logits}_{ij} = s\, q_i \cdot k_j + b_{\text{idx}(r_{ij})}

``b`` has ``2K + 1`` entries (row ``r + K``), shared ``(2K+1,)`` or per head
``(h, 2K+1)``; beyond the table: ``"clip"``, ``"zero"`` or ``"error"``.
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._validate import nonnegative_int
from ..attention import attention
from ._tables import bias_by_distance, check_table, gather_scalars
from .shaw import shaw_index

__all__ = ["bias_attention", "bias_logits"]


def bias_logits(
    table: Any, /, t_q: int, t_k: int, *, q_offset: int = 0, beyond: str = "clip"
) -> Any:
    r"""Bias matrix :math:`B_{ij} = b_{\text{idx}(r_{ij})}`.

    Parameters
    ----------
    table : floating array, shape ``(2K+1,)`` or ``(h, 2K+1)``
    t_q, t_k : int
        Number of queries and keys.
    q_offset : int, optional
        Position of query 0.
    beyond : {"clip", "zero", "error"}, optional
        Distances ``|r| > K``.

    Returns
    -------
    array, shape ``(t_q, t_k)`` or ``(h, t_q, t_k)``

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> b = xp.asarray([-1.0, 0.0, 1.0])
    >>> bias_logits(b, 2, 3)
    array([[ 0.,  1.,  1.],
           [-1.,  0.,  1.]])
    """
    xp = _xp.array_namespace(table)
    check_table("table", table, None, scalar=True)
    n = table.shape[-1]
    if n % 2 != 1:
        msg = f"`table` must have 2K + 1 entries (an odd number), got {n}"
        raise ValueError(msg)
    t_q = nonnegative_int("t_q", t_q)
    t_k = nonnegative_int("t_k", t_k)
    dev = _xp.device(table)
    index, valid = shaw_index(
        t_q, t_k, max_distance=(n - 1) // 2, q_offset=q_offset, beyond=beyond, xp=xp, device=dev
    )
    out = gather_scalars(table, index)
    return xp.where(valid, out, xp.zeros((), dtype=table.dtype, device=dev))


def bias_attention(
    q: Any,
    k: Any,
    v: Any,
    table: Any,
    /,
    *,
    scale: float | None = None,
    mask: Any = None,
    causal: bool = False,
    q_offset: int = 0,
    beyond: str = "clip",
    return_weights: bool = False,
) -> Any:
    r"""Attention with a learned relative scalar bias.

    .. math:: w = \operatorname{softmax}(s\, q k^\top + B), \qquad
              B_{ij} = b_{\text{idx}(r_{ij})}

    Parameters
    ----------
    q, k, v : floating arrays ``(..., t_q, d)``, ``(..., t_k, d)``, ``(..., t_k, d_v)``
    table : floating array, ``(2K+1,)`` or ``(h, 2K+1)`` (heads at axis -3 of `q`)
    scale, mask, causal, q_offset, return_weights
        As in `relpos_ref.attention`.
    beyond
        As in `bias_logits`.

    Returns
    -------
    out : array ``(..., t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import numpy as np
    >>> q = k = v = np.zeros((2, 2))
    >>> w = bias_attention(q, k, v, np.asarray([0.0, 0.0, np.log(3.0)]),
    ...                    return_weights=True)[1]
    >>> w.round(3).tolist()
    [[0.25, 0.75], [0.5, 0.5]]
    """
    _xp.array_namespace(q, k, v, table)
    check_table("table", table, q, scalar=True)
    bias = bias_by_distance(
        lambda t_q, t_k, offset: bias_logits(table, t_q, t_k, q_offset=offset, beyond=beyond),
        q,
        q.shape[-2],
        k.shape[-2],
        q_offset,
    )
    return attention(
        q,
        k,
        v,
        scale=scale,
        mask=mask,
        causal=causal,
        q_offset=q_offset,
        bias=bias,
        return_weights=return_weights,
    )
