r"""A learned scalar per distance, added to the logits after scaling.

.. math:: \text{logits}_{ij} = s\, q_i \cdot k_j + b_{\text{idx}(r_{ij})}

``b`` has ``2K + 1`` entries (row ``r + K``), shared ``(2K+1,)`` or per head
``(h, 2K+1)``; beyond the table: ``"clip"``, ``"zero"`` or ``"error"``. With
``max_past=P``, ``P + K + 1`` entries for ``r = -P .. K`` (asymmetric clipping,
entry ``clip(r, -P, K) + P``).
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._validate import check_choice, nonnegative_int
from ..attention import attention
from ..calls import PLAIN, Call, computes_in_float32, resolve_call
from ..gradients import check_d_output, core_vjp, forward, sum_to_shape
from ..positions import BEYOND_POLICIES
from ._tables import binned_scalars_vjp, check_table, gather_scalars
from .clipped_index import shaw_index, two_sided_extent

__all__ = [
    "DEFAULTS",
    "bias_attention",
    "bias_attention_vjp",
    "bias_call",
    "bias_logits",
]

#: A learned bias's defaults: ``scale = 1/sqrt(d)``, not causal, start-aligned queries.
DEFAULTS = PLAIN


def bias_logits(
    table: Any, /, t_q: int, t_k: int, *, q_offset: int = 0, beyond: str = "clip",
    max_past: int | None = None,
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
        Distances ``|r| > K`` (``r < -P`` or ``r > K`` with `max_past`).
    max_past : int, optional
        ``P``: asymmetric clipping, ``P + K + 1`` entries for ``r = -P .. K``;
        default: a symmetric table of ``2K + 1``.

    Returns
    -------
    array, shape ``(t_q, t_k)`` or ``(h, t_q, t_k)``

    Examples
    --------
    >>> import array_api_strict as xp
    >>> b = xp.asarray([-1.0, 0.0, 1.0])
    >>> bias_logits(b, 2, 3)
    Array([[ 0.,  1.,  1.],
           [-1.,  0.,  1.]], dtype=array_api_strict.float64)
    >>> bias_logits(b, 2, 3, max_past=2)  # entries for r = -2, -1, 0
    Array([[1., 1., 1.],
           [0., 1., 1.]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(table)
    past, k = _entries(table, None, max_past)
    t_q = nonnegative_int("t_q", t_q)
    t_k = nonnegative_int("t_k", t_k)
    dev = _xp.device(table)
    index, valid = shaw_index(
        t_q, t_k, max_distance=k, q_offset=q_offset, beyond=beyond, xp=xp, device=dev,
        max_past=None if max_past is None else past,
    )
    out = gather_scalars(table, index)
    return xp.where(valid, out, xp.zeros((), dtype=table.dtype, device=dev))


def _entries(table: Any, q: Any, max_past: int | None) -> tuple[int, int]:
    check_table("table", table, q, scalar=True)
    return two_sided_extent("table", table.shape[-1], tuple(table.shape), max_past,
                            unit="entries")


def bias_call(
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
    beyond: str,
    max_past: int | None = None,
) -> Call:
    """Validate a `bias_attention` call and resolve its defaults (shared with the kernels).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((3, 4))
    >>> bias_call(q, k, v, xp.zeros(5), scale=None, mask=None, causal=True, q_offset=None,
    ...           beyond="clip").causal
    True
    """
    call = resolve_call(
        q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset, defaults=DEFAULTS,
        tables={"table": table},
    )
    check_choice("beyond", beyond, BEYOND_POLICIES)
    _entries(table, q, max_past)
    return call


@computes_in_float32
def bias_attention(
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
    beyond: str = "clip",
    return_weights: bool = False,
    max_past: int | None = None,
) -> Any:
    r"""Attention with a learned relative scalar bias.

    .. math:: w = \operatorname{softmax}(s\, q k^\top + B), \qquad
              B_{ij} = b_{\text{idx}(r_{ij})}

    Parameters
    ----------
    q, k, v : floating arrays ``(..., t_q, d)``, ``(..., t_k, d)``, ``(..., t_k, d_v)``
    table : floating array, ``(2K+1,)`` or ``(h, 2K+1)`` (heads at axis -3 of `q`)
        ``P + K + 1`` entries with `max_past`.
    scale, mask, causal, q_offset, return_weights
        As in `relpos_ref.attention` (defaults `DEFAULTS`).
    beyond, max_past
        As in `bias_logits`.

    Returns
    -------
    out : array ``(..., t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import math
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((2, 2))
    >>> _, w = bias_attention(q, k, v, xp.asarray([0.0, 0.0, math.log(3.0)]),
    ...                       return_weights=True)
    >>> w
    Array([[0.25, 0.75],
           [0.5 , 0.5 ]], dtype=array_api_strict.float64)
    """
    call = bias_call(
        q, k, v, table, scale=scale, mask=mask, causal=causal, q_offset=q_offset, beyond=beyond,
        max_past=max_past,
    )
    bias = bias_logits(table, call.t_q, call.t_k, q_offset=call.q_offset, beyond=beyond,
                       max_past=max_past)
    return attention(
        q, k, v, scale=call.scale, mask=mask, causal=call.causal, q_offset=call.q_offset,
        bias=bias, return_weights=return_weights,
    )


@computes_in_float32
def bias_attention_vjp(
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
    beyond: str = "clip",
    max_past: int | None = None,
) -> dict[str, Any]:
    r"""Gradients of `bias_attention` for the output's cotangent `d_output` (a VJP).

    .. math:: \bar{b}_c = \sum_{r:\ \text{idx}(r) = c}\ \sum_i \bar{l}^\text{rel}_{ir}

    (the logits' gradient summed over each distance's pairs, then over the
    distances that share an entry: every ``|r| > K`` with ``"clip"``, none
    with ``"zero"``); q, k and v as in `relpos_ref.gradients.attention_vjp`.

    Parameters
    ----------
    q, k, v, table, scale, mask, causal, q_offset, beyond, max_past
        As in `bias_attention`.
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
    >>> g = bias_attention_vjp(q, k, v, xp.zeros(3), d_output=xp.asarray([[1.0], [0.0]]),
    ...                        causal=True)
    >>> g["table"]  # the pair at r = -1 moves the output by v - out = 0
    Array([0., 0., 0.], dtype=array_api_strict.float64)
    """
    call = bias_call(
        q, k, v, table, scale=scale, mask=mask, causal=causal, q_offset=q_offset, beyond=beyond,
        max_past=max_past,
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    bias = bias_logits(table, call.t_q, call.t_k, q_offset=call.q_offset, beyond=beyond,
                       max_past=max_past)
    fwd = forward(q, k, call, mask=mask, bias=bias)
    core = core_vjp(q, k, v, d_output, call, fwd)
    past, n = _entries(table, q, max_past)
    d_table = binned_scalars_vjp(core.d_logits, table, low=-past, high=n,
                                 q_offset=call.q_offset, clip=beyond != "zero")
    return {
        "q": sum_to_shape(core.dq, q.shape),
        "k": sum_to_shape(core.dk, k.shape),
        "v": sum_to_shape(core.dv, v.shape),
        "table": d_table,
    }
