r"""Swin Transformer v2's continuous position bias (Liu et al. 2022).

A window of ``Wh x Ww`` tokens (row-major, as in `relpos_ref.schemes.swin`)
attends within itself. Swin v1 learns one scalar per head for each of the
``(2Wh - 1)(2Ww - 1)`` offsets; Swin v2 computes that table with a small MLP
of log-spaced coordinates. For an offset ``Δ`` on an axis of ``W`` tokens
(``P`` when the weights were trained at window ``P``: ``pretrained_window``)

.. math:: c(\Delta) = \operatorname{sign}(u) \frac{\log_2(1 + |u|)}{\log_2 8},
          \qquad u = \frac{8 \Delta}{W - 1}

(``u = 8 Δ`` on an axis of one token), so ``c`` is in ``[-1, 1]`` at the
window's training size. The table of head ``h`` is

.. math:: b_h(\Delta y, \Delta x) = 16\, \sigma\big(w_2^{(h)} \cdot
          \operatorname{relu}(W_1 [c(\Delta y), c(\Delta x)] + b_1)\big)

read per token pair like Swin v1's (`relpos_ref.schemes.swin.swin_index`,
``Δ`` key minus query) and added after scaling. The MLP's weights are the
table: ``w1 (m, 2)``, ``b1 (m,)``, ``w2 (m,)`` shared, or with a head axis
first (``w2 (h, m)`` as transformers stores it; ``w1``, ``b1`` per head too).

Swin v2 also replaces ``s q . k`` by scaled cosine attention,
``cos(q_n, k_m) exp(min(τ_h, log 100))`` with a learnable ``τ`` per head
(``logit_scale``; ``None`` keeps the dot product). Its shifted-window mask is
additive in the released code: ``mask_penalty`` adds that value to the
logits of masked pairs instead of leaving them out (-100 in the original
code; transformers adds its mask twice: -200).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from .. import _xp
from .._validate import as_float, positive_int
from ..attention import attention
from ..calls import PLAIN, Call, computes_in_float32, resolve_call
from ..gradients import check_d_output, core_vjp, forward, sum_to_shape
from ..layouts import _take_per_row
from ._tables import gather_scalars
from .swin import _pairs_by_entry, swin_index
from .swinv2_table import _check_mlp, _mlp, _pretrained, _sigmoid, swinv2_coordinates, swinv2_table

__all__ = [
    "DEFAULTS",
    "MAX_LOGIT_SCALE",
    "swinv2_attention",
    "swinv2_attention_vjp",
    "swinv2_bias",
    "swinv2_call",
    "swinv2_coordinates",
    "swinv2_table",
]

#: Swin v2's defaults: ``scale = 1/sqrt(d)`` (dot product), not causal.
DEFAULTS = PLAIN

#: The clamp of cosine attention's logit scale: ``log(1 / 0.01)``.
MAX_LOGIT_SCALE = math.log(100.0)

_EPS = 1e-12  # torch.nn.functional.normalize's floor of the norm


def swinv2_bias(
    w1: Any, b1: Any, w2: Any, /, window_height: int, window_width: int, *,
    pretrained_window: Any = None,
) -> Any:
    """Bias matrix of one window, `swinv2_table` read at `relpos_ref.schemes.swin.swin_index`.

    Parameters
    ----------
    w1, b1, w2, window_height, window_width, pretrained_window
        As in `swinv2_table`.

    Returns
    -------
    array, shape ``(Wh Ww, Wh Ww)`` or ``(h, Wh Ww, Wh Ww)``

    Examples
    --------
    >>> import array_api_strict as xp
    >>> swinv2_bias(xp.ones((4, 2)), xp.zeros(4), xp.zeros(4), 1, 2)
    Array([[8., 8.],
           [8., 8.]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(w1, b1, w2)
    table = swinv2_table(w1, b1, w2, window_height, window_width,
                         pretrained_window=pretrained_window)
    return gather_scalars(table, swin_index(window_height, window_width, xp=xp,
                                            device=_xp.device(w1)))


def swinv2_call(
    q: Any, k: Any, v: Any, w1: Any, b1: Any, w2: Any, /, *, window_height: int,
    window_width: int, pretrained_window: Any, logit_scale: Any, scale: float | None,
    mask: Any, mask_penalty: float | None,
) -> Call:
    """Validate a `swinv2_attention` call and resolve its defaults (shared with the kernels).

    Cosine attention (`logit_scale` given) takes no `scale` (or 1): the call's is 1.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = xp.zeros((4, 8))
    >>> swinv2_call(q, q, q, xp.zeros((3, 2)), xp.zeros(3), xp.zeros(3), window_height=2,
    ...             window_width=2, pretrained_window=None, logit_scale=None, scale=None,
    ...             mask=None, mask_penalty=None).scale
    0.35355339059327373
    """
    one_number = _one_number(logit_scale)
    if logit_scale is not None and not one_number and not hasattr(logit_scale, "shape"):
        msg = (f"`logit_scale` must be a number or an array, got {logit_scale!r} "
               f"({type(logit_scale).__name__})")
        raise TypeError(msg)
    if one_number and not math.isfinite(float(logit_scale)):
        msg = f"`logit_scale` must be finite, got {logit_scale!r}"
        raise ValueError(msg)
    if logit_scale is not None and scale is not None and as_float("scale", scale) != 1.0:
        msg = ("cosine attention (`logit_scale` given) is scaled by exp(min(logit_scale, "
               f"log 100)): `scale` must be None (or 1, the call's), got {scale!r}")
        raise ValueError(msg)
    call = resolve_call(
        q, k, v, scale=1.0 if logit_scale is not None else scale, mask=mask, causal=False,
        q_offset=0, defaults=DEFAULTS,
        tables={"w1": w1, "b1": b1, "w2": w2, "logit_scale": None if one_number else logit_scale},
    )
    heads = _check_mlp(w1, b1, w2)
    _xp.check_same_dtype(q=q, w1=w1, b1=b1, w2=w2, **(  # a number (NumPy's too) is no array
        {"logit_scale": logit_scale} if not one_number and hasattr(logit_scale, "dtype")
        else {}))
    wh = positive_int("window_height", window_height)
    ww = positive_int("window_width", window_width)
    _pretrained(pretrained_window)
    for name, x in (("q", q), ("k", k)):
        if x.shape[-2] != wh * ww:
            msg = (f"`{name}` must have Wh * Ww = {wh * ww} tokens on axis -2, "
                   f"got shape {tuple(x.shape)}")
            raise ValueError(msg)
    h = q.shape[-3] if q.ndim >= 3 else 1
    if heads not in (None, 1, h):
        msg = f"the MLP has {heads} heads, `q` has {h} on axis -3 (shape {tuple(q.shape)})"
        raise ValueError(msg)
    if logit_scale is not None and not one_number and (
        not hasattr(logit_scale, "shape") or logit_scale.ndim > 1
        or (logit_scale.ndim == 1 and logit_scale.shape[0] not in (1, h))
    ):
        msg = (f"`logit_scale` must be a number (every head's) or an array of shape () or "
               f"({h},) (one per head), got "
               f"{getattr(logit_scale, 'shape', logit_scale)!r}")
        raise ValueError(msg)
    if mask_penalty is not None:
        as_float("mask_penalty", mask_penalty)
    return call


def _one_number(x: Any) -> bool:
    # `logit_scale` given as one number (every head's), not an array
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _operands(q: Any, k: Any, logit_scale: Any) -> tuple[Any, Any, Any, Any, Any]:
    # cosine attention's operands: q_hat tau, k_hat (and q_hat, k_hat, tau for the VJP)
    if logit_scale is None:
        return q, k, None, None, None
    xp = _xp.array_namespace(q)
    floor = xp.asarray(_EPS, dtype=q.dtype, device=_xp.device(q))
    q_hat, k_hat = (x / xp.maximum(xp.sqrt(xp.sum(x * x, axis=-1, keepdims=True)), floor)
                    for x in (q, k))  # no linalg extension needed
    if _one_number(logit_scale):  # every head's: a constant, as torch's clamp then exp of it
        tau = math.exp(min(float(logit_scale), MAX_LOGIT_SCALE))
        return q_hat * tau, k_hat, q_hat, k_hat, tau
    tau = xp.exp(xp.minimum(logit_scale, xp.asarray(MAX_LOGIT_SCALE, dtype=logit_scale.dtype,
                                                    device=_xp.device(q))))
    tau = xp.reshape(tau, (*tau.shape, 1, 1))
    return q_hat * tau, k_hat, q_hat, k_hat, tau


def _bias_and_mask(w1: Any, b1: Any, w2: Any, options: dict[str, Any], mask: Any,
                   mask_penalty: float | None) -> tuple[Any, Any]:
    bias = swinv2_bias(w1, b1, w2, options["window_height"], options["window_width"],
                       pretrained_window=options["pretrained_window"])
    if mask is None or mask_penalty is None:
        return bias, mask
    xp = _xp.array_namespace(bias)
    zero = xp.zeros((), dtype=bias.dtype, device=_xp.device(bias))
    penalty = xp.asarray(float(mask_penalty), dtype=bias.dtype, device=_xp.device(bias))
    return bias + xp.where(mask, zero, penalty), None


@computes_in_float32
def swinv2_attention(
    q: Any, k: Any, v: Any, w1: Any, b1: Any, w2: Any, /, *, window_height: int,
    window_width: int, pretrained_window: Any = None, logit_scale: Any = None,
    scale: float | None = None, mask: Any = None, mask_penalty: float | None = None,
    return_weights: bool = False,
) -> Any:
    r"""Window attention with Swin v2's continuous position bias.

    .. math:: w = \operatorname{softmax}(s\, q k^\top + B + \text{mask}), \quad\text{or}\quad
              \operatorname{softmax}(\cos(q, k)\, e^{\min(\tau_h, \log 100)} + B + \text{mask})

    Parameters
    ----------
    q, k, v : floating arrays ``(..., Wh Ww, d)``, ``(..., Wh Ww, d)``, ``(..., Wh Ww, d_v)``
        One window's tokens, row-major; heads at axis -3.
    w1, b1, w2 : floating arrays
        The MLP (`swinv2_table`).
    window_height, window_width : int
    pretrained_window : pair of int, optional
        As in `swinv2_coordinates`.
    logit_scale : floating array ``()`` or ``(h,)``, or a number, optional
        Cosine attention's ``τ`` (transformers' ``logit_scale`` reshaped), or one
        number for every head (a constant: it gets no gradient); ``None``:
        ``s q . k``.
    scale, mask, return_weights
        As in `relpos_ref.attention`; `mask` is boolean (``True`` = may attend).
    mask_penalty : float, optional
        ``None``: masked pairs are left out. A number: it is added to their
        logits instead (Swin v2's -100; transformers' doubled -200).

    Returns
    -------
    out : array ``(..., Wh Ww, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.eye(4)  # a 2 x 2 window
    >>> w1, b1, w2 = xp.ones((3, 2)), xp.zeros(3), xp.ones(3)
    >>> swinv2_attention(q, k, v, w1, b1, w2, window_height=2, window_width=2,
    ...                  logit_scale=xp.asarray(0.0)).shape
    (4, 4)
    """
    call = swinv2_call(
        q, k, v, w1, b1, w2, window_height=window_height, window_width=window_width,
        pretrained_window=pretrained_window, logit_scale=logit_scale, scale=scale, mask=mask,
        mask_penalty=mask_penalty,
    )
    options = {"window_height": window_height, "window_width": window_width,
               "pretrained_window": pretrained_window}
    bias, used_mask = _bias_and_mask(w1, b1, w2, options, mask, mask_penalty)
    q2, k2, *_ = _operands(q, k, logit_scale)
    return attention(q2, k2, v, scale=call.scale, mask=used_mask, bias=bias,
                     return_weights=return_weights)


def _normalize_vjp(xp: Any, x: Any, x_hat: Any, d_hat: Any) -> Any:
    floor = xp.asarray(_EPS, dtype=x.dtype, device=_xp.device(x))
    norm = xp.sqrt(xp.sum(x * x, axis=-1, keepdims=True))
    radial = x_hat * xp.sum(x_hat * d_hat, axis=-1, keepdims=True)
    return xp.where(norm > floor, (d_hat - radial) / xp.maximum(norm, floor), d_hat / floor)


@computes_in_float32
def swinv2_attention_vjp(
    q: Any, k: Any, v: Any, w1: Any, b1: Any, w2: Any, /, *, d_output: Any,
    window_height: int, window_width: int, pretrained_window: Any = None,
    logit_scale: Any = None, scale: float | None = None, mask: Any = None,
    mask_penalty: float | None = None,
) -> dict[str, Any]:
    r"""Gradients of `swinv2_attention` for the output's cotangent `d_output` (a VJP).

    The table's gradient is Swin v1's (`relpos_ref.schemes.swin.swin_attention_vjp`),
    carried back through ``16 sigma`` (:math:`16 \sigma (1 - \sigma)`), the ReLU and both
    linear maps; cosine attention's through the normalization
    (:math:`(\bar{\hat q} - \hat q (\hat q \cdot \bar{\hat q})) / \|q\|`) and
    the clamp (``τ`` gets no gradient above ``log 100``).

    Parameters
    ----------
    q, k, v, w1, b1, w2, window_height, window_width, pretrained_window
        As in `swinv2_attention`.
    logit_scale, scale, mask, mask_penalty
        As in `swinv2_attention`.
    d_output : floating array, shape ``(..., t_q, d_v)``

    Returns
    -------
    dict
        The gradient with respect to ``q``, ``k``, ``v``, ``w1``, ``b1``, ``w2`` (and
        ``logit_scale`` when given as an array), each of its argument's shape and dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = xp.zeros((2, 1))
    >>> v = xp.asarray([[1.0], [3.0]])
    >>> g = swinv2_attention_vjp(q, k, v, xp.ones((3, 2)), xp.zeros(3), xp.zeros(3),
    ...                          d_output=xp.ones((2, 1)), window_height=1, window_width=2)
    >>> sorted(g)
    ['b1', 'k', 'q', 'v', 'w1', 'w2']
    """
    call = swinv2_call(
        q, k, v, w1, b1, w2, window_height=window_height, window_width=window_width,
        pretrained_window=pretrained_window, logit_scale=logit_scale, scale=scale, mask=mask,
        mask_penalty=mask_penalty,
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    xp, device = call.xp, _xp.device(q)
    options = {"window_height": window_height, "window_width": window_width,
               "pretrained_window": pretrained_window}
    bias, used_mask = _bias_and_mask(w1, b1, w2, options, mask, mask_penalty)
    q2, k2, *_ = _operands(q, k, logit_scale)
    fwd = forward(q2, k2, call, mask=used_mask, bias=bias)
    core = core_vjp(q2, k2, v, d_output, call, fwd)
    key, inside = _pairs_by_entry(window_height, window_width, xp=xp, device=device)
    zero = xp.zeros((), dtype=core.d_logits.dtype, device=device)
    d_table = xp.sum(xp.where(inside, _take_per_row(core.d_logits, key), zero), axis=-2)
    return _carried_back(q, k, v, w1, b1, w2, options, logit_scale, core, d_table)


def _carried_back(q: Any, k: Any, v: Any, w1: Any, b1: Any, w2: Any, options: dict[str, Any],
                 logit_scale: Any, core: Any, d_table: Any) -> dict[str, Any]:
    """`swinv2_attention_vjp` from Swin v1's: the cosine operands' and the table's cotangents.

    `core` has ``dq``, ``dk``, ``dv``: the gradients of Swin v1's attention at
    the cosine operands (`_operands`); `d_table` ``(h?, n)`` its table's
    (the table `swinv2_table` gives). The window's sizes and
    ``pretrained_window`` are in `options`. For a kernel that computes Swin
    v1's VJP its own way.
    """
    xp, device = _xp.array_namespace(q, k, v), _xp.device(q)
    window_height, window_width = options["window_height"], options["window_width"]
    _, _, q_hat, k_hat, tau = _operands(q, k, logit_scale)
    coords = swinv2_coordinates(window_height, window_width,
                                pretrained_window=options["pretrained_window"],
                                xp=xp, dtype=w1.dtype, device=device)
    pre, hidden, z = _mlp(w1, b1, w2, coords)
    sig = _sigmoid(xp, z)
    dz = sum_to_shape(d_table, z.shape) * 16.0 * sig * (1.0 - sig)  # (H?, n)
    if pre.ndim == 2 and dz.ndim == 2:  # one hidden layer for every head: one product
        d_hidden = xp.matmul(xp.matrix_transpose(dz), xp.broadcast_to(w2, (dz.shape[0],
                                                                           w2.shape[-1])))
    else:
        d_hidden = dz[..., None] * w2[..., None, :]
    d_pre = xp.where(pre > 0, d_hidden, xp.zeros((), dtype=pre.dtype, device=device))
    out = {
        "v": sum_to_shape(core.dv, v.shape),
        "w1": sum_to_shape(xp.matmul(xp.matrix_transpose(d_pre), coords), w1.shape),
        "b1": sum_to_shape(xp.sum(d_pre, axis=-2), b1.shape),
        "w2": sum_to_shape(xp.matmul(dz[..., None, :], hidden)[..., 0, :], w2.shape),
    }
    if logit_scale is None:  # in the order of the arguments, as the kernels give them
        return {"q": sum_to_shape(core.dq, q.shape), "k": sum_to_shape(core.dk, k.shape), **out}
    grads = {"q": sum_to_shape(_normalize_vjp(xp, q, q_hat, core.dq * tau), q.shape),
             "k": sum_to_shape(_normalize_vjp(xp, k, k_hat, core.dk), k.shape), **out}
    if _one_number(logit_scale):  # a constant: no gradient of its own
        return grads
    d_tau = xp.sum(core.dq * q_hat, axis=(-2, -1))  # (..., h)
    below = logit_scale <= MAX_LOGIT_SCALE  # torch.clamp(max=) passes the gradient at the max
    d_log = xp.where(below, sum_to_shape(d_tau * tau[..., 0, 0], logit_scale.shape),
                     xp.zeros((), dtype=logit_scale.dtype, device=device))
    return {**grads, "logit_scale": d_log}
