r"""Absolute position embeddings as a score term ("AbsPosEmb1D" style).

A learned row per key position: the positional term is
:math:`q_i \cdot R_j`, with ``R`` of shape ``(t_max, d)`` (or per head).
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._validate import nonnegative_int
from ..attention import attention
from ..calls import PLAIN, Call, computes_in_float32, resolve_call
from ..gradients import (
    check_d_output,
    core_vjp,
    forward,
    masked_product,
    sum_to_shape,
)
from ..positions import relative_positions
from ._tables import check_table, table_logits

__all__ = [
    "DEFAULTS",
    "absolute_attention",
    "absolute_attention_vjp",
    "absolute_call",
    "absolute_index",
    "absolute_logits",
]

#: Absolute embeddings' defaults: ``scale = 1/sqrt(d)``, not causal, start-aligned queries.
DEFAULTS = PLAIN


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
    >>> import array_api_strict as xp
    >>> absolute_index(2, 3, xp=xp)
    Array([[0, 1, 2],
           [0, 1, 2]], dtype=array_api_strict.int64)
    """
    r = relative_positions(t_q, t_k, xp=xp, device=device)
    return r + xp.arange(t_q, dtype=r.dtype, device=device)[:, None]


@computes_in_float32
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
    >>> import array_api_strict as xp
    >>> q = xp.asarray([[1.0, 0.0], [0.0, 1.0]])
    >>> R = xp.asarray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    >>> absolute_logits(q, R, 3)
    Array([[1., 3., 5.],
           [2., 4., 6.]], dtype=array_api_strict.float64)
    """
    t_k = nonnegative_int("t_k", t_k)
    _check_positions(q, table, t_k)
    return table_logits(q, table[..., :t_k, :])


def _check_positions(q: Any, table: Any, t_k: int) -> None:
    check_table("table", table, q, width=q.shape[-1])
    t_max = table.shape[-2]
    if t_k > t_max:
        msg = f"`t_k` = {t_k} exceeds the table's {t_max} positions (shape {tuple(table.shape)})"
        raise ValueError(msg)


def absolute_call(
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
) -> Call:
    """Validate an `absolute_attention` call and resolve its defaults (shared with the kernels).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((3, 2))
    >>> absolute_call(q, k, v, xp.zeros((4, 2)), scale=None, mask=None, causal=None,
    ...               q_offset=None).t_k
    3
    """
    call = resolve_call(
        q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset, defaults=DEFAULTS,
        tables={"table": table},
    )
    _check_positions(q, table, call.t_k)
    return call


@computes_in_float32
def absolute_attention(
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
    return_weights: bool = False,
) -> Any:
    r"""Attention with an absolute key-position term.

    .. math:: \text{logits}_{ij} = s\,(q_i \cdot k_j + q_i \cdot R_j)

    Parameters
    ----------
    q, k, v : floating arrays ``(..., t_q, d)``, ``(..., t_k, d)``, ``(..., t_k, d_v)``
    table : floating array, shape ``(t_max, d)`` or ``(h, t_max, d)``
    scale, mask, causal, q_offset, return_weights
        As in `relpos_ref.attention` (defaults `DEFAULTS`).

    Returns
    -------
    out : array ``(..., t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.eye(2)
    >>> absolute_attention(q, k, v, xp.zeros((4, 2))).shape
    (2, 2)
    """
    call = absolute_call(
        q, k, v, table, scale=scale, mask=mask, causal=causal, q_offset=q_offset
    )
    position = absolute_logits(q, table, call.t_k)
    return attention(
        q, k, v, scale=call.scale, mask=mask, causal=call.causal, q_offset=call.q_offset,
        position=position, return_weights=return_weights,
    )


@computes_in_float32
def absolute_attention_vjp(
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
) -> dict[str, Any]:
    r"""Gradients of `absolute_attention` for the output's cotangent `d_output` (a VJP).

    .. math:: \bar{R}_j = \sum_i \bar{P}_{ij}\, q_i \ (j < t_k), \qquad
              \bar{q}_i \mathrel{+}= \sum_j \bar{P}_{ij}\, R_j

    with :math:`\bar{P} = s\,\bar{l}`; rows of positions past ``t_k`` get zero.

    Parameters
    ----------
    q, k, v, table, scale, mask, causal, q_offset
        As in `absolute_attention`.
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
    >>> absolute_attention_vjp(q, k, v, xp.zeros((3, 1)), d_output=xp.ones((2, 1)))["table"]
    Array([[0.],
           [0.],
           [0.]], dtype=array_api_strict.float64)
    """
    call = absolute_call(
        q, k, v, table, scale=scale, mask=mask, causal=causal, q_offset=q_offset
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    rows = table[..., : call.t_k, :]
    fwd = forward(q, k, call, mask=mask, position=absolute_logits(q, table, call.t_k))
    core = core_vjp(q, k, v, d_output, call, fwd)
    xp = call.xp
    d_position = core.d_logits * call.scale
    allowed_t = None if fwd.allowed is None else xp.matrix_transpose(fwd.allowed)
    d_rows = masked_product(xp.matrix_transpose(d_position), q, used=allowed_t)
    d_rows = sum_to_shape(d_rows, tuple(rows.shape))
    rest = xp.zeros((*table.shape[:-2], table.shape[-2] - call.t_k, table.shape[-1]),
                    dtype=table.dtype, device=_xp.device(table))
    return {
        "q": sum_to_shape(core.dq + masked_product(d_position, rows, used=fwd.allowed),
                          q.shape),
        "k": sum_to_shape(core.dk, k.shape),
        "v": sum_to_shape(core.dv, v.shape),
        "table": xp.concat([d_rows, rest], axis=-2),
    }
