r"""ALiBi: attention with linear biases (Press et al. 2022).

Each head ``h`` adds a fixed penalty proportional to the distance:

.. math:: \text{logits}_{ij} = s\, q_i \cdot k_j + B^h_{ij}, \qquad
          B^h_{ij} = -m_h\, |r_{ij}| \;\text{(symmetric)} \quad\text{or}\quad
          m_h\, r_{ij} \;\text{(causal form)}

with ``r = j - (i + q_offset)``. The two forms agree wherever ``r <= 0``, so
under a causal mask they give the same attention. The slopes are geometric:
for ``n`` heads, a power of two, ``m_h = 2^{-8 (h + 1) / n}``; otherwise the
slopes of the nearest smaller power of two ``p`` are followed by every other
slope of ``2p`` heads, ``h = 0, 2, 4, ...``, until there are ``n``.
``slope_rule="power_of_two"`` is attention-gym's and the PyTorch blog's
``2^{-8 (h + 1) / n}`` for every ``n``: the paper's where ``n`` is a power of
two, other slopes for every other ``n`` (MPT's ceil-power-of-two
interleaving gives the paper's; `relpos_ref.presets` lists each convention).

Exact at any offset: softmax does not change when every logit of a row
moves by one constant, so `alibi_attention` (its kernels and
`relpos_ref.blocked_attention` too) adds ``m_h c`` to every bias, with
``c = |q_offset|`` (or ``q_offset`` in the causal form): the distances become
``c - |r|`` (or ``r + q_offset = j - i``), integers no larger than the
number of queries or keys, formed in integer arithmetic and exact in float32
(a bias of ``-m 2**30`` would be rounded to a multiple of 8 in float32, and
the differences between keys lost). `alibi_bias` itself returns the
definition, ``-m |r|``, with its distances formed in float64 where the call's
dtype does not hold them (`relpos_ref._exact`).
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._exact import float_dtype
from .._validate import as_int, check_bool, check_choice, nonnegative_int
from ..attention import attention
from ..calls import PLAIN, Call, computes_in_float32, resolve_call
from ..distance_gradients import distance_axis, scalar_rows_vjp
from ..gradients import check_d_output, core_vjp, forward, sum_to_shape
from ..positions import relative_positions

__all__ = [
    "DEFAULTS",
    "SLOPE_RULES",
    "alibi_attention",
    "alibi_attention_vjp",
    "alibi_bias",
    "alibi_call",
    "alibi_shift",
    "alibi_slopes",
]

#: ALiBi's defaults: ``scale = 1/sqrt(d)``, not causal, start-aligned queries.
DEFAULTS = PLAIN

#: How `alibi_slopes` derives the slopes: Press et al.'s, or ``2^(-8 (h + 1) / n)`` for any ``n``.
SLOPE_RULES = ("paper", "power_of_two")


def _power_of_two_slopes(n: int) -> list[float]:
    start = 2.0 ** (-8.0 / n)
    return [start ** (h + 1) for h in range(n)]


def alibi_slopes(num_heads: int, *, rule: str = "paper") -> tuple[float, ...]:
    """The slopes ``m_h`` of Press et al. for any number of heads (Python floats).

    Parameters
    ----------
    num_heads : int
        ``>= 0`` (no head, as in an empty batch: no slope).
    rule : {"paper", "power_of_two"}, optional
        ``"power_of_two"``: ``2^(-8 (h + 1) / n)`` whatever ``n`` (attention-gym,
        the PyTorch FlexAttention blog), the paper's only for a power of two.

    Returns
    -------
    tuple of float
        ``num_heads`` slopes, largest first.

    Examples
    --------
    >>> alibi_slopes(4)
    (0.25, 0.0625, 0.015625, 0.00390625)
    >>> [round(m, 4) for m in alibi_slopes(3)]  # 2 heads' slopes, then 1 of 4 heads'
    [0.0625, 0.0039, 0.25]
    >>> [round(m, 4) for m in alibi_slopes(3, rule="power_of_two")]
    [0.1575, 0.0248, 0.0039]
    """
    n = nonnegative_int("num_heads", num_heads)
    if check_choice("rule", rule, SLOPE_RULES) == "power_of_two" or n == 0:
        return tuple(_power_of_two_slopes(n)) if n else ()
    p = 1 << (n.bit_length() - 1)  # the largest power of two <= n
    slopes = _power_of_two_slopes(p)
    if p < n:
        slopes += _power_of_two_slopes(2 * p)[0::2][: n - p]
    return tuple(slopes)


def alibi_shift(q_offset: int, symmetric: bool = True) -> int:
    """The constant attention adds to ALiBi's distances: ``|q_offset|`` (or ``q_offset``).

    With it the distance ``-|r| + |q_offset|`` (or ``r + q_offset = j - i``)
    is at most the number of queries or keys in magnitude, whatever the
    offset (softmax ignores a constant added to a row's logits).

    Examples
    --------
    >>> alibi_shift(-5), alibi_shift(-5, symmetric=False)
    (5, -5)
    """
    q_offset = as_int("q_offset", q_offset)
    return abs(q_offset) if check_bool("symmetric", symmetric) else q_offset


def alibi_bias(
    slopes: Any, /, t_q: int, t_k: int, *, q_offset: int = 0, symmetric: bool = True,
    shift: int = 0,
) -> Any:
    r"""ALiBi bias :math:`B^h_{ij} = -m_h |r_{ij}|` (or :math:`m_h r_{ij}`), plus :math:`m_h c`.

    .. math:: B^h_{ij} = m_h \bigl(D(r_{ij}) + c\bigr), \qquad
              D(r) = -|r| \text{ (symmetric) or } r, \qquad c = \text{shift}

    The distances ``D(r) + c`` are formed in integer arithmetic, then as
    floats in `slopes`' dtype where it holds them exactly, else in float64
    (the product rounded once to `slopes`' dtype), else refused
    (`relpos_ref._exact`). A head whose slope times the largest distance
    would overflow the dtype is NaN, not ``-inf`` (which would read as a
    mask).

    Parameters
    ----------
    slopes : floating array, shape ``(h,)``
        One slope per head, e.g. ``xp.asarray(alibi_slopes(h))``.
    t_q, t_k : int
        Number of queries and keys.
    q_offset : int, optional
        Position of query 0 (``t_k - t_q`` when decoding with a cache).
    symmetric : bool, optional
        ``True``: ``-m |r|`` (penalizes the future too); ``False``: the causal
        form ``m r``, positive for future keys (mask them).
    shift : int, optional
        ``c``, a constant softmax ignores; `alibi_attention` passes
        `alibi_shift` so that the bias stays small at any offset. ``0``, the
        default, is the definition.

    Returns
    -------
    array, shape ``(h, t_q, t_k)``
        Same dtype and device as `slopes`.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> alibi_bias(xp.asarray([0.5]), 2, 3)
    Array([[[-0. , -0.5, -1. ],
            [-0.5, -0. , -0.5]]], dtype=array_api_strict.float64)
    >>> alibi_bias(xp.asarray([0.5]), 2, 3, q_offset=2**40, shift=2**40)  # r = j - i - 2**40
    Array([[[ 0. ,  0.5,  1. ],
            [-0.5,  0. ,  0.5]]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(slopes)
    _xp.check_floating(xp, "slopes", slopes)
    if slopes.ndim != 1:
        msg = f"`slopes` must have shape (h,), got shape {tuple(slopes.shape)}"
        raise ValueError(msg)
    t_q = nonnegative_int("t_q", t_q)
    t_k = nonnegative_int("t_k", t_k)
    q_offset = as_int("q_offset", q_offset)
    symmetric = check_bool("symmetric", symmetric)
    shift = as_int("shift", shift)
    dev = _xp.device(slopes)
    r = relative_positions(t_q, t_k, q_offset=q_offset, xp=xp, device=dev)
    largest = _largest_distance(t_q, t_k, q_offset, symmetric, shift)
    dtype = _distance_dtype(xp, slopes.dtype, dev, largest, t_q, t_k, q_offset, shift)
    top = xp.iinfo(r.dtype).max
    if largest > top:
        msg = (f"`shift` = {shift} with `q_offset` = {q_offset} gives distances beyond the "
               f"index dtype {r.dtype} (at most {top})")
        raise ValueError(msg)
    distance = (-xp.abs(r) if symmetric else r) + shift
    used = _nan_where_overflowing(xp, slopes, largest)
    product = xp.astype(used, dtype)[:, None, None] * xp.astype(distance, dtype)[None, :, :]
    return xp.astype(product, slopes.dtype, copy=False)


def _largest_distance(t_q: int, t_k: int, q_offset: int, symmetric: bool, shift: int) -> int:
    # max |D(r) + shift| over the grid's distances, on the host (0 for an empty grid)
    if t_q == 0 or t_k == 0:
        return 0
    r_min, r_max = -(t_q - 1 + q_offset), t_k - 1 - q_offset
    if not symmetric:
        return max(abs(r_min + shift), abs(r_max + shift))
    nearest = 0 if r_min <= 0 <= r_max else min(abs(r_min), abs(r_max))
    farthest = max(abs(r_min), abs(r_max))
    return max(abs(shift - nearest), abs(shift - farthest))


def _distance_dtype(xp: Any, dtype: Any, dev: Any, largest: int, t_q: int, t_k: int,
                    q_offset: int, shift: int) -> Any:
    # the dtype of the distances D(r) + shift: with no shift, the message gives the exact
    # range of q_offset (r_min >= -limit, r_max <= limit); a shift leaves none to give
    def allowed(limit: int) -> tuple[int, int]:
        return t_k - 1 - limit, limit - t_q + 1

    return float_dtype(xp, dtype, device=dev, largest=largest, name="q_offset", value=q_offset,
                       what="distances", allowed=None if shift else allowed)


def _nan_where_overflowing(xp: Any, slopes: Any, largest: int) -> Any:
    # NaN for a head whose slope times the largest distance overflows its dtype: its
    # bias could overflow, and an overflow must be NaN, never -inf (a mask). Decided per
    # head, h values, not per entry of (h, t_q, t_k) (a slope above finfo.max / t).
    top = float(xp.finfo(slopes.dtype).max)
    fits = xp.abs(slopes) <= top / max(largest, 1)
    return xp.where(fits, slopes, xp.asarray(xp.nan, dtype=slopes.dtype,
                                             device=_xp.device(slopes)))


def alibi_call(
    q: Any,
    k: Any,
    v: Any,
    /,
    *,
    slopes: Any,
    symmetric: bool,
    scale: float | None,
    mask: Any,
    causal: bool | None,
    q_offset: int | None,
    slope_rule: str = "paper",
) -> tuple[Call, Any]:
    """Validate an `alibi_attention` call; return it and the slopes (shared with the kernels).

    Without `slopes`, those of `alibi_slopes` (by `slope_rule`) for the
    ``q.shape[-3]`` heads, in `q`'s dtype and on its device.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((2, 3, 4))
    >>> _, slopes = alibi_call(q, k, v, slopes=None, symmetric=True, scale=None, mask=None,
    ...                        causal=None, q_offset=None)
    >>> slopes
    Array([0.0625    , 0.00390625], dtype=array_api_strict.float64)
    """
    call = resolve_call(
        q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset, defaults=DEFAULTS,
        tables={"slopes": slopes},
    )
    xp = call.xp
    check_bool("symmetric", symmetric)
    check_choice("slope_rule", slope_rule, SLOPE_RULES)
    if slopes is None:
        if q.ndim < 3:
            msg = (
                f"`q` must have a head axis at -3 to derive ALiBi slopes, got shape "
                f"{tuple(q.shape)}; pass `slopes`"
            )
            raise ValueError(msg)
        slopes = xp.asarray(alibi_slopes(q.shape[-3], rule=slope_rule), dtype=q.dtype,
                            device=_xp.device(q))
    else:
        _xp.check_floating(xp, "slopes", slopes)
        _xp.check_same_dtype(q=q, slopes=slopes)
        if slopes.ndim != 1:
            msg = f"`slopes` must have shape (h,), got shape {tuple(slopes.shape)}"
            raise ValueError(msg)
        heads = call.batch[-1] if call.batch else 1
        if 1 not in (slopes.shape[0], heads) and slopes.shape[0] != heads:
            msg = (f"`slopes` has {slopes.shape[0]} entries (shape {tuple(slopes.shape)}), one "
                   f"per head, but the heads of `q` {tuple(q.shape)}, `k` {tuple(k.shape)} "
                   f"and `v` {tuple(v.shape)} (axis -3) number {heads}")
            raise ValueError(msg)
    return call, slopes


@computes_in_float32
def alibi_attention(
    q: Any,
    k: Any,
    v: Any,
    /,
    *,
    slopes: Any = None,
    slope_rule: str = "paper",
    symmetric: bool = True,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
    return_weights: bool = False,
) -> Any:
    r"""Attention with linear biases.

    .. math:: w = \operatorname{softmax}(s\, q k^\top + B), \qquad B^h_{ij} = -m_h |r_{ij}|

    Parameters
    ----------
    q, k, v : floating arrays ``(..., h, t_q, d)``, ``(..., h, t_k, d)``, ``(..., h, t_k, d_v)``
        Heads at axis -3.
    slopes : floating array ``(h,)``, optional
        Default `alibi_slopes` of ``h = q.shape[-3]`` heads.
    slope_rule : {"paper", "power_of_two"}, optional
        The rule of `alibi_slopes` for the default slopes (ignored with `slopes`).
    symmetric : bool, optional
        As in `alibi_bias`.
    scale, mask, causal, q_offset, return_weights
        As in `relpos_ref.attention` (defaults `DEFAULTS`).

    Returns
    -------
    out : array ``(..., h, t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((1, 3, 1))  # one head, slope 1/256
    >>> _, w = alibi_attention(q, k, v, causal=True, return_weights=True)
    >>> bool(w[0, 2, 2] > w[0, 2, 1] > w[0, 2, 0])
    True
    """
    call, slopes = alibi_call(
        q, k, v, slopes=slopes, symmetric=symmetric, scale=scale, mask=mask, causal=causal,
        q_offset=q_offset, slope_rule=slope_rule,
    )
    bias = alibi_bias(slopes, call.t_q, call.t_k, q_offset=call.q_offset, symmetric=symmetric,
                      shift=alibi_shift(call.q_offset, symmetric))
    return attention(
        q, k, v, scale=call.scale, mask=mask, causal=call.causal, q_offset=call.q_offset,
        bias=bias, return_weights=return_weights,
    )


@computes_in_float32
def alibi_attention_vjp(
    q: Any,
    k: Any,
    v: Any,
    /,
    *,
    d_output: Any,
    slopes: Any = None,
    slope_rule: str = "paper",
    symmetric: bool = True,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
) -> dict[str, Any]:
    r"""Gradients of `alibi_attention` for the output's cotangent `d_output` (a VJP).

    .. math:: \bar{m}_h = \sum_{i, j} \bar{l}^{\,h}_{ij}\,(-|r_{ij}|)
              \quad (\text{or } r_{ij} \text{ in the causal form})

    for the slopes (learned ALiBi variants train them); q, k and v as in
    `relpos_ref.gradients.attention_vjp`. Each row of :math:`\bar{l}` sums
    to 0, so the sum is taken over the distances `alibi_attention` uses,
    ``D(r) + alibi_shift(q_offset)``: the same gradient, exact at any offset.

    Parameters
    ----------
    q, k, v, slopes, slope_rule, symmetric, scale, mask, causal, q_offset
        As in `alibi_attention`.
    d_output : floating array, shape ``(..., t_q, d_v)``
        :math:`\partial L / \partial\,\text{out}`; same dtype as `q`.

    Returns
    -------
    dict
        The gradient with respect to each of ``q``, ``k``, ``v`` and ``slopes`` (those used:
        `alibi_slopes` when not given), of its shape and dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = xp.zeros((1, 2, 1))
    >>> v = xp.asarray([[[1.0], [3.0]]])
    >>> g = alibi_attention_vjp(q, k, v, d_output=xp.ones((1, 2, 1)), slopes=xp.asarray([0.0]))
    >>> g["slopes"]  # a steeper slope pulls each query towards its own key
    Array([0.], dtype=array_api_strict.float64)
    """
    call, used = alibi_call(
        q, k, v, slopes=slopes, symmetric=symmetric, scale=scale, mask=mask, causal=causal,
        q_offset=q_offset, slope_rule=slope_rule,
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    shift = alibi_shift(call.q_offset, symmetric)
    bias = alibi_bias(used, call.t_q, call.t_k, q_offset=call.q_offset, symmetric=symmetric,
                      shift=shift)
    fwd = forward(q, k, call, mask=mask, bias=bias)
    core = core_vjp(q, k, v, d_output, call, fwd)
    axis = distance_axis(call.t_q, call.t_k, call.q_offset)
    xp, dev = call.xp, _xp.device(q)
    # the shifted distances (each row of d_logits sums to 0: the same gradient, without
    # the rounding of shift times that sum), in a dtype that holds them
    largest = _largest_distance(call.t_q, call.t_k, call.q_offset, symmetric, shift)
    dtype = _distance_dtype(xp, q.dtype, dev, largest, call.t_q, call.t_k, call.q_offset, shift)
    r = xp.arange(axis.n, dtype=_xp.index_dtype(xp, dev), device=dev) + axis.low
    distance = xp.astype((-xp.abs(r) if symmetric else r) + shift, dtype)
    per_head = sum_to_shape(scalar_rows_vjp(core.d_logits, axis), (used.shape[0], axis.n))
    return {
        "q": sum_to_shape(core.dq, q.shape),
        "k": sum_to_shape(core.dk, k.shape),
        "v": sum_to_shape(core.dv, v.shape),
        "slopes": xp.astype(xp.matmul(xp.astype(per_head, dtype), distance), q.dtype),
    }
