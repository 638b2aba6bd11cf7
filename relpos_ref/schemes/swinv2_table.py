r"""Swin Transformer v2's bias table, its MLP of log-spaced coordinates (`.swinv2`).

For an offset ``Δ`` on an axis of ``W`` tokens (``P`` when the weights were
trained at window ``P``: ``pretrained_window``)

.. math:: c(\Delta) = \operatorname{sign}(u) \frac{\log_2(1 + |u|)}{\log_2 8},
          \qquad u = \frac{8 \Delta}{W - 1}

and the table of head ``h`` is :math:`16\, \sigma(w_2^{(h)} \cdot
\operatorname{relu}(W_1 [c(\Delta y), c(\Delta x)] + b_1))`, one entry per
offset ``(Δy, Δx)`` of the window.
"""

from __future__ import annotations

import math
from typing import Any

from .. import _xp
from .._validate import positive_int
from ._activations import relu

__all__ = ["swinv2_coordinates", "swinv2_table"]

def _axis_coordinates(w: int, pretrained: int | None) -> list[float]:
    divisor = (w if pretrained is None else pretrained) - 1
    out = []
    for delta in range(-(w - 1), w):
        u = 8.0 * delta / divisor if divisor > 0 else 8.0 * delta
        out.append(math.copysign(math.log2(1.0 + abs(u)), u) / 3.0 if u else 0.0)
    return out


def _pretrained(pretrained_window: Any) -> tuple[int, int] | None:
    if pretrained_window is None:
        return None
    if not isinstance(pretrained_window, tuple | list) or len(pretrained_window) != 2:
        msg = ("`pretrained_window` must be None or a pair (height, width), "
               f"got {pretrained_window!r}")
        raise ValueError(msg)
    ph, pw = (positive_int("pretrained_window", p) for p in pretrained_window)
    if ph < 2 or pw < 2:
        msg = f"`pretrained_window` sides must be >= 2, got {tuple(pretrained_window)!r}"
        raise ValueError(msg)
    return ph, pw


def swinv2_coordinates(
    window_height: int, window_width: int, /, *, pretrained_window: Any = None, xp: Any,
    dtype: Any = None, device: Any = None,
) -> Any:
    """Swin v2's log-spaced coordinates of the ``(2Wh - 1)(2Ww - 1)`` offsets.

    Parameters
    ----------
    window_height, window_width : int
        Window size, ``>= 1``.
    pretrained_window : pair of int, optional
        The window the MLP was trained at (sides ``>= 2``): its ``W - 1``
        divides the offsets instead (transformers' ``pretrained_window_size``).
    xp : namespace
    dtype, device : optional
        Of the result (default floating dtype). Computed in Python floats.

    Returns
    -------
    array, shape ``((2Wh - 1)(2Ww - 1), 2)``
        Row ``(dy + Wh - 1)(2Ww - 1) + dx + Ww - 1`` is ``[c(dy), c(dx)]``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> swinv2_coordinates(1, 2, xp=xp)  # dx = -1, 0, 1: log2(9) / 3
    Array([[ 0.        , -1.05664167],
           [ 0.        ,  0.        ],
           [ 0.        ,  1.05664167]], dtype=array_api_strict.float64)
    """
    wh = positive_int("window_height", window_height)
    ww = positive_int("window_width", window_width)
    pre = _pretrained(pretrained_window)
    xp = _xp.check_namespace(xp)
    cy, cx = (_axis_coordinates(w, None if pre is None else pre[a]) for a, w in enumerate((wh, ww)))
    rows = [[a, b] for a in cy for b in cx]
    return xp.asarray(rows, dtype=dtype, device=device)


def _check_mlp(w1: Any, b1: Any, w2: Any) -> int | None:
    # the MLP's shapes: w1 (h?, m, 2), b1 (h?, m), w2 (h?, m); the head count or None
    for name, x, ndim in (("w1", w1, 2), ("b1", b1, 1), ("w2", w2, 1)):
        if not hasattr(x, "shape") or x.ndim not in (ndim, ndim + 1):
            msg = (f"`{name}` must be an array of {ndim} or {ndim + 1} dimensions (a head axis "
                   f"first), got {getattr(x, 'shape', type(x).__name__)}")
            raise ValueError(msg)
    xp = _xp.array_namespace(w1, b1, w2)
    for name, x in (("w1", w1), ("b1", b1), ("w2", w2)):
        if not xp.isdtype(x.dtype, "real floating"):
            msg = f"`{name}` must be a real floating array, got dtype {x.dtype}"
            raise TypeError(msg)
    m = w1.shape[-2]
    if w1.shape[-1] != 2 or b1.shape[-1] != m or w2.shape[-1] != m:
        msg = ("the MLP needs `w1` (m, 2), `b1` (m,) and `w2` (m,) (each with an optional "
               f"head axis first), got {tuple(w1.shape)}, {tuple(b1.shape)} and "
               f"{tuple(w2.shape)}")
        raise ValueError(msg)
    heads = {x.shape[0] for x in (w1, b1, w2) if x.ndim > (2 if x is w1 else 1)} - {1}
    if len(heads) > 1:
        msg = f"the head axes of `w1`, `b1`, `w2` must agree, got {sorted(heads)}"
        raise ValueError(msg)
    if any(x.ndim > (2 if x is w1 else 1) for x in (w1, b1, w2)):
        return heads.pop() if heads else 1
    return None


def _mlp(w1: Any, b1: Any, w2: Any, coords: Any) -> tuple[Any, Any, Any]:
    # the MLP's pre-activation (H?, n, m), hidden layer and output z (H?, n) before 16 sigma
    xp = _xp.array_namespace(w1)
    heads = _check_mlp(w1, b1, w2)
    pre = xp.matmul(coords, xp.matrix_transpose(w1)) + b1[..., None, :]
    hidden = relu(pre)  # no gradient at pre = 0 under autograd, as the VJP's pre > 0
    if hidden.ndim == 2 and w2.ndim == 2:  # one hidden layer, an output per head: one product
        z = xp.matrix_transpose(xp.matmul(hidden, xp.matrix_transpose(w2)))
    else:  # no (H, n, m) product
        z = xp.matmul(hidden, w2[..., :, None])[..., 0]
    if heads is not None and z.ndim == 1:
        z = z[None, :]
    if heads is not None:
        z = xp.broadcast_to(z, (heads, z.shape[-1]))
    return pre, hidden, z


def _sigmoid(xp: Any, z: Any) -> Any:
    return 1.0 / (1.0 + xp.exp(-z))


def swinv2_table(
    w1: Any, b1: Any, w2: Any, /, window_height: int, window_width: int, *,
    pretrained_window: Any = None,
) -> Any:
    r"""The bias of each offset, :math:`16\,\sigma(\text{MLP}(c))`: Swin v1's table.

    Parameters
    ----------
    w1, b1, w2 : floating arrays ``(m, 2)``, ``(m,)``, ``(m,)``, each with an optional head axis
        ``Linear(2, m)`` (weight and bias) and ``Linear(m, h, bias=False)``'s weight.
    window_height, window_width : int
    pretrained_window : pair of int, optional
        As in `swinv2_coordinates`.

    Returns
    -------
    array, shape ``((2Wh-1)(2Ww-1),)`` or ``(h, (2Wh-1)(2Ww-1))``
        In ``(0, 16)``; a table of `relpos_ref.schemes.swin.swin_bias`.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> swinv2_table(xp.ones((4, 2)), xp.zeros(4), xp.zeros(4), 1, 2)  # sigma(0) = 1/2
    Array([8., 8., 8.], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(w1, b1, w2)
    coords = swinv2_coordinates(window_height, window_width, pretrained_window=pretrained_window,
                                xp=xp, dtype=w1.dtype, device=_xp.device(w1))
    return 16.0 * _sigmoid(xp, _mlp(w1, b1, w2, coords)[2])
