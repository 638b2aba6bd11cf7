r"""The gradient of RoPE-Mixed's learned frequencies (``axes_type="mixed"``, Heo et al. 2024).

A learned table :math:`F` of shape ``(..., R/2, n)`` turns pair ``c`` of the
token at axis positions :math:`p_a` by :math:`\theta_c = \sum_a p_a F_{c a}`.
A pair :math:`r = (r_1, r_2)` turned by :math:`\theta` moves as
:math:`\partial r / \partial \theta = (-r_2, r_1)` (a quarter turn of itself),
so with :math:`g` the loss's gradient at the turned pair

.. math::
    \bar\theta_{t c} = g_2 r_1 - g_1 r_2, \qquad
    \bar F_{c a} = \sum_{\text{q and k}} \sum_t p_a(t)\, \bar\theta_{t c},

summed over the axes the table was broadcast along. Queries sit at
``q_offset + i`` and keys at ``j`` on every axis, or read ``positions``.
"""

from __future__ import annotations

from typing import Any

import array_api_compat

from .. import _xp
from ..calls import Call
from ..gradients import sum_to_shape
from .rope_angles import rotary_width
from .rope_axes import check_axes, check_positions
from .rope_layouts import rotated_span, turn

__all__ = ["call_frequency_gradient", "learned_frequencies", "pair_sums",
           "rope_frequency_gradient"]


def learned_frequencies(axes: Any) -> Any:
    """The array of learned frequencies of a call's `axes`, or ``None`` (none, or a list).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> learned_frequencies({"axes_type": "mixed", "frequencies": xp.ones((2, 1))}).shape
    (2, 1)
    >>> learned_frequencies({"axes_type": "mixed", "frequencies": [[1.0], [2.0]]}) is None
    True
    """
    if axes is None or axes.get("axes_type") != "mixed":
        return None
    table = axes.get("frequencies")
    return table if array_api_compat.is_array_api_obj(table) else None


def pair_sums(x: Any, /, *, rotary_dim: int, layout: str, rotary_at: str) -> Any:
    """Each rotated pair's two features summed: ``(..., t, R/2)``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> pair_sums(xp.asarray([[1.0, 2.0, 3.0, 4.0]]), rotary_dim=4, layout="half",
    ...           rotary_at="front")  # pairs (0, 2) and (1, 3)
    Array([[4., 6.]], dtype=array_api_strict.float64)
    """
    lo, hi = rotated_span(x.shape[-1], rotary_dim, rotary_at)
    if layout == "half":
        half = rotary_dim // 2
        return x[..., lo:lo + half] + x[..., lo + half:hi]
    return x[..., lo:hi:2] + x[..., lo + 1:hi:2]


def _angle_gradient(g: Any, turned: Any, **rotation: Any) -> Any:
    # d loss / d theta per token and pair: g . (-r2, r1), from the turned array itself
    xp = _xp.array_namespace(g, turned)
    shape = (*turned.shape[:-1], rotation["rotary_dim"] // 2)
    zero = xp.zeros(shape, dtype=turned.dtype, device=_xp.device(turned))
    quarter = turn(turned, zero, zero + 1, **rotation)
    return pair_sums(g * quarter, **rotation)


def rope_frequency_gradient(table: Any, sides: list[tuple[Any, Any, int]], *,
                            positions: Any, rotary_dim: int, layout: str,
                            rotary_at: str) -> Any:
    """:math:`\\bar F` from each side's ``(gradient at the turned array, turned array, offset)``.

    Parameters
    ----------
    table : floating array ``(..., R/2, n)``
        The learned frequencies.
    sides : list of ``(g, turned, offset)``
        The queries' (offset ``q_offset``) and the keys' (offset 0): ``turned``
        ``(..., t, d)`` and ``g`` the loss's gradient at it (the call's batch).
    positions : integer array ``(n, ..., L)``, optional
        Each token's position on each axis (``None``: the token's index).
    rotary_dim, layout, rotary_at
        As in `relpos_ref.rope_rotate`.

    Returns
    -------
    array of `table`'s shape and dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> table = xp.asarray([[0.5]])  # one pair, one axis
    >>> r = xp.asarray([[1.0, 0.0], [0.0, 1.0]])  # two tokens, turned
    >>> g = xp.asarray([[0.0, 1.0], [0.0, 0.0]])  # d loss / d r2 of token 0
    >>> rope_frequency_gradient(table, [(g, r, 3)], positions=None, rotary_dim=2,
    ...                         layout="half", rotary_at="front")  # p = 3: 3 * (1 * 1)
    Array([[3.]], dtype=array_api_strict.float64)
    """
    rotation = {"rotary_dim": rotary_dim, "layout": layout, "rotary_at": rotary_at}
    xp = _xp.array_namespace(table, *(s[1] for s in sides))
    dev = _xp.device(table)
    wide = xp.float64 if _xp.has_float64(xp, dev) else xp.float32
    n = table.shape[-1]
    total = None
    for g, turned, offset in sides:
        d_theta = _angle_gradient(xp.astype(g, wide), xp.astype(turned, wide), **rotation)
        t = d_theta.shape[-2]
        per_axis = []
        for a in range(n):
            if positions is None:
                at = xp.arange(offset, offset + t, dtype=wide, device=dev)
            else:
                at = xp.astype(positions[a, ..., offset:offset + t], wide)
            per_axis.append(xp.sum(at[..., :, None] * d_theta, axis=-2))  # (..., R/2)
        part = xp.stack(per_axis, axis=-1)  # (..., R/2, n)
        total = part if total is None else total + part
    return xp.astype(sum_to_shape(total, table.shape), table.dtype)


def call_frequency_gradient(q: Any, call: Call, sides: list[tuple[Any, Any, int]],
                            rotation: dict[str, Any]) -> Any:
    """`rope_frequency_gradient` of a `rope_attention` call, or ``None`` (nothing learned).

    `rotation` holds the call's rotation options as `relpos_ref.rope_attention`
    takes them (``axes``, ``positions``, ``rotary_dim``, ``layout``,
    ``rotary_at``, ``scaling``); `sides` as in `rope_frequency_gradient`.
    The specification's backward pass and the NumPy kernel's read it.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> from relpos_ref.calls import resolve_call
    >>> q = xp.asarray([[1.0, 0.0]])  # one query at position 2, one pair, turned by 2 F
    >>> call = resolve_call(q, q, q, scale=None, mask=None, causal=None, q_offset=2)
    >>> rotation = {"axes": {"axes_type": "mixed", "frequencies": xp.asarray([[0.0]])}}
    >>> g = xp.asarray([[0.0, 1.0]])  # the loss grows with the turned pair's second feature
    >>> call_frequency_gradient(q, call, [(g, q, 2)], rotation)  # 2 * (1 * 1)
    Array([[2.]], dtype=array_api_strict.float64)
    """
    table = learned_frequencies(rotation.get("axes"))
    if table is None:
        return None
    rd = rotary_width(q.shape[-1], rotation.get("rotary_dim"))
    positions = check_positions(q, rotation.get("positions"), check_axes(rotation["axes"]),
                                rotary_dim=rd, scaling=rotation.get("scaling"),
                                needed=call.q_offset + call.t_q, offset=call.q_offset,
                                name="q")
    return rope_frequency_gradient(table, sides, positions=positions, rotary_dim=rd,
                                   layout=rotation.get("layout", "half"),
                                   rotary_at=rotation.get("rotary_at", "front"))
