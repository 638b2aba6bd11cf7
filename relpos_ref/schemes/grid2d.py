r"""2D relative attention on an ``h x w`` grid (Ramachandran et al. 2019; BoTNet).

Tokens are in row-major order: token ``n`` sits at row ``x = n // w`` and
column ``y = n % w``. Separate tables for row and column distances give

.. math:: P_{nm} = q_n \cdot R^h_{x_m - x_n + h - 1} + q_n \cdot R^w_{y_m - y_n + w - 1},

with ``R^h`` of ``2h - 1`` rows and ``R^w`` of ``2w - 1`` rows. The efficient
path computes ``Q R^{hT}`` and ``Q R^{wT}`` and lays each out along its own
axis with `relpos_ref.layouts.pad_flatten_reshape`, then broadcasts over the
other axis: memory ``O((hw)^2)``, never ``O((hw)^2 d)``.
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._validate import positive_int
from ..attention import attention
from ..calls import PLAIN, Call, computes_in_float32, resolve_call
from ..distance_gradients import every_pair_unless
from ..gradients import check_d_output, core_vjp, forward, masked_product, sum_to_shape
from ..layouts import _take_per_row, pad_flatten_reshape
from ..positions import grid_positions
from ._tables import check_method, check_table, contract_rows, gather_rows, table_logits

__all__ = [
    "DEFAULTS",
    "grid2d_attention",
    "grid2d_attention_vjp",
    "grid2d_call",
    "grid2d_index",
    "grid2d_logits",
]

#: 2D relative attention's defaults: ``scale = 1/sqrt(d)``, not causal (raster order if so).
DEFAULTS = PLAIN


def grid2d_index(height: int, width: int, /, *, xp: Any, device: Any = None) -> tuple[Any, Any]:
    """Rows of the row table and of the column table for each (query, key) token pair.

    Parameters
    ----------
    height, width : int
        Grid size, ``>= 1``.
    xp : namespace
        Array API namespace of the result.
    device : optional
        Device of the result.

    Returns
    -------
    rows, cols : arrays, shape ``(hw, hw)``
        ``x_m - x_n + h - 1`` and ``y_m - y_n + w - 1``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> rows, cols = grid2d_index(1, 3, xp=xp)
    >>> rows
    Array([[0, 0, 0],
           [0, 0, 0],
           [0, 0, 0]], dtype=array_api_strict.int64)
    >>> cols
    Array([[2, 3, 4],
           [1, 2, 3],
           [0, 1, 2]], dtype=array_api_strict.int64)
    """
    height = positive_int("height", height)
    width = positive_int("width", width)
    x, y = grid_positions(height, width, xp=xp, device=device)
    return x[None, :] - x[:, None] + (height - 1), y[None, :] - y[:, None] + (width - 1)


@computes_in_float32
def grid2d_logits(
    q: Any,
    row_table: Any,
    col_table: Any,
    /,
    *,
    height: int,
    width: int,
    method: str = "efficient",
) -> Any:
    r"""Positional term of 2D relative attention on a row-major ``height x width`` grid.

    Parameters
    ----------
    q : floating array, shape ``(..., height * width, d)``
    row_table : floating array, shape ``(2 height - 1, d)`` or ``(h, 2 height - 1, d)``
    col_table : floating array, shape ``(2 width - 1, d)`` or ``(h, 2 width - 1, d)``
    height, width : int
        Grid size; non-square grids work.
    method : {"efficient", "definition"}, optional

    Returns
    -------
    array, shape ``(..., height * width, height * width)``

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = xp.ones((2, 1))  # a 1 x 2 grid
    >>> Rh = xp.asarray([[0.0]])
    >>> Rw = xp.asarray([[-1.0], [0.0], [1.0]])
    >>> grid2d_logits(q, Rh, Rw, height=1, width=2)
    Array([[ 0.,  1.],
           [-1.,  0.]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(q, row_table, col_table)
    check_method(method)
    height, width = _check_grid(q, row_table, col_table, height, width)
    n = height * width
    if method == "definition":
        rows, cols = grid2d_index(height, width, xp=xp, device=_xp.device(q))
        return contract_rows(q, gather_rows(row_table, rows)) + contract_rows(
            q, gather_rows(col_table, cols)
        )
    batch = tuple(q.shape[:-2])
    nb = len(batch)
    # Row term: queries (x, y) -> move y before x, lay out along x.
    ph = xp.reshape(table_logits(q, row_table), (*batch, height, width, 2 * height - 1))
    ph = xp.permute_dims(ph, (*range(nb), nb + 1, nb, nb + 2))
    row_term = pad_flatten_reshape(ph, height, offset=height - 1)  # (*batch, w_q, h_q, h_k)
    row_term = xp.permute_dims(row_term, (*range(nb), nb + 1, nb, nb + 2))[..., None]
    # Column term: lay out along y directly.
    pw = xp.reshape(table_logits(q, col_table), (*batch, height, width, 2 * width - 1))
    col_term = pad_flatten_reshape(pw, width, offset=width - 1)[
        ..., None, :
    ]  # (*batch, h_q, w_q, 1, w_k)
    return xp.reshape(row_term + col_term, (*batch, n, n))


def _check_grid(q: Any, row_table: Any, col_table: Any, height: int, width: int) -> tuple:
    height = positive_int("height", height)
    width = positive_int("width", width)
    n = height * width
    if q.shape[-2] != n:
        msg = f"`q` must have height * width = {n} tokens on axis -2, got shape {tuple(q.shape)}"
        raise ValueError(msg)
    for name, table, side, size in (
        ("row_table", row_table, "height", height),
        ("col_table", col_table, "width", width),
    ):
        check_table(
            name, table, q, rows=2 * size - 1,
            rows_rule=f" (2 {side} - 1 for {side} = {size})", width=q.shape[-1],
        )
    return height, width


def grid2d_call(
    q: Any,
    k: Any,
    v: Any,
    row_table: Any,
    col_table: Any,
    /,
    *,
    height: int,
    width: int,
    scale: float | None,
    mask: Any,
    causal: bool | None,
    method: str,
) -> Call:
    """Validate a `grid2d_attention` call and resolve its defaults (shared with the kernels).

    Self-attention over the grid's tokens: ``q`` and ``k`` both have
    ``height * width`` of them, and ``q_offset`` is 0.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = xp.zeros((6, 4))
    >>> grid2d_call(q, q, q, xp.zeros((3, 4)), xp.zeros((5, 4)), height=2, width=3,
    ...             scale=None, mask=None, causal=None, method="efficient").t_k
    6
    """
    call = resolve_call(
        q, k, v, scale=scale, mask=mask, causal=causal, q_offset=0, defaults=DEFAULTS,
        tables={"row_table": row_table, "col_table": col_table},
    )
    check_method(method)
    height, width = _check_grid(q, row_table, col_table, height, width)
    if call.t_k != height * width:
        msg = (
            f"`k` must have height * width = {height * width} tokens on axis -2, "
            f"got shape {tuple(k.shape)}"
        )
        raise ValueError(msg)
    return call


@computes_in_float32
def grid2d_attention(
    q: Any,
    k: Any,
    v: Any,
    row_table: Any,
    col_table: Any,
    /,
    *,
    height: int,
    width: int,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    method: str = "efficient",
    return_weights: bool = False,
) -> Any:
    r"""Self-attention over a row-major grid with 2D relative position embeddings.

    .. math:: w = \operatorname{softmax}\bigl(s\,(q k^\top + P)\bigr)

    Parameters
    ----------
    q, k, v : floating arrays ``(..., hw, d)``, ``(..., hw, d)``, ``(..., hw, d_v)``
    row_table, col_table, height, width, method
        As in `grid2d_logits`.
    scale, mask, causal, return_weights
        As in `relpos_ref.attention` (``causal`` in raster order; defaults
        `DEFAULTS`).

    Returns
    -------
    out : array ``(..., hw, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = xp.ones((6, 4))
    >>> grid2d_attention(q, q, q, xp.zeros((3, 4)), xp.zeros((5, 4)), height=2, width=3).shape
    (6, 4)
    """
    call = grid2d_call(
        q, k, v, row_table, col_table, height=height, width=width, scale=scale, mask=mask,
        causal=causal, method=method,
    )
    position = grid2d_logits(q, row_table, col_table, height=height, width=width, method=method)
    return attention(
        q, k, v, scale=call.scale, mask=mask, causal=call.causal, position=position,
        return_weights=return_weights,
    )


def _by_offset(x: Any, coordinate: Any, size: int, sum_axis: int) -> Any:
    # (..., hw, hw) per key token -> (..., hw, 2 size - 1) per offset of one coordinate:
    # summed over the other coordinate of the key, then read at the query's own + offset.
    xp = _xp.array_namespace(x)
    other = x.shape[-1] // size  # not -1: an empty batch leaves -1 undetermined
    shape = (size, other) if sum_axis == -1 else (other, size)  # key rows, or key columns
    per_key = xp.sum(xp.reshape(x, (*x.shape[:-1], *shape)), axis=sum_axis)
    offsets = xp.arange(2 * size - 1, dtype=coordinate.dtype, device=_xp.device(coordinate))
    key = coordinate[:, None] + offsets[None, :] - (size - 1)
    inside = (key >= 0) & (key < size)
    zero = xp.zeros((), dtype=x.dtype, device=_xp.device(x))
    return xp.where(inside, _take_per_row(per_key, xp.clip(key, 0, size - 1)), zero)


@computes_in_float32
def grid2d_attention_vjp(
    q: Any,
    k: Any,
    v: Any,
    row_table: Any,
    col_table: Any,
    /,
    *,
    d_output: Any,
    height: int,
    width: int,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
) -> dict[str, Any]:
    r"""Gradients of `grid2d_attention` for the output's cotangent `d_output` (a VJP).

    .. math:: \bar{R}_{dy} = \sum_n \Bigl(\sum_{m:\ y_m - y_n = dy} \bar{P}_{nm}\Bigr) q_n,
              \qquad
              \bar{q}_n \mathrel{+}= \sum_{dy} \Bigl(\sum_{m:\ y_m - y_n = dy}
              \bar{P}_{nm}\Bigr) R_{dy} + (\text{the same for columns})

    with :math:`\bar{P} = s\,\bar{l}`: the gradient is summed over the key's
    other coordinate, then read per query at each offset (no scatter).

    Parameters
    ----------
    q, k, v, row_table, col_table, height, width, scale, mask, causal
        As in `grid2d_attention`.
    d_output : floating array, shape ``(..., t_q, d_v)``
        :math:`\partial L / \partial\,\text{out}`; same dtype as `q`.

    Returns
    -------
    dict
        The gradient with respect to each of ``q``, ``k``, ``v``, ``row_table`` and
        ``col_table``, of its shape and dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = xp.ones((2, 1))
    >>> g = grid2d_attention_vjp(q, q, q, xp.zeros((1, 1)), xp.zeros((3, 1)),
    ...                          d_output=xp.ones((2, 1)), height=1, width=2)
    >>> g["col_table"][:, 0]
    Array([0., 0., 0.], dtype=array_api_strict.float64)
    """
    call = grid2d_call(
        q, k, v, row_table, col_table, height=height, width=width, scale=scale, mask=mask,
        causal=causal, method="efficient",
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    position = grid2d_logits(q, row_table, col_table, height=height, width=width)
    fwd = forward(q, k, call, mask=mask, position=position)
    core = core_vjp(q, k, v, d_output, call, fwd)
    xp, dev = call.xp, _xp.device(q)
    d_position = core.d_logits * call.scale
    rows, cols = grid_positions(height, width, xp=xp, device=dev)
    allowed = every_pair_unless(fwd.allowed, call.t_q, call.t_k, xp=xp, device=dev)
    reach = xp.astype(allowed, d_position.dtype)
    grads = {}
    dq = core.dq
    zero = xp.zeros((), dtype=d_position.dtype, device=dev)
    for name, table, coordinate, size, axis in (("row_table", row_table, rows, height, -1),
                                                ("col_table", col_table, cols, width, -2)):
        g = _by_offset(d_position, coordinate, size, axis)
        used = _by_offset(reach, coordinate, size, axis) > zero
        dq = dq + masked_product(g, table, used=used)
        d_rows = masked_product(xp.matrix_transpose(g), q, used=xp.matrix_transpose(used))
        grads[name] = sum_to_shape(d_rows, tuple(table.shape))
    return {
        "q": sum_to_shape(dq, q.shape),
        "k": sum_to_shape(core.dk, k.shape),
        "v": sum_to_shape(core.dv, v.shape),
        **grads,
    }
