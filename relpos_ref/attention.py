r"""Softmax attention: score composition, masks and empty rows.

Every scheme builds its scores the same way (design conventions):

.. math:: \text{logits} = s \, (q \cdot k + \text{position terms}) + \text{bias},
          \qquad s = 1/\sqrt{d} \text{ by default},

then takes a numerically stable softmax over the keys each query may attend
to. A query with no such key (an empty row) gets zero weights and a zero
output, never NaN.

Overflow is never silent: a logit that is ``-inf`` although its bias is not
(``s (q . k + P)`` or its sum with the bias beyond the dtype's range, or a
non-finite input) is made NaN by `compose_logits`, so its row's output and
weights are NaN, as they are for ``+inf``; a row reads as empty (zeros) only
when it has no allowed key or every allowed key's bias is ``-inf`` (an
additive mask).
"""

from __future__ import annotations

from typing import Any

from . import _xp
from ._validate import as_float, as_int, broadcast_shapes, check_bool
from .calls import (
    PLAIN,
    Call,
    Defaults,
    check_mask,
    check_qkv,
    check_terms,
    computes_in_float32,
    default_scale,
    inverse_sqrt_width,
    resolve_call,
)
from .positions import relative_positions

__all__ = [
    "PLAIN",
    "Call",
    "Defaults",
    "allowed_keys",
    "attention",
    "check_qkv",
    "check_terms",
    "compose_logits",
    "default_scale",
    "inverse_sqrt_width",
    "masked_softmax",
    "resolve_call",
    "weighted_sum",
]


def allowed_keys(
    t_q: int,
    t_k: int,
    /,
    *,
    mask: Any = None,
    causal: bool = False,
    q_offset: int = 0,
    xp: Any,
    device: Any = None,
) -> Any:
    r"""Boolean matrix of the keys each query may attend to, or ``None`` for all.

    .. math:: \text{allowed}_{ij} = \text{mask}_{ij} \wedge
              (\neg\text{causal} \vee r_{ij} \le 0)

    Parameters
    ----------
    t_q, t_k : int
        Number of queries and keys.
    mask : bool array broadcastable to ``(..., t_q, t_k)``, optional
        ``True`` where a query may attend to a key.
    causal : bool, optional
        Also forbid future keys, ``r = j - (i + q_offset) > 0``.
    q_offset : int, optional
        Position of query 0.
    xp : namespace
        Array API namespace.
    device : optional
        Device of the result.

    Returns
    -------
    allowed : bool array or None
        ``None`` when nothing is masked; otherwise a new array.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> allowed_keys(2, 3, causal=True, q_offset=1, xp=xp)
    Array([[ True,  True, False],
           [ True,  True,  True]], dtype=array_api_strict.bool)
    """
    _xp.check_namespace(xp)
    check_mask(xp, mask, (t_q, t_k))
    if not check_bool("causal", causal):
        return None if mask is None else xp.asarray(mask, copy=True)
    r = relative_positions(t_q, t_k, q_offset=as_int("q_offset", q_offset), xp=xp, device=device)
    past_or_present = r <= 0
    return past_or_present if mask is None else mask & past_or_present


@computes_in_float32
def compose_logits(content: Any, /, *, scale: float, position: Any = None, bias: Any = None) -> Any:
    r"""Combine score terms by the one scaling rule, with overflow made NaN.

    .. math:: \text{logits} = s\,(\text{content} + \text{position}) + \text{bias},
              \qquad \text{logits}_{ij} := \text{NaN} \text{ where }
              \text{logits}_{ij} = -\infty \ne \text{bias}_{ij}

    Content-position terms are scaled with the content term; scalar biases
    (learned ``b_r``, T5, ALiBi, Swin) are added after scaling. A ``-inf``
    bias is an additive mask (the pair gets weight 0); any
    other ``-inf`` is an overflow (``q . k`` of large entries, say, or a
    non-finite input) and becomes NaN, so that its row is NaN after
    `masked_softmax` rather than an empty row of zeros or a finite wrong
    answer (``+inf`` gives NaN there by itself).

    Parameters
    ----------
    content : floating array, shape ``(..., t_q, t_k)``
        ``q . k`` for every pair.
    scale : float
        The scale ``s``, a finite real number.
    position : array broadcastable to ``(..., t_q, t_k)``, optional
        Terms scaled with the content term.
    bias : array broadcastable to ``(..., t_q, t_k)``, optional
        Terms added after scaling; ``-inf`` leaves a pair out.

    Returns
    -------
    logits : array
        Same dtype as `content`.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> compose_logits(xp.asarray([[2.0]]), scale=0.5, position=xp.asarray([[4.0]]),
    ...                bias=xp.asarray([[1.0]]))
    Array([[4.]], dtype=array_api_strict.float64)
    >>> lost = xp.asarray([[-xp.inf, 1.0]])  # a q . k that overflowed; the bias masks key 1
    >>> compose_logits(lost, scale=2.0, bias=xp.asarray([[0.0, -xp.inf]]))
    Array([[ nan, -inf]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(content, position, bias)
    _xp.check_floating(xp, "content", content)
    scale = as_float("scale", scale)
    logits = content if position is None else content + position
    logits = logits * scale
    if bias is not None:
        logits = logits + bias
    neg_inf = xp.asarray(-xp.inf, dtype=logits.dtype, device=_xp.device(logits))
    lost = logits == neg_inf  # an overflow, unless the bias put it there
    if bias is not None:
        lost = lost & (bias != neg_inf)
    return xp.where(lost, xp.asarray(xp.nan, dtype=logits.dtype, device=_xp.device(logits)),
                    logits)


@computes_in_float32
def masked_softmax(logits: Any, /, *, allowed: Any = None) -> Any:
    r"""Numerically stable softmax over the last axis, restricted to allowed keys.

    .. math:: w_{ij} = \frac{\exp(l_{ij} - m_i)\,[\text{allowed}_{ij}]}
                            {\sum_{j'} \exp(l_{ij'} - m_i)\,[\text{allowed}_{ij'}]},
              \qquad m_i = \max_{j \text{ allowed}} l_{ij}

    A row with no allowed key, or whose allowed logits are all ``-inf``, gets
    zero weights (never NaN); a NaN or ``+inf`` allowed logit makes its row
    NaN. (`compose_logits` turns a ``-inf`` that is an overflow into NaN.)

    Parameters
    ----------
    logits : floating array, shape ``(..., t_q, t_k)``
    allowed : bool array broadcastable to `logits`, optional

    Returns
    -------
    weights : array
        Same dtype and device as `logits`, broadcast with `allowed`.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> logits = xp.asarray([[0.0, 0.0], [1.0, 2.0]])
    >>> masked_softmax(logits, allowed=xp.asarray([[False, False], [True, True]]))
    Array([[0.        , 0.        ],
           [0.26894142, 0.73105858]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(logits, allowed)
    _xp.check_floating(xp, "logits", logits)
    if allowed is not None and not xp.isdtype(allowed.dtype, "bool"):
        msg = f"`allowed` must be a bool array (True = may attend), got dtype {allowed.dtype}"
        raise TypeError(msg)
    dev = _xp.device(logits)
    neg_inf = xp.asarray(-xp.inf, dtype=logits.dtype, device=dev)
    zero = xp.asarray(0.0, dtype=logits.dtype, device=dev)
    if allowed is not None:
        logits = xp.where(allowed, logits, neg_inf)
    if _xp.size(logits) == 0:  # no keys or no queries: nothing to normalize
        return xp.zeros(logits.shape, dtype=logits.dtype, device=dev)
    row_max = xp.max(logits, axis=-1, keepdims=True)
    row_max = xp.where(row_max == neg_inf, zero, row_max)
    e = xp.exp(logits - row_max)
    total = xp.sum(e, axis=-1, keepdims=True)
    return e / xp.where(total == zero, xp.asarray(1.0, dtype=logits.dtype, device=dev), total)


@computes_in_float32
def attention(
    q: Any,
    k: Any,
    v: Any,
    /,
    *,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
    bias: Any = None,
    position: Any = None,
    return_weights: bool = False,
) -> Any:
    r"""Scaled dot-product attention with masks, a bias and safe empty rows.

    .. math:: \text{out} = \operatorname{softmax}_{\text{allowed}}
              \left(s\, (q k^\top + \text{position}) + \text{bias}\right) v

    Parameters
    ----------
    q : floating array, shape ``(..., t_q, d)``
    k : floating array, shape ``(..., t_k, d)``
    v : floating array, shape ``(..., t_k, d_v)``
        Leading axes broadcast; all three share one dtype.
    scale : float, optional
        ``s``; default ``1 / sqrt(d)``.
    mask : bool array broadcastable to ``(..., t_q, t_k)``, optional
        ``True`` where a query may attend to a key.
    causal : bool, optional
        Forbid keys in the future of their query, ``j > i + q_offset``;
        default ``False``.
    q_offset : int, optional
        Position of query 0 (``t_k - t_q`` when decoding with a cache);
        default ``0``.
    bias : floating array broadcastable to ``(..., t_q, t_k)``, optional
        Added to the logits after scaling; same dtype as `q`.
    position : floating array broadcastable to ``(..., t_q, t_k)``, optional
        Content-position terms (``q . a_r`` and the like), scaled together
        with ``q k^T``; same dtype as `q`.
    return_weights : bool, optional
        Also return the attention weights.

    Returns
    -------
    out : array, shape ``(..., t_q, d_v)``
        Same dtype and device as `q`. Rows with no allowed key are zero.
    weights : array, shape ``(..., t_q, t_k)``
        Only with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = xp.asarray([[1.0, 0.0], [0.0, 1.0]])
    >>> k = xp.asarray([[1.0, 0.0], [0.0, 1.0]])
    >>> v = xp.asarray([[1.0], [2.0]])
    >>> attention(q, k, v, scale=1.0, causal=True)
    Array([[1.        ],
           [1.73105858]], dtype=array_api_strict.float64)
    """
    call = resolve_call(q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset)
    check_terms(q, call, bias=bias, position=position)
    xp = call.xp
    allowed = allowed_keys(
        call.t_q,
        call.t_k,
        mask=mask,
        causal=call.causal,
        q_offset=call.q_offset,
        xp=xp,
        device=_xp.device(q),
    )
    content = xp.matmul(q, xp.matrix_transpose(k))
    logits = compose_logits(content, scale=call.scale, position=position, bias=bias)
    weights = masked_softmax(logits, allowed=allowed)
    out = weighted_sum(weights, v, used=allowed)
    return (out, weights) if check_bool("return_weights", return_weights) else out


def weighted_sum(weights: Any, values: Any, /, *, used: Any = None) -> Any:
    r"""Sum of rows weighted per pair, over the pairs `used` allows and no other.

    .. math:: \text{out}[..., i, :] = \sum_{j:\ \text{used}_{ij}} w_{ij}\, v_j

    The attention output ``weights @ v`` (and a relative-value term) with a
    mask: a pair that is not used contributes exactly nothing, even when its
    value is NaN or infinite (``0 * NaN`` would be NaN), while a used pair
    follows IEEE arithmetic (a NaN there, or ``0 * inf``, gives NaN; ``inf``
    with a positive weight gives ``inf``). Without `used` every pair counts:
    ``weights @ values``. No array value is read on the host.

    Parameters
    ----------
    weights : floating array, shape ``(..., t_q, n)``
        Non-negative (attention weights, or weights binned by distance).
    values : floating array, shape ``(..., n, d)``
    used : bool array broadcastable to ``(..., t_q, n)``, optional

    Returns
    -------
    array, shape ``(..., t_q, d)``

    Examples
    --------
    >>> import array_api_strict as xp
    >>> w = xp.asarray([[1.0, 0.0], [0.5, 0.5]])
    >>> v = xp.asarray([[2.0], [xp.nan]])
    >>> weighted_sum(w, v, used=xp.asarray([[True, False], [True, True]]))
    Array([[ 2.],
           [nan]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(weights, values, used)
    if used is None:
        return xp.matmul(weights, values)
    dev = _xp.device(weights)
    dtype = weights.dtype
    shape = broadcast_shapes(weights=tuple(weights.shape), used=tuple(used.shape))
    weights, used = xp.broadcast_to(weights, shape), xp.broadcast_to(used, shape)

    def count(a: Any, b: Any) -> Any:  # pairs where both hold, per (i, feature)
        return xp.matmul(xp.astype(a, dtype), xp.astype(b, dtype))

    zero, inf, nan = (xp.asarray(x, dtype=dtype, device=dev) for x in (0.0, xp.inf, xp.nan))
    out = xp.matmul(weights, xp.where(xp.isfinite(values), values, zero))
    nans = count(used, xp.isnan(values)) + count(used & (weights == zero), xp.isinf(values))
    positive = used & (weights > zero)
    up = count(positive, values == inf)
    down = count(positive, values == -inf)
    out = xp.where(up > zero, inf, xp.where(down > zero, -inf, out))
    bad = (nans > zero) | ((up > zero) & (down > zero))
    return xp.where(bad, nan, out)
