r"""Rotary position embedding, RoPE (Su et al. 2021).

Queries and keys are rotated by an angle proportional to their position, so
that ``q . k`` depends on positions only through ``r``:

.. math:: \langle R_{p_q} q,\, R_{p_k} k \rangle = \langle q,\, R_{p_k - p_q} k \rangle
          = \langle q,\, R_{r} k \rangle

The first ``rotary_dim`` features form ``rotary_dim / 2`` pairs; pair ``c``
turns by ``p θ_c`` with ``θ_c = base^{-2c / rotary_dim}``; features beyond
``rotary_dim`` pass through. Two pairings are in use:

- ``"interleaved"`` (the paper, GPT-J, Mesh-TF): pair ``c`` is features
  ``(2c, 2c + 1)``;
- ``"half"`` (GPT-NeoX, LLaMA in HF transformers): pair ``c`` is features
  ``(c, c + rotary_dim / 2)``.

A pair ``(a, b)`` becomes ``(a cos φ - b sin φ, b cos φ + a sin φ)``.
Positions are ``p_q = i + q_offset`` and ``p_k = j``.

The angles ``p θ_c`` and their cosines and sines are computed in float64
wherever the arrays' device has it, and rounded once to the arrays' dtype:
in float32 the position ``2**24 + 1`` would be ``2**24``, and ``p θ`` would
carry the rounding of ``θ`` times ``p``. Positions beyond ``2**53`` (or, on
a device without float64, beyond what the dtype holds exactly: ``2**24`` in
float32) are refused (`relpos_ref._exact`).
"""

from __future__ import annotations

import math
from typing import Any

from .. import _xp
from .._exact import float_dtype
from .._validate import as_float, as_int, check_bool, check_choice
from ..attention import attention
from ..calls import PLAIN, Call, computes_in_float32, resolve_call
from ..gradients import (
    check_d_output,
    core_vjp,
    forward,
    sum_to_shape,
)

__all__ = [
    "DEFAULTS",
    "ROPE_LAYOUTS",
    "angle_dtype",
    "rope_attention",
    "rope_attention_vjp",
    "rope_call",
    "rope_frequencies",
    "rope_rotate",
]

#: RoPE's defaults: ``scale = 1/sqrt(d)``, not causal, start-aligned queries.
DEFAULTS = PLAIN

ROPE_LAYOUTS = ("half", "interleaved")


def _rotary_dim(d: int, rotary_dim: int | None) -> int:
    if rotary_dim is None:
        rotary_dim = d
    rotary_dim = as_int("rotary_dim", rotary_dim)
    if rotary_dim < 0 or rotary_dim % 2 or rotary_dim > d:
        msg = f"`rotary_dim` must be even and in 0 .. {d} (the feature width), got {rotary_dim}"
        raise ValueError(msg)
    return rotary_dim


def rope_frequencies(rotary_dim: int, /, *, base: float = 10000.0) -> tuple[float, ...]:
    r"""Angular frequencies :math:`\theta_c = \text{base}^{-2c / \text{rotary\_dim}}` (host floats).

    Parameters
    ----------
    rotary_dim : int
        Number of rotated features, even.
    base : float, optional
        ``> 0``; 10000 in the paper.

    Returns
    -------
    tuple of float
        ``rotary_dim / 2`` frequencies, ``θ_0 = 1`` first.

    Examples
    --------
    >>> rope_frequencies(4, base=100.0)
    (1.0, 0.1)
    """
    rotary_dim = _rotary_dim(rotary_dim, rotary_dim)
    base = as_float("base", base)
    if not base > 0:
        msg = f"`base` must be > 0, got {base}"
        raise ValueError(msg)
    return tuple(base ** (-2.0 * c / rotary_dim) for c in range(rotary_dim // 2))


@computes_in_float32
def rope_rotate(
    x: Any,
    /,
    *,
    offset: int = 0,
    base: float = 10000.0,
    rotary_dim: int | None = None,
    layout: str = "half",
    inverse: bool = False,
) -> Any:
    """Rotate each row of `x` by its position ``offset + t`` (by minus it, if `inverse`).

    Parameters
    ----------
    x : floating array, shape ``(..., t, d)``
    offset : int, optional
        Position of row 0 (``q_offset`` for queries, 0 for keys).
    base : float, optional
        Frequency base.
    rotary_dim : int, optional
        Rotated features (even, ``<= d``); default all ``d``.
    layout : {"half", "interleaved"}, optional
        Which features form a pair.
    inverse : bool, optional
        Turn the other way: ``R^T = R^{-1}``, the rotation's transpose (the
        backward pass's).

    Returns
    -------
    array
        Same shape, dtype and device as `x`.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> x = xp.asarray([[1.0, 0.0], [1.0, 0.0]])  # positions 0 and 1
    >>> rope_rotate(x, base=1.0)  # θ = 1: turn by 0 and 1 radian
    Array([[1.        , 0.        ],
           [0.54030231, 0.84147098]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(x)
    _xp.check_floating(xp, "x", x)
    check_choice("layout", layout, ROPE_LAYOUTS)
    offset = as_int("offset", offset)
    if x.ndim < 2:
        msg = f"`x` must have shape (..., t, d), got shape {tuple(x.shape)}"
        raise ValueError(msg)
    *_, t, d = x.shape
    rd = _rotary_dim(d, rotary_dim)
    if rd == 0:
        return xp.reshape(x, tuple(x.shape), copy=True)  # fresh, bit for bit, autograd-quiet
    dev = _xp.device(x)
    wide = angle_dtype(xp, x.dtype, dev, offset=offset, t=t, name="offset")
    cos, sin = _turns(xp, wide, dev, offset, t, rope_frequencies(rd, base=base))
    cos, sin = xp.astype(cos, x.dtype), xp.astype(sin, x.dtype)
    if check_bool("inverse", inverse):
        sin = -sin
    half = rd // 2
    if layout == "half":
        a, b = x[..., :half], x[..., half:rd]
        parts = [a * cos - b * sin, b * cos + a * sin]
    else:
        a, b = x[..., 0:rd:2], x[..., 1:rd:2]
        pairs = xp.stack([a * cos - b * sin, b * cos + a * sin], axis=-1)
        parts = [xp.reshape(pairs, (*pairs.shape[:-2], rd))]
    if rd < d:
        parts.append(x[..., rd:])
    return xp.concat(parts, axis=-1) if len(parts) > 1 else parts[0]


def _turns(xp: Any, wide: Any, dev: Any, offset: int, t: int,
           freqs: tuple[float, ...]) -> tuple[Any, Any]:
    # cos and sin of (offset + i) θ_c, (t, rd / 2), in `wide`: position offset + a B + b
    # turns by (offset + a B) θ then b θ (the angle-addition formulas), so that only
    # 2 (t / B + B) angles of the t rd / 2 are evaluated (float64 cosines cost 13 times
    # float32's in NumPy), at an error of a few float64 roundings
    block = max(1, math.isqrt(t))
    blocks = -(-t // block)
    idx = _xp.index_dtype(xp, dev)
    theta = xp.asarray(freqs, dtype=wide, device=dev)[None, :]
    start = xp.arange(blocks, dtype=idx, device=dev) * block + offset
    coarse = xp.astype(start, wide)[:, None] * theta  # (blocks, rd / 2)
    fine = xp.astype(xp.arange(block, dtype=idx, device=dev), wide)[:, None] * theta
    c1, s1 = xp.cos(coarse)[:, None, :], xp.sin(coarse)[:, None, :]
    c2, s2 = xp.cos(fine)[None, :, :], xp.sin(fine)[None, :, :]
    shape = (blocks * block, len(freqs))
    cos = xp.reshape(c1 * c2 - s1 * s2, shape)[:t, :]
    sin = xp.reshape(s1 * c2 + c1 * s2, shape)[:t, :]
    return cos, sin


def angle_dtype(xp: Any, dtype: Any, device: Any, *, offset: int, t: int, name: str,
                t_other: int = 0) -> Any:
    """The dtype of the angles of positions ``offset .. offset + t - 1`` (and ``0 .. t_other - 1``).

    float64 where `device` has it, else `dtype`; a `ValueError` naming `name`
    where a position is beyond what that dtype holds exactly
    (`relpos_ref._exact.float_dtype`).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> angle_dtype(xp, xp.float32, None, offset=2**24, t=2, name="q_offset") == xp.float64
    True
    """
    largest = max(abs(offset), abs(offset + t - 1), t_other - 1, 0) if t else max(t_other - 1, 0)

    def allowed(limit: int) -> tuple[int, int]:  # offset >= -limit, offset + t - 1 <= limit
        return -limit, limit - max(t - 1, 0)

    return float_dtype(xp, dtype, device=device, largest=largest, name=name, value=offset,
                       what="positions", allowed=allowed, angles=True)


def rope_call(
    q: Any,
    k: Any,
    v: Any,
    /,
    *,
    base: float,
    rotary_dim: int | None,
    layout: str,
    scale: float | None,
    mask: Any,
    causal: bool | None,
    q_offset: int | None,
) -> Call:
    """Validate a `rope_attention` call and resolve its defaults (shared with the kernels).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((3, 4))
    >>> rope_call(q, k, v, base=10000.0, rotary_dim=None, layout="half", scale=None,
    ...           mask=None, causal=None, q_offset=2).q_offset
    2
    """
    call = resolve_call(
        q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset, defaults=DEFAULTS
    )
    check_choice("layout", layout, ROPE_LAYOUTS)
    rope_frequencies(_rotary_dim(q.shape[-1], rotary_dim), base=base)
    angle_dtype(call.xp, q.dtype, _xp.device(q), offset=call.q_offset, t=call.t_q,
                name="q_offset", t_other=call.t_k)
    return call


@computes_in_float32
def rope_attention(
    q: Any,
    k: Any,
    v: Any,
    /,
    *,
    base: float = 10000.0,
    rotary_dim: int | None = None,
    layout: str = "half",
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
    return_weights: bool = False,
) -> Any:
    r"""Attention on rotated queries and keys.

    .. math:: w = \operatorname{softmax}\bigl(s\, (R_{i + q_\text{offset}} q_i)
              \cdot (R_j k_j)\bigr)

    Parameters
    ----------
    q, k, v : floating arrays ``(..., t_q, d)``, ``(..., t_k, d)``, ``(..., t_k, d_v)``
    base, rotary_dim, layout
        As in `rope_rotate`.
    scale, mask, causal, q_offset, return_weights
        As in `relpos_ref.attention` (defaults `DEFAULTS`); `q_offset` also
        sets the queries' rotation (``t_k - t_q`` when decoding with a cache).

    Returns
    -------
    out : array ``(..., t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.eye(4)
    >>> rope_attention(q, k, v, causal=True).shape
    (4, 4)
    """
    call = rope_call(
        q, k, v, base=base, rotary_dim=rotary_dim, layout=layout, scale=scale, mask=mask,
        causal=causal, q_offset=q_offset,
    )
    opts = {"base": base, "rotary_dim": rotary_dim, "layout": layout}
    q_rot = rope_rotate(q, offset=call.q_offset, **opts)
    k_rot = rope_rotate(k, offset=0, **opts)
    return attention(
        q_rot, k_rot, v, scale=call.scale, mask=mask, causal=call.causal,
        q_offset=call.q_offset, return_weights=return_weights,
    )


@computes_in_float32
def rope_attention_vjp(
    q: Any,
    k: Any,
    v: Any,
    /,
    *,
    d_output: Any,
    base: float = 10000.0,
    rotary_dim: int | None = None,
    layout: str = "half",
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
) -> dict[str, Any]:
    r"""Gradients of `rope_attention` for the output's cotangent `d_output` (a VJP).

    .. math:: \bar{q}_i = R_{i + q_\text{offset}}^\top\, \bar{\tilde{q}}_i, \qquad
              \bar{k}_j = R_j^\top\, \bar{\tilde{k}}_j

    where :math:`\bar{\tilde{q}}, \bar{\tilde{k}}` are plain attention's
    gradients at the rotated queries and keys, and :math:`R^\top` turns by
    the opposite angle (``rope_rotate(..., inverse=True)``).

    Parameters
    ----------
    q, k, v, base, rotary_dim, layout, scale, mask, causal, q_offset
        As in `rope_attention`.
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
    >>> rope_attention_vjp(q, k, v, d_output=xp.zeros((2, 2)))["q"]
    Array([[0., 0.],
           [0., 0.]], dtype=array_api_strict.float64)
    """
    call = rope_call(
        q, k, v, base=base, rotary_dim=rotary_dim, layout=layout, scale=scale, mask=mask,
        causal=causal, q_offset=q_offset,
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    opts = {"base": base, "rotary_dim": rotary_dim, "layout": layout}
    q_rot = rope_rotate(q, offset=call.q_offset, **opts)
    k_rot = rope_rotate(k, offset=0, **opts)
    fwd = forward(q_rot, k_rot, call, mask=mask)
    core = core_vjp(q_rot, k_rot, v, d_output, call, fwd)
    dq = rope_rotate(sum_to_shape(core.dq, q.shape), offset=call.q_offset, inverse=True, **opts)
    dk = rope_rotate(sum_to_shape(core.dk, k.shape), offset=0, inverse=True, **opts)
    return {"q": dq, "k": dk, "v": sum_to_shape(core.dv, v.shape)}
