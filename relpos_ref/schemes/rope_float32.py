r"""RoPE's frequencies as float32 arithmetic forms them: ``angles="float32"``.

The common float32 computation (transformers' ``modeling_rope_utils``, vLLM's
``_compute_inv_freq``, Meta's and GPT-NeoX's reference code) forms the
frequencies in float32 before it multiplies them by the positions:

.. math:: \theta^{(32)}_c = \text{fl}\Bigl(1 \big/ \text{fl}\bigl(\text{base}^{\,
          \text{fl}(2c / R)}\bigr)\Bigr)

(``fl``: rounded to float32; ``base`` itself rounded to float32 first), then
applies the rule in float32, each operation rounded, in the order the
rules are written (`relpos_ref.schemes.rope_scaling`):

- ``linear``: :math:`\text{fl}(\theta/s)`;
- ``dynamic``: the chain with :math:`\text{base}'` computed in float32 from the
  call's length (``per_call``), or computed in float64 and rounded (``fixed``);
- ``yarn``: :math:`\text{fl}(\text{fl}(1/\text{fl}(s p_c))\,\text{fl}(1 - m_c)
  + \text{fl}(\theta\, m_c))`, :math:`p_c` the power above, :math:`m_c =
  \text{fl}(1 - \rho_c)` the extrapolation weight, :math:`\rho_c` the ramp
  in float32;
- ``longrope``: :math:`\text{fl}(1 / \text{fl}(e_c\, p_c))`;
- ``llama3``: wavelength :math:`\text{fl}(\text{fl}(2\pi)/\theta)`, then
  :math:`\text{fl}(\theta/s)` or the smoothed blend, each operation rounded;
- ``proportional``: :math:`\text{fl}(\theta/s)` for the turning pairs, 0 for the others.

Every operation here is on Python floats (float64) rounded to float32
afterwards, which for ``+ - * /`` of float32 operands is the correctly
rounded float32 result; a library's float32 ``pow`` may differ from the
correctly rounded power by an ulp (PyTorch's does for about one pair in a
hundred), which moves that pair's angle by :math:`p\,\theta\,2^{-24}`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any

from .rope_scaling import dynamic_span, longrope_factors, proportional_pairs, yarn_range

__all__ = ["f32", "float32_frequencies"]


def f32(value: float) -> float:
    """`value` rounded to the nearest float32 (a Python float).

    Examples
    --------
    >>> f32(0.1) == 0.10000000149011612
    True
    """
    return struct.unpack("f", struct.pack("f", value))[0]


def _powers(base: float, rd: int, pairs: int) -> list[float]:
    # fl(base ** fl(fl(2c) / fl(R))), the float32 powers behind the chain
    b = f32(base)
    return [f32(b ** f32(f32(2.0 * c) / f32(rd))) for c in range(pairs)]


def _dynamic_base32(base: float, rd: int, s: Mapping[str, Any], length: int) -> float:
    factor, l0 = s["factor"], s["original_max_position_embeddings"]
    span = dynamic_span(s, length)
    if s["policy"] == "fixed":  # computed once on the host, in float64
        return base * (factor * span / l0 - (factor - 1)) ** (rd / (rd - 2))
    ratio = f32(f32(f32(factor) * f32(span)) / f32(l0))  # the call's length, in float32
    grown = f32(f32(ratio - f32(factor - 1)) ** f32(rd / (rd - 2)))
    return f32(f32(base) * grown)


def _yarn32(powers: list[float], base: float, rd: int, s: Mapping[str, Any]) -> list[float]:
    low, high = yarn_range(base, rd, s)
    factor = f32(s["factor"])
    out = []
    for c, p in enumerate(powers):
        ramp = min(max(f32(f32(c - f32(low)) / f32(high - low)), 0.0), 1.0)
        extrapolation = f32(1.0 - ramp)
        interpolated = f32(1.0 / f32(factor * p))
        out.append(f32(f32(interpolated * f32(1.0 - extrapolation))
                       + f32(f32(1.0 / p) * extrapolation)))
    return out


def _llama3_32(theta: list[float], s: Mapping[str, Any]) -> list[float]:
    factor, l0 = f32(s["factor"]), s["original_max_position_embeddings"]
    low, high = s["low_freq_factor"], s["high_freq_factor"]
    out = []
    for t in theta:
        wavelength = f32(f32(2 * math.pi) / t)
        divided = f32(t / factor)
        if wavelength < f32(l0 / high):
            out.append(t)
        elif wavelength > f32(l0 / low):
            out.append(divided)
        else:
            smooth = f32(f32(f32(f32(l0) / wavelength) - f32(low)) / f32(high - low))
            out.append(f32(f32(f32(f32(1.0 - smooth) * t) / factor) + f32(smooth * t)))
    return out


def float32_frequencies(rotary_dim: int, /, *, base: float, scaling: Mapping[str, Any],
                        length: int) -> tuple[float, ...]:
    """The frequencies of the module docstring, each a float32 value (as a Python float).

    Parameters
    ----------
    rotary_dim : int
        ``R``, even.
    base : float
    scaling : mapping
        Checked (`relpos_ref.schemes.rope_scaling.check_scaling`).
    length : int
        The call's length, for the ``per_call`` rules.

    Examples
    --------
    >>> float32_frequencies(4, base=10000.0, scaling={"rope_type": "default"}, length=1)
    (1.0, 0.009999999776482582)
    """
    kind = scaling["rope_type"]
    n = rotary_dim // 2
    if kind == "dynamic" and rotary_dim > 2:
        base = _dynamic_base32(base, rotary_dim, scaling, length)
    powers = _powers(base, rotary_dim, n)
    theta = [f32(1.0 / p) for p in powers]
    if kind in ("linear", "proportional"):
        factor = f32(scaling["factor"])
        theta = [f32(t / factor) for t in theta]
    if kind == "proportional":
        theta = [t if c < proportional_pairs(rotary_dim, scaling) else 0.0
                 for c, t in enumerate(theta)]
    elif kind == "yarn":
        theta = _yarn32(powers, base, rotary_dim, scaling)
    elif kind == "longrope":
        factors = longrope_factors(n, rotary_dim, scaling, length)
        theta = [f32(1.0 / f32(f32(e) * p)) for e, p in zip(factors, powers, strict=True)]
    elif kind == "llama3":
        theta = _llama3_32(theta, scaling)
    return tuple(theta)
