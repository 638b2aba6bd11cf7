r"""The forgetting bias: Forgetting Attention (FoX, Lin et al. 2025), "data-dependent ALiBi".

Each token ``t`` carries, per head, a forget-gate logit :math:`f_t` computed
from the input by the caller (FoX: :math:`f_t = w_f^\top x_t + b_f`). A query
at position :math:`p_i = i + q_\text{offset}` sees key ``j`` with the sum of
the log forget gates of the tokens after the key, up to and including the
query's own:

.. math:: b_{ij} = \sum_{t=j+1}^{p_i} \log\sigma(f_t) = F_{p_i} - F_j, \qquad
          F_t = \sum_{u=0}^{t} \log\sigma(f_u) \qquad (j \le p_i)

added after scaling: :math:`\text{logits}_{ij} = s\, q_i\cdot k_j + b_{ij}`.
The key's own gate :math:`f_j` is never read for that key (:math:`b_{jj} = 0`),
the query's gate :math:`f_{p_i}` is read for every earlier key, and the first
gate :math:`f_0` for no pair (it cancels). ``f`` has one entry per key,
``(..., h, t_k)``, so a query's own gate is the entry of the key at its
position: decoding against a cache, the cache keeps ``f`` of every key, and
the query at ``q_offset = t_k - t_q`` reads ``f[..., q_offset + i]`` (FoX's
kernel's ``P_SEQ``). Every query position must have a gate: ``f`` may hold
gates for more positions than there are keys (a cache allocated ahead), and
those past the last key are never read unless a query sits there.

The bias is causal, as FoX is: ``causal=False`` is refused, and :math:`b_{ij}`
is 0 where :math:`j > p_i` (the pair is never attended). Negative query
positions have no key and output zeros.

A closed gate, :math:`\sigma(f_t) = 0` (:math:`f_t = -\infty`), forgets every
key before it: each pair whose range :math:`(j, p_i]` holds it has
:math:`b_{ij} = -\infty`, a mask (the key at the query's own position is
always seen), and every other pair is exact. A NaN gate makes NaN of the
pairs whose range holds it and of no other. The sums count such gates apart
from the finite ones (:math:`F` alone would give :math:`-\infty - (-\infty)`,
NaN, for every pair after the gate).

Numerics: :math:`\log\sigma(x) = -\operatorname{softplus}(-x)
= \min(x, 0) - \log(1 + e^{-|x|})`, which neither overflows nor loses the
tail (:math:`\log\sigma(-1000) = -1000`). :math:`F` grows linearly in
``t`` and :math:`F_{p_i} - F_j` cancels most of it, so ``F`` is summed in
float64 wherever the device has it (float32 otherwise), and the difference
is rounded once to the call's dtype (float32 for 16-bit calls). A sum of
``n`` terms in precision :math:`u` is within :math:`n u \sum_t |\log\sigma(f_t)|`
of the exact one, so

.. math:: |\hat b_{ij} - b_{ij}| \le 2\, t_k\, u_\text{acc} \sum_{t < t_k} |\log\sigma(f_t)|
          + u_\text{out} |b_{ij}|

with :math:`u_\text{acc} = 2^{-53}` (float64) and :math:`u_\text{out}` the
call's unit roundoff: at ``t_k = 10^6`` and gates near 0
(:math:`|\log\sigma| \approx 0.7`) the first term is below :math:`2 \cdot 10^{-4}`,
far below float32's rounding of a bias of that size; where only float32 is
had, the same bound has :math:`u_\text{acc} = 2^{-24}`, which is why
summing in the call's own dtype is not done (FoX's kernel sums in float32).
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._validate import as_int, nonnegative_int
from ..attention import attention
from ..calls import Call, Defaults, computes_in_float32, resolve_call
from ..gradients import check_d_output, core_vjp, forward, sum_to_shape

__all__ = [
    "DEFAULTS",
    "forgetting_attention",
    "forgetting_attention_vjp",
    "forgetting_bias",
    "forgetting_call",
    "forgetting_cumsum",
    "forgetting_f_gradient",
    "forgetting_f_gradient_from_sums",
    "forgetting_tile",
    "log_sigmoid",
]

#: The forgetting bias's defaults: ``scale = 1/sqrt(d)``, causal, end-aligned queries.
DEFAULTS = Defaults(causal=True, q_offset="end")


def log_sigmoid(x: Any, /) -> Any:
    r""":math:`\log\sigma(x) = -\operatorname{softplus}(-x) = \min(x, 0) - \log(1 + e^{-|x|})`.

    Stable at both ends: no overflow of :math:`e^{-x}` for large ``-x``, and
    :math:`\log(1 + e^{-x})` kept by ``log1p`` for large ``x`` (not rounded to 0).

    Parameters
    ----------
    x : floating array

    Returns
    -------
    array
        Of `x`'s shape and dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> log_sigmoid(xp.asarray([-1000.0, 0.0]))
    Array([-1.00000000e+03, -6.93147181e-01], dtype=array_api_strict.float64)
    >>> float(log_sigmoid(xp.asarray(40.0)))  # -exp(-40), not 0
    -4.248354255291589e-18
    """
    xp = _xp.array_namespace(x)
    zero = xp.zeros_like(x)
    return xp.minimum(x, zero) - xp.log1p(xp.exp(-xp.abs(x)))


def _accumulator(xp: Any, device: Any) -> Any:
    return xp.float64 if _xp.has_float64(xp, device) else xp.float32


def forgetting_cumsum(f: Any, /) -> Any:
    r""":math:`F_t = \sum_{u \le t} \log\sigma(f_u)` along the last axis, in float64 where had.

    Parameters
    ----------
    f : floating array, shape ``(..., t_k)``
        Forget-gate logits, one per key position.

    Returns
    -------
    array, shape ``(..., t_k)``
        float64 where the device has it, float32 otherwise.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> forgetting_cumsum(xp.asarray([0.0, 0.0]))
    Array([-0.69314718, -1.38629436], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(f)
    wide = _accumulator(xp, _xp.device(f))
    return xp.cumulative_sum(log_sigmoid(xp.astype(f, wide)), axis=-1)


def _check_f(xp: Any, f: Any, t_k: int, batch: tuple[int, ...] | None = None) -> None:
    _xp.check_floating(xp, "f", f)
    if f.ndim < 1 or f.shape[-1] < t_k:
        msg = (f"`f` must have a forget-gate logit for each of the {t_k} keys, shape "
               f"(..., h, n) with n >= {t_k}, got shape {tuple(f.shape)}")
        raise ValueError(msg)
    if batch is not None:
        lead = tuple(f.shape[:-1])
        ok = len(lead) <= len(batch) and all(
            a in (1, b) for a, b in zip(lead[::-1], batch[::-1], strict=False))
        if not ok:
            msg = (f"`f` of shape {tuple(f.shape)} does not broadcast with the leading axes "
                   f"{batch} of `q`, `k` and `v` (heads at -3 of `q`, at -2 of `f`)")
            raise ValueError(msg)


def _check_positions(t_q: int, n: int, q_offset: int) -> None:
    if t_q and t_q - 1 + q_offset >= n:
        msg = (f"`q_offset` = {q_offset} puts the last of {t_q} queries at position "
               f"{t_q - 1 + q_offset}, but `f` has gates for positions 0 .. {n - 1} only "
               f"(each query reads its own token's gate; q_offset <= {n - t_q})")
        raise ValueError(msg)


def _positions(xp: Any, t_q: int, q_offset: int, device: Any) -> Any:
    return xp.arange(t_q, dtype=_xp.index_dtype(xp, device), device=device) + q_offset


def _gate_sums(f: Any) -> tuple[Any, Any]:
    # F summed over the finite log gates, and per position the counts of the gates before it
    # that are closed (sigma(f) = 0, log -inf) or NaN, so that a pair's bias reads only the
    # gates of its own range: F's differences would make -inf - (-inf) = NaN of every pair
    # after a closed gate, and spread a NaN gate to pairs that never read it
    xp = _xp.array_namespace(f)
    wide = _accumulator(xp, _xp.device(f))
    logs = log_sigmoid(xp.astype(f, wide))
    closed, nan = logs == -xp.inf, xp.isnan(logs)
    zero = xp.zeros((), dtype=wide, device=_xp.device(f))
    unread = closed | nan
    finite = xp.cumulative_sum(xp.where(unread, zero, logs), axis=-1)
    if _xp.readable(f) and not bool(xp.any(unread)):
        return finite, None  # every gate finite (where that can be read now)
    counts = xp.stack([xp.cumulative_sum(xp.astype(c, wide), axis=-1) for c in (closed, nan)])
    return finite, counts


def _at_queries(x: Any, p: Any) -> Any:
    # x (..., n) at the query positions p (clipped: a query before 0 reads position 0)
    xp = _xp.array_namespace(x)
    n = x.shape[-1]
    if n:
        return xp.take(x, xp.clip(p, 0, n - 1), axis=-1)
    return xp.zeros((*x.shape[:-1], p.shape[0]), dtype=x.dtype, device=_xp.device(x))


def _bias_wide(big_f: Any, t_q: int, q_offset: int, t_k: int, j0: int = 0,
               counts: Any = None) -> Any:
    # F_{p_i} - F_j for keys j0 .. j0 + t_k - 1 on the causal region, 0 elsewhere, in F's
    # dtype; every position p_i < n (checked), so no gate is made up. `counts` (`_gate_sums`):
    # -inf where the pair's range holds a closed gate, NaN where it holds a NaN one
    xp = _xp.array_namespace(big_f)
    dev = _xp.device(big_f)
    p = _positions(xp, t_q, q_offset, dev)
    j = xp.arange(j0, j0 + t_k, dtype=p.dtype, device=dev)
    diff = _at_queries(big_f, p)[..., :, None] - big_f[..., None, j0:j0 + t_k]
    if counts is not None:
        read = _at_queries(counts, p)[..., :, None] != counts[..., None, j0:j0 + t_k]
        diff = xp.where(read[0, ...], xp.asarray(-xp.inf, dtype=diff.dtype, device=dev), diff)
        diff = xp.where(read[1, ...], xp.asarray(xp.nan, dtype=diff.dtype, device=dev), diff)
    causal = j[None, :] <= p[:, None]
    return xp.where(causal, diff, xp.zeros((), dtype=diff.dtype, device=dev))


def forgetting_tile(f: Any, /, t_q: int, t_k: int, *, q_offset: int, j0: int = 0) -> Any:
    """The bias of a tile: queries at ``q_offset ..``, keys ``j0 .. j0 + t_k - 1`` (unchecked).

    For the blocked evaluation (`relpos_ref.blocked`): `f` holds every gate
    of the call, read through its cumulative sum; in `f`'s dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> forgetting_tile(xp.zeros(4), 1, 2, q_offset=3, j0=2) / 0.6931471805599453  # keys 2, 3
    Array([[-1.,  0.]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(f)
    big_f, counts = _gate_sums(f)
    return xp.astype(_bias_wide(big_f, t_q, q_offset, t_k, j0, counts), f.dtype)


def forgetting_bias(f: Any, /, t_q: int, t_k: int | None = None, *, q_offset: int = 0) -> Any:
    r"""The forgetting bias :math:`b_{ij} = F_{i + q_\text{offset}} - F_j` (0 where ``j > p_i``).

    Parameters
    ----------
    f : floating array, shape ``(..., n)``
        Forget-gate logits, one per position, ``n >= t_k`` (heads at -2).
    t_q : int
        Number of queries.
    t_k : int, optional
        Number of keys; default ``n``. Gates past ``t_k`` are never read.
    q_offset : int, optional
        Position of query 0; every query position must have a gate (``< n``).
        0 here (the first queries), unlike `forgetting_attention`, whose
        default is end-aligned (``t_k - t_q``): a decode step against a cache
        passes ``q_offset = t_k - 1``.

    Returns
    -------
    array, shape ``(..., t_q, t_k)``
        In `f`'s dtype, on its device (computed in float64 where the device
        has it, rounded once).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> import math
    >>> f = xp.asarray([0.0, 0.0, math.log(3.0)])  # gates 1/2, 1/2, 3/4
    >>> b = forgetting_bias(f, 3)
    >>> xp.exp(b) * 8  # 8 * the product of the gates after the key; 0 (so 8) above
    Array([[8., 8., 8.],
           [4., 8., 8.],
           [3., 6., 8.]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(f)
    t_q = nonnegative_int("t_q", t_q)
    q_offset = as_int("q_offset", q_offset)
    _check_f(xp, f, 0)
    t_k = f.shape[-1] if t_k is None else nonnegative_int("t_k", t_k)
    _check_f(xp, f, t_k)
    _check_positions(t_q, f.shape[-1], q_offset)
    return forgetting_tile(f, t_q, t_k, q_offset=q_offset)


def forgetting_call(
    q: Any, k: Any, v: Any, f: Any, /, *, scale: float | None, mask: Any,
    causal: bool | None, q_offset: int | None,
) -> Call:
    """Validate a `forgetting_attention` call: the common checks, then `f`'s and causality.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((2, 3, 4))
    >>> forgetting_call(q, k, v, xp.zeros((2, 3)), scale=None, mask=None, causal=None,
    ...                 q_offset=None).causal
    True
    """
    call = resolve_call(q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
                        defaults=DEFAULTS, tables={"f": f})
    if not call.causal:
        msg = ("`causal` must be True for the forgetting bias (its sum runs from the key to "
               f"the query, j <= i), got {causal!r}")
        raise ValueError(msg)
    xp = call.xp
    _check_f(xp, f, call.t_k, tuple(call.batch))
    _xp.check_same_dtype(q=q, f=f)
    _check_positions(call.t_q, f.shape[-1], call.q_offset)
    return call


@computes_in_float32
def forgetting_attention(
    q: Any,
    k: Any,
    v: Any,
    f: Any,
    /,
    *,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
    return_weights: bool = False,
) -> Any:
    r"""Attention with the forgetting bias (FoX's Forgetting Attention).

    .. math:: w = \operatorname{softmax}_{j \le p_i}(s\, q k^\top + b), \qquad
              b_{ij} = \sum_{t=j+1}^{i + q_\text{offset}} \log\sigma(f_t)

    Parameters
    ----------
    q, k, v : floating arrays ``(..., h, t_q, d)``, ``(..., h, t_k, d)``, ``(..., h, t_k, d_v)``
    f : floating array ``(..., h, n)``, ``n >= t_k``
        Forget-gate logits (before the sigmoid), one per position and head,
        broadcasting with the leading axes of `q`; `q`'s dtype. Usually
        ``n = t_k``; every query position ``i + q_offset`` must be below ``n``.
    scale, mask, q_offset, return_weights
        As in `relpos_ref.attention`; `q_offset` defaults to ``t_k - t_q``.
    causal : bool, optional
        Must be ``True`` (the default).

    Returns
    -------
    out : array ``(..., h, t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = xp.zeros((1, 3, 1))
    >>> v = xp.asarray([[[1.0], [2.0], [4.0]]])
    >>> out, w = forgetting_attention(q, k, v, xp.zeros((1, 3)), return_weights=True)
    >>> w[0, 2, :]  # gates 1/2: weights 1/4 : 1/2 : 1
    Array([0.14285714, 0.28571429, 0.57142857], dtype=array_api_strict.float64)
    """
    call = forgetting_call(q, k, v, f, scale=scale, mask=mask, causal=causal,
                           q_offset=q_offset)
    bias = forgetting_bias(f, call.t_q, call.t_k, q_offset=call.q_offset)
    return attention(q, k, v, scale=call.scale, mask=mask, causal=True,
                     q_offset=call.q_offset, bias=bias, return_weights=return_weights)


def forgetting_f_gradient(f: Any, d_bias: Any, q_offset: int) -> Any:
    r"""The gradient of a loss with respect to `f`, from its gradient ``d_bias`` w.r.t. the bias.

    .. math:: \bar F_u = \sum_i [p_i = u] \sum_j \bar b_{ij} - \sum_i \bar b_{iu}, \qquad
              \bar f_t = \sigma(-f_t) \sum_{u \ge t} \bar F_u

    Parameters
    ----------
    f : floating array ``(..., n)``
    d_bias : floating array ``(..., t_q, t_k)``, ``t_k <= n``
        Zero where ``j > p_i`` (the bias is causal); every ``p_i < n``.
    q_offset : int

    Returns
    -------
    array, `f`'s shape and dtype (computed in float64 where the device has it).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> d = xp.asarray([[0.0, 0.0], [1.0, 0.0]])  # only b_10 = log sigma(f_1)
    >>> forgetting_f_gradient(xp.asarray([0.0, 0.0]), d, 0)  # sigma(-f_1) = 1/2
    Array([0. , 0.5], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(f, d_bias)
    d_bias = xp.astype(d_bias, _accumulator(xp, _xp.device(f)))
    rows, cols = xp.sum(d_bias, axis=-1), xp.sum(d_bias, axis=-2)
    return forgetting_f_gradient_from_sums(f, rows, cols, q_offset)


def forgetting_f_gradient_from_sums(f: Any, rows: Any, cols: Any, q_offset: int) -> Any:
    r"""`forgetting_f_gradient` from the bias cotangent's row sums and column sums.

    ``rows`` ``(..., t_q)`` and ``cols`` ``(..., t_k)`` are
    :math:`\sum_j \bar b_{ij}` and :math:`\sum_i \bar b_{ij}`, in the
    accumulator's dtype (float64 where the device has it): all of the bias's
    cotangent that reaches `f`, so a kernel that never holds
    :math:`\bar b` passes its sums here.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> rows, cols = xp.asarray([0.0, 1.0]), xp.asarray([1.0, 0.0])  # b_10's cotangent 1
    >>> forgetting_f_gradient_from_sums(xp.asarray([0.0, 0.0]), rows, cols, 0)
    Array([0. , 0.5], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(f, rows, cols)
    dev = _xp.device(f)
    wide = _accumulator(xp, dev)
    n, t_q, t_k = f.shape[-1], rows.shape[-1], cols.shape[-1]
    lead = rows.shape[:-1]

    def zeros(m: int) -> Any:
        return xp.zeros((*lead, m), dtype=wide, device=dev)

    first = min(max(0, -q_offset), t_q)  # queries at negative positions read no gate
    start = max(q_offset, 0)
    at_rows = xp.concat([zeros(start), rows[..., first:], zeros(n - start - (t_q - first))],
                        axis=-1) if t_q > first else zeros(n)
    cols = xp.concat([cols, zeros(n - t_k)], axis=-1)
    d_big = at_rows - cols
    total = xp.sum(d_big, axis=-1, keepdims=True)
    before = xp.cumulative_sum(d_big, axis=-1) - d_big  # sum over u < t
    suffix = total - before
    gate = xp.exp(log_sigmoid(-xp.astype(f, wide)))
    return xp.astype(sum_to_shape(gate * suffix, f.shape), f.dtype)


@computes_in_float32
def forgetting_attention_vjp(
    q: Any,
    k: Any,
    v: Any,
    f: Any,
    /,
    *,
    d_output: Any,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
) -> dict[str, Any]:
    r"""Gradients of `forgetting_attention` for the output's cotangent `d_output` (a VJP).

    The logits' cotangent :math:`\bar l` is the bias's; `forgetting_f_gradient`
    carries it to `f` (row sums at the query positions minus column sums, a
    suffix sum, times :math:`\sigma(-f)`); q, k and v as in
    `relpos_ref.gradients.attention_vjp`.

    Parameters
    ----------
    q, k, v, f, scale, mask, causal, q_offset
        As in `forgetting_attention`.
    d_output : floating array, shape ``(..., t_q, d_v)``

    Returns
    -------
    dict
        The gradient with respect to each of ``q``, ``k``, ``v`` and ``f``, of its
        shape and dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = xp.zeros((1, 2, 1))
    >>> v = xp.asarray([[[1.0], [3.0]]])
    >>> g = forgetting_attention_vjp(q, k, v, xp.zeros((1, 2)), d_output=xp.ones((1, 2, 1)))
    >>> g["f"]  # query 1: w = (1/3, 2/3), out 7/3; a larger gate 1 pulls it to v_0 = 1
    Array([[ 0.        , -0.22222222]], dtype=array_api_strict.float64)
    """
    call = forgetting_call(q, k, v, f, scale=scale, mask=mask, causal=causal,
                           q_offset=q_offset)
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    bias = forgetting_bias(f, call.t_q, call.t_k, q_offset=call.q_offset)
    fwd = forward(q, k, call, mask=mask, bias=bias)
    core = core_vjp(q, k, v, d_output, call, fwd)
    return {"q": sum_to_shape(core.dq, q.shape), "k": sum_to_shape(core.dk, k.shape),
            "v": sum_to_shape(core.dv, v.shape),
            "f": forgetting_f_gradient(f, core.d_logits, call.q_offset)}
