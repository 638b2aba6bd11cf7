r"""xPos: RoPE with an exponential decay per rotated pair (Sun et al. 2022).

xPos ("A Length-Extrapolatable Transformer") rotates queries and keys as RoPE
does and scales pair ``c`` of a query at position ``n`` by
:math:`\zeta_c^{\,(n - o)/\gamma}` and of a key at position ``m`` by
:math:`\zeta_c^{\,-(m - o)/\gamma}`, so that their product decays with the
distance:

.. math:: \langle \zeta^{(n - o)/\gamma} R_n q,\; \zeta^{-(m - o)/\gamma} R_m k\rangle
          = \sum_c \zeta_c^{\,(n - m)/\gamma}\, \langle q_c,\, R^c_{m - n} k_c\rangle,
          \qquad \zeta_c = \frac{2c / R + \gamma_\zeta}{1 + \gamma_\zeta}

for ``c = 0 .. R/2 - 1`` of the ``R = rotary_dim`` rotated features, with
``gamma`` = `scale_base` (512) and ``gamma_zeta`` = `scale_offset` (0.4): torchscale's
``(arange(0, d, 2) + 0.4 d) / (1.4 d)``. Every ``ζ_c`` lies in ``(0, 1)``, so
a key in the past (``r = m - n < 0``) is damped, pair 0 most. Positions are
``n = i + q_offset`` and ``m = j``; the rotation is RoPE's (angles at the
positions themselves, ``θ_c = base^{-2c/R}``, `relpos_ref.schemes.rope`),
by default with the interleaved pairs that both peers use.

The centre ``o``
    Queries and keys must be scaled about the same centre ``o`` (`center`):
    then the product depends on ``n - m`` only, and the attention does not
    depend on ``o`` at all (in exact arithmetic; the scaled operands do).
    The peers centre on the middle of the call's ``L = max(t_k, q_offset + t_q)``
    positions, differently: x-transformers' ``RotaryEmbedding(use_xpos=True)``
    at ``L // 2`` (``"middle"``, the default), torchscale's ``XPOS`` at
    ``ceil(L / 2)`` (``"middle_up"``); an integer is a fixed centre (``0``:
    the positions themselves). A decoding step has the length of the full
    forward over its keys, so it gets the same centre.

Range
    The scales are formed in float64 where the device has it (``exp`` of
    ``±(p - o) ln ζ_c / gamma``) and rounded once, with the cosines and sines, to
    the arrays' dtype. Far from the centre they leave the dtype's range: a
    query's ``ζ_0^{(n - o)/gamma}`` underflows while the key's overflows, and
    ``0 · inf`` would replace a product near 1. The rule: every scale must be
    a normal number of the computing dtype, ``|p - o| ln(1/ζ_0) / gamma`` below
    ``min(ln max, -ln tiny)`` (``|p - o| <= 35694`` in float32 with the
    defaults, ``<= 289519`` in float64, ``<= 3966`` for `xpos_rotate`'s
    float16 result); otherwise a `ValueError` naming
    `center`. A centred call reaches twice as far as ``center=0``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from .. import _xp
from .._validate import as_float, as_int, check_bool, check_choice, nonnegative_int
from ..attention import attention
from ..calls import PLAIN, Call, computes_in_float32, resolve_call
from ..gradients import check_d_output, core_vjp, forward, sum_to_shape
from .rope_angles import angle_dtype, cos_sin, rope_frequencies, rotary_width
from .rope_layouts import ROPE_LAYOUTS, turn
from .rope_scaling import call_length

__all__ = [
    "CENTERS",
    "DEFAULTS",
    "ROTATION",
    "xpos_attention",
    "xpos_attention_vjp",
    "xpos_call",
    "xpos_center",
    "xpos_pair",
    "xpos_rotate",
    "xpos_zeta",
]

#: xPos's defaults: ``scale = 1/sqrt(d)``, not causal, start-aligned queries.
DEFAULTS = PLAIN

_F64_MAX, _F64_TINY = 1.7976931348623157e308, 2.2250738585072014e-308

#: The named centres: ``L // 2`` (x-transformers) and ``ceil(L / 2)`` (torchscale).
CENTERS = ("middle", "middle_up")

#: `xpos_attention`'s options that `xpos_rotate` takes too: what the kernels pass on.
ROTATION = ("base", "rotary_dim", "layout", "scale_base", "scale_offset", "center")


def xpos_zeta(rotary_dim: int, /, *, scale_offset: float = 0.4) -> tuple[float, ...]:
    r"""The decay base of each rotated pair (Python floats).

    .. math:: \zeta_c = \frac{2c / R + \gamma_\zeta}{1 + \gamma_\zeta},
              \qquad c = 0 .. R/2 - 1

    Parameters
    ----------
    rotary_dim : int
        ``R``, the rotated features (even, ``>= 0``).
    scale_offset : float, optional
        ``gamma_zeta > 0`` (0.4 in the paper and both peers).

    Returns
    -------
    tuple of float
        ``R / 2`` values in ``(0, 1)``, increasing.

    Examples
    --------
    >>> xpos_zeta(4)  # (0 + 0.4) / 1.4, (0.5 + 0.4) / 1.4
    (0.28571428571428575, 0.6428571428571429)
    """
    rotary_dim = nonnegative_int("rotary_dim", rotary_dim)
    if rotary_dim % 2:
        msg = f"`rotary_dim` must be even, got {rotary_dim}"
        raise ValueError(msg)
    scale_offset = as_float("scale_offset", scale_offset)
    if scale_offset <= 0:
        msg = f"`scale_offset` must be > 0, got {scale_offset}"
        raise ValueError(msg)
    return tuple((2 * c / rotary_dim + scale_offset) / (1 + scale_offset)
                 for c in range(rotary_dim // 2))


def xpos_center(center: int | str, length: int) -> int:
    """The centre ``o`` of a call of `length` positions: an integer, or a name of `CENTERS`.

    Examples
    --------
    >>> xpos_center("middle", 5), xpos_center("middle_up", 5), xpos_center(0, 5)
    (2, 3, 0)
    """
    if isinstance(center, str):
        check_choice("center", center, CENTERS)
        return length // 2 if center == "middle" else (length + 1) // 2
    if isinstance(center, bool) or not isinstance(center, numbers.Integral):
        msg = (f"`center` must be an integer or one of {', '.join(map(repr, CENTERS))}, "
               f"got {center!r}")
        raise ValueError(msg)
    return int(center)


def _check_range(xp: Any, dtype: Any, *, low: int, high: int, zeta: tuple[float, ...],
                 scale_base: float, center: int) -> None:
    # every scale ζ_c^{±(p - o)/gamma} a normal number of `dtype` (module docstring)
    if not zeta or high < low:
        return
    info = xp.finfo(dtype)
    top, tiny = float(info.max), float(info.smallest_normal)  # inf, 0.0 beyond float64
    # the scales are formed in float64 (at most) and rounded to `dtype`: the narrower range
    room = min(math.log(top), -math.log(tiny) if tiny > 0 else math.inf,
               math.log(_F64_MAX), -math.log(_F64_TINY))
    reach = math.floor(room * scale_base / -math.log(zeta[0]))
    far = max(abs(low - center), abs(high - center))
    if far > reach:
        centred = (high - low + 1) // 2  # the farthest position from the middle of the call
        needed = centred * -math.log(zeta[0]) / room
        fix = ("centre the call (center='middle')" if centred <= reach and centred < far
               else f"a `scale_base` above {needed:.3g} keeps the centred call in range")
        msg = (f"`center` {center} leaves positions {low} .. {high} up to {far} away, where "
               f"the scale zeta^(p - center)/{scale_base:g} leaves the range of {dtype} "
               f"(|p - center| <= {reach}); {fix}"
               + ("" if info.bits >= 64 else " (or use float64)"))
        raise ValueError(msg)


def _scale_base(scale_base: float) -> float:
    scale_base = as_float("scale_base", scale_base)
    if scale_base <= 0:
        msg = f"`scale_base` must be > 0, got {scale_base}"
        raise ValueError(msg)
    return scale_base


def xpos_rotate(
    x: Any,
    /,
    *,
    offset: int = 0,
    key: bool = False,
    base: float = 10000.0,
    rotary_dim: int | None = None,
    layout: str = "interleaved",
    scale_base: float = 512.0,
    scale_offset: float = 0.4,
    center: int | str = "middle",
    length: int | None = None,
    inverse: bool = False,
) -> Any:
    r"""Rotate and scale each row of `x` at its position ``p = offset + t``.

    .. math:: (x_a, x_b) \mapsto \zeta_c^{\pm (p - o)/\gamma}\,
              (x_a \cos p\theta_c - x_b \sin p\theta_c,\;
              x_b \cos p\theta_c + x_a \sin p\theta_c)

    with ``+`` for queries and ``-`` for keys (`key`), ``o`` the centre. The
    other features pass through, unscaled.

    Parameters
    ----------
    x : floating array, shape ``(..., t, d)``
    offset : int, optional
        Position of row 0 (``q_offset`` for queries, 0 for keys).
    key : bool, optional
        Scale by ``ζ^{-(p - o)/gamma}`` (keys) rather than ``ζ^{(p - o)/gamma}`` (queries).
    base, rotary_dim, layout
        RoPE's frequency base, rotated features (even; default all) and pairing
        (``"interleaved"``, the peers', or ``"half"``).
    scale_base : float, optional
        ``gamma > 0``.
    scale_offset : float, optional
        ``gamma_zeta > 0`` of `xpos_zeta`.
    center : int or {"middle", "middle_up"}, optional
        The centre ``o``: ``length // 2``, ``ceil(length / 2)`` or an integer.
    length : int, optional
        The call's length ``L`` the named centres read; default ``offset + t``.
    inverse : bool, optional
        The transpose (the backward pass's): the opposite turn, the same scale.

    Returns
    -------
    array
        Same shape, dtype and device as `x`. A scale out of the dtype's range
        is a `ValueError` (module docstring).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> x = xp.asarray([[1.0, 0.0], [1.0, 0.0]])  # positions 0 and 1; o = 1
    >>> xpos_rotate(x, base=1.0, scale_base=1.0)  # ζ_0 = 2/7: scales 3.5 and 1
    Array([[3.5       , 0.        ],
           [0.54030231, 0.84147098]], dtype=array_api_strict.float64)
    """
    # computed in float32 for 16-bit arrays; the scales' range is checked in the result's dtype
    return _rotate(x, result_dtype=getattr(x, "dtype", None), offset=offset, key=key,
                   base=base, rotary_dim=rotary_dim, layout=layout, scale_base=scale_base,
                   scale_offset=scale_offset, center=center, length=length, inverse=inverse)


@computes_in_float32
def _rotate(x: Any, /, *, result_dtype: Any, offset: int, key: bool, base: float,
            rotary_dim: int | None, layout: str, scale_base: float, scale_offset: float,
            center: int | str, length: int | None, inverse: bool) -> Any:
    xp = _xp.array_namespace(x)
    _xp.check_floating(xp, "x", x)
    check_choice("layout", layout, ROPE_LAYOUTS)
    offset = as_int("offset", offset)
    key, inverse = check_bool("key", key), check_bool("inverse", inverse)
    if x.ndim < 2:
        msg = f"`x` must have shape (..., t, d), got shape {tuple(x.shape)}"
        raise ValueError(msg)
    *_, t, d = x.shape
    rd = rotary_width(d, rotary_dim)
    length = max(offset + t, 0) if length is None else nonnegative_int("length", length)
    o = xpos_center(center, length)
    freqs = rope_frequencies(rd, base=base)
    zeta = xpos_zeta(rd, scale_offset=scale_offset)
    gamma = _scale_base(scale_base)
    _check_range(xp, x.dtype if result_dtype is None else result_dtype, low=offset,
                 high=offset + t - 1, zeta=zeta, scale_base=gamma, center=o)
    if rd == 0:
        return xp.reshape(x, tuple(x.shape), copy=True)
    dev = _xp.device(x)
    wide = angle_dtype(xp, x.dtype, dev, offset=offset, t=t, name="offset",
                       t_other=abs(o) + 1)
    cos, sin = cos_sin(xp, wide, dev, offset=offset, t=t, freqs=freqs, angles="float64",
                       factor=1.0)
    steps = xp.arange(t, dtype=_xp.index_dtype(xp, dev), device=dev) + (offset - o)
    logs = xp.asarray([(-1.0 if key else 1.0) * math.log(z) / gamma for z in zeta],
                      dtype=wide, device=dev)
    scale = xp.exp(xp.astype(steps, wide)[:, None] * logs[None, :])  # (t, rd / 2)
    cos, sin = xp.astype(cos * scale, x.dtype), xp.astype(sin * scale, x.dtype)
    return turn(x, cos, -sin if inverse else sin, rotary_dim=rd, layout=layout,
                rotary_at="front")


def xpos_call(
    q: Any, k: Any, v: Any, /, *, base: float = 10000.0, rotary_dim: int | None = None,
    layout: str = "interleaved", scale_base: float = 512.0, scale_offset: float = 0.4,
    center: int | str = "middle", scale: float | None = None, mask: Any = None,
    causal: bool | None = None, q_offset: int | None = None,
) -> Call:
    """Validate an `xpos_attention` call and resolve its defaults (shared with the kernels).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((3, 4))
    >>> xpos_call(q, k, v, q_offset=2).q_offset
    2
    """
    call = resolve_call(q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
                        defaults=DEFAULTS)
    check_choice("layout", layout, ROPE_LAYOUTS)
    rd = rotary_width(q.shape[-1], rotary_dim)
    rope_frequencies(rd, base=base)
    zeta = xpos_zeta(rd, scale_offset=scale_offset)
    gamma = _scale_base(scale_base)
    o = xpos_center(center, call_length(call.t_q, call.t_k, call.q_offset))
    _check_range(call.xp, q.dtype, low=min(call.q_offset, 0),
                 high=max(call.q_offset + call.t_q, call.t_k) - 1, zeta=zeta,
                 scale_base=gamma, center=o)
    angle_dtype(call.xp, q.dtype, _xp.device(q), offset=call.q_offset, t=call.t_q,
                name="q_offset", t_other=max(call.t_k, abs(o) + 1))
    return call


def xpos_pair(q: Any, k: Any, call: Call, /, *, inverse: bool = False,
              **rotation: Any) -> tuple[Any, Any]:
    """`q` scaled up at ``call.q_offset`` and `k` down at 0, about the call's centre.

    `rotation` holds `xpos_rotate`'s ``base``, ``rotary_dim``, ``layout``,
    ``scale_base``, ``scale_offset`` and ``center``; both read the whole
    call's length (`relpos_ref.schemes.rope_scaling.call_length`), so they
    share the centre.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.ones((1, 2))
    >>> call = xpos_call(q, k, v)
    >>> xpos_pair(q, k, call, center=1, scale_base=1.0)[1]  # key at p - o = -1: ζ_0 = 2/7
    Array([[0.28571429, 0.28571429]], dtype=array_api_strict.float64)
    """
    length = call_length(call.t_q, call.t_k, call.q_offset)
    return (xpos_rotate(q, offset=call.q_offset, length=length, inverse=inverse, **rotation),
            xpos_rotate(k, offset=0, key=True, length=length, inverse=inverse, **rotation))


@computes_in_float32
def xpos_attention(
    q: Any, k: Any, v: Any, /, *, base: float = 10000.0, rotary_dim: int | None = None,
    layout: str = "interleaved", scale_base: float = 512.0, scale_offset: float = 0.4,
    center: int | str = "middle", scale: float | None = None, mask: Any = None,
    causal: bool | None = None, q_offset: int | None = None, return_weights: bool = False,
) -> Any:
    r"""Attention on rotated and scaled queries and keys (xPos).

    .. math:: w = \operatorname{softmax}\Bigl(s \sum_c \zeta_c^{(n - m)/\gamma}\,
              (R_n q_i)_c \cdot (R_m k_j)_c\Bigr), \qquad n = i + q_\text{offset},\ m = j

    Parameters
    ----------
    q, k, v : floating arrays ``(..., t_q, d)``, ``(..., t_k, d)``, ``(..., t_k, d_v)``
    base, rotary_dim, layout, scale_base, scale_offset, center
        As in `xpos_rotate`; the centre reads the call's length
        ``max(t_k, q_offset + t_q)``, for queries and keys alike.
    scale, mask, causal, q_offset, return_weights
        As in `relpos_ref.attention` (defaults `DEFAULTS`); `q_offset` also
        sets the queries' positions (``t_k - t_q`` when decoding with a cache).

    Returns
    -------
    out : array ``(..., t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.eye(4)
    >>> xpos_attention(q, k, v, causal=True).shape
    (4, 4)
    """
    rotation = {"base": base, "rotary_dim": rotary_dim, "layout": layout,
                "scale_base": scale_base, "scale_offset": scale_offset, "center": center}
    call = xpos_call(q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
                     **rotation)
    q_rot, k_rot = xpos_pair(q, k, call, **rotation)
    return attention(q_rot, k_rot, v, scale=call.scale, mask=mask, causal=call.causal,
                     q_offset=call.q_offset, return_weights=return_weights)


@computes_in_float32
def xpos_attention_vjp(
    q: Any, k: Any, v: Any, /, *, d_output: Any, base: float = 10000.0,
    rotary_dim: int | None = None, layout: str = "interleaved", scale_base: float = 512.0,
    scale_offset: float = 0.4, center: int | str = "middle", scale: float | None = None,
    mask: Any = None, causal: bool | None = None, q_offset: int | None = None,
) -> dict[str, Any]:
    r"""Gradients of `xpos_attention` for the output's cotangent `d_output` (a VJP).

    .. math:: \bar{q}_i = \zeta^{(n - o)/\gamma} R_n^\top\, \bar{\tilde{q}}_i, \qquad
              \bar{k}_j = \zeta^{-(m - o)/\gamma} R_m^\top\, \bar{\tilde{k}}_j

    where :math:`\bar{\tilde{q}}, \bar{\tilde{k}}` are plain attention's
    gradients at the scaled, rotated queries and keys (a scale per pair
    commutes with the pair's rotation).

    Parameters
    ----------
    q, k, v, base, rotary_dim, layout, scale_base, scale_offset, center
        As in `xpos_attention`.
    scale, mask, causal, q_offset
        As in `xpos_attention`.
    d_output : floating array, shape ``(..., t_q, d_v)``
        :math:`\partial L / \partial\,\text{out}`; same dtype as `q`.

    Returns
    -------
    dict
        The gradient with respect to each of ``q``, ``k`` and ``v``, of its shape and dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.eye(2)
    >>> xpos_attention_vjp(q, k, v, d_output=xp.zeros((2, 2)))["q"]
    Array([[0., 0.],
           [0., 0.]], dtype=array_api_strict.float64)
    """
    rotation = {"base": base, "rotary_dim": rotary_dim, "layout": layout,
                "scale_base": scale_base, "scale_offset": scale_offset, "center": center}
    call = xpos_call(q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
                     **rotation)
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    q_rot, k_rot = xpos_pair(q, k, call, **rotation)
    fwd = forward(q_rot, k_rot, call, mask=mask)
    core = core_vjp(q_rot, k_rot, v, d_output, call, fwd)
    dq, dk = xpos_pair(sum_to_shape(core.dq, q.shape), sum_to_shape(core.dk, k.shape), call,
                       inverse=True, **rotation)
    return {"q": dq, "k": dk, "v": sum_to_shape(core.dv, v.shape)}
