r"""Softmax attention: score composition, masks and empty rows.

Every scheme builds its scores the same way (design conventions):

.. math:: \text{logits} = s \, (q \cdot k + \text{position terms}) + \text{bias},
          \qquad s = 1/\sqrt{d} \text{ by default},

then takes a numerically stable softmax over the keys each query may attend
to. A query with no such key (an empty row) gets zero weights and a zero
output, never NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from . import _numpy_softmax, _xp
from ._validate import as_float, as_int, broadcast_shapes
from .positions import relative_positions

__all__ = [
    "allowed_keys",
    "attention",
    "check_qkv",
    "compose_logits",
    "default_scale",
    "masked_softmax",
]


def default_scale(d: int, scale: float | None = None) -> float:
    r"""The logit scale: `scale` if given, else ``1 / sqrt(d)``.

    .. math:: s = \begin{cases} \text{scale} & \text{if given} \\
                                 1/\sqrt{d} & \text{otherwise} \end{cases}

    Parameters
    ----------
    d : int
        Feature size of queries and keys.
    scale : float, optional
        An explicit scale (``1.0`` for T5); must be finite.

    Returns
    -------
    float

    Examples
    --------
    >>> default_scale(64)
    0.125
    >>> default_scale(64, 1.0)
    1.0
    """
    if scale is None:
        return 1.0 / math.sqrt(d) if d > 0 else 1.0
    return as_float("scale", scale)


def check_qkv(q: Any, k: Any, v: Any) -> tuple[Any, tuple[int, ...]]:
    """Validate ``q (..., t_q, d)``, ``k (..., t_k, d)``, ``v (..., t_k, d_v)``.

    Returns the namespace and the broadcast leading shape. Raises a
    `TypeError` for mixed libraries, non-floating or mixed dtypes, and a
    `ValueError` naming the shapes when they do not fit together.
    """
    xp = _xp.array_namespace(q, k, v)
    for name, a in (("q", q), ("k", k), ("v", v)):
        _xp.check_floating(xp, name, a)
        if a.ndim < 2:
            msg = f"`{name}` must have at least 2 dimensions, got shape {tuple(a.shape)}"
            raise ValueError(msg)
    _xp.check_same_dtype(q=q, k=k, v=v)
    if q.shape[-1] != k.shape[-1]:
        msg = (
            f"`q` and `k` must share the feature size d, got shapes "
            f"{tuple(q.shape)} and {tuple(k.shape)}"
        )
        raise ValueError(msg)
    if k.shape[-2] != v.shape[-2]:
        msg = (
            f"`k` and `v` must have the same number of keys, got shapes "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
        raise ValueError(msg)
    batch = broadcast_shapes(q=q.shape[:-2], k=k.shape[:-2], v=v.shape[:-2])
    return xp, batch


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
        ``None`` when nothing is masked.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> allowed_keys(2, 3, causal=True, q_offset=1, xp=xp)
    array([[ True,  True, False],
           [ True,  True,  True]])
    """
    if mask is not None:
        if not xp.isdtype(mask.dtype, "bool"):
            msg = f"`mask` must be a bool array (True = may attend), got dtype {mask.dtype}"
            raise TypeError(msg)
        broadcast_shapes(mask=mask.shape, logits=(t_q, t_k))
    if not causal:
        return mask
    r = relative_positions(t_q, t_k, q_offset=as_int("q_offset", q_offset), xp=xp, device=device)
    past_or_present = r <= 0
    return past_or_present if mask is None else mask & past_or_present


def compose_logits(content: Any, /, *, scale: float, position: Any = None, bias: Any = None) -> Any:
    r"""Combine score terms by the one scaling rule.

    .. math:: \text{logits} = s\,(\text{content} + \text{position}) + \text{bias}

    Content-position terms are scaled with the content term; scalar biases
    (learned ``b_r``, T5, ALiBi, Swin) are added after scaling.

    Parameters
    ----------
    content : array, shape ``(..., t_q, t_k)``
        ``q . k`` for every pair.
    scale : float
        The scale ``s``.
    position : array broadcastable to ``(..., t_q, t_k)``, optional
        Terms scaled with the content term.
    bias : array broadcastable to ``(..., t_q, t_k)``, optional
        Terms added after scaling.

    Returns
    -------
    logits : array
        Same dtype as `content`.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> compose_logits(xp.asarray([[2.0]]), scale=0.5, position=xp.asarray([[4.0]]),
    ...                bias=xp.asarray([[1.0]]))
    array([[4.]])
    """
    logits = content if position is None else content + position
    logits = logits * scale
    return logits if bias is None else logits + bias


def masked_softmax(logits: Any, /, *, allowed: Any = None) -> Any:
    r"""Numerically stable softmax over the last axis, restricted to allowed keys.

    .. math:: w_{ij} = \frac{\exp(l_{ij} - m_i)\,[\text{allowed}_{ij}]}
                            {\sum_{j'} \exp(l_{ij'} - m_i)\,[\text{allowed}_{ij'}]},
              \qquad m_i = \max_{j \text{ allowed}} l_{ij}

    A row with no allowed key, or whose allowed logits are all ``-inf``, gets
    zero weights (never NaN).

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
    >>> import array_api_compat.numpy as xp
    >>> logits = xp.asarray([[0.0, 0.0], [1.0, 2.0]])
    >>> masked_softmax(logits, allowed=xp.asarray([[False, False], [True, True]]))
    array([[0.        , 0.        ],
           [0.26894142, 0.73105858]])
    """
    xp = _xp.array_namespace(logits, allowed)
    dev = _xp.device(logits)
    neg_inf = xp.asarray(-xp.inf, dtype=logits.dtype, device=dev)
    zero = xp.asarray(0.0, dtype=logits.dtype, device=dev)
    if allowed is not None:
        logits = xp.where(allowed, logits, neg_inf)
    if _xp.size(logits) == 0:  # no keys or no queries: nothing to normalize
        return logits
    row_max = xp.max(logits, axis=-1, keepdims=True)
    row_max = xp.where(row_max == neg_inf, zero, row_max)
    e = xp.exp(logits - row_max)
    total = xp.sum(e, axis=-1, keepdims=True)
    return e / xp.where(total == zero, xp.asarray(1.0, dtype=logits.dtype, device=dev), total)


def attention(
    q: Any,
    k: Any,
    v: Any,
    /,
    *,
    scale: float | None = None,
    mask: Any = None,
    causal: bool = False,
    q_offset: int = 0,
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
        Forbid keys in the future of their query, ``j > i + q_offset``.
    q_offset : int, optional
        Position of query 0 (``t_k - t_q`` when decoding with a cache).
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
    >>> import array_api_compat.numpy as xp
    >>> q = xp.asarray([[1.0, 0.0], [0.0, 1.0]])
    >>> k = xp.asarray([[1.0, 0.0], [0.0, 1.0]])
    >>> v = xp.asarray([[1.0], [2.0]])
    >>> attention(q, k, v, scale=1.0, causal=True)
    array([[1.        ],
           [1.73105858]])
    """
    return _attention(
        q,
        k,
        v,
        scale=scale,
        mask=mask,
        causal=causal,
        q_offset=q_offset,
        bias=bias,
        position=position,
        return_weights=return_weights,
    )


def _attention(
    q: Any,
    k: Any,
    v: Any,
    /,
    *,
    scale: float | None,
    mask: Any,
    causal: bool,
    q_offset: int,
    bias: Any,
    position: Any,
    return_weights: bool,
    softmax: Callable[[Any, float, Any], Any] | None = None,
    position_rows: Callable[[int, int], Any] | None = None,
) -> Any:
    # `attention`, plus two hooks for the schemes' NumPy fast paths, each in place of
    # `position`: `softmax(content, s, allowed)` returns the weights of
    # ``s (content + the scheme's position term)``, restricted to `allowed`, computed in
    # `content` (which this function owns); `position_rows(a, b)` gives the position
    # term of query rows a .. b - 1, asked for one block at a time.
    xp, _ = check_qkv(q, k, v)
    _xp.array_namespace(q, mask, bias, position)  # one library for every array argument
    *_, t_q, d = q.shape
    t_k = k.shape[-2]
    s = default_scale(d, scale)
    for name, term in (("bias", bias), ("position", position)):
        if term is not None:
            _check_term(xp, name, q, term, t_q, t_k)
    allowed = allowed_keys(
        t_q, t_k, mask=mask, causal=causal, q_offset=q_offset, xp=xp, device=_xp.device(q)
    )
    content = xp.matmul(q, xp.matrix_transpose(k))
    if softmax is not None:
        if position is not None or bias is not None:
            msg = "internal error: a scheme's softmax hook takes no position or bias term"
            raise RuntimeError(msg)
        weights = softmax(content, s, allowed)
    else:
        weights = _softmax_of_terms(
            content,
            scale=s,
            position=position,
            bias=bias,
            allowed=allowed,
            position_rows=position_rows,
        )
    out = xp.matmul(weights, v)
    return (out, weights) if return_weights else out


def _softmax_of_terms(
    content: Any,
    /,
    *,
    scale: float,
    position: Any = None,
    bias: Any = None,
    allowed: Any = None,
    position_rows: Callable[[int, int], Any] | None = None,
) -> Any:
    """`masked_softmax` of `compose_logits`, reusing `content` where the library allows.

    `content` must be an array the caller owns: on NumPy it is overwritten
    block by block (equal bit for bit to the standard forms, tested).
    `position_rows(a, b)`, instead of `position`, gives the position term of
    query rows ``a .. b - 1`` (a scheme computing it one block at a time).
    """
    weights = _numpy_softmax.softmax_of_terms(
        content,
        scale=scale,
        position=position,
        bias=bias,
        allowed=allowed,
        position_rows=position_rows,
    )
    if weights is not None:
        return weights
    if position_rows is not None:
        position = position_rows(0, content.shape[-2])
    logits = compose_logits(content, scale=scale, position=position, bias=bias)
    return masked_softmax(logits, allowed=allowed)


def _check_term(xp: Any, name: str, q: Any, term: Any, t_q: int, t_k: int) -> None:
    _xp.check_floating(xp, name, term)
    _xp.check_same_dtype(q=q, **{name: term})
    broadcast_shapes(**{name: term.shape}, logits=(t_q, t_k))
