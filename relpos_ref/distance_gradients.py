r"""The transposes of reading tables by distance: the backward steps of relative terms.

A relative term reads row ``idx(r)`` of a table for the pair at distance
``r = j - (i + q_offset)``; its transpose adds. `by_distance` lays a
``(t_q, t_k)`` gradient out by distance (`relpos_ref.layouts.to_relative`,
each entry once), and `rows_to_table` adds the distances that share a table
row (a scatter-add, written as a product with the 0/1 matrix of the row map,
since the array API has no scatter):

.. math::
    \bar{q}_i \mathrel{+}= \sum_r \bar{P}^{\,\text{rel}}_{ir}\, a_{\text{idx}(r)}, \qquad
    \bar{a}_c = \sum_{r:\ \text{idx}(r) = c}\ \sum_i \bar{P}^{\,\text{rel}}_{ir}\, q_i,

with ``O(t_q (t_q + t_k))`` memory and no ``(t_q, t_k, d)`` tensor. The steps
through the softmax, which every scheme shares, are `relpos_ref.gradients`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from . import _xp
from .gradients import masked_product, sum_to_shape
from .layouts import to_relative

__all__ = [
    "DistanceAxis",
    "by_distance",
    "distance_axis",
    "every_pair_unless",
    "key_rows_vjp",
    "keys_by_distance",
    "query_rows_vjp",
    "rows_to_table",
    "scalar_rows_vjp",
    "table_gradient",
    "table_rows",
]


class DistanceAxis(NamedTuple):
    """The distances ``r = low .. low + n - 1`` of a ``t_q x t_k`` grid, in order."""

    low: int
    n: int
    t_q: int
    t_k: int
    q_offset: int


def distance_axis(t_q: int, t_k: int, q_offset: int) -> DistanceAxis:
    """Every distance ``r = j - (i + q_offset)`` of the grid, most distant past first.

    Examples
    --------
    >>> distance_axis(2, 3, 1)
    DistanceAxis(low=-2, n=4, t_q=2, t_k=3, q_offset=1)
    """
    n = t_q + t_k - 1 if t_q and t_k else 0
    return DistanceAxis(-(t_q - 1) - q_offset, n, t_q, t_k, q_offset)


def by_distance(x: Any, axis: DistanceAxis, /) -> Any:
    r"""A ``(..., t_q, t_k)`` array laid out by distance: ``out[..., i, c] = x[..., i, j]``
    with ``r_ij = low + c`` (zero where no key is at that distance).

    Each entry of `x` appears once: the transpose of reading per-distance
    columns back per pair (`relpos_ref.layouts.gather`).
    """
    return to_relative(x, axis.n, offset=-axis.low, q_offset=axis.q_offset)


def table_rows(table: Any, index: Any, valid: Any = None, *, scalar: bool = False) -> Any:
    """The rows ``table[index]`` (entries, for a `scalar` table), zero where not `valid`.

    ``(n_rows, d)`` or ``(h, n_rows, d)`` with a 1-D ``index`` of length ``n``
    gives ``(n, d)`` or ``(h, n, d)``; a scalar ``(n_rows,)`` or ``(h, n_rows)``
    gives ``(n,)`` or ``(h, n)``.
    """
    xp = _xp.array_namespace(table, index, valid)
    rows = xp.take(table, index, axis=table.ndim - (1 if scalar else 2))
    if valid is None:
        return rows
    zero = xp.zeros((), dtype=table.dtype, device=_xp.device(table))
    return xp.where(valid if scalar else valid[:, None], rows, zero)


def rows_to_table(d_rows: Any, index: Any, valid: Any, n_rows: int, *, axis: int = -2) -> Any:
    r"""Add per-distance gradients into the table rows they were read from (a scatter-add).

    .. math:: \bar{a}_c = \sum_{r:\ \text{idx}(r) = c,\ \text{valid}(r)} \bar{a}^{\,\text{rel}}_r

    Parameters
    ----------
    d_rows : floating array
        One entry (or row) per distance along `axis`.
    index, valid : arrays, shape ``(n,)``
        The table row of each distance and whether it has one.
    n_rows : int
        Rows of the table.
    axis : {-2, -1}
        ``-2`` for tables of rows, ``-1`` for scalar tables.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> rows_to_table(xp.asarray([1.0, 2.0, 4.0]), xp.asarray([0, 1, 1]),
    ...               xp.asarray([True, True, True]), 2, axis=-1)
    Array([1., 6.], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(d_rows, index, valid)
    dev = _xp.device(d_rows)
    targets = xp.arange(n_rows, dtype=index.dtype, device=dev)
    onehot = (index[:, None] == targets[None, :]) & valid[:, None]  # (n, n_rows)
    onehot = xp.astype(onehot, d_rows.dtype)
    if axis == -1:
        return xp.matmul(d_rows, onehot)
    return xp.matmul(xp.matrix_transpose(onehot), d_rows)


def keys_by_distance(x: Any, axis: DistanceAxis, /) -> Any:
    r"""`by_distance` from the keys' side: ``out[..., j, c] = x[..., i, j]`` with
    ``r_ij = low + c``, shape ``(..., t_k, n)`` (DeBERTa's position-to-content term)."""
    xp = _xp.array_namespace(x)
    rel = to_relative(xp.matrix_transpose(x), axis.n, offset=axis.t_k - 1)
    return xp.flip(rel, axis=-1)


def every_pair_unless(allowed: Any, t_q: int, t_k: int, *, xp: Any, device: Any = None) -> Any:
    """`allowed` with its pair axes full, or (``None``: nothing masked) ``(t_q, t_k)`` of ``True``.

    A mask that broadcasts over the pairs (``()``, ``(t_k,)``, ``(1, t_k)``,
    ``(t_q, 1)``, ...) is broadcast to ``(..., t_q, t_k)``, the layout every
    distance binning reads.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> every_pair_unless(None, 1, 2, xp=xp)
    Array([[ True,  True]], dtype=array_api_strict.bool)
    >>> every_pair_unless(xp.asarray([True, False]), 2, 2, xp=xp)
    Array([[ True, False],
           [ True, False]], dtype=array_api_strict.bool)
    """
    if allowed is None:
        return xp.ones((t_q, t_k), dtype=xp.bool, device=device)
    if allowed.shape[-2:] == (t_q, t_k):
        return allowed
    return xp.broadcast_to(allowed, (*allowed.shape[:-2], t_q, t_k))


def _reached(allowed: Any, like: Any, axis: DistanceAxis, layout: Any) -> Any:
    xp = _xp.array_namespace(like)
    allowed = every_pair_unless(allowed, axis.t_q, axis.t_k, xp=xp, device=_xp.device(like))
    zero = xp.zeros((), dtype=like.dtype, device=_xp.device(like))
    return layout(xp.astype(allowed, like.dtype), axis) > zero


def _rows_vjp(d_position: Any, x: Any, rows: Any, axis: DistanceAxis, layout: Any,
              allowed: Any) -> tuple[Any, Any]:
    # the transpose of a side's term x . rows[r], read through `layout` (by the side's axis)
    xp = _xp.array_namespace(d_position, x, rows)
    g = layout(d_position, axis)
    reached = _reached(allowed, g, axis, layout)
    dx = masked_product(g, rows, used=reached)
    d_rows = masked_product(xp.matrix_transpose(g), x, used=xp.matrix_transpose(reached))
    return dx, d_rows


def query_rows_vjp(d_position: Any, q: Any, rows: Any, axis: DistanceAxis, /, *,
                   allowed: Any = None) -> tuple[Any, Any]:
    r"""Transpose of :math:`P_{ij} = q_i \cdot \text{rows}_{r_{ij}}`: ``(dq, d_rows)``.

    `rows` holds one row per distance of `axis`, ``(n, d)`` or ``(h, n, d)``;
    ``d_rows`` is ``(..., n, d)`` over the call's batch.
    """
    return _rows_vjp(d_position, q, rows, axis, by_distance, allowed)


def key_rows_vjp(d_position: Any, k: Any, rows: Any, axis: DistanceAxis, /, *,
                 allowed: Any = None) -> tuple[Any, Any]:
    r"""Transpose of :math:`P_{ij} = k_j \cdot \text{rows}_{r_{ij}}`: ``(dk, d_rows)``."""
    return _rows_vjp(d_position, k, rows, axis, keys_by_distance, allowed)


def scalar_rows_vjp(d_bias: Any, axis: DistanceAxis, /) -> Any:
    r"""Transpose of :math:`B_{ij} = b_{r_{ij}}`: ``(..., n)``,
    :math:`\bar{b}_r = \sum_i \bar{B}^\text{rel}_{ir}`."""
    xp = _xp.array_namespace(d_bias)
    return xp.sum(by_distance(d_bias, axis), axis=-2)


def table_gradient(d_rows: Any, table: Any, index: Any, valid: Any, /, *,
                   scalar: bool = False) -> Any:
    """Per-distance gradients summed over the batch to the table's heads, then into its rows."""
    xp = _xp.array_namespace(d_rows, table)
    n = index.shape[0]
    if scalar:
        per_head = sum_to_shape(d_rows, (*table.shape[:-1], n))
        return rows_to_table(per_head, index, valid, table.shape[-1], axis=-1)
    per_head = sum_to_shape(d_rows, (*table.shape[:-2], n, table.shape[-1]))
    out = rows_to_table(per_head, index, valid, table.shape[-2])
    return xp.astype(out, table.dtype)
