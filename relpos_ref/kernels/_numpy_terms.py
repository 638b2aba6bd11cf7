"""NumPy term builders of the kernels: each adds one scheme's term into a block in place.

Each returns an `AddRows` (``add(live, a)``) for `softmax_in_place`, built
from the scheme's small tables once and read per block through views or
gathers, so that no ``(h, t_q, t_k)`` term exists. `relpos_ref.kernels.numpy`
calls them after the specification's validation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..calls import Call
from ..schemes import deberta
from ..schemes._tables import table_logits
from ._numpy_blocks import AddRows, distance_view

__all__ = ["deberta_terms", "grid_terms", "one_sided_rows", "window_bias"]


def grid_terms(
    q: np.ndarray, row_table: Any, col_table: Any, *, height: int, width: int
) -> AddRows:
    """2D relative attention per block of query tokens.

    The row term depends on the key's grid row alone and the column term on
    its grid column, so each is a ``(B, h)`` or ``(B, w)`` gather broadcast
    over the other axis of the key grid; no ``(hw, hw)`` term is built.
    """
    by_row, by_col = table_logits(q, row_table), table_logits(q, col_table)
    token = np.arange(q.shape[-2])
    key_rows, key_cols = np.arange(height), np.arange(width)

    def add(live: np.ndarray, a: int) -> None:
        n, keys = live.shape[-2:]
        b = a + n
        y, x = token[a:b] // width, token[a:b] % width
        at_row = (key_rows[None, :] - y[:, None]) + (height - 1)  # (B, h)
        at_col = (key_cols[None, :] - x[:, None]) + (width - 1)  # (B, w)
        row_term = np.take_along_axis(by_row[..., a:b, :], _like(at_row, by_row), axis=-1)
        col_term = np.take_along_axis(by_col[..., a:b, :], _like(at_col, by_col), axis=-1)
        term = row_term[..., :, :, None] + col_term[..., :, None, :]
        live += np.reshape(term, (*term.shape[:-2], height * width))[..., :keys]

    return add


def _like(index: np.ndarray, values: np.ndarray) -> np.ndarray:
    # `index` (B, n) with the leading axes of `values` (..., t, m), for take_along_axis.
    return np.broadcast_to(index, (*values.shape[:-2], *index.shape))


def window_bias(table: np.ndarray, wh: int, ww: int) -> AddRows:
    # The bias of query (y, x) is the (Wh, Ww) window of the (2Wh - 1, 2Ww - 1) table
    # starting at (Wh - 1 - y, Ww - 1 - x): a 4-D strided view over every query, added
    # one grid row of queries at a time (no gather, no (h, n, n) array).
    grid = np.ascontiguousarray(np.reshape(table, (*table.shape[:-1], 2 * wh - 1, 2 * ww - 1)))
    step_y, step_x = grid.strides[-2:]
    windows = np.lib.stride_tricks.as_strided(
        grid[..., wh - 1 :, ww - 1 :],
        shape=(*grid.shape[:-2], wh, ww, wh, ww),
        strides=(*grid.strides[:-2], -step_y, -step_x, step_y, step_x),
        writeable=False,
    )

    def add(live: np.ndarray, a: int) -> None:
        start, end = a, a + live.shape[-2]
        while start < end:  # the block's queries, one grid row at a time
            y, x = divmod(start, ww)
            stop = min(end, (y + 1) * ww)
            rows = live[..., start - a : stop - a, :]
            keys = np.reshape(rows, (*rows.shape[:-1], wh, ww))
            keys += windows[..., y, x : x + stop - start, :, :]
            start = stop

    return add


def one_sided_rows(table: np.ndarray, r_min: int, r_max: int, beyond: str) -> np.ndarray:
    # The one-sided table extended to the distances r_min .. r_max (row r - r_min): its
    # rows for -(M - 1) .. 0, its first row ("clip") or zeros before them, zeros for
    # the future, whose positional term is zero.
    m = table.shape[-2]
    r = np.arange(r_min, r_max + 1)
    row = np.clip(r, -(m - 1), 0) + (m - 1)
    keep = (r <= 0) & ((r >= -(m - 1)) | (beyond == "clip"))
    return np.where(keep[:, None], np.take(table, row, axis=-2), 0).astype(table.dtype)


def deberta_terms(q, k, key_table, query_table, call: Call, max_position) -> AddRows:
    """c2p + p2c for one block: gathers from ``q K^r^T`` and ``Q^r k^T`` through views.

    The table row of every distance of the grid is computed once (``t_q + t_k - 1``
    entries); a block's row indices are a Toeplitz view of it. c2p reads row ``i`` of
    ``X = q K^r^T`` (local reads); p2c reads ``Z^T = Q^r k^T``, ``(2S, t_k)``, whose
    consecutive keys are consecutive entries while the row stays the same, which it
    does for every key of a log bucket (local reads again, unlike ``Z = k Q^r^T``).
    """
    import array_api_compat.numpy as xp

    t_q, t_k = call.t_q, call.t_k
    span = (key_table if key_table is not None else query_table).shape[-2] // 2
    r_min = -(t_q - 1) - call.q_offset
    distances = np.arange(r_min, t_k - call.q_offset)
    row_of = np.asarray(deberta.deberta_rows(xp.asarray(distances), span=span,
                                             max_position=max_position))
    n_rows = 2 * span
    if key_table is not None:
        by_query = table_logits(q, key_table)  # (..., t_q, 2S)
        by_query = np.reshape(by_query, (*by_query.shape[:-2], t_q * n_rows))
    if query_table is not None:
        by_key = np.matmul(query_table, np.swapaxes(k, -1, -2))  # (..., 2S, t_k)
        by_key = np.reshape(by_key, (*by_key.shape[:-2], n_rows * t_k))
        row_starts = row_of * t_k

    def add(live: np.ndarray, a: int) -> None:
        n, width = live.shape[-2:]
        b = a + n
        window = slice(t_q - b, t_q - b + width + n - 1)  # distances of rows a .. b - 1
        if key_table is not None:
            index = distance_view(row_of[window], n, width) + (np.arange(a, b) * n_rows)[:, None]
            live += np.take(by_query, index, axis=-1, mode="clip")  # in range: no checks
        if query_table is not None:
            index = distance_view(row_starts[window], n, width) + np.arange(width)
            live += np.take(by_key, index, axis=-1, mode="clip")

    return add


