r"""T5's bucketed relative bias (Raffel et al. 2020).

A learned scalar per *bucket* of distances is added to the logits, and T5
does not scale ``q . k`` (``scale = 1``).

.. math:: \text{logits}_{ij} = q_i \cdot k_j + b_{\text{bucket}(r_{ij})}

With ``r = j - (i + q_offset)`` (key minus query, as in T5 itself):

- bidirectional: ``n = num_buckets // 2``; keys in the future (``r > 0``) use
  buckets ``n .. 2n - 1``, the rest ``0 .. n - 1``, on ``a = |r|``;
- causal (``bidirectional=False``): ``n = num_buckets``, ``a = max(-r, 0)``
  (every future key shares bucket 0);
- ``a < n // 2`` has a bucket of its own (``bucket = a``); larger ``a`` are
  log-spaced up to `max_distance`:
  ``n//2 + floor(log(a / (n//2)) / log(max_distance / (n//2)) * (n - n//2))``,
  capped at ``n - 1``.

The log is evaluated on the host, in float64, once per bucket boundary; the
arrays only compare integers against those boundaries. So no ``log(0)`` is
ever taken, nothing depends on the array library's float precision, and the
bucket is exact for every distance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from .. import _xp
from .._validate import check_bool, nonnegative_int, positive_int
from ..attention import attention
from ..calls import Call, Defaults, computes_in_float32, resolve_call
from ..distance_gradients import distance_axis, scalar_rows_vjp, table_gradient
from ..gradients import check_d_output, core_vjp, forward, sum_to_shape
from ..positions import check_integer_array, relative_positions
from ._tables import check_table, count_reached, gather_scalars

__all__ = [
    "DEFAULTS",
    "t5_attention",
    "t5_attention_vjp",
    "t5_bias",
    "t5_bucket",
    "t5_bucket_boundaries",
    "t5_call",
    "unscaled",
]


def unscaled(d: int, tables: Sequence[Any] = ()) -> float:
    """T5's scale rule: ``1`` whatever the width (the scale lives in the weights).

    Examples
    --------
    >>> unscaled(64)
    1.0
    """
    return 1.0


#: T5's defaults: unscaled (``scale = 1``), not causal, start-aligned queries.
DEFAULTS = Defaults(scale=unscaled)


def _halves(num_buckets: int, max_distance: int, bidirectional: bool) -> tuple[int, int]:
    num_buckets = positive_int("num_buckets", num_buckets)
    max_distance = positive_int("max_distance", max_distance)
    n = num_buckets // 2 if bidirectional else num_buckets
    if n < 2:
        need = 4 if bidirectional else 2
        msg = f"`num_buckets` must be >= {need} (bidirectional={bidirectional}), got {num_buckets}"
        raise ValueError(msg)
    max_exact = n // 2
    if max_distance <= max_exact:
        msg = (
            f"`max_distance` must exceed the {max_exact} exact buckets "
            f"(num_buckets={num_buckets}, bidirectional={bidirectional}), got {max_distance}"
        )
        raise ValueError(msg)
    return n, max_exact


@lru_cache(maxsize=256)
def t5_bucket_boundaries(
    num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True
) -> tuple[int, ...]:
    """Smallest ``a`` that reaches each log-spaced bucket, from ``n//2 + 1`` to ``n - 1``.

    Parameters
    ----------
    num_buckets, max_distance, bidirectional
        As in `t5_bucket`.

    Returns
    -------
    tuple of int
        ``boundaries[m]`` is the smallest ``a >= n//2`` whose bucket is at
        least ``n//2 + 1 + m``.

    Examples
    --------
    >>> t5_bucket_boundaries(32, 128)  # n = 16: buckets 8 .. 15
    (12, 16, 23, 32, 46, 64, 91)
    """
    n, max_exact = _halves(num_buckets, max_distance, bidirectional)
    span = math.log(max_distance / max_exact)

    def bucket(a: int) -> int:
        return max_exact + int(math.log(a / max_exact) / span * (n - max_exact))

    out = []
    a = max_exact
    for target in range(max_exact + 1, n):
        guess = math.ceil(max_exact * math.exp(span * (target - max_exact) / (n - max_exact)))
        a = max(a, guess - 2)
        while bucket(a) < target:
            a += 1
        out.append(a)
    return tuple(out)


def t5_bucket(
    r: Any, /, *, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True
) -> Any:
    """T5 bucket of each distance.

    Parameters
    ----------
    r : integer array
        Distances ``r = j - (i + q_offset)``, key minus query.
    num_buckets : int, optional
        Buckets in all (both directions together when bidirectional).
    max_distance : int, optional
        Distance at which the log-spaced buckets end; farther distances share
        the last bucket.
    bidirectional : bool, optional
        ``False`` for causal (decoder) attention.

    Returns
    -------
    array
        Same shape and dtype as `r`, values in ``0 .. num_buckets - 1``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> r = xp.asarray([-200, -16, -15, -1, 0, 1, 7, 8, 200])
    >>> t5_bucket(r)
    Array([15, 10,  9,  1,  0, 17, 23, 24, 31], dtype=array_api_strict.int64)
    >>> t5_bucket(r, bidirectional=False)
    Array([31, 16, 15,  1,  0,  0,  0,  0,  0], dtype=array_api_strict.int64)
    """
    xp = _xp.array_namespace(r)
    check_integer_array(xp, "r", r)
    bidirectional = check_bool("bidirectional", bidirectional)
    n, max_exact = _halves(num_buckets, max_distance, bidirectional)
    bounds = t5_bucket_boundaries(num_buckets, max_distance, bidirectional)
    dev = _xp.device(r)
    zero = xp.zeros((), dtype=r.dtype, device=dev)
    if bidirectional:
        base = xp.where(r > zero, xp.asarray(n, dtype=r.dtype, device=dev), zero)
        a = xp.abs(r)
    else:
        base = zero
        a = xp.where(r < zero, -r, zero)
    steps = count_reached(a, bounds) if bounds else zero
    large = max_exact + steps
    return base + xp.where(a < max_exact, a, large)


def t5_bias(
    table: Any,
    /,
    t_q: int,
    t_k: int,
    *,
    q_offset: int = 0,
    bidirectional: bool = True,
    max_distance: int = 128,
) -> Any:
    r"""Bias matrix :math:`B_{ij} = b_{\text{bucket}(r_{ij})}`.

    Parameters
    ----------
    table : floating array, shape ``(num_buckets,)`` or ``(h, num_buckets)``
    t_q, t_k : int
        Number of queries and keys.
    q_offset : int, optional
        Position of query 0 (``t_k - t_q`` when decoding with a cache).
    bidirectional, max_distance
        As in `t5_bucket`.

    Returns
    -------
    array, shape ``(t_q, t_k)`` or ``(h, t_q, t_k)``

    Examples
    --------
    >>> import array_api_strict as xp
    >>> b = xp.arange(8.0)  # 8 buckets: 0..3 past and present, 4..7 future
    >>> t5_bias(b, 1, 7, q_offset=3, max_distance=4)
    Array([[3., 2., 1., 0., 5., 6., 7.]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(table)
    check_table("table", table, None, scalar=True)
    t_q = nonnegative_int("t_q", t_q)
    t_k = nonnegative_int("t_k", t_k)
    dev = _xp.device(table)
    r = relative_positions(t_q, t_k, q_offset=q_offset, xp=xp, device=dev)
    bucket = t5_bucket(
        r, num_buckets=table.shape[-1], max_distance=max_distance, bidirectional=bidirectional
    )
    return gather_scalars(table, bucket)


def t5_call(
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
    bidirectional: bool,
    max_distance: int,
) -> Call:
    """Validate a `t5_attention` call and resolve its defaults (shared with the kernels).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((3, 4))
    >>> t5_call(q, k, v, xp.zeros(32), scale=None, mask=None, causal=None, q_offset=None,
    ...         bidirectional=True, max_distance=128).scale
    1.0
    """
    call = resolve_call(
        q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset, defaults=DEFAULTS,
        tables={"table": table},
    )
    check_table("table", table, q, scalar=True)
    bidirectional = check_bool("bidirectional", bidirectional)
    _halves(table.shape[-1], max_distance, bidirectional)
    return call


@computes_in_float32
def t5_attention(
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
    bidirectional: bool = True,
    max_distance: int = 128,
    return_weights: bool = False,
) -> Any:
    r"""Attention with T5's bucketed relative bias, unscaled by default.

    .. math:: w = \operatorname{softmax}(s\, q k^\top + B), \quad s = 1 \text{ (T5)}

    Parameters
    ----------
    q, k, v : floating arrays ``(..., t_q, d)``, ``(..., t_k, d)``, ``(..., t_k, d_v)``
    table : floating array, ``(num_buckets,)`` or ``(h, num_buckets)``
    scale : float, optional
        Default (``None``) ``1``, T5's choice (`DEFAULTS`); pass
        ``1 / sqrt(d)`` explicitly for a scaled variant.
    mask, causal, q_offset, return_weights
        As in `relpos_ref.attention`.
    bidirectional, max_distance
        As in `t5_bucket`; T5's decoder uses ``bidirectional=False`` with
        ``causal=True``.

    Returns
    -------
    out : array ``(..., t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.eye(2)
    >>> t5_attention(q, k, v, xp.zeros(32))
    Array([[0.73105858, 0.26894142],
           [0.26894142, 0.73105858]], dtype=array_api_strict.float64)
    """
    call = t5_call(
        q, k, v, table, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
        bidirectional=bidirectional, max_distance=max_distance,
    )
    bias = t5_bias(
        table, call.t_q, call.t_k, q_offset=call.q_offset, bidirectional=bidirectional,
        max_distance=max_distance,
    )
    return attention(
        q, k, v, scale=call.scale, mask=mask, causal=call.causal, q_offset=call.q_offset,
        bias=bias, return_weights=return_weights,
    )


@computes_in_float32
def t5_attention_vjp(
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
    bidirectional: bool = True,
    max_distance: int = 128,
) -> dict[str, Any]:
    r"""Gradients of `t5_attention` for the output's cotangent `d_output` (a VJP).

    .. math:: \bar{b}_c = \sum_{r:\ \text{bucket}(r) = c}\ \sum_i \bar{l}^\text{rel}_{ir}

    The logits' gradient summed over the pairs of each distance, then over
    the distances of each bucket; q, k and v as in
    `relpos_ref.gradients.attention_vjp` (T5's scale is 1).

    Parameters
    ----------
    q, k, v, table, scale, mask, causal, q_offset, bidirectional, max_distance
        As in `t5_attention`.
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
    >>> q = k = xp.zeros((2, 1))
    >>> v = xp.asarray([[1.0], [3.0]])
    >>> g = t5_attention_vjp(q, k, v, xp.zeros(4), d_output=xp.ones((2, 1)), max_distance=2)
    >>> g["table"]  # r = 0 (bucket 0) twice, r = -1 (bucket 1), r = 1 (bucket 3)
    Array([ 0. , -0.5,  0. ,  0.5], dtype=array_api_strict.float64)
    """
    call = t5_call(
        q, k, v, table, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
        bidirectional=bidirectional, max_distance=max_distance,
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    bias = t5_bias(
        table, call.t_q, call.t_k, q_offset=call.q_offset, bidirectional=bidirectional,
        max_distance=max_distance,
    )
    fwd = forward(q, k, call, mask=mask, bias=bias)
    core = core_vjp(q, k, v, d_output, call, fwd)
    axis = distance_axis(call.t_q, call.t_k, call.q_offset)
    xp, dev = call.xp, _xp.device(q)
    r = xp.arange(axis.n, dtype=_xp.index_dtype(xp, dev), device=dev) + axis.low
    bucket = t5_bucket(r, num_buckets=table.shape[-1], max_distance=max_distance,
                       bidirectional=bidirectional)
    every = xp.ones((axis.n,), dtype=xp.bool, device=dev)
    return {
        "q": sum_to_shape(core.dq, q.shape),
        "k": sum_to_shape(core.dk, k.shape),
        "v": sum_to_shape(core.dv, v.shape),
        "table": table_gradient(scalar_rows_vjp(core.d_logits, axis), table, bucket, every,
                                scalar=True),
    }
