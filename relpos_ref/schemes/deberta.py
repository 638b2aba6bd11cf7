r"""DeBERTa's disentangled attention (He et al. 2021).

Each score adds, to the content term, a content-to-position (c2p) and a
position-to-content (p2c) term read from two relative tables of ``2 S`` rows
(``S``, the attention span, is half the rows):

.. math::
    e_{ij} = s\,\bigl(q_i \cdot k_j
             + q_i \cdot K^r_{\text{row}(b_{ij})}
             + k_j \cdot Q^r_{\text{row}(b_{ij})}\bigr),

    s = \frac{1}{\sqrt{d \cdot f}},\quad f = 1 + \#\text{terms},

with ``b = bucket(r)`` the bucketed key-minus-query distance and
``row(u) = clamp(u, -(S - 1), S) + S - 1``.

Canonical rows run past to future, row ``u + S - 1`` for ``u = -(S-1) .. S``
(the range has one more future row than past rows). DeBERTa's own code indexes
the same table by ``δ = i - j``, row ``δ + S``: its rows are ours in reverse
order (`relpos_ref.presets` converts them).

Both terms read the row of the same pair distance. Eq. (4) of the paper
writes ``δ(j, i)`` for p2c (the opposite sign), but the released code,
Microsoft's and HF transformers', reads ``δ(i, j)`` for both terms, and every
published checkpoint was trained with it; we follow the code (peer-tested
against transformers' ``DisentangledSelfAttention``).

Buckets: without `max_position`, ``b = r`` (DeBERTa v1); with it, log buckets
of size ``S`` (DeBERTa v2 and v3), `relpos_ref.schemes.deberta_buckets`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .. import _xp
from ..attention import attention
from ..calls import Call, Defaults, computes_in_float32, resolve_call
from ..distance_gradients import (
    distance_axis,
    key_rows_vjp,
    query_rows_vjp,
    table_gradient,
    table_rows,
)
from ..gradients import check_d_output, core_vjp, forward, sum_to_shape
from ..layouts import _take_per_row
from ._tables import (
    check_method,
    check_table,
    contract_rows,
    gather_rows,
    table_logits,
)
from .deberta_buckets import (
    _bucket_parameters,
    _span,
    deberta_bucket,
    deberta_bucket_boundaries,
    deberta_index,
    deberta_rows,
)

__all__ = [
    "DEFAULTS",
    "deberta_attention",
    "deberta_attention_vjp",
    "deberta_bucket",
    "deberta_bucket_boundaries",
    "deberta_call",
    "deberta_index",
    "deberta_logits",
    "deberta_rows",
    "deberta_scale",
]


def deberta_scale(d: int, tables: Sequence[Any] = ()) -> float:
    r"""DeBERTa's scale :math:`1/\sqrt{d f}`, ``f = 1 +`` the number of tables given.

    Parameters
    ----------
    d : int
        Feature width.
    tables : sequence
        ``(key_table, query_table)``, ``None`` for an omitted one.

    Examples
    --------
    >>> deberta_scale(8, (object(), None))  # c2p only: f = 2
    0.25
    """
    factor = 1 + sum(t is not None for t in tables)
    return 1.0 / math.sqrt(d * factor) if d > 0 else 1.0


#: DeBERTa's defaults: ``scale = 1/sqrt(d f)``, not causal, start-aligned queries.
DEFAULTS = Defaults(scale=deberta_scale)



@computes_in_float32
def deberta_logits(
    q: Any,
    k: Any,
    key_table: Any = None,
    query_table: Any = None,
    /,
    *,
    max_position: int | None = None,
    q_offset: int = 0,
    method: str = "efficient",
) -> Any:
    r"""c2p plus p2c: :math:`q_i \cdot K^r_{\text{row}_{ij}} + k_j \cdot Q^r_{\text{row}_{ij}}`.

    Unscaled; `deberta_attention` scales it with the content term.

    Parameters
    ----------
    q : floating array, shape ``(..., t_q, d)``
    k : floating array, shape ``(..., t_k, d)``
    key_table : floating array, shape ``(2S, d)`` or ``(h, 2S, d)``, optional
        ``K^r``, the relative embeddings projected by the key projection;
        omitted, there is no c2p term.
    query_table : floating array, shape ``(2S, d)`` or ``(h, 2S, d)``, optional
        ``Q^r``, projected by the query projection; omitted, no p2c term.
    max_position : int, optional
        Log buckets (DeBERTa v2/v3) up to this distance; ``None``, exact
        distances (v1).
    q_offset : int, optional
        Position of query 0.
    method : {"efficient", "definition"}, optional
        ``"definition"`` gathers ``(t_q, t_k, d)`` tensors of rows;
        ``"efficient"`` multiplies by the ``2S`` rows once and gathers the
        products (DeBERTa's own algorithm), memory ``O(t_q t_k + (t_q + t_k) S)``.

    Returns
    -------
    array, shape ``(..., t_q, t_k)``

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = xp.asarray([[1.0], [1.0]]); k = xp.asarray([[0.0], [10.0]])
    >>> Kr = xp.asarray([[-1.0], [0.0], [1.0], [2.0]])  # S = 2: u = -1, 0, 1, 2
    >>> deberta_logits(q, k, Kr)  # c2p only: q_i . Kr[row(j - i)]
    Array([[ 0.,  1.],
           [-1.,  0.]], dtype=array_api_strict.float64)
    >>> deberta_logits(q, k, None, Kr)  # p2c only: k_j . Kr[row(j - i)]
    Array([[ 0., 10.],
           [ 0.,  0.]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(q, k, key_table, query_table)
    check_method(method)
    span = _check_tables(q, key_table, query_table)
    t_q, t_k = q.shape[-2], k.shape[-2]
    dev = _xp.device(q)
    out = xp.zeros((*q.shape[:-2], t_q, t_k), dtype=q.dtype, device=dev)
    if span is None:
        return out
    index = deberta_index(
        t_q, t_k, span=span, max_position=max_position, q_offset=q_offset, xp=xp, device=dev
    )
    if key_table is not None:
        if method == "definition":
            out = out + contract_rows(q, gather_rows(key_table, index))
        else:
            out = out + _take_per_row(table_logits(q, key_table), index)
    if query_table is not None:
        if method == "definition":
            rows = gather_rows(query_table, index)  # (..., t_q, t_k, d)
            out = out + xp.sum(k[..., None, :, :] * rows, axis=-1)
        else:
            per_key = table_logits(k, query_table)  # (..., t_k, 2S): one row per key
            out = out + xp.matrix_transpose(_take_per_row(per_key, xp.matrix_transpose(index)))
    return out


def _check_tables(q: Any, key_table: Any, query_table: Any) -> int | None:
    # The span S shared by the tables given, None when there is none.
    spans = set()
    for name, table in (("key_table", key_table), ("query_table", query_table)):
        if table is not None:
            check_table(name, table, q, width=q.shape[-1])
            spans.add(_span(name, table))
    if len(spans) > 1:
        msg = (
            "`key_table` and `query_table` must have the same number of rows, got shapes "
            f"{tuple(key_table.shape)} and {tuple(query_table.shape)}"
        )
        raise ValueError(msg)
    return spans.pop() if spans else None


def deberta_call(
    q: Any,
    k: Any,
    v: Any,
    key_table: Any = None,
    query_table: Any = None,
    /,
    *,
    max_position: int | None,
    scale: float | None,
    mask: Any,
    causal: bool | None,
    q_offset: int | None,
    method: str,
) -> Call:
    """Validate a `deberta_attention` call and resolve its defaults (shared with the kernels).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((3, 8))
    >>> deberta_call(q, k, v, xp.zeros((4, 8)), max_position=None, scale=None, mask=None,
    ...              causal=None, q_offset=None, method="efficient").scale  # 1/sqrt(8 * 2)
    0.25
    """
    call = resolve_call(
        q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset, defaults=DEFAULTS,
        tables={"key_table": key_table, "query_table": query_table},
    )
    check_method(method)
    span = _check_tables(q, key_table, query_table)
    if span is not None and max_position is not None:
        _bucket_parameters(span, max_position)
    return call


@computes_in_float32
def deberta_attention(
    q: Any,
    k: Any,
    v: Any,
    key_table: Any = None,
    query_table: Any = None,
    /,
    *,
    max_position: int | None = None,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
    method: str = "efficient",
    return_weights: bool = False,
) -> Any:
    r"""Disentangled attention: content, c2p and p2c, scaled by ``1/sqrt(d f)``.

    .. math::
        w = \operatorname{softmax}\bigl(s\,(q k^\top + \text{c2p} + \text{p2c})\bigr),

        s = 1 / \sqrt{d\,(1 + \#\text{tables})}

    Parameters
    ----------
    q, k, v : floating arrays ``(..., t_q, d)``, ``(..., t_k, d)``, ``(..., t_k, d_v)``
    key_table, query_table : floating arrays ``(2S, d)`` or ``(h, 2S, d)``, optional
        As in `deberta_logits`; each one given adds its term and 1 to ``f``.
    max_position, method
        As in `deberta_logits`.
    scale : float, optional
        Default ``1 / sqrt(d f)``, DeBERTa's (`DEFAULTS`, `deberta_scale`).
    mask, causal, q_offset, return_weights
        As in `relpos_ref.attention`.

    Returns
    -------
    out : array ``(..., t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.reshape(xp.arange(48.0) / 48, (6, 8))
    >>> Kr = Qr = xp.reshape(xp.arange(128.0) / 128, (16, 8))  # S = 8
    >>> out = deberta_attention(q, k, v, Kr, Qr, max_position=32)
    >>> slow = deberta_attention(q, k, v, Kr, Qr, max_position=32, method="definition")
    >>> bool(xp.all(xp.abs(out - slow) < 1e-12))
    True
    """
    call = deberta_call(
        q, k, v, key_table, query_table, max_position=max_position, scale=scale, mask=mask,
        causal=causal, q_offset=q_offset, method=method,
    )
    position = deberta_logits(
        q, k, key_table, query_table, max_position=max_position, q_offset=call.q_offset,
        method=method,
    )
    return attention(
        q, k, v, scale=call.scale, mask=mask, causal=call.causal, q_offset=call.q_offset,
        position=position, return_weights=return_weights,
    )


@computes_in_float32
def deberta_attention_vjp(
    q: Any,
    k: Any,
    v: Any,
    key_table: Any = None,
    query_table: Any = None,
    /,
    *,
    d_output: Any,
    max_position: int | None = None,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
) -> dict[str, Any]:
    r"""Gradients of `deberta_attention` for the output's cotangent `d_output` (a VJP).

    With :math:`\bar{P} = s\,\bar{l}` laid out by distance, from the queries'
    side for c2p and from the keys' side for p2c,

    .. math::
        \bar{K}^r_c = \sum_{r:\ \text{row}(r) = c}\ \sum_i \bar{P}^\text{rel}_{ir}\, q_i,

        \bar{Q}^r_c = \sum_{r:\ \text{row}(r) = c}\ \sum_j \bar{P}^\text{rel}_{jr}\, k_j,

    and :math:`\bar{q}` (:math:`\bar{k}`) gains the rows of :math:`K^r`
    (:math:`Q^r`) weighted the same way.

    Parameters
    ----------
    q, k, v, key_table, query_table, max_position, scale, mask, causal, q_offset
        As in `deberta_attention`.
    d_output : floating array, shape ``(..., t_q, d_v)``
        :math:`\partial L / \partial\,\text{out}`; same dtype as `q`.

    Returns
    -------
    dict
        The gradient with respect to each of ``q``, ``k``, ``v`` and the tables given, of
        its shape and dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.ones((2, 1))
    >>> g = deberta_attention_vjp(q, k, v, xp.zeros((4, 1)), d_output=xp.ones((2, 1)))
    >>> sorted(g)
    ['k', 'key_table', 'q', 'v']
    """
    call = deberta_call(
        q, k, v, key_table, query_table, max_position=max_position, scale=scale, mask=mask,
        causal=causal, q_offset=q_offset, method="efficient",
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    position = deberta_logits(
        q, k, key_table, query_table, max_position=max_position, q_offset=call.q_offset
    )
    fwd = forward(q, k, call, mask=mask, position=position)
    core = core_vjp(q, k, v, d_output, call, fwd)
    xp, dev = call.xp, _xp.device(q)
    d_position = core.d_logits * call.scale
    axis = distance_axis(call.t_q, call.t_k, call.q_offset)
    dq, dk = core.dq, core.dk
    grads: dict[str, Any] = {}
    span = _check_tables(q, key_table, query_table)
    if span is not None:
        r = xp.arange(axis.n, dtype=_xp.index_dtype(xp, dev), device=dev) + axis.low
        index = deberta_rows(r, span=span, max_position=max_position)
        every = xp.ones((axis.n,), dtype=xp.bool, device=dev)
        if key_table is not None:
            d_q, d_rows = query_rows_vjp(d_position, q, table_rows(key_table, index), axis,
                                         allowed=fwd.allowed)
            dq = dq + d_q
            grads["key_table"] = table_gradient(d_rows, key_table, index, every)
        if query_table is not None:
            d_k, d_rows = key_rows_vjp(d_position, k, table_rows(query_table, index), axis,
                                       allowed=fwd.allowed)
            dk = dk + d_k
            grads["query_table"] = table_gradient(d_rows, query_table, index, every)
    return {
        "q": sum_to_shape(dq, q.shape),
        "k": sum_to_shape(dk, k.shape),
        "v": sum_to_shape(core.dv, v.shape),
        **grads,
    }
