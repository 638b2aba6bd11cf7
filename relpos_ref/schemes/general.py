r"""Relative attention for any attention: self or cross, full or causal, ``t_q != t_k``.

A table ``E`` of ``2 t_max - 1`` rows covers every distance between
sequences of up to ``t_max`` positions. The positional term is

.. math:: P_{ij} = q_i \cdot E_{c(r_{ij})}, \qquad
          c(r) = r + t_\max - 1 \text{ (past to future)} \text{ or }
          t_\max - 1 - r \text{ (future to past)},

computed efficiently as ``Q E^T`` followed by
`relpos_ref.layouts.stacked_diagonals` (each diagonal of ``P`` is one
column of ``Q E^T``).
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._validate import as_int, check_choice, nonnegative_int, positive_int
from ..attention import _attention, attention
from ..layouts import TABLE_ORDERS, stacked_diagonals
from ..positions import check_distances_in_table, relative_positions
from ._tables import (
    check_method,
    check_table,
    contract_rows,
    gather_rows,
    numpy_block_logits,
    table_logits,
)

__all__ = ["general_attention", "general_index", "general_logits"]


def general_index(
    t_q: int,
    t_k: int,
    /,
    *,
    t_max: int,
    q_offset: int = 0,
    order: str = "past_to_future",
    xp: Any,
    device: Any = None,
) -> Any:
    """Row of the ``2 t_max - 1`` table for each (query, key) pair.

    Raises a `ValueError` when ``t_q`` or ``t_k`` exceeds ``t_max`` or a
    distance falls outside the table.

    Parameters
    ----------
    t_q, t_k : int
        Number of queries and keys, each ``<= t_max``.
    t_max : int
        Maximum length; the table has ``2 t_max - 1`` rows.
    q_offset : int, optional
        Position of query 0.
    order : {"past_to_future", "future_to_past"}, optional
        Row order of the table.
    xp : namespace
        Array API namespace of the result.
    device : optional
        Device of the result.

    Returns
    -------
    array, shape ``(t_q, t_k)``
        ``r + t_max - 1`` or ``t_max - 1 - r``.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> general_index(2, 3, t_max=3, xp=xp)
    array([[2, 3, 4],
           [1, 2, 3]])
    >>> general_index(2, 3, t_max=3, order="future_to_past", xp=xp)
    array([[2, 1, 0],
           [3, 2, 1]])
    """
    t_q, t_k, t_max, q_offset = _check_grid(t_q, t_k, t_max, q_offset, order)
    r = relative_positions(t_q, t_k, q_offset=q_offset, xp=xp, device=device)
    return r + (t_max - 1) if order == "past_to_future" else (t_max - 1) - r


def _check_grid(
    t_q: int, t_k: int, t_max: int, q_offset: int, order: str
) -> tuple[int, int, int, int]:
    # Host-side: lengths within the table and every distance in it.
    t_q = nonnegative_int("t_q", t_q)
    t_k = nonnegative_int("t_k", t_k)
    t_max = positive_int("t_max", t_max)
    q_offset = as_int("q_offset", q_offset)
    check_choice("order", order, TABLE_ORDERS)
    for name, n in (("t_q", t_q), ("t_k", t_k)):
        if n > t_max:
            msg = f"`{name}` = {n} exceeds the table's maximum length t_max = {t_max}"
            raise ValueError(msg)
    check_distances_in_table(
        t_q,
        t_k,
        q_offset=q_offset,
        low=-(t_max - 1),
        high=t_max - 1,
        what=f"t_max={t_max}",
        hint="use a table with a larger t_max",
    )
    return t_q, t_k, t_max, q_offset


def _t_max(table: Any) -> int:
    n = table.shape[-2]
    if n % 2 != 1:
        shape = tuple(table.shape)
        msg = f"`table` must have 2 t_max - 1 rows (an odd number), got {n} (shape {shape})"
        raise ValueError(msg)
    return (n + 1) // 2


def general_logits(
    q: Any,
    table: Any,
    /,
    t_k: int,
    *,
    q_offset: int = 0,
    order: str = "past_to_future",
    method: str = "efficient",
) -> Any:
    r"""Positional term :math:`P_{ij} = q_i \cdot E_{c(r_{ij})}` for any ``t_q``, ``t_k <= t_max``.

    Parameters
    ----------
    q : floating array, shape ``(..., t_q, d)``
    table : floating array, shape ``(2 t_max - 1, d)`` or ``(h, 2 t_max - 1, d)``
    t_k : int
        Number of keys, ``<= t_max``.
    q_offset : int, optional
        Position of query 0 (``t_k - t_q`` for end-aligned decoding).
    order : {"past_to_future", "future_to_past"}, optional
        Row order of the table. ``"future_to_past"`` reads row ``t_max - 1 - r``.
    method : {"efficient", "definition"}, optional

    Returns
    -------
    array, shape ``(..., t_q, t_k)``

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> E = xp.asarray([[-3.0], [-2.0], [-1.0], [0.0], [1.0], [2.0], [3.0]])  # t_max = 4
    >>> general_logits(xp.ones((2, 1)), E, 4)
    array([[ 0.,  1.,  2.,  3.],
           [-1.,  0.,  1.,  2.]])
    """
    xp = _xp.array_namespace(q, table)
    check_method(method)
    check_table("table", table, q, width=q.shape[-1])
    t_max = _t_max(table)
    t_q = q.shape[-2]
    if method == "definition":
        index = general_index(
            t_q, t_k, t_max=t_max, q_offset=q_offset, order=order, xp=xp, device=_xp.device(q)
        )
        return contract_rows(q, gather_rows(table, index))
    _check_grid(t_q, t_k, t_max, q_offset, order)
    return stacked_diagonals(table_logits(q, table), t_k, q_offset=q_offset, order=order)


def general_attention(
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
    order: str = "past_to_future",
    method: str = "efficient",
    return_weights: bool = False,
) -> Any:
    r"""Relative attention for any attention pattern.

    .. math:: w = \operatorname{softmax}\bigl(s\,(q k^\top + P)\bigr),\quad
              P_{ij} = q_i \cdot E_{c(r_{ij})}

    Parameters
    ----------
    q, k, v : floating arrays ``(..., t_q, d)``, ``(..., t_k, d)``, ``(..., t_k, d_v)``
    table : floating array, ``(2 t_max - 1, d)`` or ``(h, 2 t_max - 1, d)``
    scale, mask, causal, q_offset, return_weights
        As in `relpos_ref.attention`.
    order, method
        As in `general_logits`.

    Returns
    -------
    out : array ``(..., t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import numpy as np
    >>> q, k = np.ones((2, 4)), np.ones((5, 4))
    >>> general_attention(q, k, k, np.zeros((9, 4)), q_offset=3, causal=True).shape
    (2, 4)
    """
    _xp.array_namespace(q, k, v, table)
    check_method(method)
    t_k = k.shape[-2]
    rows = None
    if method == "efficient" and _xp.all_numpy(q, k, v, table):
        check_table("table", table, q, width=q.shape[-1])
        _check_grid(q.shape[-2], t_k, _t_max(table), q_offset, order)
        if order == "future_to_past":  # reversed, row c holds distance c - (t_max - 1)
            table = table[..., ::-1, :]
        rows = numpy_block_logits(q, table, t_k, q_offset=q_offset, low=1 - _t_max(table))
    if rows is None:
        position = general_logits(q, table, t_k, q_offset=q_offset, order=order, method=method)
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

    return _attention(
        q,
        k,
        v,
        scale=scale,
        mask=mask,
        causal=causal,
        q_offset=q_offset,
        bias=None,
        position=None,
        return_weights=return_weights,
        position_rows=rows,
    )
