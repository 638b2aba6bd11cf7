r"""Swin Transformer's 2D relative position bias (Liu et al. 2021).

A window of ``Wh x Ww`` tokens (row-major, token ``n`` at row ``n // Ww``,
column ``n % Ww``) attends within itself. Each head has one learned scalar
per 2D offset, ``(2Wh - 1)(2Ww - 1)`` in all:

.. math:: \text{logits}_{nm} = s\, q_n \cdot k_m + b_{\text{idx}(n, m)}, \qquad
          \text{idx} = (\Delta y + W_h - 1)(2 W_w - 1) + (\Delta x + W_w - 1)

with ``Δy`` and ``Δx`` the key's row and column minus the query's (key minus
query, our convention). Swin's own code indexes with query minus key, which
reverses the row order of its table; `relpos_ref.presets` converts.
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._validate import positive_int
from ..attention import attention
from ..calls import PLAIN, Call, computes_in_float32, resolve_call
from ..gradients import (
    check_d_output,
    core_vjp,
    forward,
    sum_to_shape,
)
from ..layouts import _take_per_row
from ..positions import grid_positions
from ._tables import check_table, gather_scalars

__all__ = [
    "DEFAULTS",
    "swin_attention",
    "swin_attention_vjp",
    "swin_bias",
    "swin_call",
    "swin_index",
]

#: Swin's defaults: ``scale = 1/sqrt(d)``, not causal (window attention).
DEFAULTS = PLAIN


def swin_index(
    window_height: int, window_width: int, /, *, xp: Any, device: Any = None
) -> Any:
    """Row of the ``(2Wh - 1)(2Ww - 1)`` table for each (query, key) token pair.

    Parameters
    ----------
    window_height, window_width : int
        Window size ``Wh x Ww``, ``>= 1``; non-square windows work.
    xp : namespace
        Array API namespace of the result.
    device : optional
        Device of the result.

    Returns
    -------
    array, shape ``(Wh Ww, Wh Ww)``
        ``(dy + Wh - 1)(2 Ww - 1) + (dx + Ww - 1)``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> swin_index(1, 3, xp=xp)  # one row: column offsets -2 .. 2 -> rows 0 .. 4
    Array([[2, 3, 4],
           [1, 2, 3],
           [0, 1, 2]], dtype=array_api_strict.int64)
    """
    wh = positive_int("window_height", window_height)
    ww = positive_int("window_width", window_width)
    y, x = grid_positions(wh, ww, xp=xp, device=device)
    dy = y[None, :] - y[:, None]
    dx = x[None, :] - x[:, None]
    return (dy + (wh - 1)) * (2 * ww - 1) + (dx + (ww - 1))


def swin_bias(table: Any, /, window_height: int, window_width: int) -> Any:
    r"""Bias matrix :math:`B_{nm} = b_{\text{idx}(n, m)}` of one window.

    Parameters
    ----------
    table : floating array, shape ``((2Wh-1)(2Ww-1),)`` or ``(h, (2Wh-1)(2Ww-1))``
    window_height, window_width : int
        Window size.

    Returns
    -------
    array, shape ``(Wh Ww, Wh Ww)`` or ``(h, Wh Ww, Wh Ww)``

    Examples
    --------
    >>> import array_api_strict as xp
    >>> swin_bias(xp.arange(3.0), 1, 2)
    Array([[1., 2.],
           [0., 1.]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(table)
    wh = positive_int("window_height", window_height)
    ww = positive_int("window_width", window_width)
    n = (2 * wh - 1) * (2 * ww - 1)
    check_table("table", table, None, rows=n, rows_rule=" = (2Wh - 1)(2Ww - 1)", scalar=True)
    return gather_scalars(table, swin_index(wh, ww, xp=xp, device=_xp.device(table)))


def swin_call(
    q: Any,
    k: Any,
    v: Any,
    table: Any,
    /,
    *,
    window_height: int,
    window_width: int,
    scale: float | None,
    mask: Any,
) -> Call:
    """Validate a `swin_attention` call and resolve its defaults (shared with the kernels).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = xp.zeros((4, 8))
    >>> swin_call(q, q, q, xp.zeros(9), window_height=2, window_width=2, scale=None,
    ...           mask=None).scale
    0.35355339059327373
    """
    call = resolve_call(
        q, k, v, scale=scale, mask=mask, causal=False, q_offset=0, defaults=DEFAULTS,
        tables={"table": table},
    )
    wh = positive_int("window_height", window_height)
    ww = positive_int("window_width", window_width)
    n = (2 * wh - 1) * (2 * ww - 1)
    check_table("table", table, q, rows=n, rows_rule=" = (2Wh - 1)(2Ww - 1)", scalar=True)
    for name, x in (("q", q), ("k", k)):
        if x.shape[-2] != wh * ww:
            msg = (
                f"`{name}` must have Wh * Ww = {wh * ww} tokens on axis -2, "
                f"got shape {tuple(x.shape)}"
            )
            raise ValueError(msg)
    return call


@computes_in_float32
def swin_attention(
    q: Any,
    k: Any,
    v: Any,
    table: Any,
    /,
    *,
    window_height: int,
    window_width: int,
    scale: float | None = None,
    mask: Any = None,
    return_weights: bool = False,
) -> Any:
    r"""Window attention with Swin's relative position bias.

    .. math:: w = \operatorname{softmax}(s\, q k^\top + B + \text{mask})

    Parameters
    ----------
    q, k, v : floating arrays ``(..., Wh Ww, d)``, ``(..., Wh Ww, d)``, ``(..., Wh Ww, d_v)``
        One window's tokens, row-major; windows go in the leading axes.
    table : floating array, ``((2Wh-1)(2Ww-1),)`` or ``(h, (2Wh-1)(2Ww-1))``
    window_height, window_width : int
        Window size.
    scale, mask, return_weights
        As in `relpos_ref.attention` (defaults `DEFAULTS`); `mask` is boolean
        (``True`` = may attend), e.g. the shifted-window mask.

    Returns
    -------
    out : array ``(..., Wh Ww, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.eye(4)  # a 2 x 2 window
    >>> swin_attention(q, k, v, xp.zeros(9), window_height=2, window_width=2).shape
    (4, 4)
    """
    call = swin_call(
        q, k, v, table, window_height=window_height, window_width=window_width, scale=scale,
        mask=mask,
    )
    bias = swin_bias(table, window_height, window_width)
    return attention(
        q, k, v, scale=call.scale, mask=mask, bias=bias, return_weights=return_weights
    )


def _pairs_by_entry(window_height: int, window_width: int, *, xp: Any, device: Any = None
                    ) -> tuple[Any, Any]:
    # For token n and table entry c = (dy + Wh - 1)(2 Ww - 1) + dx + Ww - 1: the key m at
    # offset (dy, dx) from n, and whether it is in the window. (Wh Ww, n_entries) each.
    wh, ww = window_height, window_width
    y, x = grid_positions(wh, ww, xp=xp, device=device)
    c = xp.arange((2 * wh - 1) * (2 * ww - 1), dtype=y.dtype, device=device)
    ky = y[:, None] + (c[None, :] // (2 * ww - 1) - (wh - 1))
    kx = x[:, None] + (c[None, :] % (2 * ww - 1) - (ww - 1))
    inside = (ky >= 0) & (ky < wh) & (kx >= 0) & (kx < ww)
    return xp.clip(ky, 0, wh - 1) * ww + xp.clip(kx, 0, ww - 1), inside


@computes_in_float32
def swin_attention_vjp(
    q: Any,
    k: Any,
    v: Any,
    table: Any,
    /,
    *,
    d_output: Any,
    window_height: int,
    window_width: int,
    scale: float | None = None,
    mask: Any = None,
) -> dict[str, Any]:
    r"""Gradients of `swin_attention` for the output's cotangent `d_output` (a VJP).

    .. math:: \bar{b}_c = \sum_{(n, m):\ \text{idx}(n, m) = c} \bar{l}_{nm}

    Each entry collects the logits' gradient of every token pair at its
    offset ``(dy, dx)``, read per query token (no scatter); q, k and v as in
    `relpos_ref.gradients.attention_vjp`.

    Parameters
    ----------
    q, k, v, table, window_height, window_width, scale, mask
        As in `swin_attention`.
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
    >>> g = swin_attention_vjp(q, k, v, xp.zeros(3), d_output=xp.ones((2, 1)),
    ...                        window_height=1, window_width=2)
    >>> g["table"]  # offsets dx = -1, 0, 1
    Array([-0.5,  0. ,  0.5], dtype=array_api_strict.float64)
    """
    call = swin_call(
        q, k, v, table, window_height=window_height, window_width=window_width, scale=scale,
        mask=mask,
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    bias = swin_bias(table, window_height, window_width)
    fwd = forward(q, k, call, mask=mask, bias=bias)
    core = core_vjp(q, k, v, d_output, call, fwd)
    xp = call.xp
    key, inside = _pairs_by_entry(window_height, window_width, xp=xp, device=_xp.device(q))
    zero = xp.zeros((), dtype=core.d_logits.dtype, device=_xp.device(q))
    by_entry = xp.where(inside, _take_per_row(core.d_logits, key), zero)  # (..., n, entries)
    return {
        "q": sum_to_shape(core.dq, q.shape),
        "k": sum_to_shape(core.dk, k.shape),
        "v": sum_to_shape(core.dv, v.shape),
        "table": sum_to_shape(xp.sum(by_entry, axis=-2), table.shape),
    }
