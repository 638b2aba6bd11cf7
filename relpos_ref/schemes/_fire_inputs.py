r"""FIRE's MLP input and its derivatives in ``c`` and ``L`` (`relpos_ref.schemes.fire`).

.. math:: x_{ij} = \frac{A_{ij}}{N_i}, \qquad A_{ij} = \psi(|p_i - j|), \qquad
          N_i = \psi(\max(|L|, p_i)) + \epsilon, \qquad \psi(x) = \log(|c\, x| + 1)

:math:`A` depends on the pair through the distance alone and :math:`N` on the
row alone: the specification computes both in a wide dtype (float64 where the
device has it) and rounds ``x`` once; the kernels read the same factors
(`relpos_ref._fire_pieces.input_factors`). ``c`` reaches ``x`` through both,
``L`` through :math:`N` alone, so the gradients of both are sums along each
row of :math:`\bar x` against :math:`\partial A / \partial c` and against
:math:`A` (`_gradients_from_row_sums`).
"""

from __future__ import annotations

import math
from typing import Any

from .. import _xp
from .._exact import float_dtype
from .._validate import as_float


def _largest(t_q: int, t_k: int, q_offset: int) -> int:
    if t_q == 0 or t_k == 0:
        return 0
    return max(abs(q_offset), abs(t_q - 1 + q_offset), t_k - 1, abs(t_k - 1 - q_offset))


def _wide(xp: Any, dtype: Any, device: Any, t_q: int, t_k: int, q_offset: int) -> Any:
    return float_dtype(xp, dtype, device=device, largest=_largest(t_q, t_k, q_offset),
                       name="q_offset", value=q_offset, what="positions", allowed=None,
                       angles=True)


def _check_scalar(name: str, x: Any) -> None:
    if hasattr(x, "shape"):
        if x.ndim != 0:
            msg = f"`{name}` must be a number or an array of shape (), got shape {tuple(x.shape)}"
            raise ValueError(msg)
        _xp.check_floating(_xp.array_namespace(x), name, x)
    else:
        as_float(name, x)


def _check_eps(eps: Any, c: Any, L: Any, call: Any) -> None:
    # eps >= 0, and 0 only where no query that sees a key has a normaliser of 0,
    # log(|c| max(|L|, p_i) + 1) = 0: every query if c = 0, those at p_i <= 0 if L = 0
    # (a causal query before position 0 sees no key: its row is zeros whatever its input)
    eps = as_float("eps", eps)
    if not math.isfinite(eps) or eps < 0:
        msg = f"`eps` must be a finite number >= 0, got {eps!r}"
        raise ValueError(msg)
    if eps or not call.t_q or not call.t_k or not all(
            _xp.readable(x) for x in (c, L) if hasattr(x, "shape")):
        return
    c_value, l_value = float(c), float(L)
    first, last = call.q_offset, call.q_offset + call.t_q - 1
    if c_value != 0:
        last = min(last, 0) if l_value == 0 else first - 1  # L = 0: p_i <= 0; else none
    if call.causal:
        first = max(first, 0)
    if first <= last:
        msg = (f"`eps` = 0 leaves the normaliser log(|c| max(|L|, p_i) + 1) + eps at 0 for "
               f"the query at position {first} (c = {c_value:g}, L = {l_value:g}): its row "
               f"would be NaN; pass eps > 0")
        raise ValueError(msg)


def _scalar(xp: Any, x: Any, dtype: Any, device: Any) -> Any:
    if hasattr(x, "shape"):
        return xp.astype(x, dtype)
    return xp.asarray(float(x), dtype=dtype, device=device)


def _row_parts(xp: Any, t_q: int, c: Any, L: Any, eps: float, q_offset: int, dtype: Any,
               device: Any) -> dict[str, Any]:
    # each query's position p, max(|L|, p) and normaliser n = psi(max(|L|, p)) + eps, (t_q,)
    idx = _xp.index_dtype(xp, device)
    p = xp.astype(xp.arange(t_q, dtype=idx, device=device) + q_offset, dtype)
    u = xp.abs(_scalar(xp, c, dtype, device))
    big_l = xp.abs(_scalar(xp, L, dtype, device))
    m = xp.maximum(p, big_l)
    return {"p": p, "u": u, "big_l": big_l, "m": m, "n": xp.log1p(u * m) + eps}


def _parts(xp: Any, t_q: int, t_k: int, c: Any, L: Any, eps: float, q_offset: int,
           dtype: Any, device: Any, j0: int = 0) -> dict[str, Any]:
    # the input x = A / N (keys j0 .. j0 + t_k - 1) and the pieces its gradients read
    rows = _row_parts(xp, t_q, c, L, eps, q_offset, dtype, device)
    idx = _xp.index_dtype(xp, device)
    j = xp.astype(xp.arange(j0, j0 + t_k, dtype=idx, device=device), dtype)
    dist = xp.abs(rows["p"][:, None] - j[None, :])
    a = xp.log1p(rows["u"] * dist)
    n = rows["n"][:, None]
    return {**rows, "dist": dist, "a": a, "n": n, "x": a / n}


def _distance_derivative(xp: Any, dist: Any, u: Any, c: Any) -> Any:
    # d psi(dist) / dc = sign(c) dist / (|c| dist + 1), any shape of distances
    return xp.sign(_scalar(xp, c, dist.dtype, _xp.device(dist))) * dist / (u * dist + 1.0)


def _row_derivatives(xp: Any, rows: dict[str, Any], c: Any, L: Any) -> tuple[Any, Any]:
    # (t_q,) each: dN/dc / N^2 and dN/dL / N^2 of each row (the normaliser's part of dx)
    u, m, n, big_l, p = rows["u"], rows["m"], rows["n"], rows["big_l"], rows["p"]
    n = xp.reshape(n, (-1,))
    dtype, dev = u.dtype, _xp.device(u)
    sign_c = xp.sign(_scalar(xp, c, dtype, dev))
    sign_l = xp.sign(_scalar(xp, L, dtype, dev))
    half = xp.asarray(0.5, dtype=dtype, device=dev)
    one, zero = xp.ones_like(half), xp.zeros_like(half)
    through = xp.where(big_l > p, one, xp.where(big_l == p, half, zero))  # torch.maximum's
    return (sign_c * m / (u * m + 1.0) / (n * n),
            sign_l * through * u / (u * m + 1.0) / (n * n))


def _gradients_from_row_sums(xp: Any, rows: dict[str, Any], by_da: Any, by_a: Any, c: Any,
                             L: Any) -> tuple[Any, Any]:
    r"""``c``'s and ``L``'s gradients (shape ``()``, wide) from two sums of each row.

    With :math:`\bar x` the input's cotangent, ``by_da[i]`` is
    :math:`\sum_j \bar x_{ij}\, \partial A_{ij} / \partial c` and ``by_a[i]``
    :math:`\sum_j \bar x_{ij} A_{ij}` (:math:`A_{ij} = \psi(|p_i - j|)`):
    :math:`x = A / N_i`, so :math:`\partial x / \partial c = (\partial A /
    \partial c) / N_i - A\, (\partial N_i / \partial c) / N_i^2`, and ``L``
    reaches ``x`` through :math:`N_i` alone.
    """
    row_c, row_l = _row_derivatives(xp, rows, c, L)
    n = xp.reshape(rows["n"], (-1,))
    # (a sum with keepdims, then reshaped: NumPy's sum of every entry is a scalar)
    d_c = xp.sum(by_da / n - row_c * by_a, axis=0, keepdims=True)
    d_l = -xp.sum(row_l * by_a, axis=0, keepdims=True)
    return xp.reshape(d_c, ()), xp.reshape(d_l, ())


def _parameter_gradients(xp: Any, parts: dict[str, Any], d_x: Any, c: Any,
                         L: Any) -> tuple[Any, Any]:
    # dx/dc and dx/dL, summed against d_x (all in the wide dtype): scalars
    da = _distance_derivative(xp, parts["dist"], parts["u"], c)
    by_da = xp.sum(d_x * da, axis=1)
    by_a = xp.sum(d_x * parts["a"], axis=1)
    return _gradients_from_row_sums(xp, parts, by_da, by_a, c, L)


def _like(xp: Any, g: Any, x: Any, dtype: Any) -> Any:
    return xp.astype(g, x.dtype if hasattr(x, "dtype") else dtype)
