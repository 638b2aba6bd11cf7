r"""Relative attention for any attention: self or cross, full or causal, ``t_q != t_k``.

A table ``E`` of ``2 t_max - 1`` rows covers every distance between
sequences of up to ``t_max`` positions. The positional term is

.. math:: P_{ij} = q_i \cdot E_{c(r_{ij})}, \qquad
          c(r) = r + t_\max - 1 \text{ (past to future)} \text{ or }
          t_\max - 1 - r \text{ (future to past)},

computed efficiently as ``Q E_w^T`` followed by the layout of
`relpos_ref.layouts.stacked_diagonals`: ``E_w`` holds only the
``t_q + t_k - 1`` rows whose distances occur, in past-to-future order, and
each diagonal of ``P`` is one column of ``Q E_w^T``.
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._validate import as_int, check_choice, nonnegative_int, positive_int
from ..attention import attention
from ..calls import PLAIN, Call, computes_in_float32, resolve_call
from ..distance_gradients import distance_axis, query_rows_vjp, table_gradient, table_rows
from ..gradients import check_d_output, core_vjp, forward, sum_to_shape
from ..layouts import TABLE_ORDERS, pad_flatten_reshape
from ..positions import check_distances_in_table, distance_range, relative_positions
from ._tables import check_method, check_table, contract_rows, gather_rows, table_logits

__all__ = [
    "DEFAULTS",
    "general_attention",
    "general_attention_vjp",
    "general_call",
    "general_index",
    "general_logits",
    "general_window",
]

#: The general scheme's defaults: ``scale = 1/sqrt(d)``, not causal, start-aligned queries.
DEFAULTS = PLAIN


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
    >>> import array_api_strict as xp
    >>> general_index(2, 3, t_max=3, xp=xp)
    Array([[2, 3, 4],
           [1, 2, 3]], dtype=array_api_strict.int64)
    >>> general_index(2, 3, t_max=3, order="future_to_past", xp=xp)
    Array([[2, 1, 0],
           [3, 2, 1]], dtype=array_api_strict.int64)
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


@computes_in_float32
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
    >>> import array_api_strict as xp
    >>> E = xp.asarray([[-3.0], [-2.0], [-1.0], [0.0], [1.0], [2.0], [3.0]])  # t_max = 4
    >>> general_logits(xp.ones((2, 1)), E, 4)
    Array([[ 0.,  1.,  2.,  3.],
           [-1.,  0.,  1.,  2.]], dtype=array_api_strict.float64)
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
    t_q, t_k, t_max, q_offset = _check_grid(t_q, t_k, t_max, q_offset, order)
    span = distance_range(t_q, t_k, q_offset=q_offset)
    if span is None:
        return xp.zeros((*q.shape[:-2], t_q, t_k), dtype=q.dtype, device=_xp.device(q))
    window = general_window(table, t_q, t_k, q_offset=q_offset, order=order)
    return pad_flatten_reshape(table_logits(q, window), t_k, offset=-span[0], q_offset=q_offset)


def general_window(
    table: Any, /, t_q: int, t_k: int, *, q_offset: int = 0, order: str = "past_to_future"
) -> Any:
    r"""The table rows of the distances that occur, from ``r_min`` to ``r_max``, past to future.

    .. math:: E_w[c] = E[\text{row}(r_\min + c)], \quad c = 0 .. t_q + t_k - 2

    Parameters
    ----------
    table : array, shape ``(2 t_max - 1, d)`` or ``(h, 2 t_max - 1, d)``
    t_q, t_k : int
        Queries and keys, at least one each; every distance must be in the table.
    q_offset : int, optional
        Position of query 0.
    order : {"past_to_future", "future_to_past"}, optional
        Row order of `table`.

    Returns
    -------
    array, shape ``(t_q + t_k - 1, d)`` or ``(h, t_q + t_k - 1, d)``
        Row ``c`` holds distance ``r_min + c``, ``r_min = -(t_q - 1 + q_offset)``;
        a copy, not a view of `table`.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> E = xp.reshape(xp.arange(-3.0, 4.0), (7, 1))  # t_max = 4, row r + 3 holds r
    >>> general_window(E, 2, 2)[:, 0]  # distances -1 .. 1
    Array([-1.,  0.,  1.], dtype=array_api_strict.float64)
    >>> general_window(xp.flip(E, axis=0), 2, 2, order="future_to_past")[:, 0]
    Array([-1.,  0.,  1.], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(table)
    t_max = _t_max(table)
    t_q, t_k, t_max, q_offset = _check_grid(t_q, t_k, t_max, q_offset, order)
    span = distance_range(t_q, t_k, q_offset=q_offset)
    if span is None:
        msg = f"`t_q` and `t_k` must be >= 1 for a window of distances, got {t_q} and {t_k}"
        raise ValueError(msg)
    r_min, r_max = span
    if order == "past_to_future":
        window = table[..., r_min + t_max - 1 : r_max + t_max, :]
    else:
        window = xp.flip(table[..., t_max - 1 - r_max : t_max - r_min, :], axis=-2)
    # a fresh array (reshape's copy keeps autograd quiet where asarray's would warn)
    return xp.reshape(window, tuple(window.shape), copy=True)


def general_call(
    q: Any,
    k: Any,
    v: Any,
    table: Any,
    /,
    *,
    scale: float | None,
    mask: Any,
    causal: bool | None,
    q_offset: int | None,
    order: str,
    method: str,
) -> Call:
    """Validate a `general_attention` call and resolve its defaults (shared with the kernels).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q, k = xp.zeros((2, 4)), xp.zeros((5, 4))
    >>> general_call(q, k, k, xp.zeros((9, 4)), scale=None, mask=None, causal=None,
    ...              q_offset=3, order="past_to_future", method="efficient").q_offset
    3
    """
    call = resolve_call(
        q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset, defaults=DEFAULTS,
        tables={"table": table},
    )
    check_method(method)
    check_table("table", table, q, width=q.shape[-1])
    _check_grid(call.t_q, call.t_k, _t_max(table), call.q_offset, order)
    return call


@computes_in_float32
def general_attention(
    q: Any,
    k: Any,
    v: Any,
    table: Any,
    /,
    *,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
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
        As in `relpos_ref.attention` (defaults `DEFAULTS`).
    order, method
        As in `general_logits`.

    Returns
    -------
    out : array ``(..., t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q, k = xp.ones((2, 4)), xp.ones((5, 4))
    >>> general_attention(q, k, k, xp.zeros((9, 4)), q_offset=3, causal=True).shape
    (2, 4)
    """
    call = general_call(
        q, k, v, table, scale=scale, mask=mask, causal=causal, q_offset=q_offset, order=order,
        method=method,
    )
    position = general_logits(
        q, table, call.t_k, q_offset=call.q_offset, order=order, method=method
    )
    return attention(
        q, k, v, scale=call.scale, mask=mask, causal=call.causal, q_offset=call.q_offset,
        position=position, return_weights=return_weights,
    )


@computes_in_float32
def general_attention_vjp(
    q: Any,
    k: Any,
    v: Any,
    table: Any,
    /,
    *,
    d_output: Any,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
    order: str = "past_to_future",
) -> dict[str, Any]:
    r"""Gradients of `general_attention` for the output's cotangent `d_output` (a VJP).

    .. math:: \bar{E}_{\text{row}(r)} = \sum_i \bar{P}^\text{rel}_{ir}\, q_i, \qquad
              \bar{q}_i \mathrel{+}= \sum_r \bar{P}^\text{rel}_{ir}\, E_{\text{row}(r)}

    with :math:`\bar{P} = s\,\bar{l}`; one row per distance, so rows of
    distances the grid never has get zero.

    Parameters
    ----------
    q, k, v, table, scale, mask, causal, q_offset, order
        As in `general_attention`.
    d_output : floating array, shape ``(..., t_q, d_v)``
        :math:`\partial L / \partial\,\text{out}`; same dtype as `q`.

    Returns
    -------
    dict
        The gradient with respect to each of ``q``, ``k``, ``v`` and ``table``, of its shape
        and dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.ones((2, 1))
    >>> general_attention_vjp(q, k, v, xp.zeros((3, 1)), d_output=xp.ones((2, 1)))["v"]
    Array([[1.],
           [1.]], dtype=array_api_strict.float64)
    """
    call = general_call(
        q, k, v, table, scale=scale, mask=mask, causal=causal, q_offset=q_offset, order=order,
        method="efficient",
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    position = general_logits(q, table, call.t_k, q_offset=call.q_offset, order=order)
    fwd = forward(q, k, call, mask=mask, position=position)
    axis = distance_axis(call.t_q, call.t_k, call.q_offset)
    xp, dev = call.xp, _xp.device(q)
    t_max = _t_max(table)
    r = xp.arange(axis.n, dtype=_xp.index_dtype(xp, dev), device=dev) + axis.low
    index = r + (t_max - 1) if order == "past_to_future" else (t_max - 1) - r
    every = xp.ones((axis.n,), dtype=xp.bool, device=dev)
    core = core_vjp(q, k, v, d_output, call, fwd)
    dq_table, d_rows = query_rows_vjp(core.d_logits * call.scale, q, table_rows(table, index),
                                      axis, allowed=fwd.allowed)
    return {
        "q": sum_to_shape(core.dq + dq_table, q.shape),
        "k": sum_to_shape(core.dk, k.shape),
        "v": sum_to_shape(core.dv, v.shape),
        "table": table_gradient(d_rows, table, index, every),
    }
