"""NumPy VJP kernels of the relative tables: Shaw's clipped tables, general and Music.

Shaw's tables go through the band of each block and one constant per row
beyond it (`_ClippedTable`); general's and Music's through one table row per
distance (`relpos_ref.kernels._numpy_vjp_common._DistanceRows`). Registered in
`relpos_ref.kernels._numpy_vjp_common.VJP_KERNELS`.
"""

from __future__ import annotations

import numpy as np

from ..calls import Call
from ..gradients import check_d_output
from ..positions import check_distances_in_table, extent_text
from ..schemes import (
    general,
    music,
    shaw,
)
from ..schemes._tables import table_logits
from ._numpy_terms import one_sided_rows
from ._numpy_vjp import Block, Term, at, backward
from ._numpy_vjp_common import (
    _covered,
    _DistanceRows,
    _distances,
    _grads,
    _ndarrays,
    _register,
    _scratch,
)
from ._numpy_vjp_tiles import band_view, row_dot

__all__: list[str] = []

#: Query rows per block at most with Shaw's clipped tables (`_ClippedTable`): the band
#: tile of a block, ``B + P + K`` keys wide, is the part of its work that grows with
#: ``B^2`` (at t = 1024, K = 16: 256 rows as fast as 512, 7 % faster than 128).
CLIPPED_ROWS = 256


class _ClippedTable(Term):
    """Shaw et al.'s tables of ``P + K + 1`` rows (``r = -P .. K``), clipped (or zero) beyond.

    ``x = s q a^K^T`` is ``(..., t_q, P + K + 1)``. A block of rows ``a .. b - 1``
    reads row 0 at every key before ``start = a + q_offset - P`` and the last row
    at every key from ``end = b + q_offset + K`` on (with ``clip``; nothing with
    ``zero``); between them lies a ``(B, B + P + K)`` tile whose entry ``(i', c)``
    is at ``r = c - i' - P``: the band ``0 <= c - i' <= P + K`` (a strided view),
    and the clipped triangles before and after it. Softmax and its backward are
    blind to a constant per row, so each row is shifted by its entry on the wider
    of the two rectangles, which then needs nothing, and the other gets one
    constant per row. The value table's share of ``g`` is the same layout of
    ``o' a^V^T``; the bins of the weights (the value table's gradient) and of
    :math:`\\bar{l}` (the key table's) are the band and, with ``clip``, the row
    sums of the triangles and rectangles. Nothing of the block's width is laid out.
    """

    rows = CLIPPED_ROWS

    def __init__(self, q, key_table, value_table, call: Call, *, clip: bool,
                 past: int | None = None) -> None:
        self.key_table, self.value_table, self.call, self.clip = (key_table, value_table,
                                                                  call, clip)
        self.n = key_table.shape[-2]
        self.past = (self.n - 1) // 2 if past is None else past  # P: rows r = -P .. K
        self.q = q
        self.x = table_logits(q, key_table) * q.dtype.type(call.scale)
        self.batch = self.x.shape[:-2]
        self.d_key = np.zeros(key_table.shape, dtype=key_table.dtype)
        self.d_value = None if value_table is None else np.zeros(value_table.shape,
                                                                 dtype=value_table.dtype)
        self.store: dict[str, np.ndarray] = {}
        self.masks: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.ones = np.ones(call.t_k, dtype=q.dtype)

    def select(self, group: tuple[int, ...]) -> None:
        self.x_g, self.q_g = at(self.x, group, 2), at(self.q, group, 2)
        self.key_g, self.d_key_g = at(self.key_table, group, 2), at(self.d_key, group, 2)
        self.value_g, self.d_value_g = (at(self.value_table, group, 2),
                                        at(self.d_value, group, 2))

    def _geometry(self, block: Block) -> tuple[int, int, int, np.ndarray, np.ndarray]:
        # (start, lo, hi, before, after): the tile's first key, the keys lo .. hi - 1 it
        # covers, and its triangles as 0 / 1 masks (the clipped rows 0 and P + K)
        rows = block.b - block.a
        start = block.a + self.call.q_offset - self.past
        end = start + rows + self.n - 1
        lo, hi = min(max(start, 0), block.width), min(max(end, 0), block.width)
        masks = self.masks.get(rows)
        if masks is None:
            columns, at_row = np.arange(rows + self.n - 1)[None, :], np.arange(rows)[:, None]
            masks = self.masks[rows] = ((columns < at_row).astype(self.x.dtype),
                                        (columns > at_row + self.n - 1).astype(self.x.dtype))
        return start, lo, hi, *masks

    def _add(self, block: Block, target: np.ndarray, x: np.ndarray) -> None:
        # target (B, W) += the table's term, read from x (B, P + K + 1)
        start, lo, hi, before, after = self._geometry(block)
        width = target.shape[-1]
        if self.clip:  # shift every row by its entry on the wider rectangle
            right = lo <= width - hi
            x = x - (x[:, -1:] if right else x[:, :1])
            if right and lo:
                target[:, :lo] += x[:, :1]
            elif not right and hi < width:
                target[:, hi:] += x[:, -1:]
        if hi > lo:
            tile = _scratch(self.store, before.shape, target.dtype)
            if not self.clip:
                tile.fill(0)
            elif right:  # the right triangle reads the last row, 0 after the shift
                np.multiply(before, x[:, :1], out=tile)
            else:
                np.multiply(after, x[:, -1:], out=tile)
            band_view(tile, self.n)[...] = x
            target[:, lo:hi] += tile[:, lo - start : hi - start]

    def _bins(self, block: Block, grid: np.ndarray) -> np.ndarray:
        # (B, P + K + 1): the entries of `grid` (B, W) summed by table row
        start, lo, hi, before, after = self._geometry(block)
        width = grid.shape[-1]
        out = np.zeros((grid.shape[0], self.n), dtype=grid.dtype)
        if hi > lo:
            if lo == start and hi == start + before.shape[-1]:
                tile = grid[:, lo:hi]  # the whole tile among the keys: a view
            else:
                tile = _scratch(self.store, before.shape, grid.dtype)
                tile[:, : lo - start] = 0
                tile[:, lo - start : hi - start] = grid[:, lo:hi]
                tile[:, hi - start :] = 0
            out[...] = band_view(tile, self.n)
            if self.clip:
                out[:, 0] += row_dot(tile, before)
                out[:, -1] += row_dot(tile, after)
        if self.clip:
            if lo:
                out[:, 0] += grid[:, :lo] @ self.ones[:lo]
            if hi < width:
                out[:, -1] += grid[:, hi:] @ self.ones[: width - hi]
        return out

    def position(self, block: Block, scores: np.ndarray) -> None:
        self._add(block, scores, self.x_g[block.a : block.b])

    def d_weights(self, block: Block, weights: np.ndarray, g: np.ndarray) -> None:
        if self.value_table is None:
            return
        self._add(block, g, block.d_output @ self.value_g.T)
        self.d_value_g += self._bins(block, weights).T @ block.d_output

    def d_logits(self, block: Block, d_logits: np.ndarray) -> None:
        dx = self._bins(block, d_logits)
        block.dq[...] += dx @ self.key_g
        self.d_key_g += dx.T @ block.q




def _values_widened_by_v(q, k, v, d_output, mask) -> bool:
    # Whether v's leading axes widen the output beyond those of the weights (q, k, the
    # mask) and d_output. The specification's value-table gradient
    # (`binned_values_vjp`) then sums over the weights' and d_output's batch alone,
    # which counts the broadcast copies of the value term once; the kernel, which
    # counts each, hands such calls to the specification so that both agree.
    weights = np.broadcast_shapes(q.shape[:-2], k.shape[:-2],
                                  mask.shape[:-2] if mask is not None and mask.ndim > 2 else ())
    without_v = np.broadcast_shapes(weights, d_output.shape[:-2])
    return np.broadcast_shapes(without_v, v.shape[:-2]) != without_v


@_register("shaw")
def shaw_attention_vjp(
    q, k, v, key_table, value_table=None, /, *, d_output, scale=None, mask=None, causal=None,
    q_offset=None, beyond="clip", max_past=None,
):
    """Declines a value table when ``v``'s leading axes widen the output (see
    `_values_widened_by_v`)."""
    if not _ndarrays(q, k, v, key_table, value_table, d_output, mask):
        return NotImplemented
    call = shaw.shaw_call(
        q, k, v, key_table, value_table, scale=scale, mask=mask, causal=causal,
        q_offset=q_offset, beyond=beyond, method="efficient", max_past=max_past,
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    past, k_max = shaw.two_sided_extent("key_table", key_table.shape[-2], key_table.shape,
                                        max_past)
    if beyond == "error":  # as the specification's shaw_index, on the host
        check_distances_in_table(call.t_q, call.t_k, q_offset=call.q_offset, low=-past,
                                 high=k_max, what=extent_text(past, k_max, max_past))
    if not _covered("shaw", q, call, mask, k, v, d_output, key_table=key_table,
                    value_table=value_table):
        return NotImplemented
    if value_table is not None and _values_widened_by_v(q, k, v, d_output, mask):
        return NotImplemented
    term = _ClippedTable(q, key_table, value_table, call, clip=beyond != "zero", past=past)
    core = backward(q, k, v, d_output, call, mask=mask, term=term)
    grads = _grads(q, k, v, core, key_table=term.d_key * call.scale)
    if value_table is not None:
        grads["value_table"] = term.d_value
    return grads


@_register("general")
def general_attention_vjp(
    q, k, v, table, /, *, d_output, scale=None, mask=None, causal=None, q_offset=None,
    order="past_to_future",
):
    if not _ndarrays(q, k, v, table, d_output, mask):
        return NotImplemented
    call = general.general_call(
        q, k, v, table, scale=scale, mask=mask, causal=causal, q_offset=q_offset, order=order,
        method="efficient",
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    if not _covered("general", q, call, mask, k, v, d_output, table=table):
        return NotImplemented
    t_max = (table.shape[-2] + 1) // 2
    ordered = table if order == "past_to_future" else table[..., ::-1, :]
    term = _DistanceRows(ordered, 1 - t_max, call)
    core = backward(q, k, v, d_output, call, mask=mask, term=term)
    d_rows = term.d_rows * call.scale
    return _grads(q, k, v, core,
                  table=d_rows if order == "past_to_future" else d_rows[..., ::-1, :].copy())


@_register("music")
def music_attention_vjp(
    q, k, v, table, value_table=None, /, *, d_output, scale=None, mask=None, causal=None,
    q_offset=None, beyond="clip",
):
    """Declines a value table (the specification's binned values run instead)."""
    if not _ndarrays(q, k, v, table, value_table, d_output, mask):
        return NotImplemented
    call = music.music_call(
        q, k, v, table, value_table, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
        beyond=beyond, method="efficient",
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    if value_table is not None or not _covered("music", q, call, mask, k, v, d_output, table=table):
        return NotImplemented
    policy = "zero" if beyond == "zero" else "clip"  # "error" checked: every r has a row
    r_min, n = _distances(call)
    extended = one_sided_rows(table, r_min, r_min + n - 1, policy)
    term = _DistanceRows(extended, r_min, call)
    core = backward(q, k, v, d_output, call, mask=mask, term=term)
    return _grads(q, k, v, core,
                  table=_fold_one_sided(term.d_rows * call.scale, table, r_min, policy))


def _fold_one_sided(d_rows: np.ndarray, table: np.ndarray, r_min: int,
                    beyond: str) -> np.ndarray:
    # The transpose of `one_sided_rows`: distance r's row into table row r + M - 1 for
    # -(M - 1) <= r <= 0, every earlier distance into row 0 with "clip", none after 0.
    m = table.shape[-2]
    n = d_rows.shape[-2]
    out = np.zeros(table.shape, dtype=table.dtype)
    lo = max(-(m - 1), r_min)
    hi = min(0, r_min + n - 1)
    if hi >= lo:
        out[..., lo + m - 1 : hi + m, :] = d_rows[..., lo - r_min : hi - r_min + 1, :]
    if beyond == "clip" and r_min < -(m - 1):
        out[..., 0, :] += d_rows[..., : -(m - 1) - r_min, :].sum(axis=-2)
    return out


