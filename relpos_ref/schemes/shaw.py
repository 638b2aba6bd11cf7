r"""Relative position representations of Shaw et al. (2018), keys and values.

.. math::
    e_{ij} = s\,\bigl(q_i \cdot k_j + q_i \cdot a^K_{\text{idx}(r_{ij})}\bigr),

    z_i = \sum_j w_{ij}\,\bigl(v_j + a^V_{\text{idx}(r_{ij})}\bigr),

with ``r = j - (i + q_offset)``, tables of ``2K + 1`` rows (row ``r + K``)
and a policy for ``|r| > K``: ``"clip"`` (the paper), ``"zero"`` or ``"error"``.
With ``max_past=P`` the clipping is asymmetric, as in wav2vec2-BERT's
``relative_key``: tables of ``P + K + 1`` rows for ``r = -P .. K``, row
``clip(r, -P, K) + P``.

The efficient path never builds a ``(t_q, t_k, d)`` tensor: the key term is
``q a^K^T`` (``t_q x (2K+1)``) laid out by the table index, and the value
term bins the weights by distance (exact entries for ``|r| < K``, masked row
sums for the clipped ends) and multiplies the ``t_q x (2K+1)`` bins by ``a^V``.
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._validate import check_bool, check_choice
from ..attention import allowed_keys, attention
from ..calls import PLAIN, Call, computes_in_float32, resolve_call
from ..gradients import check_d_output, forward
from ..layouts import _take_per_row
from ..positions import (
    BEYOND_POLICIES,
    TableIndex,
    check_distances_in_table,
    extent_text,
)
from ._tables import (
    binned_keys_values_vjp,
    binned_values,
    check_method,
    check_table,
    check_value_table,
    check_value_width,
    contract_rows,
    gather_rows,
    gather_valid_rows,
    table_logits,
    weighted_rows,
)
from .clipped_index import shaw_index, two_sided_extent

__all__ = [
    "DEFAULTS",
    "shaw_attention",
    "shaw_attention_vjp",
    "shaw_call",
    "shaw_index",
    "shaw_logits",
    "shaw_values",
    "two_sided_extent",
]

#: Shaw et al.'s defaults: ``scale = 1/sqrt(d)``, not causal, start-aligned queries.
DEFAULTS = PLAIN


def _extent(name: str, table: Any, max_past: int | None) -> tuple[int, int]:
    return two_sided_extent(name, table.shape[-2], tuple(table.shape), max_past)


@computes_in_float32
def shaw_logits(
    q: Any,
    key_table: Any,
    /,
    t_k: int,
    *,
    q_offset: int = 0,
    beyond: str = "clip",
    method: str = "efficient",
    max_past: int | None = None,
) -> Any:
    r"""Key term :math:`P_{ij} = q_i \cdot a^K_{\text{idx}(r_{ij})}` (before scaling).

    Parameters
    ----------
    q : floating array, shape ``(..., t_q, d)``
    key_table : floating array, shape ``(2K+1, d)`` or ``(h, 2K+1, d)``
        Row ``r + K`` for distance ``r`` (``r + P``, ``P + K + 1`` rows,
        with `max_past`).
    t_k : int
        Number of keys.
    q_offset : int, optional
        Position of query 0.
    beyond : {"clip", "zero", "error"}, optional
        Distances ``|r| > K``: the row of ``±K``, a zero term, or an error.
    method : {"efficient", "definition"}, optional
        ``"definition"`` gathers a ``(t_q, t_k, d)`` tensor of rows;
        ``"efficient"`` gathers from ``q a^K^T``, memory ``O(t_q (t_k + K))``.
    max_past : int, optional
        ``P``: asymmetric clipping, rows for ``r = -P .. K``; default: a
        symmetric table of ``2K + 1`` rows.

    Returns
    -------
    array, shape ``(..., t_q, t_k)``

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = xp.asarray([[1.0]])
    >>> aK = xp.asarray([[-1.0], [0.0], [1.0]])  # K = 1: r = -1, 0, 1
    >>> shaw_logits(q, aK, 4)
    Array([[0., 1., 1., 1.]], dtype=array_api_strict.float64)
    >>> shaw_logits(q, aK, 4, beyond="zero")
    Array([[0., 1., 0., 0.]], dtype=array_api_strict.float64)
    >>> shaw_logits(q, aK, 4, max_past=2)  # r = -2, -1, 0: r = 0 .. 3 read row 2
    Array([[1., 1., 1., 1.]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(q, key_table)
    check_method(method)
    check_table("key_table", key_table, q, width=q.shape[-1])
    past, k = _extent("key_table", key_table, max_past)
    t_q = q.shape[-2]
    index, valid = shaw_index(
        t_q, t_k, max_distance=k, q_offset=q_offset, beyond=beyond, xp=xp, device=_xp.device(q),
        max_past=None if max_past is None else past,
    )
    if method == "definition":
        return contract_rows(q, gather_valid_rows(key_table, index, valid))
    out = _take_per_row(table_logits(q, key_table), index)
    if beyond == "clip":
        return out
    return xp.where(valid, out, xp.zeros((), dtype=q.dtype, device=_xp.device(q)))


@computes_in_float32
def shaw_values(
    weights: Any,
    value_table: Any,
    /,
    *,
    q_offset: int = 0,
    beyond: str = "clip",
    method: str = "efficient",
    allowed: Any = None,
    max_past: int | None = None,
) -> Any:
    r"""Value term :math:`\sum_j w_{ij}\, a^V_{\text{idx}(r_{ij})}`.

    Parameters
    ----------
    weights : floating array, shape ``(..., t_q, t_k)``
        Attention weights.
    value_table : floating array, shape ``(2K+1, d_v)`` or ``(h, 2K+1, d_v)``
        ``P + K + 1`` rows with `max_past`.
    q_offset, beyond, max_past
        As in `shaw_logits`.
    allowed : bool array broadcastable to ``(..., t_q, t_k)``, optional
        The keys each query attends to (`relpos_ref.allowed_keys`); a row
        read only through other keys contributes nothing, even NaN. Default:
        every key.
    method : {"efficient", "definition"}, optional
        ``"definition"`` gathers a ``(t_q, t_k, d_v)`` tensor of rows;
        ``"efficient"`` sums the weights into one distance bin per table
        row, memory ``O(t_q (t_k + K))``.

    Returns
    -------
    array, shape ``(..., t_q, d_v)``

    Examples
    --------
    >>> import array_api_strict as xp
    >>> w = xp.asarray([[0.5, 0.25, 0.25]])
    >>> aV = xp.asarray([[1.0], [2.0], [4.0]])  # K = 1
    >>> shaw_values(w, aV)  # r = 0, 1, 2 -> rows 1, 2, 2
    Array([[3.]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(weights, value_table)
    check_method(method)
    check_value_table("value_table", value_table, weights)
    check_choice("beyond", beyond, BEYOND_POLICIES)
    past, k = _extent("value_table", value_table, max_past)
    t_q, t_k = weights.shape[-2:]
    if method == "definition":
        index, valid = shaw_index(
            t_q,
            t_k,
            max_distance=k,
            q_offset=q_offset,
            beyond=beyond,
            max_past=None if max_past is None else past,
            xp=xp,
            device=_xp.device(weights),
        )
        used = valid if allowed is None else valid & allowed
        return weighted_rows(weights, gather_rows(value_table, index), used)
    if beyond == "error":
        check_distances_in_table(t_q, t_k, q_offset=q_offset, low=-past, high=k,
                                 what=extent_text(past, k, max_past))
        beyond = "clip"
    return binned_values(
        weights, value_table, low=-past, high=k, q_offset=q_offset, clip=beyond == "clip",
        allowed=allowed,
    )


def shaw_call(
    q: Any,
    k: Any,
    v: Any,
    key_table: Any,
    value_table: Any = None,
    /,
    *,
    scale: float | None,
    mask: Any,
    causal: bool | None,
    q_offset: int | None,
    beyond: str,
    method: str,
    max_past: int | None = None,
) -> Call:
    """Validate a `shaw_attention` call and resolve its defaults (shared with the kernels).

    Returns
    -------
    relpos_ref.attention.Call

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((3, 4))
    >>> shaw_call(q, k, v, xp.zeros((5, 4)), scale=None, mask=None, causal=None,
    ...           q_offset=None, beyond="clip", method="efficient").scale
    0.5
    """
    call = resolve_call(
        q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset, defaults=DEFAULTS,
        tables={"key_table": key_table, "value_table": value_table},
    )
    check_method(method)
    check_choice("beyond", beyond, BEYOND_POLICIES)
    check_table("key_table", key_table, q, width=q.shape[-1])
    _extent("key_table", key_table, max_past)
    if value_table is not None:
        if value_table.shape[-2:-1] != key_table.shape[-2:-1]:
            msg = (
                f"`value_table` must have as many rows as `key_table`, got shapes "
                f"{tuple(value_table.shape)} and {tuple(key_table.shape)}"
            )
            raise ValueError(msg)
        check_value_width(value_table, v)
        check_table("value_table", value_table, q)
    return call


@computes_in_float32
def shaw_attention(
    q: Any,
    k: Any,
    v: Any,
    key_table: Any,
    value_table: Any = None,
    /,
    *,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
    beyond: str = "clip",
    method: str = "efficient",
    return_weights: bool = False,
    max_past: int | None = None,
) -> Any:
    r"""Self-attention with relative position representations (Shaw et al. 2018).

    .. math::
        w = \operatorname{softmax}\bigl(s\,(q k^\top + P)\bigr),\quad
        P_{ij} = q_i \cdot a^K_{\text{idx}(r_{ij})},

        z_i = \sum_j w_{ij} (v_j + a^V_{\text{idx}(r_{ij})})

    Parameters
    ----------
    q, k, v : floating arrays ``(..., t_q, d)``, ``(..., t_k, d)``, ``(..., t_k, d_v)``
    key_table : floating array, ``(2K+1, d)`` or ``(h, 2K+1, d)``
        ``P + K + 1`` rows with `max_past`.
    value_table : floating array, ``(2K+1, d_v)`` or ``(h, 2K+1, d_v)``, optional
        Relative value embeddings, as many rows as `key_table`; omitted, only
        the key term is used.
    scale, mask, causal, q_offset, return_weights
        As in `relpos_ref.attention` (defaults `DEFAULTS`: ``1/sqrt(d)``,
        not causal, ``q_offset = 0``).
    beyond, method, max_past
        As in `shaw_logits`: ``max_past=P`` clips ``r`` to ``[-P, K]``, the
        left and right maxima of wav2vec2-BERT's ``relative_key``.

    Returns
    -------
    out : array ``(..., t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.eye(3)
    >>> out = shaw_attention(q, k, v, xp.zeros((5, 3)), xp.zeros((5, 3)))
    >>> slow = shaw_attention(q, k, v, xp.zeros((5, 3)), method="definition")
    >>> bool(xp.all(xp.abs(out - slow) < 1e-12))
    True
    >>> out = shaw_attention(q, k, v, xp.zeros((4, 3)), max_past=2)  # r = -2 .. 1
    """
    call = shaw_call(
        q, k, v, key_table, value_table, scale=scale, mask=mask, causal=causal,
        q_offset=q_offset, beyond=beyond, method=method, max_past=max_past,
    )
    position = shaw_logits(
        q, key_table, call.t_k, q_offset=call.q_offset, beyond=beyond, method=method,
        max_past=max_past,
    )
    out, weights = attention(
        q, k, v, scale=call.scale, mask=mask, causal=call.causal, q_offset=call.q_offset,
        position=position, return_weights=True,
    )
    if value_table is not None:
        allowed = allowed_keys(
            call.t_q, call.t_k, mask=mask, causal=call.causal, q_offset=call.q_offset,
            xp=call.xp, device=_xp.device(q),
        )
        out = out + shaw_values(
            weights, value_table, q_offset=call.q_offset, beyond=beyond, method=method,
            allowed=allowed, max_past=max_past,
        )
    return (out, weights) if check_bool("return_weights", return_weights) else out


@computes_in_float32
def shaw_attention_vjp(
    q: Any,
    k: Any,
    v: Any,
    key_table: Any,
    value_table: Any = None,
    /,
    *,
    d_output: Any,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
    beyond: str = "clip",
    max_past: int | None = None,
) -> dict[str, Any]:
    r"""Gradients of `shaw_attention` for the output's cotangent `d_output` (a VJP).

    With :math:`\bar{l}` the logits' gradient (`relpos_ref.gradients`) and
    :math:`\bar{P} = s\,\bar{l}` laid out by distance,

    .. math::
        \bar{q}_i = s \sum_j \bar{l}_{ij}\, k_j
                    + \sum_r \bar{P}^\text{rel}_{ir}\, a^K_{\text{idx}(r)},

        \bar{a}^K_c = \sum_{r:\ \text{idx}(r) = c}\ \sum_i \bar{P}^\text{rel}_{ir}\, q_i,

        \bar{a}^V_c = \sum_{r:\ \text{idx}(r) = c}\ \sum_i w^\text{rel}_{ir}\, \bar{o}_i,

    and the value table adds :math:`\bar{o}_i \cdot a^V_{\text{idx}(r_{ij})}` to
    :math:`\bar{w}_{ij}`. With ``beyond="clip"`` the end rows collect every
    distance beyond ``±K`` (beyond ``-P`` and ``K`` with `max_past`); with
    ``"zero"`` those distances add nothing.

    Parameters
    ----------
    q, k, v, key_table, value_table, scale, mask, causal, q_offset, beyond, max_past
        As in `shaw_attention`.
    d_output : floating array, shape ``(..., t_q, d_v)``
        :math:`\partial L / \partial\,\text{out}`; same dtype as `q`.

    Returns
    -------
    dict
        ``"q"``, ``"k"``, ``"v"``, ``"key_table"`` and, when given,
        ``"value_table"``: the gradient with respect to each, of its shape and dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.ones((1, 2, 1))
    >>> aK = xp.zeros((3, 1))  # K = 1
    >>> g = shaw_attention_vjp(q, k, v, aK, d_output=xp.ones((1, 2, 1)))
    >>> g["v"][0, :, 0]
    Array([1., 1.], dtype=array_api_strict.float64)
    >>> g["key_table"][:, 0]  # v is the same at every key: no table row moves the output
    Array([0., 0., 0.], dtype=array_api_strict.float64)
    """
    call = shaw_call(
        q, k, v, key_table, value_table, scale=scale, mask=mask, causal=causal,
        q_offset=q_offset, beyond=beyond, method="efficient", max_past=max_past,
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    position = shaw_logits(q, key_table, call.t_k, q_offset=call.q_offset, beyond=beyond,
                           max_past=max_past)
    fwd = forward(q, k, call, mask=mask, position=position)
    past, n = _extent("key_table", key_table, max_past)
    policy = "zero" if beyond == "zero" else "clip"  # "error" checked: every r has a row
    bins = {"low": -past, "high": n, "q_offset": call.q_offset, "clip": policy == "clip"}

    def value_rows() -> TableIndex:
        return shaw_index(call.t_q, call.t_k, max_distance=n, q_offset=call.q_offset,
                          beyond=policy, max_past=past, xp=call.xp, device=_xp.device(q))

    return binned_keys_values_vjp(q, k, v, d_output, call, fwd, key_table, value_table,
                                  value_rows, names=("key_table", "value_table"), **bins)
