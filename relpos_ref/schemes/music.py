r"""Music Transformer relative attention (Huang et al. 2018): causal, one-sided.

.. math:: \text{logits}_{ij} = s\,(q_i \cdot k_j + q_i \cdot E_{\text{idx}(r_{ij})}),
          \quad r_{ij} \le 0,

with a table ``E`` of ``M`` rows for ``r = -(M-1) .. 0`` (row ``r + M - 1``).
The efficient path is the "skew": ``Q E^T`` for the ``t_k`` distances that
occur, laid out by `relpos_ref.layouts.rel_shift` (exactly the skew when
``t_q = t_k``), memory ``O(L d + L^2)`` instead of ``O(L^2 d)``.
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._validate import as_int, check_choice, nonnegative_int
from ..attention import _attention
from ..layouts import rel_shift
from ..positions import (
    _ERROR_POLICY_HINT,
    BEYOND_POLICIES,
    TableIndex,
    _raise_if_outside,
    causal_table_index,
    distance_range,
    relative_positions,
)
from ._tables import (
    check_method,
    check_table,
    check_value_width,
    contract_rows,
    distance_bins,
    gather_valid_rows,
    numpy_block_logits,
    table_logits,
    weighted_rows,
)

__all__ = ["music_attention", "music_index", "music_logits", "music_values"]


def _check_beyond(t_q: int, t_k: int, length: int, q_offset: int, beyond: str) -> None:
    # Host-side: the policy name, and under "error" that no past distance
    # falls before the table (future distances have no row and are not errors).
    check_choice("beyond", beyond, BEYOND_POLICIES)
    if beyond == "error":
        span = distance_range(t_q, t_k, q_offset=q_offset)
        if span is not None:  # the table has rows for r = -(length - 1) .. 0
            past_end, _ = span
            _raise_if_outside(past_end, 0, -(length - 1), 0, f"length={length}", _ERROR_POLICY_HINT)


def music_index(
    t_q: int,
    t_k: int,
    /,
    *,
    length: int,
    q_offset: int = 0,
    beyond: str = "clip",
    xp: Any,
    device: Any = None,
) -> TableIndex:
    """One-sided table row and validity per pair; future entries are invalid.

    Parameters
    ----------
    t_q, t_k : int
        Number of queries and keys.
    length : int
        ``M``; rows for ``r = -(M-1) .. 0``.
    q_offset : int, optional
        Position of query 0.
    beyond : {"clip", "zero", "error"}, optional
        Policy for ``r < -(M-1)``.
    xp : namespace
        Array API namespace of the result.
    device : optional
        Device of the result.

    Returns
    -------
    TableIndex
        ``index = clip(r, -(M-1), 0) + M - 1`` and ``valid``, each ``(t_q, t_k)``.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> music_index(3, 3, length=3, xp=xp).index
    array([[2, 2, 2],
           [1, 2, 2],
           [0, 1, 2]])
    """
    _check_beyond(t_q, t_k, length, q_offset, beyond)
    if beyond == "error":
        beyond = "clip"
    r = relative_positions(t_q, t_k, q_offset=q_offset, xp=xp, device=device)
    return causal_table_index(r, length, beyond=beyond)


def _rows_for_every_distance(xp: Any, table: Any, t_k: int, beyond: str) -> Any:
    # Rows for r = -(t_k - 1) .. 0: the table's last t_k rows, extended at the
    # past end with its first row ("clip") or zeros ("zero") when M < t_k.
    m = table.shape[-2]
    if m >= t_k:
        return table[..., m - t_k :, :]
    shape = (*table.shape[:-2], t_k - m, table.shape[-1])
    if beyond == "clip":
        fill = xp.broadcast_to(table[..., :1, :], shape)
    else:
        fill = xp.zeros(shape, dtype=table.dtype, device=_xp.device(table))
    return xp.concat([fill, table], axis=-2)


def music_logits(
    q: Any,
    table: Any,
    /,
    t_k: int,
    *,
    q_offset: int = 0,
    beyond: str = "clip",
    method: str = "efficient",
) -> Any:
    r"""Positional term :math:`P_{ij} = q_i \cdot E_{\text{idx}(r_{ij})}` for ``r <= 0``, else 0.

    Parameters
    ----------
    q : floating array, shape ``(..., t_q, d)``
    table : floating array, shape ``(M, d)`` or ``(h, M, d)``
        Row ``r + M - 1`` for distance ``r = -(M-1) .. 0``.
    t_k : int
        Number of keys.
    q_offset : int, optional
        Position of query 0. The efficient path needs end alignment,
        ``q_offset = t_k - t_q`` (``0`` for self-attention).
    beyond : {"clip", "zero", "error"}, optional
        Past distances ``r < -(M-1)``.
    method : {"efficient", "definition"}, optional

    Returns
    -------
    array, shape ``(..., t_q, t_k)``; zero where ``r > 0`` (no row).

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> q = xp.ones((3, 1))
    >>> E = xp.asarray([[-2.0], [-1.0], [0.0]])  # M = 3: r = -2, -1, 0
    >>> music_logits(q, E, 3)
    array([[ 0.,  0.,  0.],
           [-1.,  0.,  0.],
           [-2., -1.,  0.]])
    """
    xp = _xp.array_namespace(q, table)
    check_method(method)
    check_table("table", table, q, width=q.shape[-1])
    t_k = nonnegative_int("t_k", t_k)
    q_offset = as_int("q_offset", q_offset)
    t_q = q.shape[-2]
    m = table.shape[-2]
    if m < 1:
        msg = f"`table` must have at least one row, got shape {tuple(table.shape)}"
        raise ValueError(msg)
    dev = _xp.device(q)
    index, valid = music_index(
        t_q, t_k, length=m, q_offset=q_offset, beyond=beyond, xp=xp, device=dev
    )
    zero = xp.zeros((), dtype=q.dtype, device=dev)
    if method == "definition":
        return contract_rows(q, gather_valid_rows(table, index, valid))
    if q_offset != t_k - t_q:
        msg = (
            "music's efficient path (the skew) needs end-aligned queries, "
            f"q_offset = t_k - t_q = {t_k - t_q}, got q_offset={q_offset}; "
            "use method='definition' or the general scheme"
        )
        raise ValueError(msg)
    if t_q == 0 or t_k == 0:
        return xp.zeros((*q.shape[:-2], t_q, t_k), dtype=q.dtype, device=dev)
    policy = "zero" if beyond == "zero" else "clip"
    rows = _rows_for_every_distance(xp, table, t_k, policy)
    out = rel_shift(table_logits(q, rows))
    return xp.where(valid, out, zero)


def music_values(
    weights: Any,
    value_table: Any,
    /,
    *,
    q_offset: int = 0,
    beyond: str = "clip",
    method: str = "efficient",
) -> Any:
    r"""Relative value term :math:`\sum_{j:\, r_{ij} \le 0} w_{ij}\, E^V_{\text{idx}(r_{ij})}`.

    Parameters
    ----------
    weights : floating array, shape ``(..., t_q, t_k)``
    value_table : floating array, shape ``(M, d_v)`` or ``(h, M, d_v)``
        Row ``r + M - 1`` for ``r = -(M-1) .. 0``; future keys get no row.
    q_offset, beyond
        As in `music_logits`.
    method : {"efficient", "definition"}, optional
        ``"efficient"`` sums the weights into the ``M`` distance bins,
        memory ``O(t_q (t_k + M))``.

    Returns
    -------
    array, shape ``(..., t_q, d_v)``

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> w = xp.asarray([[0.25, 0.25, 0.5]])
    >>> EV = xp.asarray([[1.0], [10.0]])  # M = 2: r = -1, 0
    >>> music_values(w, EV, q_offset=2)  # r = -2 (clipped), -1, 0
    array([[5.5]])
    """
    xp = _xp.array_namespace(weights, value_table)
    check_method(method)
    check_table("value_table", value_table, weights)
    m = value_table.shape[-2]
    t_q, t_k = weights.shape[-2:]
    if method == "definition":
        dev = _xp.device(weights)
        index, valid = music_index(
            t_q, t_k, length=m, q_offset=q_offset, beyond=beyond, xp=xp, device=dev
        )
        return weighted_rows(weights, gather_valid_rows(value_table, index, valid))
    _check_beyond(t_q, t_k, m, q_offset, beyond)
    bins = distance_bins(
        weights, low=-(m - 1), high=0, q_offset=q_offset, clip=beyond == "clip", clip_future=False
    )
    return xp.matmul(bins, value_table)


def music_attention(
    q: Any,
    k: Any,
    v: Any,
    table: Any,
    value_table: Any = None,
    /,
    *,
    scale: float | None = None,
    mask: Any = None,
    causal: bool = True,
    q_offset: int = 0,
    beyond: str = "clip",
    method: str = "efficient",
    return_weights: bool = False,
) -> Any:
    r"""Causal relative self-attention of the Music Transformer.

    .. math:: w = \operatorname{softmax}_{r \le 0}\bigl(s\,(q k^\top + S^\text{rel})\bigr),
              \quad S^\text{rel}_{ij} = q_i \cdot E_{r_{ij} + M - 1}

    Parameters
    ----------
    q, k, v : floating arrays ``(..., t_q, d)``, ``(..., t_k, d)``, ``(..., t_k, d_v)``
    table : floating array, ``(M, d)`` or ``(h, M, d)``
    value_table : floating array, ``(M, d_v)`` or ``(h, M, d_v)``, optional
        Relative value embeddings, added as in `music_values`.
    scale, mask, q_offset, return_weights
        As in `relpos_ref.attention`.
    causal : bool, optional
        ``True`` (the scheme's setting). With ``False`` future keys are
        attended with a zero positional term.
    beyond, method
        As in `music_logits`.

    Returns
    -------
    out : array ``(..., t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import numpy as np
    >>> q = k = v = np.eye(3)
    >>> music_attention(q, k, v, np.zeros((3, 3)))[0].tolist()
    [1.0, 0.0, 0.0]
    """
    _xp.array_namespace(q, k, v, table, value_table)
    check_value_width(value_table, v)
    t_q, t_k = q.shape[-2], k.shape[-2]
    rows = position = None
    if _numpy_window_path(q, k, table, q_offset=q_offset, method=method):
        check_table("table", table, q, width=q.shape[-1])
        _check_beyond(t_q, t_k, table.shape[-2], q_offset, beyond)
        # NumPy, a table about as long as the keys: the term as general's, one block
        # of queries at a time, from the table extended to every distance of the grid.
        extended = _extended_table(table, t_q, t_k, q_offset=q_offset, beyond=beyond)
        low = -(t_q - 1) - q_offset  # the grid's most distant past
        rows = numpy_block_logits(q, extended, t_k, q_offset=q_offset, low=low)
    else:
        position = music_logits(q, table, t_k, q_offset=q_offset, beyond=beyond, method=method)
    out, weights = _attention(
        q,
        k,
        v,
        scale=scale,
        mask=mask,
        causal=causal,
        q_offset=q_offset,
        bias=None,
        position=position,
        return_weights=True,
        position_rows=rows,
    )
    if value_table is not None:
        out = out + music_values(
            weights, value_table, q_offset=q_offset, beyond=beyond, method=method
        )
    return (out, weights) if return_weights else out


def _numpy_window_path(q: Any, k: Any, table: Any, *, q_offset: int, method: str) -> bool:
    # The windowed form pays off when the table covers at least half the keys: it
    # multiplies each query by t_k + B - 1 table rows where the skew needs M.
    check_method(method)
    t_q, t_k = q.shape[-2], k.shape[-2]
    return (
        method == "efficient"
        and _xp.all_numpy(q, k, table)
        and q_offset == t_k - t_q
        and 2 * table.shape[-2] >= t_k > 0
        and t_q > 0
        and table.ndim in (2, 3)
    )


def _extended_table(table: Any, t_q: int, t_k: int, *, q_offset: int, beyond: str) -> Any:
    """The one-sided table extended to the grid's distances, ``r_min .. r_max`` (row ``r - r_min``).

    The table's rows for ``-(M - 1) .. 0``, its first row (``"clip"``) or
    zeros (``"zero"``) before them, and zeros for the future, whose
    positional term is zero. NumPy only; ``O((t_q + t_k) d)``.
    """
    import numpy as np

    m = table.shape[-2]
    r_min, r_max = -(t_q - 1) - q_offset, t_k - 1 - q_offset
    r = np.arange(r_min, r_max + 1)
    row = np.clip(r, -(m - 1), 0) + (m - 1)
    keep = (r <= 0) & ((r >= -(m - 1)) | (beyond == "clip"))
    return np.where(keep[:, None], np.take(table, row, axis=-2), 0).astype(table.dtype, copy=False)
