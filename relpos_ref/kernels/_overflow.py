r"""Which calls a kernel may take: those whose logits cannot overflow, bounded from the inputs.

The specification makes an overflow visible (`relpos_ref.compose_logits`:
a ``-inf`` logit whose bias is not ``-inf`` becomes NaN, and its row NaN).
A kernel that composes the logits its own way (a fused SDPA call, ``q``
scaled before ``q k^T``, the scores in place) would read the same ``-inf``
as a masked key, and an empty row as zeros. So a kernel takes only calls
whose logits provably do not overflow, from the magnitudes of its inputs
(one pass over ``q``, ``k`` and the tables, no pass over the scores), and
hands every other call to the specification:

.. math::
    S = \max(1, |s|)\,\bigl(d\,M_q M_k + P + M_q + M_k\bigr)
        \;\le\; \min\bigl(\text{max} / 16,\ \tfrac12 \operatorname{ulp}(\text{max})\bigr)

where ``M_x`` is the largest ``|x|``, ``P`` bounds the scheme's
content-position terms (`logit_bound`: ``d M_q M_{table}`` for a table of
rows, ``2 M`` for RoPE's rotated entries, ``d_model M_{W_R}`` for
Transformer-XL's projected sinusoids) and ``max`` is the compute dtype's
largest value (float32 for 16-bit inputs). ``S / 16`` leaves room for the
rounding of the sums and for the differences the kernels take (a row's
maximum, Shaw's shifted table). Below half an ulp of ``max``, adding any
finite bias cannot overflow: ``|x + b| <= max + S`` rounds to at most
``max`` (a bias of ``finfo.min``, the usual additive mask, included), so
the biases themselves need no bound. A ``-inf`` bias is a mask in both
paths, and a NaN or ``+inf`` one makes its row NaN in both.

For float32 the bound is ``2**103`` (about ``1e31``): ordinary inputs are
far below it, and a call above it runs the specification (slower, exact).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["MARGIN", "bounded", "limit", "logit_bound", "numpy_magnitude"]

#: The bound stays below the dtype's largest value divided by this.
MARGIN = 16

#: Schemes whose position term reads rows of a ``(n, d)`` table by ``q``: name of the table(s).
_ROW_TABLES: dict[str, tuple[str, ...]] = {
    "shaw": ("key_table",), "general": ("table",), "music": ("table",),
    "grid2d": ("row_table", "col_table"),
    "cope": ("table",),  # its term, q . e, unscaled: bounded as if scaled
}


def limit(largest: float, eps: float) -> float:
    """The bound `logit_bound` must not exceed, for a dtype of `largest` value and `eps`.

    ``min(largest / MARGIN, ulp(largest) / 2)``; ``ulp(largest) = eps largest / (2 - eps)``.

    Examples
    --------
    >>> import numpy as np
    >>> f = np.finfo(np.float32)
    >>> limit(float(f.max), float(f.eps)) == 2.0**103
    True
    """
    half_ulp = eps * largest / (2 - eps) / 2
    return min(largest / MARGIN, half_ulp)


def logit_bound(scheme: str, magnitude: Mapping[str, float], *, d: int, scale: float,
                d_model: int = 0) -> float:
    r"""An upper bound of ``|s (q . k + P)|`` and of every operand a kernel scales.

    Parameters
    ----------
    scheme : str
        A name of `relpos_ref.catalog` (``"plain"`` for `relpos_ref.attention`).
    magnitude : mapping
        The largest ``|x|`` of ``q``, ``k`` and each array argument given, by
        its name (``"table"``, ``"w_r"``, plain's ``"position"``; NaN or
        ``inf`` for one that is not finite, which makes the bound so).
    d : int
        The feature width of ``q`` and ``k``.
    scale : float
        The call's scale.
    d_model : int, optional
        Transformer-XL: the rows of ``W_R`` (a projected sinusoid's entries
        are at most ``d_model M_{W_R}``).

    Returns
    -------
    float
        `S` of the module docstring (``inf`` or NaN where an input is not finite).

    Examples
    --------
    >>> logit_bound("plain", {"q": 1.0, "k": 2.0}, d=4, scale=0.5)
    11.0
    >>> logit_bound("shaw", {"q": 1.0, "k": 1.0, "key_table": 3.0}, d=2, scale=1.0)
    10.0
    """
    m = dict(magnitude)
    mq, mk = m["q"], m["k"]
    if scheme == "rope":  # a rotated entry a cos - b sin is at most |a| + |b|
        mq, mk = 2 * mq, 2 * mk
    keys = mk + m.get("table", 0.0) if scheme == "absolute" else mk  # q . (k_j + R_j)
    position = m.get("position", 0.0) if scheme == "plain" else 0.0
    if scheme in _ROW_TABLES:
        position = d * mq * sum(m.get(name, 0.0) for name in _ROW_TABLES[scheme])
    elif scheme == "deberta":  # c2p: q . K^r, p2c: k . Q^r
        position = d * (mq * m.get("key_table", 0.0) + mk * m.get("query_table", 0.0))
    elif scheme == "transformer_xl":  # (c) u . k; (b) + (d): (q + v) . W_R^T R_delta
        u, v = m.get("content_bias", 0.0), m.get("position_bias", 0.0)
        position = d * u * mk + d * (mq + v) * d_model * m.get("w_r", 0.0)
        mq = mq + u + v  # the kernels add u and v to q
    return max(1.0, abs(scale)) * (d * mq * keys + position + mq + keys)


def numpy_magnitude(a: Any, *, quick: bool = False) -> float:
    """The largest ``|a|`` of a NumPy array (NaN if one is NaN, ``inf`` if one is), 0 if empty.

    With `quick` (an array of the scores' size), an upper bound from one
    BLAS pass, ``sqrt(a . a)``, where that is finite (five times faster
    than the maximum and minimum, which it falls back to).

    Examples
    --------
    >>> import numpy as np
    >>> numpy_magnitude(np.array([3.0, -4.0])), numpy_magnitude(np.array([1.0, np.nan]))
    (4.0, nan)
    >>> numpy_magnitude(np.array([3.0, -4.0]), quick=True)
    5.0
    """
    if a.size == 0:
        return 0.0
    if quick and a.ndim and a.flags.c_contiguous:
        flat = a.reshape(-1)
        squares = float(flat @ flat)
        if squares < float("inf"):  # False for inf and NaN
            return squares**0.5
    return max(abs(float(a.max())), abs(float(a.min())))


def bounded(scheme: str, call: Any, q: Any, k: Any, **arrays: Any) -> bool:
    """Whether no logit of a NumPy call can overflow: `logit_bound` within `limit`.

    `arrays` are the call's array arguments by name (``None`` skipped);
    plain attention's ``position`` is bounded in one BLAS pass, its ``bias``
    needs no bound.
    """
    magnitude = {"q": numpy_magnitude(q), "k": numpy_magnitude(k)}
    for name, a in arrays.items():
        if a is not None and name != "bias":
            magnitude[name] = numpy_magnitude(a, quick=name == "position")
    w_r = arrays.get("w_r")
    bound = logit_bound(scheme, magnitude, d=call.d, scale=call.scale,
                        d_model=0 if w_r is None else w_r.shape[-2])
    info = np.finfo(q.dtype)
    return bound <= limit(float(info.max), float(info.eps))  # False for NaN
