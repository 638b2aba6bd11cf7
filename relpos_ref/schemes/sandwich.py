r"""Sandwich: the inner product of sinusoidal positions as a bias (Chi et al. 2023).

Sandwich keeps, of the sinusoidal embeddings' expansion, the
position-position inner product :math:`p_m \cdot p_n = \sum_c \cos((m - n)\,\omega_c)`,
and divides it per head by ALiBi's compression ratio. It has no parameter:

.. math:: \text{logits}_{ij} = s\, q_i \cdot k_j + B^h_{ij}, \qquad
          B^h_{ij} = \frac{1}{\rho_h}\Bigl(\sum_{c=c_0}^{c_0 + \bar{d}/2 - 1}
          \cos(r_{ij}\, \omega_c) - \frac{\bar{d}}{2}\Bigr), \qquad
          \omega_c = 10000^{-2c/\bar{d}}, \qquad \rho_h = \frac{8 (h + 1)}{H}

with ``r = j - (i + q_offset)``, head ``h = 0 .. H - 1`` of ``H = q.shape[-3]``.
The bias is even in ``r``, 0 at ``r = 0`` and negative elsewhere (the
``- d̄/2``, NeMo's, is a constant of each head: softmax ignores it).
``d̄`` (`d_bar`) is the sinusoids' width, 128 in the paper. The
implementations differ in the first frequency ``c_0`` (`start`): 0, the
sinusoidal embedding's own (attention-gym's ``generate_sandwich_bias``), or
1 (NeMo's ``SandwichRelativePositionEmbedding``, ``arange(1, d̄/2 + 1)``).
NeMo, when not bidirectional, applies ``tril`` start-aligned to its
end-aligned ``(t_q, t_k)`` slice: the same attention when ``t_q = t_k``, but
after a cache it zeroes the bias of the ``t_k - t_q - 1`` most recent past
keys of each query.

The angles ``r ω_c`` are computed in float64 where the device has it
(`relpos_ref._exact`), the sum rounded once to the call's dtype.
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._exact import check_exact_distances, float_dtype
from .._validate import as_int, nonnegative_int, positive_int
from ..attention import attention
from ..calls import PLAIN, Call, computes_in_float32, resolve_call
from ..gradients import check_d_output, core_vjp, forward, sum_to_shape
from ..positions import relative_positions

__all__ = [
    "DEFAULTS",
    "sandwich_attention",
    "sandwich_attention_vjp",
    "sandwich_bias",
    "sandwich_call",
    "sandwich_kernel",
    "sandwich_ratios",
]

#: Sandwich's defaults: ``scale = 1/sqrt(d)``, not causal, start-aligned queries.
DEFAULTS = PLAIN


def sandwich_ratios(num_heads: int) -> tuple[float, ...]:
    r"""ALiBi's compression ratios, one divisor per head (Python floats).

    .. math:: \rho_h = \frac{8 (h + 1)}{H}, \qquad h = 0 .. H - 1

    Parameters
    ----------
    num_heads : int
        ``H >= 0`` (no head, as in an empty batch: no ratio).

    Returns
    -------
    tuple of float
        One divisor per head, smallest first.

    Examples
    --------
    >>> sandwich_ratios(4)
    (2.0, 4.0, 6.0, 8.0)
    """
    n = nonnegative_int("num_heads", num_heads)
    return tuple(8.0 * (h + 1) / n for h in range(n))


def _check_options(d_bar: int, start: int) -> tuple[int, int]:
    d_bar = positive_int("d_bar", d_bar)
    if d_bar % 2:
        msg = f"`d_bar` must be even (sine and cosine pairs), got {d_bar}"
        raise ValueError(msg)
    return d_bar, nonnegative_int("start", start)


def sandwich_kernel(distance: Any, /, *, d_bar: int = 128, start: int = 0) -> Any:
    r"""The head-independent sum :math:`\sum_c \cos(r \omega_c) - \bar{d}/2` at each distance.

    Parameters
    ----------
    distance : floating array, any shape
        Distances ``r`` (the sum is even in ``r``), elementwise.
    d_bar : int, optional
        Width of the sinusoids (even); ``d_bar / 2`` frequencies.
    start : int, optional
        Index of the first frequency ``c_0``: 0 (the sinusoid's, attention-gym) or 1 (NeMo).

    Returns
    -------
    array, the shape of `distance`

    Raises
    ------
    TypeError
        If `distance` is not a floating array.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> sandwich_kernel(xp.asarray([0.0, 1.0]), d_bar=2)  # cos(r) - 1
    Array([ 0.        , -0.45969769], dtype=array_api_strict.float64)
    """
    d_bar, start = _check_options(d_bar, start)
    xp = _xp.array_namespace(distance)
    if not xp.isdtype(distance.dtype, "real floating"):
        msg = (f"`distance` must be a real floating array (cast integer distances first), "
               f"got dtype {distance.dtype}")
        raise TypeError(msg)
    dev = _xp.device(distance)
    c = xp.arange(start, start + d_bar // 2, dtype=distance.dtype, device=dev)
    omega = 10000.0 ** (-2.0 * c / d_bar)
    return xp.sum(xp.cos(distance[..., None] * omega), axis=-1) - d_bar / 2


def _wide(xp: Any, dtype: Any, device: Any, t_q: int, t_k: int, q_offset: int) -> Any:
    check_exact_distances(xp, dtype, device, t_q=t_q, t_k=t_k, q_offset=q_offset,
                          clamp_len=None)
    largest = 0 if not (t_q and t_k) else max(abs(t_q - 1 + q_offset), abs(t_k - 1 - q_offset))
    return float_dtype(xp, dtype, device=device, largest=largest, name="q_offset",
                       value=q_offset, what="distances", allowed=None, angles=True)


def sandwich_bias(
    ratios: Any, /, t_q: int, t_k: int, *, q_offset: int = 0, d_bar: int = 128, start: int = 0,
) -> Any:
    r"""Sandwich's bias :math:`B^h_{ij}`: `sandwich_kernel` at :math:`r_{ij}` over :math:`\rho_h`.

    Parameters
    ----------
    ratios : floating array, shape ``(h,)``
        The heads' ratios, ``xp.asarray(sandwich_ratios(h))``; gives the dtype and device.
    t_q, t_k : int
        Number of queries and keys.
    q_offset : int, optional
        Position of query 0 (``t_k - t_q`` when decoding with a cache).
    d_bar, start : int, optional
        As in `sandwich_kernel`.

    Returns
    -------
    array, shape ``(h, t_q, t_k)``

    Examples
    --------
    >>> import array_api_strict as xp
    >>> sandwich_bias(xp.asarray([1.0, 2.0]), 1, 2, d_bar=2)
    Array([[[ 0.        , -0.45969769]],
    <BLANKLINE>
           [[ 0.        , -0.22984885]]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(ratios)
    _xp.check_floating(xp, "ratios", ratios)
    if ratios.ndim != 1:
        msg = f"`ratios` must have shape (h,), got shape {tuple(ratios.shape)}"
        raise ValueError(msg)
    t_q = nonnegative_int("t_q", t_q)
    t_k = nonnegative_int("t_k", t_k)
    q_offset = as_int("q_offset", q_offset)
    d_bar, start = _check_options(d_bar, start)
    dev = _xp.device(ratios)
    wide = _wide(xp, ratios.dtype, dev, t_q, t_k, q_offset)
    r = relative_positions(t_q, t_k, q_offset=q_offset, xp=xp, device=dev)
    sums = sandwich_kernel(xp.reshape(xp.astype(r, wide), (-1,)), d_bar=d_bar, start=start)
    bias = sums[None, :] / xp.astype(ratios, wide)[:, None]
    return xp.astype(xp.reshape(bias, (ratios.shape[0], t_q, t_k)), ratios.dtype)


def sandwich_call(
    q: Any, k: Any, v: Any, /, *, d_bar: int, start: int, scale: float | None, mask: Any,
    causal: bool | None, q_offset: int | None,
) -> tuple[Call, Any]:
    """Validate a `sandwich_attention` call; return it and the heads' ratios (in `q`'s dtype).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((2, 3, 4))
    >>> _, ratios = sandwich_call(q, k, v, d_bar=8, start=0, scale=None, mask=None,
    ...                           causal=None, q_offset=None)
    >>> ratios
    Array([4., 8.], dtype=array_api_strict.float64)
    """
    call = resolve_call(q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
                        defaults=DEFAULTS)
    _check_options(d_bar, start)
    if q.ndim < 3:
        msg = (f"`q` must have a head axis at -3 (Sandwich's ratios depend on the head count), "
               f"got shape {tuple(q.shape)}")
        raise ValueError(msg)
    heads = q.shape[-3]
    ratios = call.xp.asarray(sandwich_ratios(heads), dtype=q.dtype, device=_xp.device(q))
    return call, ratios


@computes_in_float32
def sandwich_attention(
    q: Any,
    k: Any,
    v: Any,
    /,
    *,
    d_bar: int = 128,
    start: int = 0,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
    return_weights: bool = False,
) -> Any:
    r"""Attention with Sandwich's bias.

    .. math:: w = \operatorname{softmax}(s\, q k^\top + B), \qquad
              B^h_{ij} = \Bigl(\sum_c \cos(r_{ij} \omega_c) - \bar{d}/2\Bigr) / \rho_h

    Parameters
    ----------
    q, k, v : floating arrays ``(..., h, t_q, d)``, ``(..., h, t_k, d)``, ``(..., h, t_k, d_v)``
        Heads at axis -3: their count ``H`` sets the ratios ``8 (h + 1) / H``.
    d_bar, start : int, optional
        As in `sandwich_kernel`.
    scale, mask, causal, q_offset, return_weights
        As in `relpos_ref.attention` (defaults `DEFAULTS`).

    Returns
    -------
    out : array ``(..., h, t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((1, 3, 1))
    >>> _, w = sandwich_attention(q, k, v, causal=True, return_weights=True)
    >>> bool(w[0, 2, 2] > w[0, 2, 1] > w[0, 2, 0])
    True
    """
    call, ratios = sandwich_call(q, k, v, d_bar=d_bar, start=start, scale=scale, mask=mask,
                                 causal=causal, q_offset=q_offset)
    bias = sandwich_bias(ratios, call.t_q, call.t_k, q_offset=call.q_offset, d_bar=d_bar,
                         start=start)
    return attention(q, k, v, scale=call.scale, mask=mask, causal=call.causal,
                     q_offset=call.q_offset, bias=bias, return_weights=return_weights)


@computes_in_float32
def sandwich_attention_vjp(
    q: Any,
    k: Any,
    v: Any,
    /,
    *,
    d_output: Any,
    d_bar: int = 128,
    start: int = 0,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
) -> dict[str, Any]:
    r"""Gradients of `sandwich_attention` for the output's cotangent `d_output` (a VJP).

    Sandwich has no parameter: q, k and v as in
    `relpos_ref.gradients.attention_vjp`, with the bias in the logits.

    Parameters
    ----------
    q, k, v, d_bar, start, scale, mask, causal, q_offset
        As in `sandwich_attention`.
    d_output : floating array, shape ``(..., t_q, d_v)``
        :math:`\partial L / \partial\,\text{out}`; same dtype as `q`.

    Returns
    -------
    dict
        The gradients with respect to ``q``, ``k`` and ``v``, of their shapes and dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = xp.zeros((1, 2, 1))
    >>> v = xp.asarray([[[1.0], [3.0]]])
    >>> sandwich_attention_vjp(q, k, v, d_output=xp.ones((1, 2, 1)))["v"]
    Array([[[1.],
            [1.]]], dtype=array_api_strict.float64)
    """
    call, ratios = sandwich_call(q, k, v, d_bar=d_bar, start=start, scale=scale, mask=mask,
                                 causal=causal, q_offset=q_offset)
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    bias = sandwich_bias(ratios, call.t_q, call.t_k, q_offset=call.q_offset, d_bar=d_bar,
                         start=start)
    fwd = forward(q, k, call, mask=mask, bias=bias)
    core = core_vjp(q, k, v, d_output, call, fwd)
    return {"q": sum_to_shape(core.dq, q.shape), "k": sum_to_shape(core.dk, k.shape),
            "v": sum_to_shape(core.dv, v.shape)}
