r"""RoPE's frequencies, angles, cosines and sines: exact, or as float32 computes them.

Pair ``c`` of the position ``p`` turns by :math:`\varphi = p\,\theta'_c`, the
scaled frequency :math:`\theta'_c` (`relpos_ref.schemes.rope_scaling`)
computed on the host in float64. Two ways to form the angle, the option
``angles``:

- ``"float64"`` (the default, the golden): :math:`\varphi` and its cosine and
  sine in float64 wherever the arrays' device has it (in the arrays' dtype
  otherwise), rounded once to the dtype; exact to a few float64 roundings at
  any position up to :math:`2^{53}`.
- ``"float32"``: the common float32 computation, :math:`\varphi_{32} =
  \text{fl}_{32}(\text{fl}_{32}(p)\cdot\theta^{(32)}_c)`, the position
  rounded to float32 times the frequency as float32 arithmetic forms it
  (``1 / base ** (2c / R)`` and the rule, each operation rounded:
  `relpos_ref.schemes.rope_float32`), the product rounded; its cosine and
  sine are then evaluated as above. A float32 angle is off by up to
  :math:`|\varphi|\,2^{-23}`: about ``5e-3`` rad at position 131071 and
  ``0.03`` to ``0.07`` rad near ``2**20``, where the two modes' outputs
  differ visibly. An implementation whose float32 frequency differs by one
  ulp from this one (correctly rounded from float64, say, which a third of
  the pairs are not) differs from this mode by up to
  :math:`p\,\theta_c\,2^{-24}` as well: at large positions a float32
  angle depends on how its frequency was rounded.

Only the ``(t, R/2)`` cosines and sines of the positions in use are formed,
never a table of all positions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .. import _xp
from .._exact import float_dtype
from .._validate import as_float, as_int, check_choice, nonnegative_int
from .rope_float32 import f32, float32_frequencies
from .rope_scaling import attention_factor, check_scaling, reads_length, scaled_frequencies

__all__ = [
    "ANGLES",
    "angle_dtype",
    "cos_sin",
    "frequencies",
    "rope_cos_sin",
    "rope_frequencies",
    "rotary_width",
]

#: How angles are formed: exactly (the golden) or as float32 arithmetic does.
ANGLES = ("float64", "float32")


def rotary_width(d: int, rotary_dim: int | None) -> int:
    """`rotary_dim` checked against the feature width `d` (``None``: all of it).

    Examples
    --------
    >>> rotary_width(8, None), rotary_width(8, 4)
    (8, 4)
    """
    if rotary_dim is None:
        rotary_dim = d
    rotary_dim = as_int("rotary_dim", rotary_dim)
    if rotary_dim < 0 or rotary_dim % 2 or rotary_dim > d:
        msg = f"`rotary_dim` must be even and in 0 .. {d} (the feature width), got {rotary_dim}"
        raise ValueError(msg)
    return rotary_dim


def rope_frequencies(
    rotary_dim: int,
    /,
    *,
    base: float = 10000.0,
    scaling: Mapping[str, Any] | None = None,
    length: int | None = None,
) -> tuple[float, ...]:
    r"""Angular frequencies :math:`\theta'_c`, scaled by `scaling` (host floats, float64).

    .. math:: \theta_c = \text{base}^{-2c / \text{rotary\_dim}}, \quad
              \theta'_c = \text{the rule of } \texttt{scaling["rope\_type"]}
              \text{ applied to } \theta \ (\text{`relpos\_ref.schemes.rope\_scaling`})

    Parameters
    ----------
    rotary_dim : int
        Number of rotated features, even.
    base : float, optional
        ``> 0``; 10000 in the paper.
    scaling : mapping, optional
        The frequency rule (`relpos_ref.schemes.rope_scaling.check_scaling`);
        ``None``: none.
    length : int, optional
        The call's length, largest position plus one; needed by the rules
        that read it (``dynamic`` and ``longrope`` with ``policy="per_call"``).

    Returns
    -------
    tuple of float
        ``rotary_dim / 2`` frequencies, ``θ_0`` first.

    Examples
    --------
    >>> rope_frequencies(4, base=100.0)
    (1.0, 0.1)
    >>> rope_frequencies(4, base=100.0, scaling={"rope_type": "linear", "factor": 4.0})
    (0.25, 0.025)
    """
    rotary_dim = rotary_width(rotary_dim, rotary_dim)
    base = as_float("base", base)
    if not base > 0:
        msg = f"`base` must be > 0, got {base}"
        raise ValueError(msg)
    rule = check_scaling(scaling)
    if length is None:
        if reads_length(rule):
            msg = (f"`length` (the call's largest position + 1) is needed by rope_type "
                   f"{rule['rope_type']!r} with policy 'per_call', got None")
            raise ValueError(msg)
        length = 0
    length = nonnegative_int("length", length)
    if rule["rope_type"] == "default":
        return tuple(base ** (-2.0 * c / rotary_dim) for c in range(rotary_dim // 2))
    return scaled_frequencies(rotary_dim, base=base, scaling=rule, length=length)


def frequencies(rotary_dim: int, *, base: float, scaling: Mapping[str, Any] | None,
                length: int, angles: str) -> tuple[float, ...]:
    """The frequencies an `angles` mode multiplies positions by: exact, or float32's.

    Examples
    --------
    >>> frequencies(2, base=10.0, scaling=None, length=1, angles="float32")
    (1.0,)
    """
    exact = rope_frequencies(rotary_dim, base=base, scaling=scaling, length=length)
    if check_choice("angles", angles, ANGLES) == "float64":
        return exact
    return float32_frequencies(rotary_dim, base=base, scaling=check_scaling(scaling),
                               length=length)


def angle_dtype(xp: Any, dtype: Any, device: Any, *, offset: int, t: int, name: str,
                t_other: int = 0) -> Any:
    """The dtype of the angles of positions ``offset`` to ``offset + t - 1`` (and ``t_other``'s).

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


def _float32_turns(xp: Any, wide: Any, dev: Any, offset: int, t: int,
                   freqs: tuple[float, ...]) -> tuple[Any, Any]:
    # cos and sin, in `wide`, of fl32(fl32(p) fl32(θ)): the angles float32 arithmetic forms
    idx = _xp.index_dtype(xp, dev)
    theta = xp.asarray([f32(f) for f in freqs], dtype=xp.float32, device=dev)
    positions = xp.astype(xp.arange(t, dtype=idx, device=dev) + offset, xp.float32)
    angles = xp.astype(positions[:, None] * theta[None, :], wide)
    return xp.cos(angles), xp.sin(angles)


def cos_sin(xp: Any, dtype: Any, dev: Any, *, offset: int, t: int, freqs: tuple[float, ...],
            angles: str, factor: float, name: str = "offset") -> tuple[Any, Any]:
    """``a cos φ`` and ``a sin φ`` of positions ``offset ..``, ``(t, len(freqs))``, in `dtype`.

    The angles as `angles` says (module docstring), in float64 where `dev`
    has it; `factor` is the attention factor ``a``; one rounding to `dtype`.
    Positions are checked (`angle_dtype`, naming `name`) first.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> c, s = cos_sin(xp, xp.float64, None, offset=1, t=1, freqs=(1.0,), angles="float64",
    ...                factor=2.0)
    >>> float(c[0, 0]) == 2 * __import__("math").cos(1.0)
    True
    """
    wide = angle_dtype(xp, dtype, dev, offset=offset, t=t, name=name)
    turns = _float32_turns if angles == "float32" else _turns
    cos, sin = turns(xp, wide, dev, offset, t, freqs)
    if factor != 1.0:
        cos, sin = cos * factor, sin * factor
    return xp.astype(cos, dtype), xp.astype(sin, dtype)


def rope_cos_sin(
    t: int,
    /,
    *,
    rotary_dim: int,
    offset: int = 0,
    base: float = 10000.0,
    scaling: Mapping[str, Any] | None = None,
    angles: str = "float64",
    length: int | None = None,
    xp: Any,
    device: Any = None,
    dtype: Any = None,
) -> tuple[Any, Any]:
    r"""Cosines and sines a RoPE kernel multiplies by, positions ``offset`` to ``offset + t - 1``.

    .. math:: C_{ic} = a \cos\bigl((i + \text{offset})\,\theta'_c\bigr), \qquad
              S_{ic} = a \sin\bigl((i + \text{offset})\,\theta'_c\bigr)

    with :math:`\theta'` from `rope_frequencies` and :math:`a` the attention
    factor of `scaling` (`relpos_ref.schemes.rope_scaling.attention_factor`).
    Pair ``c`` of a row turns as ``(x_a, x_b) -> (x_a C - x_b S, x_b C + x_a S)``.

    Parameters
    ----------
    t : int
        Number of positions.
    rotary_dim : int
        Rotated features (even); the result has ``rotary_dim / 2`` columns.
    offset, base, scaling, angles
        As in `relpos_ref.rope_rotate`.
    length : int, optional
        The call's length for the rules that read it; default ``offset + t``.
    xp : namespace
    device : device, optional
    dtype : floating dtype, optional
        Default float64 where `device` has it, else float32.

    Returns
    -------
    cos, sin : arrays ``(t, rotary_dim / 2)``

    Examples
    --------
    >>> import array_api_strict as xp
    >>> cos, sin = rope_cos_sin(2, rotary_dim=2, base=1.0, xp=xp)
    >>> sin
    Array([[0.        ],
           [0.84147098]], dtype=array_api_strict.float64)
    """
    xp = _xp.check_namespace(xp)
    t = nonnegative_int("t", t)
    offset = as_int("offset", offset)
    check_choice("angles", angles, ANGLES)
    if length is None:
        length = max(offset + t, 0)
    freqs = frequencies(rotary_dim, base=base, scaling=scaling, length=length, angles=angles)
    if dtype is None:
        dtype = xp.float64 if _xp.has_float64(xp, device) else xp.float32
    return cos_sin(xp, dtype, device, offset=offset, t=t, freqs=freqs, angles=angles,
                   factor=attention_factor(check_scaling(scaling)))
