r"""Transformer-XL's sinusoids of the distance, projected (Dai et al. 2019).

For `relpos_ref.schemes.transformer_xl`: the distances ``δ = (i + q_offset) - j``
(`transformer_xl_distance`, clamped to `clamp_len`), the sinusoids
``R_δ = [sin(δ ω_0) .. sin(δ ω_{m-1}), cos(δ ω_0) .. cos(δ ω_{m-1})]`` with
``ω_c = base^{-2c / d_model}`` (`transformer_xl_embedding`, angles in float64
where the device has it, rounded once) and their projections
``p_δ = W_R^T R_δ`` (`transformer_xl_rows`).
"""

from __future__ import annotations

import math
from typing import Any

from .. import _xp
from .._validate import as_float, as_int, nonnegative_int
from ..calls import computes_in_float32
from ..positions import relative_positions
from ._tables import check_table
from .rope import rope_frequencies

__all__ = [
    "transformer_xl_distance",
    "transformer_xl_embedding",
    "transformer_xl_rows",
]


def _clamp_len(clamp_len: int | None) -> int | None:
    return None if clamp_len is None else nonnegative_int("clamp_len", clamp_len)


def _end_aligned(t_q: int, t_k: int, q_offset: int | None) -> int:
    return t_k - t_q if q_offset is None else as_int("q_offset", q_offset)


def transformer_xl_distance(
    t_q: int,
    t_k: int,
    /,
    *,
    q_offset: int | None = None,
    clamp_len: int | None = None,
    xp: Any,
    device: Any = None,
) -> Any:
    r"""Query-minus-key distance ``δ = -r``, clamped to ``[-clamp_len, clamp_len]``.

    .. math:: \delta_{ij} = \operatorname{clamp}\bigl((i + q_\text{offset}) - j,
              \ -c,\ c\bigr), \quad c = \text{clamp\_len}

    Parameters
    ----------
    t_q, t_k : int
        Number of queries and keys.
    q_offset : int, optional
        Position of query 0; default ``t_k - t_q`` (queries after a memory).
    clamp_len : int, optional
        Largest ``|δ|`` with a sinusoid of its own; ``None`` for no clamping.
    xp : namespace
        Array API namespace of the result.
    device : optional
        Device of the result.

    Returns
    -------
    array, shape ``(t_q, t_k)``
        Integer distances, index dtype of `xp`.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> transformer_xl_distance(2, 5, xp=xp)  # memory of 3
    Array([[ 3,  2,  1,  0, -1],
           [ 4,  3,  2,  1,  0]], dtype=array_api_strict.int64)
    >>> transformer_xl_distance(2, 5, clamp_len=2, xp=xp)
    Array([[ 2,  2,  1,  0, -1],
           [ 2,  2,  2,  1,  0]], dtype=array_api_strict.int64)
    """
    t_q = nonnegative_int("t_q", t_q)
    t_k = nonnegative_int("t_k", t_k)
    c = _clamp_len(clamp_len)
    q_offset = _end_aligned(t_q, t_k, q_offset)
    delta = -relative_positions(t_q, t_k, q_offset=q_offset, xp=xp, device=device)
    return delta if c is None else xp.clip(delta, -c, c)


def transformer_xl_embedding(
    delta: Any, /, d_model: int, *, dtype: Any, base: float = 10000.0
) -> Any:
    r"""Sinusoid ``R_δ`` of each distance: sines first, then cosines.

    .. math::
        R_\delta = [\sin(\delta\omega_0), \dots, \sin(\delta\omega_{m-1}),
        \cos(\delta\omega_0), \dots, \cos(\delta\omega_{m-1})],

        \omega_c = \text{base}^{-2c/d_\text{model}}

    Parameters
    ----------
    delta : integer array, any shape
        Distances (already clamped).
    d_model : int
        Width of the sinusoid, even (``m = d_model / 2`` frequencies).
    dtype : floating dtype of the namespace of `delta`
        Dtype of the result. The angles ``δ ω`` are computed in float64 where
        the device of `delta` has it (exact for ``|δ| <= 2**53``), else in
        `dtype`; `transformer_xl_attention` refuses distances beyond that.
    base : float, optional
        Frequency base, 10000 in the paper.

    Returns
    -------
    array, shape ``(*delta.shape, d_model)``

    Examples
    --------
    >>> import array_api_strict as xp
    >>> R = transformer_xl_embedding(xp.asarray([0, 1]), 4, dtype=xp.float64, base=100.0)
    >>> R  # ω = 1, 0.1
    Array([[0.        , 0.        , 1.        , 1.        ],
           [0.84147098, 0.09983342, 0.54030231, 0.99500417]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(delta)
    d_model = as_int("d_model", d_model)
    if d_model <= 0 or d_model % 2:
        msg = f"`d_model` must be even and positive, got {d_model}"
        raise ValueError(msg)
    if not xp.isdtype(dtype, "real floating"):
        msg = f"`dtype` must be a real floating dtype, got {dtype}"
        raise TypeError(msg)
    dev = _xp.device(delta)
    wide = xp.float64 if _xp.has_float64(xp, dev) else dtype
    omega = xp.asarray(rope_frequencies(d_model, base=as_float("base", base)), dtype=wide,
                       device=dev)
    angle = xp.astype(delta, wide)[..., None] * omega
    return xp.astype(xp.concat([xp.sin(angle), xp.cos(angle)], axis=-1), dtype)



def _check_projection(w_r: Any, q: Any) -> int:
    check_table("w_r", w_r, q, width=q.shape[-1])
    d_model = w_r.shape[-2]
    if d_model == 0 or d_model % 2:
        msg = (
            "`w_r` must have an even, positive number of rows (d_model), "
            f"got shape {tuple(w_r.shape)}"
        )
        raise ValueError(msg)
    return d_model


@computes_in_float32
def transformer_xl_rows(delta: Any, w_r: Any, /, *, base: float = 10000.0) -> Any:
    r"""Projected sinusoids :math:`p_\delta = W_R^\top R_\delta` for every entry of `delta`.

    Parameters
    ----------
    delta : integer array, any shape
        Distances ``δ = -r`` (already clamped).
    w_r : floating array, shape ``(d_model, d)`` or ``(h, d_model, d)``
    base : float, optional
        Frequency base of the sinusoids.

    Returns
    -------
    array, shape ``(*delta.shape, d)`` or ``(h, *delta.shape, d)``

    Examples
    --------
    >>> import array_api_strict as xp
    >>> w_r = xp.eye(2)  # d_model = 2: p_δ = (sin δ, cos δ)
    >>> transformer_xl_rows(xp.asarray([0, 1]), w_r)
    Array([[0.        , 1.        ],
           [0.84147098, 0.54030231]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(delta, w_r)
    _xp.check_floating(xp, "w_r", w_r)
    embedding = transformer_xl_embedding(delta, w_r.shape[-2], dtype=w_r.dtype, base=base)
    if w_r.ndim == 2:
        return xp.matmul(embedding, w_r)
    flat = xp.reshape(embedding, (math.prod(delta.shape), w_r.shape[-2]))
    rows = xp.matmul(flat, w_r)  # (h, n, d)
    return xp.reshape(rows, (w_r.shape[0], *delta.shape, w_r.shape[-1]))
