r"""Absolute position embeddings as a score term ("AbsPosEmb1D" style).

A learned row per key position: the positional term is
:math:`q_i \cdot R_j`, with ``R`` of shape ``(t_max, d)`` (or per head).
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._validate import nonnegative_int
from ..attention import attention
from ..positions import relative_positions
from ._tables import check_table, table_logits

__all__ = ["absolute_attention", "absolute_index", "absolute_logits"]


def absolute_index(t_q: int, t_k: int, /, *, xp: Any, device: Any = None) -> Any:
    """Row of the absolute table used by each (query, key) pair: the key's position ``j``.

    Parameters
    ----------
    t_q, t_k : int
        Number of queries and keys.
    xp : namespace
        Array API namespace of the result.
    device : optional
        Device of the result.

    Returns
    -------
    array, shape ``(t_q, t_k)``
        ``index[i, j] = j``.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> absolute_index(2, 3, xp=xp)
    array([[0, 1, 2],
           [0, 1, 2]])
    """
    r = relative_positions(t_q, t_k, xp=xp, device=device)
    return r + xp.arange(t_q, dtype=r.dtype, device=device)[:, None]


def absolute_logits(q: Any, table: Any, /, t_k: int) -> Any:
    r"""Positional term :math:`P_{ij} = q_i \cdot R_j` of absolute key embeddings.

    Parameters
    ----------
    q : floating array, shape ``(..., t_q, d)``
    table : floating array, shape ``(t_max, d)`` or ``(h, t_max, d)``
        Row ``j`` embeds key position ``j``; ``t_k <= t_max``.
    t_k : int
        Number of keys.

    Returns
    -------
    array, shape ``(..., t_q, t_k)``

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> q = xp.asarray([[1.0, 0.0], [0.0, 1.0]])
    >>> R = xp.asarray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    >>> absolute_logits(q, R, 3)
    array([[1., 3., 5.],
           [2., 4., 6.]])
    """
    t_k = nonnegative_int("t_k", t_k)
    check_table("table", table, q, width=q.shape[-1])
    t_max = table.shape[-2]
    if t_k > t_max:
        msg = f"`t_k` = {t_k} exceeds the table's {t_max} positions (shape {tuple(table.shape)})"
        raise ValueError(msg)
    return table_logits(q, table[..., :t_k, :])


def absolute_attention(
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
    return_weights: bool = False,
) -> Any:
    r"""Attention with an absolute key-position term.

    .. math:: \text{logits}_{ij} = s\,(q_i \cdot k_j + q_i \cdot R_j)

    Parameters
    ----------
    q, k, v : floating arrays ``(..., t_q, d)``, ``(..., t_k, d)``, ``(..., t_k, d_v)``
    table : floating array, shape ``(t_max, d)`` or ``(h, t_max, d)``
    scale, mask, causal, q_offset, return_weights
        As in `relpos_ref.attention`.

    Returns
    -------
    out : array ``(..., t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import numpy as np
    >>> q = k = v = np.eye(2)
    >>> absolute_attention(q, k, v, np.zeros((4, 2))).shape
    (2, 2)
    """
    _xp.array_namespace(q, k, v, table)
    position = absolute_logits(q, table, k.shape[-2])
    return attention(
        q,
        k,
        v,
        scale=scale,
        mask=mask,
        causal=causal,
        q_offset=q_offset,
        position=position,
        return_weights=return_weights,
    )
