r"""KERPLE: kernelized relative positional embedding (Chi et al. 2022).

Each head adds a conditionally positive definite kernel of the distance,
after scaling, with two learned parameters per head, :math:`r_1, r_2 > 0`:

.. math:: \text{logits}_{ij} = s\, q_i \cdot k_j + B^h_{ij}, \qquad
          B^h_{ij} = \begin{cases}
          -r_1^h \log\bigl(1 + r_2^h\, |r_{ij}|\bigr) & \text{log variant} \\
          -r_1^h\, |r_{ij}|^{r_2^h} & \text{power variant } (0 < r_2 \le 2)
          \end{cases}

with ``r = j - (i + q_offset)``. Both are symmetric in ``r`` and 0 at
``r = 0``; under a causal mask only ``r <= 0`` is read. NeMo's ``tril``
zeroes the future of its end-aligned ``(t_q, t_k)`` slice start-aligned: the
same attention when ``t_q = t_k``, but after a cache (``t_q < t_k``) it
zeroes the bias of the ``t_k - t_q - 1`` most recent past keys of each query
(docs/schemes/kerple.md). The defaults are NeMo's initialization: ``r_1``
the ALiBi slopes of the head count (`relpos_ref.schemes.alibi.alibi_slopes`),
``r_2 = 1``; with them the power variant is ALiBi. NeMo's module computes
``-b log(1 + a |r|^p)`` with ``p`` learned: the log variant only while
``p = 1`` (its initialization); a trained ``p != 1`` is not a kernel here.
Its ``a`` was a constant 0 until NVIDIA-NeMo PR #6666, which made every
bias 0.

The parameters are values, never checked (that would read array values): a
non-positive one gives what the formula gives (NaN for a log of a negative
number). The distances are integers, made floats in float64 where the
device has it (`relpos_ref._exact`), the kernel evaluated there and rounded
once to the parameters' dtype.
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._exact import float_dtype
from .._validate import as_int, check_choice, nonnegative_int
from ..attention import attention
from ..calls import PLAIN, Call, computes_in_float32, resolve_call
from ..distance_gradients import distance_axis, scalar_rows_vjp
from ..gradients import check_d_output, core_vjp, forward, sum_to_shape
from ..positions import relative_positions
from .alibi import alibi_slopes

__all__ = [
    "DEFAULTS",
    "KERNELS",
    "kerple_attention",
    "kerple_attention_vjp",
    "kerple_bias",
    "kerple_call",
    "kerple_kernel",
]

#: KERPLE's defaults: ``scale = 1/sqrt(d)``, not causal, start-aligned queries.
DEFAULTS = PLAIN

#: The two kernels of the paper.
KERNELS = ("log", "power")


def kerple_kernel(distance: Any, r1: Any, r2: Any, /, *, kernel: str = "log") -> Any:
    r"""The kernel of each head at each distance ``a``: the log or the power variant.

    .. math:: -r_1 \log(1 + r_2 a) \qquad\text{or}\qquad -r_1 a^{r_2}

    Parameters
    ----------
    distance : floating array, shape ``(n,)``
        Distances ``a = |r| >= 0``.
    r1, r2 : floating arrays, shape ``(h,)``
        One value per head (``(1,)`` broadcasts), of `distance`'s dtype.
    kernel : {"log", "power"}, optional

    Returns
    -------
    array, shape ``(h, n)``

    Examples
    --------
    >>> import array_api_strict as xp
    >>> a = xp.asarray([0.0, 1.0, 3.0])
    >>> kerple_kernel(a, xp.asarray([2.0]), xp.asarray([1.0]), kernel="log")
    Array([[-0.        , -1.38629436, -2.77258872]], dtype=array_api_strict.float64)
    >>> kerple_kernel(a, xp.asarray([0.5]), xp.asarray([2.0]), kernel="power")
    Array([[-0. , -0.5, -4.5]], dtype=array_api_strict.float64)
    """
    kernel = check_choice("kernel", kernel, KERNELS)
    xp = _xp.array_namespace(distance, r1, r2)
    a = distance[None, :]
    if kernel == "log":
        return -r1[:, None] * xp.log1p(r2[:, None] * a)
    return -r1[:, None] * xp.pow(a, r2[:, None])


def _kernel_gradients(xp: Any, a: Any, r1: Any, r2: Any, kernel: str) -> tuple[Any, Any]:
    # d kernel / d r1 and d r2 per head and distance, (h, n); 0 at a = 0 for the power's
    # r2 (a^r2 log a -> 0 there; the formula would read 0 * -inf)
    a = a[None, :]
    one, two = r1[:, None], r2[:, None]
    if kernel == "log":
        return -xp.log1p(two * a), -one * a / (1 + two * a)
    power = xp.pow(a, two)
    positive = a > 0
    log_a = xp.log(xp.where(positive, a, xp.ones_like(a)))
    return -power, xp.where(positive, -one * power * log_a, xp.zeros_like(power))


def _wide(xp: Any, dtype: Any, device: Any, largest: int, q_offset: int) -> Any:
    # float64 where the device has it (the kernel evaluated once, then rounded)
    return float_dtype(xp, dtype, device=device, largest=largest, name="q_offset",
                       value=q_offset, what="distances", allowed=None, angles=True)


def _largest(t_q: int, t_k: int, q_offset: int) -> int:
    if t_q == 0 or t_k == 0:
        return 0
    return max(abs(t_q - 1 + q_offset), abs(t_k - 1 - q_offset))


def _check_params(xp: Any, **params: Any) -> None:
    for name, p in params.items():
        _xp.check_floating(xp, name, p)
        if p.ndim != 1:
            msg = f"`{name}` must have shape (h,), got shape {tuple(p.shape)}"
            raise ValueError(msg)


def kerple_bias(
    r1: Any, r2: Any, /, t_q: int, t_k: int, *, q_offset: int = 0, kernel: str = "log",
) -> Any:
    r"""KERPLE's bias :math:`B^h_{ij}`, the kernel at :math:`|r_{ij}|`.

    Parameters
    ----------
    r1, r2 : floating arrays, shape ``(h,)``
        One value per head (one of them may be ``(1,)``), of one dtype.
    t_q, t_k : int
        Number of queries and keys.
    q_offset : int, optional
        Position of query 0 (``t_k - t_q`` when decoding with a cache).
    kernel : {"log", "power"}, optional

    Returns
    -------
    array, shape ``(h, t_q, t_k)``
        In `r1`'s dtype, on its device.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> kerple_bias(xp.asarray([1.0]), xp.asarray([1.0]), 2, 3, kernel="power")
    Array([[[-0., -1., -2.],
            [-1., -0., -1.]]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(r1, r2)
    _check_params(xp, r1=r1, r2=r2)
    _xp.check_same_dtype(r1=r1, r2=r2)
    kernel = check_choice("kernel", kernel, KERNELS)
    t_q = nonnegative_int("t_q", t_q)
    t_k = nonnegative_int("t_k", t_k)
    q_offset = as_int("q_offset", q_offset)
    dev = _xp.device(r1)
    wide = _wide(xp, r1.dtype, dev, _largest(t_q, t_k, q_offset), q_offset)
    r = relative_positions(t_q, t_k, q_offset=q_offset, xp=xp, device=dev)
    a = xp.reshape(xp.astype(xp.abs(r), wide), (-1,))
    bias = kerple_kernel(a, xp.astype(r1, wide), xp.astype(r2, wide), kernel=kernel)
    return xp.astype(xp.reshape(bias, (bias.shape[0], t_q, t_k)), r1.dtype)


def _default_or_checked(call: Call, name: str, given: Any, default: Any, q: Any) -> Any:
    xp = call.xp
    if given is None:
        if q.ndim < 3:
            msg = (f"`q` must have a head axis at -3 to derive KERPLE's `{name}`, got shape "
                   f"{tuple(q.shape)}; pass `{name}`")
            raise ValueError(msg)
        return xp.asarray(default(q.shape[-3]), dtype=q.dtype, device=_xp.device(q))
    _check_params(xp, **{name: given})
    _xp.check_same_dtype(q=q, **{name: given})
    heads = call.batch[-1] if call.batch else 1
    if given.shape[0] not in (1, heads):
        msg = (f"`{name}` has {given.shape[0]} entries (shape {tuple(given.shape)}), one per "
               f"head, but the heads of `q`, `k` and `v` (axis -3) number {heads}")
        raise ValueError(msg)
    return given


def kerple_call(
    q: Any, k: Any, v: Any, /, *, r1: Any, r2: Any, kernel: str, scale: float | None,
    mask: Any, causal: bool | None, q_offset: int | None,
) -> tuple[Call, Any, Any]:
    """Validate a `kerple_attention` call; return it and the parameters ``r1``, ``r2``.

    Without them, NeMo's initialization for the ``q.shape[-3]`` heads: ``r1``
    the ALiBi slopes, ``r2`` ones, in `q`'s dtype and on its device.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((2, 3, 4))
    >>> _, r1, r2 = kerple_call(q, k, v, r1=None, r2=None, kernel="log", scale=None,
    ...                         mask=None, causal=None, q_offset=None)
    >>> r1
    Array([0.0625    , 0.00390625], dtype=array_api_strict.float64)
    >>> r2
    Array([1., 1.], dtype=array_api_strict.float64)
    """
    call = resolve_call(q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
                        defaults=DEFAULTS, tables={"r1": r1, "r2": r2})
    check_choice("kernel", kernel, KERNELS)
    used1 = _default_or_checked(call, "r1", r1, alibi_slopes, q)
    used2 = _default_or_checked(call, "r2", r2, lambda h: [1.0] * h, q)
    return call, used1, used2


@computes_in_float32
def kerple_attention(
    q: Any,
    k: Any,
    v: Any,
    /,
    *,
    r1: Any = None,
    r2: Any = None,
    kernel: str = "log",
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
    return_weights: bool = False,
) -> Any:
    r"""Attention with KERPLE's kernel bias.

    .. math:: w = \operatorname{softmax}(s\, q k^\top + B), \qquad
              B^h_{ij} = -r_1^h \log(1 + r_2^h |r_{ij}|) \text{ or } -r_1^h |r_{ij}|^{r_2^h}

    Parameters
    ----------
    q, k, v : floating arrays ``(..., h, t_q, d)``, ``(..., h, t_k, d)``, ``(..., h, t_k, d_v)``
        Heads at axis -3.
    r1, r2 : floating arrays ``(h,)``, optional
        Default: ``alibi_slopes(h)`` and ones (NeMo's initialization).
    kernel : {"log", "power"}, optional
    scale, mask, causal, q_offset, return_weights
        As in `relpos_ref.attention` (defaults `DEFAULTS`).

    Returns
    -------
    out : array ``(..., h, t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((1, 3, 1))
    >>> _, w = kerple_attention(q, k, v, causal=True, return_weights=True)
    >>> bool(w[0, 2, 2] > w[0, 2, 1] > w[0, 2, 0])
    True
    """
    call, used1, used2 = kerple_call(q, k, v, r1=r1, r2=r2, kernel=kernel, scale=scale,
                                     mask=mask, causal=causal, q_offset=q_offset)
    bias = kerple_bias(used1, used2, call.t_q, call.t_k, q_offset=call.q_offset,
                       kernel=kernel)
    return attention(q, k, v, scale=call.scale, mask=mask, causal=call.causal,
                     q_offset=call.q_offset, bias=bias, return_weights=return_weights)


@computes_in_float32
def kerple_attention_vjp(
    q: Any,
    k: Any,
    v: Any,
    /,
    *,
    d_output: Any,
    r1: Any = None,
    r2: Any = None,
    kernel: str = "log",
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
) -> dict[str, Any]:
    r"""Gradients of `kerple_attention` for the output's cotangent `d_output` (a VJP).

    .. math:: \bar{r}_1^h = \sum_{i,j} \bar{l}^{\,h}_{ij}\, \partial_{r_1} B^h_{ij}, \qquad
              \bar{r}_2^h = \sum_{i,j} \bar{l}^{\,h}_{ij}\, \partial_{r_2} B^h_{ij}

    summed by distance (`relpos_ref.gradients.scalar_rows_vjp`), with
    :math:`\partial_{r_1} B = -\log(1 + r_2 a)`, :math:`\partial_{r_2} B = -r_1 a / (1 + r_2 a)`
    (log) or :math:`-a^{r_2}`, :math:`-r_1 a^{r_2} \log a` (power, 0 at ``a = 0``),
    ``a = |r|``; q, k and v as in `relpos_ref.gradients.attention_vjp`.

    Parameters
    ----------
    q, k, v, r1, r2, kernel, scale, mask, causal, q_offset
        As in `kerple_attention`.
    d_output : floating array, shape ``(..., t_q, d_v)``
        :math:`\partial L / \partial\,\text{out}`; same dtype as `q`.

    Returns
    -------
    dict
        The gradient with respect to each of ``q``, ``k``, ``v``, ``r1`` and ``r2``
        (those used when not given), of its shape and dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = xp.zeros((1, 2, 1))
    >>> v = xp.asarray([[[1.0], [3.0]]])
    >>> g = kerple_attention_vjp(q, k, v, d_output=xp.ones((1, 2, 1)))
    >>> g["r1"]  # a larger r1 pulls each query towards its own key
    Array([0.], dtype=array_api_strict.float64)
    """
    call, used1, used2 = kerple_call(q, k, v, r1=r1, r2=r2, kernel=kernel, scale=scale,
                                     mask=mask, causal=causal, q_offset=q_offset)
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    bias = kerple_bias(used1, used2, call.t_q, call.t_k, q_offset=call.q_offset,
                       kernel=kernel)
    fwd = forward(q, k, call, mask=mask, bias=bias)
    core = core_vjp(q, k, v, d_output, call, fwd)
    grads = {"q": sum_to_shape(core.dq, q.shape), "k": sum_to_shape(core.dk, k.shape),
             "v": sum_to_shape(core.dv, v.shape)}
    axis = distance_axis(call.t_q, call.t_k, call.q_offset)
    xp, dev = call.xp, _xp.device(q)
    wide = _wide(xp, q.dtype, dev, _largest(call.t_q, call.t_k, call.q_offset), call.q_offset)
    r = xp.arange(axis.n, dtype=_xp.index_dtype(xp, dev), device=dev) + axis.low
    heads = max(used1.shape[0], used2.shape[0])
    per_head = xp.astype(sum_to_shape(scalar_rows_vjp(core.d_logits, axis), (heads, axis.n)),
                         wide)
    d1, d2 = _kernel_gradients(xp, xp.astype(xp.abs(r), wide), xp.astype(used1, wide),
                               xp.astype(used2, wide), kernel)
    for name, used, d in (("r1", used1, d1), ("r2", used2, d2)):
        total = xp.sum(per_head * d, axis=-1)
        grads[name] = xp.astype(sum_to_shape(total, used.shape), q.dtype)
    return grads
