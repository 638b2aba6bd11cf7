"""Relative tables: validation, per-distance logits and row gathers.

A table holds one row per distance: ``(n, d)`` shared by every head, or
``(h, n, d)`` per head, heads matching axis ``-3`` of ``q``. A scalar table
(biases) is ``(n,)`` or ``(h, n)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import _xp
from .._validate import broadcast_shapes
from ..attention import weighted_sum
from ..calls import Call
from ..distance_gradients import every_pair_unless
from ..gradients import Forward, core_vjp, dot_rows, masked_product, sum_to_shape
from ..layouts import _take_per_row, to_relative
from ..positions import relative_positions

__all__ = [
    "METHODS",
    "binned_keys_values_vjp",
    "binned_rows_vjp",
    "binned_scalars_vjp",
    "binned_values",
    "binned_values_vjp",
    "check_method",
    "check_table",
    "check_value_table",
    "check_value_width",
    "contract_rows",
    "count_reached",
    "distance_bins",
    "gather_rows",
    "gather_scalars",
    "gather_valid_rows",
    "table_logits",
    "weighted_rows",
]

METHODS = ("efficient", "definition")


def check_method(method: str) -> str:
    """`method` if it is ``"efficient"`` or ``"definition"``; a `ValueError` otherwise."""
    if method not in METHODS:
        msg = f"`method` must be one of 'efficient', 'definition', got {method!r}"
        raise ValueError(msg)
    return method


def check_table(
    name: str,
    table: Any,
    q: Any,
    *,
    rows: int | None = None,
    rows_rule: str = "",
    width: int | None = None,
    scalar: bool = False,
) -> int | None:
    """Validate a relative table against the queries; return its head count or ``None``.

    Parameters
    ----------
    name : str
        Parameter name for messages.
    table : array
        ``(n, d)`` or ``(h, n, d)``; with ``scalar=True``, ``(n,)`` or ``(h, n)``.
    q : array or None
        The queries, ``(..., t_q, d)``, heads at axis -3 for per-head tables;
        ``None`` skips the checks against them.
    rows : int, optional
        Required number of rows ``n``; `rows_rule` explains it in messages.
    width : int, optional
        Required feature width (``d`` for key tables, ``d_v`` for value tables).
    scalar : bool, optional
        The table holds one scalar per distance.
    """
    xp = _xp.array_namespace(q, table)
    _xp.check_floating(xp, name, table)
    if q is not None:
        _xp.check_same_dtype(q=q, **{name: table})
    shape = tuple(table.shape)
    shared_ndim = 1 if scalar else 2
    if table.ndim not in (shared_ndim, shared_ndim + 1):
        layout = "(n,) or (h, n)" if scalar else "(n, d) or (h, n, d)"
        msg = f"`{name}` must have shape {layout}, got shape {shape}"
        raise ValueError(msg)
    n = shape[-1] if scalar else shape[-2]
    if rows is not None and n != rows:
        msg = f"`{name}` must have {rows} rows{rows_rule}, got {n} (shape {shape})"
        raise ValueError(msg)
    if not scalar and width is not None and shape[-1] != width:
        msg = f"`{name}` must have width {width} to match the features, got shape {shape}"
        raise ValueError(msg)
    if table.ndim == shared_ndim:
        return None
    heads = shape[0]
    if q is None:
        return heads
    if q.ndim < 3 or q.shape[-3] != heads:
        msg = (
            f"`{name}` has {heads} heads (shape {shape}) but `q` has shape "
            f"{tuple(q.shape)}; per-head tables need q of shape (..., {heads}, t_q, d)"
        )
        if scalar and q.ndim >= 3 and shape[-1] == q.shape[-3]:
            msg += (f"; a table of shape (n, h) = {shape}, the layout of HF transformers' T5 "
                    "`relative_attention_bias.weight`, is ours transposed: pass its "
                    f"transpose, of shape (h, n) = {shape[::-1]}")
        raise ValueError(msg)
    return heads


def table_logits(q: Any, table: Any) -> Any:
    r"""Per-distance logits ``q . a_c`` for every row ``c`` of the table.

    .. math:: P[..., i, c] = q[..., i, :] \cdot a[c, :]

    ``q (..., t_q, d)`` and ``(n, d)`` or ``(h, n, d)`` give ``(..., t_q, n)``.
    """
    xp = _xp.array_namespace(q, table)
    if table.ndim == 2 and q.ndim > 2 and _xp.size(q):
        # one (rows, d) x (d, n) product instead of one per leading index: a single large
        # GEMM is faster in every BLAS we measured (NumPy: 18 ms against 27 ms for
        # 8 x 1024 queries and 2047 rows)
        *lead, t_q, d = q.shape
        flat = xp.matmul(xp.reshape(q, (-1, d)), xp.matrix_transpose(table))
        return xp.reshape(flat, (*lead, t_q, table.shape[0]))
    return xp.matmul(q, xp.matrix_transpose(table))


def gather_rows(table: Any, index: Any) -> Any:
    """Rows of the table for every (query, key) pair: the definition's tensor.

    ``(n, d)`` with ``index (t_q, t_k)`` gives ``(t_q, t_k, d)``;
    ``(h, n, d)`` gives ``(h, t_q, t_k, d)``. This is the
    ``O(t_q t_k d)`` tensor the efficient paths never build.
    """
    xp = _xp.array_namespace(table, index)
    t_q, t_k = index.shape
    axis = table.ndim - 2
    flat = xp.take(table, xp.reshape(index, (t_q * t_k,)), axis=axis)
    return xp.reshape(flat, (*table.shape[:axis], t_q, t_k, table.shape[-1]))


def gather_scalars(table: Any, index: Any) -> Any:
    """Entries of a scalar table for every (query, key) pair.

    ``(n,)`` with ``index (t_q, t_k)`` gives ``(t_q, t_k)``; ``(h, n)`` gives
    ``(h, t_q, t_k)``.
    """
    xp = _xp.array_namespace(table, index)
    t_q, t_k = index.shape
    flat = xp.take(table, xp.reshape(index, (t_q * t_k,)), axis=table.ndim - 1)
    return xp.reshape(flat, (*table.shape[:-1], t_q, t_k))


def contract_rows(q: Any, rows: Any) -> Any:
    r"""``out[..., i, j] = q[..., i, :] . rows[..., i, j, :]`` (the definition's product)."""
    xp = _xp.array_namespace(q, rows)
    return xp.sum(q[..., :, None, :] * rows, axis=-1)


def weighted_rows(weights: Any, rows: Any, used: Any = None) -> Any:
    r"""``out[..., i, :] = sum_j w_ij rows[..., i, j, :]`` over the `used` pairs (definition).

    An unused pair contributes nothing, even a NaN or infinite row; a used
    one follows IEEE arithmetic (`relpos_ref.attention.weighted_sum` is the
    same rule for the efficient path).
    """
    xp = _xp.array_namespace(weights, rows, used)
    if used is not None:  # an unused pair's row is never multiplied (0 * inf would be NaN)
        zero = xp.zeros((), dtype=rows.dtype, device=_xp.device(rows))
        rows = xp.where(used[..., None], rows, zero)
    return xp.sum(weights[..., None] * rows, axis=-2)


def binned_values(
    weights: Any,
    table: Any,
    /,
    *,
    low: int,
    high: int,
    q_offset: int,
    clip: bool,
    clip_future: bool = True,
    allowed: Any = None,
) -> Any:
    r"""``sum_j w_ij table[row(r_ij)]`` over the `allowed` pairs, by distance bins (efficient).

    The weights are summed by table row (`distance_bins`), and the bins are
    multiplied by the table with `relpos_ref.attention.weighted_sum`, whose
    `used` pairs are the rows some allowed key of each query reaches: a row no
    allowed key reaches (a masked key's, or a distance the grid never has)
    contributes nothing, even when it holds NaN or infinities.
    """
    xp = _xp.array_namespace(weights, table, allowed)
    t_q, t_k = weights.shape[-2:]
    allowed = every_pair_unless(allowed, t_q, t_k, xp=xp, device=_xp.device(weights))
    opts = {"low": low, "high": high, "q_offset": q_offset, "clip": clip,
            "clip_future": clip_future}
    bins = distance_bins(weights, **opts)
    reached = distance_bins(xp.astype(allowed, weights.dtype), **opts) > 0
    return weighted_sum(bins, table, used=reached)


def distance_bins(
    weights: Any, /, *, low: int, high: int, q_offset: int, clip: bool, clip_future: bool = True
) -> Any:
    r"""Attention weights summed by table row: the efficient relative-values term.

    .. math:: W[..., i, c] = \sum_{j:\ \text{row}(r_{ij}) = c} w[..., i, j]

    for a table with rows for ``r = low .. high`` (row ``r - low``). Rows
    inside the table hold one weight each (read exactly, by
    `relpos_ref.layouts.to_relative`); with ``clip=True`` the first row also
    collects every key before ``low`` and, if ``clip_future``, the last row
    every key after ``high`` (one masked row sum each). ``W @ table`` then equals
    ``sum_j w_ij table[row(r_ij)]`` without a ``(t_q, t_k, d)`` tensor.
    """
    xp = _xp.array_namespace(weights)
    *batch, t_q, t_k = weights.shape
    n = high - low + 1
    bins = to_relative(weights, n, offset=-low, q_offset=q_offset)
    if not clip or t_q == 0 or t_k == 0:
        return bins
    dev = _xp.device(weights)
    r = relative_positions(t_q, t_k, q_offset=q_offset, xp=xp, device=dev)
    # Keys before the one at r = low, and after the one at r = high: one masked row sum
    # each (vecdot reads the weights once and makes no (t_q, t_k) temporary)
    left = xp.vecdot(weights, xp.astype(r < low, weights.dtype))[..., None]
    if clip_future:
        right = xp.vecdot(weights, xp.astype(r > high, weights.dtype))[..., None]
    else:
        right = xp.zeros((*batch, t_q, 1), dtype=weights.dtype, device=dev)
    if n == 1:
        return bins + left + right
    middle = xp.zeros((*batch, t_q, n - 2), dtype=weights.dtype, device=dev)
    return bins + xp.concat([left, middle, right], axis=-1)


def count_reached(a: Any, edges: tuple[int, ...]) -> Any:
    """How many of the sorted host integers `edges` each entry of `a` reaches (``a >= e``).

    A binary search per entry (``searchsorted``), so no ``(..., len(edges))``
    comparison tensor is built. Same shape and dtype as `a`.
    """
    xp = _xp.array_namespace(a)
    sorted_edges = xp.asarray(edges, dtype=a.dtype, device=_xp.device(a))
    flat = xp.reshape(a, (-1,))
    found = xp.searchsorted(sorted_edges, flat, side="right")
    return xp.reshape(xp.astype(found, a.dtype), a.shape)


def check_value_table(name: str, table: Any, weights: Any) -> None:
    """Validate a relative value table against attention weights ``(..., t_q, t_k)``.

    The table is ``(n, d_v)`` or ``(h, n, d_v)``, floating and of the weights'
    dtype; per-head tables broadcast with the weights' leading axes (a mask
    may have widened them beyond ``q``'s).
    """
    heads = check_table(name, table, None)
    _xp.check_same_dtype(weights=weights, **{name: table})
    if heads is not None:
        broadcast_shapes(weights=tuple(weights.shape[:-2]), **{name: (heads,)})


def check_value_width(value_table: Any, v: Any) -> None:
    """Raise a `ValueError` unless a relative value table is as wide as ``v`` (``d_v``)."""
    if value_table is not None and value_table.shape[-1] != v.shape[-1]:
        msg = (
            f"`value_table` must have width d_v = {v.shape[-1]}, got shape "
            f"{tuple(value_table.shape)}"
        )
        raise ValueError(msg)


def gather_valid_rows(table: Any, index: Any, valid: Any) -> Any:
    """`gather_rows`, with the rows of invalid pairs set to zero (the definition's tensor)."""
    xp = _xp.array_namespace(table, index, valid)
    zero = xp.zeros((), dtype=table.dtype, device=_xp.device(table))
    return xp.where(valid[..., None], gather_rows(table, index), zero)


def binned_rows_vjp(
    g: Any, x: Any, table: Any, /, *, low: int, high: int, q_offset: int, clip: bool,
    clip_future: bool = True, allowed: Any = None,
) -> tuple[Any, Any]:
    r"""Transpose of :math:`P_{ij} = x_i \cdot a_{\text{row}(r_{ij})}` by distance bins.

    With :math:`G^\text{bin} = ` `distance_bins` of the gradient `g` (one
    column per table row, the clipped ends collecting every distance beyond),

    .. math:: \bar{x} = G^\text{bin} a, \qquad \bar{a} = \sum_\text{batch} G^{\text{bin}\top} x

    Returns ``(dx, d_table)``, ``d_table`` of the table's shape. Memory
    ``O(t_q (t_k + n))``, no per-distance layout. Rows no allowed pair
    reaches contribute nothing, even when NaN.
    """
    xp = _xp.array_namespace(g, x, table)
    opts = {"low": low, "high": high, "q_offset": q_offset, "clip": clip,
            "clip_future": clip_future}
    bins = distance_bins(g, **opts)
    t_q, t_k = g.shape[-2:]
    allowed = every_pair_unless(allowed, t_q, t_k, xp=xp, device=_xp.device(g))
    zero = xp.zeros((), dtype=g.dtype, device=_xp.device(g))
    reached = distance_bins(xp.astype(allowed, g.dtype), **opts) > zero
    dx = masked_product(bins, table, used=reached)
    d_rows = masked_product(xp.matrix_transpose(bins), x, used=xp.matrix_transpose(reached))
    return dx, sum_to_shape(d_rows, tuple(table.shape))


def binned_scalars_vjp(
    g: Any, table: Any, /, *, low: int, high: int, q_offset: int, clip: bool,
) -> Any:
    r"""Transpose of :math:`B_{ij} = b_{\text{row}(r_{ij})}`: the gradient summed by table entry.

    .. math:: \bar{b}_c = \sum_\text{batch} \sum_i G^\text{bin}_{ic}
    """
    xp = _xp.array_namespace(g, table)
    bins = distance_bins(g, low=low, high=high, q_offset=q_offset, clip=clip)
    return sum_to_shape(xp.sum(bins, axis=-2), tuple(table.shape))


def binned_values_vjp(
    weights: Any, d_output: Any, table: Any, index: Any, valid: Any, /, *, low: int,
    high: int, q_offset: int, clip: bool, clip_future: bool = True,
    output_batch: tuple[int, ...] = (),
) -> tuple[Any, Any]:
    r"""Transpose of :math:`z_i = \sum_j w_{ij}\, a_{\text{row}(r_{ij})}` by distance bins.

    .. math:: \bar{w}_{ij} = \bar{o}_i \cdot a_{\text{row}(r_{ij})}, \qquad
              \bar{a} = \sum_\text{batch} W^{\text{bin}\top} \bar{o}

    `index` and `valid` are the ``(t_q, t_k)`` table rows of the pairs.
    ``output_batch`` is the batch of the attention output where it is wider
    than the weights' (a ``v`` with more leading axes): the term ``z`` is
    broadcast there, so its cotangent is ``d_output`` broadcast to that batch.
    Returns ``(d_weights, d_table)``; masked pairs of ``d_weights`` are
    zeroed by the caller (with the rest of :math:`\bar{w}`).
    """
    xp = _xp.array_namespace(weights, d_output, table)
    batch = broadcast_shapes(weights=tuple(weights.shape[:-2]),
                             d_output=tuple(d_output.shape[:-2]), output=tuple(output_batch))
    d_out = xp.broadcast_to(d_output, (*batch, weights.shape[-2], table.shape[-1]))
    per_row = dot_rows(d_out, table)  # (..., t_q, n): o_i . a_c
    zero = xp.zeros((), dtype=weights.dtype, device=_xp.device(weights))
    d_weights = xp.where(valid, _take_per_row(per_row, index), zero)
    bins = distance_bins(weights, low=low, high=high, q_offset=q_offset, clip=clip,
                         clip_future=clip_future)
    d_rows = xp.matmul(xp.matrix_transpose(bins), d_out)
    return d_weights, sum_to_shape(d_rows, tuple(table.shape))


def binned_keys_values_vjp(
    q: Any, k: Any, v: Any, d_output: Any, call: Call, fwd: Forward, key_table: Any,
    value_table: Any, value_rows: Callable[[], tuple[Any, Any]], /, *, names: tuple[str, str],
    **bins: Any,
) -> dict[str, Any]:
    r"""The backward pass of relative keys and values read through clipped distance bins.

    Shaw et al.'s and the Music Transformer's VJP once the forward weights
    `fwd` are known: the value table's share of :math:`\bar{w}`
    (`binned_values_vjp`, rows of the pairs from ``value_rows()``), the
    softmax and content terms (`relpos_ref.gradients.core_vjp`), then the key
    table's transpose (`binned_rows_vjp`) with :math:`\bar{P} = s\,\bar{l}`.
    `names` are the two tables' argument names; `bins` the `distance_bins` options.
    """
    grads: dict[str, Any] = {}
    d_weights = None
    if value_table is not None:
        index, valid = value_rows()
        d_weights, grads[names[1]] = binned_values_vjp(
            fwd.weights, d_output, value_table, index, valid, **bins,
            output_batch=tuple(v.shape[:-2]))
    core = core_vjp(q, k, v, d_output, call, fwd, d_weights=d_weights)
    dq_table, d_key_table = binned_rows_vjp(core.d_logits * call.scale, q, key_table, **bins,
                                            allowed=fwd.allowed)
    return {
        "q": sum_to_shape(core.dq + dq_table, tuple(q.shape)),
        "k": sum_to_shape(core.dk, tuple(k.shape)),
        "v": sum_to_shape(core.dv, tuple(v.shape)),
        names[0]: d_key_table,
        **grads,
    }
