"""NumPy VJP kernels: each scheme's backward pass, equal to the specification, in less time.

Every kernel takes the arguments of the scheme's ``*_attention_vjp``,
validates them with the scheme's own ``<scheme>_call`` and
`relpos_ref.gradients.check_d_output` (so bad input gets the specification's
message, word for word), and returns ``NotImplemented`` for what it does not
cover:

- arrays that are not plain ``numpy.ndarray``, dtypes other than float32 and
  float64 (16-bit calls are widened to float32 first, as the specification does);
- any non-finite value in ``q``, ``k``, ``v``, ``d_output`` or a table (the
  specification then keeps a masked pair from carrying a NaN into a
  gradient; with finite inputs a masked pair has weight 0 and carries nothing);
- a call whose logits could overflow (`relpos_ref.kernels._overflow`): the
  specification makes the overflowed rows NaN, and their gradients;
- a mask that broadcasts along the queries or the keys (shape ``(..., 1, t_k)``,
  ``(t_k,)``, ...): the specification's backward pass refuses those today
  (its ``masked_product`` needs the full ``(t_q, t_k)`` grid), and a call
  should get the same answer with and without kernels;
- the few cases named at each kernel.

Each runs `relpos_ref.kernels._numpy_vjp.backward` with the scheme's `Term`,
and returns fresh arrays of the arguments' shapes and dtype, keyed as the
specification keys them. Every scheme of the catalog has one: the terms add
what the forward kernels add (the same views and gathers, or a GEMM per
block) and take their transposes per row block: column sums and products of
the skewed tile for tables by distance, Shaw's clipped tables through the
band of each block and one constant per row beyond it (never a tile of the
block's width), DeBERTa's buckets as sums by table row (its p2c from the
keys' side, through the block transposed), Swin's window bias and the grid's
row and column tables through their 2-D offsets.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..calls import Call, check_terms, computes_in_float32, resolve_call
from ..gradients import check_d_output
from ..positions import check_distances_in_table, extent_text
from ..schemes import (
    absolute,
    alibi,
    bias,
    deberta,
    general,
    grid2d,
    music,
    rope,
    shaw,
    swin,
    t5,
    transformer_xl,
)
from ..schemes._tables import table_logits
from ._numpy_blocks import distance_view
from ._numpy_terms import grid_terms, one_sided_rows, window_bias
from ._numpy_vjp import (
    Block,
    Term,
    at,
    backward,
    band_view,
    finite,
    row_dot,
    skew_view,
    sum_to,
    tile_products,
    tile_rows,
)
from ._overflow import bounded

__all__ = ["VJP_KERNELS"]

#: Scheme name (as in `relpos_ref.catalog`) -> its NumPy VJP kernel.
VJP_KERNELS: dict[str, Callable[..., Any]] = {}

#: Distances per group of DeBERTa's p2c backward (`_DebertaTables`): a group's view of
#: the block reads ``G (B + G - 1)`` entries for the ``G B`` of its distances.
GROUP_ROWS = 64

#: Bytes of the diagonal-major copies of DeBERTa's blocks (`_DebertaTables`) kept before
#: they are summed: the copies of this many bytes' worth of heads are summed together.
DIAGONAL_BYTES = 16 * 2**20

#: DeBERTa's table rows read by this many distances of a block or more (the clipped
#: buckets at either end) are one sum each (`_RowSums`) rather than gathered.
END_RUN = 16

#: Stretches of at least this many single distances on consecutive table rows (DeBERTa's
#: exact distances) are added as one slice (`_RowSums`).
SINGLE_ROWS = 4

#: Distances per product of DeBERTa's other runs (`_RowSums`, its logarithmic buckets):
#: a 0/1 matrix of (runs, distances) times that many rows.
RUN_ROWS = 64

#: Query rows per block at most with Shaw's clipped tables (`_ClippedTable`): the band
#: tile of a block, ``B + P + K`` keys wide, is the part of its work that grows with
#: ``B^2`` (at t = 1024, K = 16: 256 rows as fast as 512, 7 % faster than 128).
CLIPPED_ROWS = 256


def _register(scheme: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def add(kernel: Callable[..., Any]) -> Callable[..., Any]:
        VJP_KERNELS[scheme] = computes_in_float32(kernel)
        return kernel

    return add


def _ndarrays(*arrays: Any) -> bool:
    return all(a is None or type(a) is np.ndarray for a in arrays)


def _covered(scheme: str, q: np.ndarray, call: Call, mask: Any, k: np.ndarray, v: np.ndarray,
             d_output: np.ndarray, **tables: Any) -> bool:
    # float32 / float64, a mask of the whole grid, finite everywhere (the products need no
    # guards), and logits that cannot overflow (the specification makes an overflow NaN)
    if mask is not None and (mask.ndim < 2 or mask.shape[-2:] != (call.t_q, call.t_k)):
        return False
    return (q.dtype in (np.float32, np.float64) and finite(q, k, v, d_output, *tables.values())
            and bounded(scheme, call, q, k, **tables))


def _grads(q, k, v, core, **more: Any) -> dict[str, Any]:
    return {"q": sum_to(core.dq, q.shape), "k": sum_to(core.dk, k.shape),
            "v": sum_to(core.dv, v.shape), **more}


def _distances(call: Call) -> tuple[int, int]:
    # (r_min, n): the grid's distances r_min .. r_min + n - 1, in order (none if empty)
    n = call.t_q + call.t_k - 1 if call.t_q and call.t_k else 0
    return -(call.t_q - 1) - call.q_offset, n


def _by_distance_row(term_of_grid: Callable[[int, int, int], Any], call: Call) -> np.ndarray:
    # A distance-only term evaluated once per distance of the grid: (..., n). An empty
    # grid has no distance (its term is evaluated for the checks alone).
    r_min, n = _distances(call)
    if call.t_q == 0 or call.t_k == 0:
        full = np.asarray(term_of_grid(call.t_q, call.t_k, call.q_offset))
        return np.zeros((*full.shape[:-2], 0), dtype=full.dtype)
    return np.asarray(term_of_grid(1, n, -r_min))[..., 0, :]


def _scratch(store: dict[str, np.ndarray], shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    # A buffer reused from block to block (allocating one per block faults its pages in).
    size = int(np.prod(shape))
    buffer = store.get("buffer")
    if buffer is None or buffer.size < size or buffer.dtype != dtype:
        buffer = store["buffer"] = np.empty(size, dtype=dtype)
    return buffer[:size].reshape(shape)


# -- terms ----------------------------------------------------------------------------


class _FullTerms(Term):
    """Plain attention's ``position`` / ``bias`` arrays, broadcastable to the scores."""

    def __init__(self, position: Any, bias_term: Any, scale: float) -> None:
        self.terms = {"position": position, "bias": bias_term}
        self.scale = scale
        self.as2d = {name: None if t is None else t.reshape((1,) * (2 - t.ndim) + t.shape)
                     for name, t in self.terms.items()}
        self.batch = np.broadcast_shapes(*(t.shape[:-2] for t in self.as2d.values()
                                           if t is not None))
        self.sums = {name: None if t is None else np.zeros(t.shape, dtype=t.dtype)
                     for name, t in self.as2d.items()}
        self.now: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def select(self, group: tuple[int, ...]) -> None:
        self.now = {name: (at(t, group, 2), at(self.sums[name], group, 2))
                    for name, t in self.as2d.items() if t is not None}

    @staticmethod
    def _rows(t: np.ndarray, block: Block) -> tuple[slice, slice]:
        rows = slice(None) if t.shape[-2] == 1 else slice(block.a, block.b)
        cols = slice(None) if t.shape[-1] == 1 else slice(0, block.width)
        return rows, cols

    def position(self, block: Block, scores: np.ndarray) -> None:
        if "position" in self.now:
            t = self.now["position"][0]
            scores += self.scale * t[self._rows(t, block)]

    def bias(self, block: Block, scores: np.ndarray) -> None:
        if "bias" in self.now:
            t = self.now["bias"][0]
            scores += t[self._rows(t, block)]

    def d_logits(self, block: Block, d_logits: np.ndarray) -> None:
        for t, sums in self.now.values():
            part = d_logits
            if t.shape[-1] == 1:
                part = part.sum(axis=-1, keepdims=True)
            if t.shape[-2] == 1:
                part = part.sum(axis=-2, keepdims=True)
            sums[self._rows(t, block)] += part

    def gradients(self, scale: float) -> dict[str, Any]:
        out = {}
        for name in ("bias", "position"):  # the specification's order
            t = self.terms[name]
            if t is not None:
                total = self.sums[name].reshape(t.shape)
                out[name] = total * scale if name == "position" else total
        return out


class _DistanceBias(Term):
    """A scalar per distance (``(..., n)`` for the grid's distances), outside the scale.

    The block's rows read it as a Toeplitz view; its gradient is the column sums of
    the skewed tile (one matrix-vector product).
    """

    skewed = True

    def __init__(self, row: np.ndarray) -> None:
        self.row = np.ascontiguousarray(row)
        self.batch = row.shape[:-1]
        self.sums = np.zeros(row.shape, dtype=row.dtype)
        self.ones = np.ones(0)

    def start(self, batch: tuple[int, ...], dtype: Any) -> None:
        self.ones = np.ones(0, dtype=dtype)

    def select(self, group: tuple[int, ...]) -> None:
        self.now = at(self.row, group, 1), at(self.sums, group, 1)

    def bias(self, block: Block, scores: np.ndarray) -> None:
        n, width = scores.shape
        row = self.now[0]
        scores += distance_view(row[block.first : block.first + width + n - 1], n, width)

    def d_logits(self, block: Block, d_logits: np.ndarray) -> None:
        tile = block.tile
        n, length = tile.shape
        if self.ones.size != n:
            self.ones = np.ones(n, dtype=tile.dtype)
        target = self.now[1][block.first : block.first + length]
        target += self.ones @ tile


def _onehot(index: np.ndarray, valid: np.ndarray, rows: int, dtype: Any) -> np.ndarray:
    # (n, rows): 1 where distance n reads table entry `rows` (the specification's map)
    return ((index[:, None] == np.arange(rows)[None, :]) & valid[:, None]).astype(dtype)


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


class _DistanceRows(Term):
    """A table of one row per distance, inside the scale: ``P_ij = q_i . rows[r_ij - low]``.

    In the tile, columns ``0 .. L - 1`` are the table's rows ``start .. start + L - 1``
    (the `window`): the term is ``q_B window^T`` (`tile_rows`), its transposes
    ``tile window`` (into dq) and ``tile^T q_B`` (into the rows, `tile_products`).

    With `query` (Transformer-XL's ``q + v``, of ``(..., t_q, d)``), the term reads
    it in place of ``q``, and its share of dq goes to `dq` (``(*batch, t_q, d)``)
    rather than into `Block.dq`.
    """

    skewed = True

    def __init__(self, rows: np.ndarray, low: int, call: Call,
                 query: np.ndarray | None = None) -> None:
        self.table, self.low, self.call, self.query = rows, low, call, query
        self.query_scaled = None if query is None else query * query.dtype.type(call.scale)
        self.d_rows = np.zeros(rows.shape, dtype=rows.dtype)
        self.dq: np.ndarray | None = None
        lead = () if query is None else query.shape[:-2]
        self.batch = np.broadcast_shapes(lead, rows.shape[:-2])

    def start(self, batch: tuple[int, ...], dtype: Any) -> None:
        if self.query is not None:
            self.dq = np.zeros((*batch, self.call.t_q, self.query.shape[-1]), dtype=dtype)

    def select(self, group: tuple[int, ...]) -> None:
        self.rows_g, self.d_rows_g = at(self.table, group, 2), at(self.d_rows, group, 2)
        if self.query is not None:
            self.query_g = at(self.query, group, 2)
            self.scaled_g = at(self.query_scaled, group, 2)
            self.dq_g = self.dq[group]

    def _start(self, block: Block) -> int:
        r_first = -(block.b - 1) - self.call.q_offset  # the distance of tile column 0
        return r_first - self.low

    def position(self, block: Block, scores: np.ndarray) -> None:
        q_block = (block.q_scaled if self.query is None
                   else self.scaled_g[block.a : block.b])
        tile_rows(block.scratch, q_block, self.rows_g, self._start(block))
        scores += skew_view(block.scratch, scores.shape[-1])

    def d_logits(self, block: Block, d_logits: np.ndarray) -> None:
        if self.query is None:
            query, dq = block.q, block.dq
        else:
            query, dq = self.query_g[block.a : block.b], self.dq_g[block.a : block.b]
        tile_products(block.tile, self.rows_g, self._start(block), query, dq, self.d_rows_g)


# -- plain attention and the schemes that change q and k -------------------------------


@_register("plain")
def attention_vjp(
    q, k, v, /, *, d_output, scale=None, mask=None, causal=None, q_offset=None, bias=None,
    position=None,
):
    if not _ndarrays(q, k, v, d_output, mask, bias, position):
        return NotImplemented
    call = resolve_call(q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset)
    check_terms(q, call, bias=bias, position=position)
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    if not _covered("plain", q, call, mask, k, v, d_output, bias=bias, position=position):
        return NotImplemented
    term = None if bias is None and position is None else _FullTerms(position, bias, call.scale)
    core = backward(q, k, v, d_output, call, mask=mask, term=term)
    return _grads(q, k, v, core, **({} if term is None else term.gradients(call.scale)))


@_register("absolute")
def absolute_attention_vjp(
    q, k, v, table, /, *, d_output, scale=None, mask=None, causal=None, q_offset=None,
):
    if not _ndarrays(q, k, v, table, d_output, mask):
        return NotImplemented
    call = absolute.absolute_call(
        q, k, v, table, scale=scale, mask=mask, causal=causal, q_offset=q_offset
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    if not _covered("absolute", q, call, mask, k, v, d_output, table=table):
        return NotImplemented
    rows = table[..., : call.t_k, :]
    core = backward(q, k + rows, v, d_output, call, mask=mask)  # q . (k_j + R_j)
    d_table = np.zeros(table.shape, dtype=table.dtype)
    d_table[..., : call.t_k, :] = sum_to(core.dk, rows.shape)
    return _grads(q, k, v, core, table=d_table)


@_register("rope")
def rope_attention_vjp(
    q, k, v, /, *, d_output, scale=None, mask=None, causal=None, q_offset=None, **rotation,
):
    # `rotation`: base, rotary_dim, layout, scaling, angles (checked by rope_call); the
    # rotated operands are bounded, whatever their attention factor
    if not _ndarrays(q, k, v, d_output, mask) or not set(rotation) <= set(rope.ROTATION):
        return NotImplemented  # an unknown keyword: the specification names it
    call = rope.rope_call(q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
                          **rotation)
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    q_rot, k_rot = rope.rope_pair(q, k, call, **rotation)
    if not _covered("plain", q_rot, call, mask, k_rot, v, d_output):
        return NotImplemented
    core = backward(q_rot, k_rot, v, d_output, call, mask=mask)
    dq, dk = rope.rope_pair(sum_to(core.dq, q.shape), sum_to(core.dk, k.shape), call,
                            inverse=True, **rotation)
    return {"q": dq, "k": dk, "v": sum_to(core.dv, v.shape)}


# -- scalar biases: a column constant of the skewed tile ------------------------------


def _scalar_table_vjp(q, k, v, d_output, call, mask, row, table, index, valid):
    term = _DistanceBias(row)
    core = backward(q, k, v, d_output, call, mask=mask, term=term)
    per_head = sum_to(term.sums, (*table.shape[:-1], term.sums.shape[-1]))
    onehot = _onehot(index, valid, table.shape[-1], table.dtype)
    return _grads(q, k, v, core, table=per_head @ onehot)


@_register("bias")
def bias_attention_vjp(
    q, k, v, table, /, *, d_output, scale=None, mask=None, causal=None, q_offset=None,
    beyond="clip", max_past=None,
):
    if not _ndarrays(q, k, v, table, d_output, mask):
        return NotImplemented
    call = bias.bias_call(
        q, k, v, table, scale=scale, mask=mask, causal=causal, q_offset=q_offset, beyond=beyond,
        max_past=max_past,
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    if not _covered("bias", q, call, mask, k, v, d_output, table=table):
        return NotImplemented
    row = _by_distance_row(
        lambda t_q, t_k, off: bias.bias_logits(table, t_q, t_k, q_offset=off, beyond=beyond,
                                               max_past=max_past),
        call,
    )  # beyond="error" raises here, as the specification's bias_logits does
    past, k_max = shaw.two_sided_extent("table", table.shape[-1], table.shape, max_past,
                                        unit="entries")
    r_min, n = _distances(call)
    r = np.arange(r_min, r_min + n)
    index = np.clip(r, -past, k_max) + past
    valid = ((r >= -past) & (r <= k_max)) | (beyond != "zero")
    return _scalar_table_vjp(q, k, v, d_output, call, mask, row, table, index, valid)


@_register("t5")
def t5_attention_vjp(
    q, k, v, table, /, *, d_output, scale=None, mask=None, causal=None, q_offset=None,
    bidirectional=True, max_distance=128,
):
    if not _ndarrays(q, k, v, table, d_output, mask):
        return NotImplemented
    call = t5.t5_call(
        q, k, v, table, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
        bidirectional=bidirectional, max_distance=max_distance,
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    if not _covered("t5", q, call, mask, k, v, d_output, table=table):
        return NotImplemented
    row = _by_distance_row(
        lambda t_q, t_k, off: t5.t5_bias(
            table, t_q, t_k, q_offset=off, bidirectional=bidirectional, max_distance=max_distance
        ),
        call,
    )
    r_min, n = _distances(call)
    bucket = np.asarray(t5.t5_bucket(np.arange(r_min, r_min + n), num_buckets=table.shape[-1],
                                     max_distance=max_distance, bidirectional=bidirectional))
    every = np.ones(n, dtype=bool)
    return _scalar_table_vjp(q, k, v, d_output, call, mask, row, table, bucket, every)


@_register("alibi")
def alibi_attention_vjp(
    q, k, v, /, *, d_output, slopes=None, slope_rule="paper", symmetric=True, scale=None,
    mask=None, causal=None, q_offset=None,
):
    if not _ndarrays(q, k, v, slopes, d_output, mask):
        return NotImplemented
    call, used = alibi.alibi_call(
        q, k, v, slopes=slopes, symmetric=symmetric, scale=scale, mask=mask, causal=causal,
        q_offset=q_offset, slope_rule=slope_rule,
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    if not _covered("alibi", q, call, mask, k, v, d_output, slopes=used):
        return NotImplemented
    shift = alibi.alibi_shift(call.q_offset, symmetric)  # the specification's constant
    row = _by_distance_row(
        lambda t_q, t_k, off: alibi.alibi_bias(used, t_q, t_k, q_offset=off,
                                               symmetric=symmetric, shift=shift),
        call,
    )
    term = _DistanceBias(row)
    core = backward(q, k, v, d_output, call, mask=mask, term=term)
    r_min, n = _distances(call)
    r = np.arange(r_min, r_min + n)
    distance = (-np.abs(r) if symmetric else r) + shift  # integers, exact
    exact = np.abs(distance).max(initial=0) <= 2 ** (np.finfo(used.dtype).nmant + 1)
    wide = used.dtype if exact else np.float64  # as the specification forms them
    slopes = (term.sums.astype(wide) @ distance.astype(wide)).astype(used.dtype)
    return _grads(q, k, v, core, slopes=slopes)


# -- relative tables -------------------------------------------------------------------


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


# -- 2D schemes: Swin's window bias and the grid's row and column tables ---------------


class _WindowBias(Term):
    """Swin's bias: entry ``(dy + Wh - 1, dx + Ww - 1)`` of a ``(2Wh - 1, 2Ww - 1)`` grid.

    The scores get it through `window_bias` (a strided view per query). Its
    transpose, for the queries of one grid row ``y``: key row ``ky`` of query
    ``x`` lands on grid row ``Wh - 1 - y + ky``, columns ``Ww - 1 - x ..``, a
    skewed ``(Ww, Wh, 2Ww - 1)`` tile (``x`` shifts the columns) whose sum over
    ``x`` is ``Wh`` rows of the grid's gradient: one copy and one sum per grid row.
    """

    def __init__(self, table: np.ndarray, wh: int, ww: int) -> None:
        self.table, self.wh, self.ww = table, wh, ww
        self.batch = table.shape[:-1]
        self.d_grid = np.zeros((*table.shape[:-1], 2 * wh - 1, 2 * ww - 1), dtype=table.dtype)
        self.tile: np.ndarray | None = None
        self.adds: dict[tuple[int, ...], Any] = {}

    def select(self, group: tuple[int, ...]) -> None:
        self.add = self.adds.get(group)
        if self.add is None:
            self.add = self.adds[group] = window_bias(at(self.table, group, 1), self.wh,
                                                      self.ww)
        self.d_grid_g = at(self.d_grid, group, 2)

    def bias(self, block: Block, scores: np.ndarray) -> None:
        self.add(scores, block.a)

    def d_logits(self, block: Block, d_logits: np.ndarray) -> None:
        wh, ww = self.wh, self.ww
        if self.tile is None:  # zero outside the skewed band, written nowhere else
            self.tile = np.zeros((ww, wh, 2 * ww - 1), dtype=d_logits.dtype)
        tile = self.tile
        step_x, step_y, step_c = tile.strides
        band = np.lib.stride_tricks.as_strided(  # band[x, ky, kx] = tile[.., ww - 1 - x + kx]
            tile[..., ww - 1 :], shape=(ww, wh, ww), strides=(step_x - step_c, step_y, step_c))
        start, end = block.a, block.b
        while start < end:  # the block's queries, one grid row at a time
            y, x = divmod(start, ww)
            stop = min(end, (y + 1) * ww)
            rows = d_logits[start - block.a : stop - block.a]
            band[x : x + stop - start] = rows.reshape(stop - start, wh, ww)
            self.d_grid_g[wh - 1 - y : 2 * wh - 1 - y] += tile[x : x + stop - start].sum(axis=0)
            start = stop

    def gradient(self) -> np.ndarray:
        return self.d_grid.reshape(self.table.shape)


@_register("swin")
def swin_attention_vjp(
    q, k, v, table, /, *, d_output, window_height, window_width, scale=None, mask=None,
):
    if not _ndarrays(q, k, v, table, d_output, mask):
        return NotImplemented
    call = swin.swin_call(
        q, k, v, table, window_height=window_height, window_width=window_width, scale=scale,
        mask=mask,
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    if not _covered("swin", q, call, mask, k, v, d_output, table=table):
        return NotImplemented
    term = _WindowBias(table, int(window_height), int(window_width))
    core = backward(q, k, v, d_output, call, mask=mask, term=term)
    return _grads(q, k, v, core, table=term.gradient())


class _GridTables(Term):
    """2D relative attention's row and column tables, inside the scale.

    The scores get them through `grid_terms`. Query ``n`` at grid row ``x``
    reads row-table row ``x_m - x + h - 1`` for every key of grid row ``x_m``:
    its gradient is the block's :math:`\\bar{l}` summed over each key row
    (``(B, h)``), placed at columns ``h - 1 - x ..`` of a ``(B, 2h - 1)``
    array ``G`` (likewise the columns); then ``dq_B += G R`` and
    ``dR += G^T q_B``, two small GEMMs per table.
    """

    def __init__(self, q, row_table, col_table, height: int, width: int, call: Call) -> None:
        self.q, self.tables = q, (row_table, col_table)
        self.h, self.w, self.t_k, self.scale = height, width, call.t_k, call.scale
        self.batch = np.broadcast_shapes(row_table.shape[:-2], col_table.shape[:-2])
        self.grads = [np.zeros(t.shape, dtype=t.dtype) for t in self.tables]
        self.store: dict[str, np.ndarray] = {}
        self.adds: dict[tuple[int, ...], Any] = {}

    def select(self, group: tuple[int, ...]) -> None:
        self.now = [at(t, group, 2) for t in self.tables]
        self.grads_g = [at(g, group, 2) for g in self.grads]
        self.add = self.adds.get(group)
        if self.add is None:
            q_g = at(self.q, group, 2)
            self.add = self.adds[group] = grid_terms(q_g * q_g.dtype.type(self.scale),
                                                     *self.now, height=self.h, width=self.w)

    def position(self, block: Block, scores: np.ndarray) -> None:
        self.add(scores, block.a)

    def d_logits(self, block: Block, d_logits: np.ndarray) -> None:
        h, w = self.h, self.w
        full = d_logits
        if block.width != self.t_k:  # causal: the keys no row of the block sees are 0
            full = _scratch(self.store, (d_logits.shape[0], self.t_k), d_logits.dtype)
            full[:, : block.width] = d_logits
            full[:, block.width :] = 0
        grid = full.reshape(full.shape[0], h, w)
        token = np.arange(block.a, block.b)
        row_at = np.arange(block.b - block.a)[:, None]
        for i, (sums, size, coordinate) in enumerate((
                (grid.sum(axis=-1), h, token // w), (grid.sum(axis=-2), w, token % w))):
            g = np.zeros((sums.shape[0], 2 * size - 1), dtype=sums.dtype)
            g[row_at, (size - 1 - coordinate)[:, None] + np.arange(size)] = sums
            block.dq[...] += g @ self.now[i]
            self.grads_g[i] += g.T @ block.q


@_register("grid2d")
def grid2d_attention_vjp(
    q, k, v, row_table, col_table, /, *, d_output, height, width, scale=None, mask=None,
    causal=None,
):
    if not _ndarrays(q, k, v, row_table, col_table, d_output, mask):
        return NotImplemented
    call = grid2d.grid2d_call(
        q, k, v, row_table, col_table, height=height, width=width, scale=scale, mask=mask,
        causal=causal, method="efficient",
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    if not _covered("grid2d", q, call, mask, k, v, d_output, row_table=row_table,
                    col_table=col_table):
        return NotImplemented
    term = _GridTables(q, row_table, col_table, int(height), int(width), call)
    core = backward(q, k, v, d_output, call, mask=mask, term=term)
    return _grads(q, k, v, core, row_table=term.grads[0] * call.scale,
                  col_table=term.grads[1] * call.scale)


# -- Transformer-XL and DeBERTa ---------------------------------------------------------


@_register("transformer_xl")
def transformer_xl_attention_vjp(
    q, k, v, w_r, content_bias=None, position_bias=None, /, *, d_output, clamp_len=None,
    base=10000.0, scale=None, mask=None, causal=None, q_offset=None,
):
    """``(q + u) . k`` is the content term (u's and k's gradients from it), ``(q + v)``
    reads the projected sinusoids, one row per distance (`_DistanceRows`)."""
    if not _ndarrays(q, k, v, w_r, content_bias, position_bias, d_output, mask):
        return NotImplemented
    call = transformer_xl.transformer_xl_call(
        q, k, v, w_r, content_bias, position_bias, scale=scale, mask=mask, causal=causal,
        q_offset=q_offset, clamp_len=clamp_len, method="efficient",
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    if not _covered("transformer_xl", q, call, mask, k, v, d_output, w_r=w_r,
                    content_bias=content_bias, position_bias=position_bias):
        return NotImplemented
    arrays = {"q": q, "k": k, "v": v, "w_r": w_r, "content_bias": content_bias,
              "position_bias": position_bias}
    if call.t_q == 0 or call.t_k == 0:  # no pair: every gradient is zero
        return {name: np.zeros_like(a) for name, a in arrays.items() if a is not None}
    import array_api_compat.numpy as xp

    deltas = np.asarray(transformer_xl.grid_distances(
        call.t_q, call.t_k, q_offset=call.q_offset, clamp_len=clamp_len, xp=xp))
    rows = np.asarray(transformer_xl.transformer_xl_rows(deltas, w_r, base=base))
    per_head = transformer_xl._per_head_vector
    content_query = q if content_bias is None else q + per_head(content_bias)
    query = q if position_bias is None else q + per_head(position_bias)
    r_min, _ = _distances(call)
    term = _DistanceRows(rows, r_min, call, query=query)
    core = backward(content_query, k, v, d_output, call, mask=mask, term=term)
    dq_rows = np.zeros_like(core.dq) if term.dq is None else term.dq * call.scale
    embedding = np.asarray(transformer_xl.transformer_xl_embedding(
        deltas, w_r.shape[-2], dtype=w_r.dtype, base=base))
    d_rows = sum_to(term.d_rows * call.scale, (*w_r.shape[:-2], *rows.shape[-2:]))
    grads = {"q": sum_to(core.dq + dq_rows, q.shape), "k": sum_to(core.dk, k.shape),
             "v": sum_to(core.dv, v.shape), "w_r": np.matmul(embedding.T, d_rows)}
    for name, vector, per_row in (("content_bias", content_bias, core.dq),
                                  ("position_bias", position_bias, dq_rows)):
        if vector is not None:
            grads[name] = _vector_gradient(per_row, vector)
    return grads


def _vector_gradient(per_row: np.ndarray, vector: np.ndarray) -> np.ndarray:
    # a (d,) or per-head (h, d) vector added to every row of (..., t, d)
    if vector.ndim == 1:
        return sum_to(per_row, vector.shape)
    return sum_to(per_row, (vector.shape[0], 1, vector.shape[1])).reshape(vector.shape)


class _RowSums:
    """Rows of a distance-major array summed by table row, row ``u`` being distance ``w + u``.

    `row_of` (non-decreasing, one table row per distance index) makes each table
    row one run of distances. For ``x`` of shape ``(..., length, R)`` and `out`
    ``(..., rows, R)``, `add` does ``out[..., row_of[w + u], :] += x[..., u, :]``
    for every ``u``, in whole rows of ``R`` entries: runs of `END_RUN` distances or
    more (the clipped ends) as one sum each; stretches of `SINGLE_ROWS` or more
    single distances on consecutive table rows (the exact distances) as one slice;
    the other runs (DeBERTa's logarithmic buckets) about `RUN_ROWS` distances at a
    time (the runs that start in one band of that many), as the product of a 0/1
    matrix (a run per row) with those rows of ``x``.
    The plan for a window ``(w, length)`` is made once.

    With ``assign=True`` the sums replace rows ``lo .. hi - 1`` of `out` (`span`;
    rows no distance of the window reads get zeros): each row is one run, so
    every step writes rows no other step writes.
    """

    def __init__(self, row_of: np.ndarray) -> None:
        starts = np.flatnonzero(np.concatenate(([True], row_of[1:] != row_of[:-1])))
        self.row_of = row_of
        self.starts, self.ends = starts, np.append(starts[1:], row_of.size)
        self.plans: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}

    def _plan(self, w: int, length: int, dtype: Any, end_run: int, single_rows: int,
              run_rows: int) -> list[tuple[Any, ...]]:
        k0 = int(np.searchsorted(self.ends, w, side="right"))
        k1 = int(np.searchsorted(self.starts, w + length, side="left"))
        start = np.maximum(self.starts[k0:k1], w) - w
        size = np.minimum(self.ends[k0:k1], w + length) - w - start
        rows = self.row_of[w + start]
        # stretches of single distances on consecutive table rows
        single = (size == 1) & (size < end_run)
        follows = np.concatenate(([False], single[:-1] & (np.diff(rows) == 1))) & single
        stretch = np.cumsum(single & ~follows)
        counts = np.bincount(stretch[single], minlength=int(stretch[-1]) + 1)
        sliced = single & (counts[stretch] >= single_rows)
        steps: list[tuple[Any, ...]] = []
        for i in np.flatnonzero(sliced & ~follows):
            count = int(counts[stretch[i]])
            steps.append(("rows", int(start[i]), int(start[i]) + count, int(rows[i])))
        for i in np.flatnonzero(size >= end_run):
            steps.append(("sum", int(start[i]), int(start[i] + size[i]), int(rows[i])))
        # the other runs, consecutive ones together: a band per run_rows distances of a
        # stretch (by where each run starts), a 0/1 matrix of (runs, distances) each
        other = np.flatnonzero(~sliced & (size < end_run))
        if other.size:
            fresh = np.concatenate(([True], np.diff(other) != 1))  # a stretch begins
            stretch_of = np.cumsum(fresh) - 1
            band = (start[other] - start[other[fresh]][stretch_of]) // run_rows
            key = stretch_of * (length + 1) + band
            cuts = np.flatnonzero(np.concatenate(([True], np.diff(key) != 0)))
            for c0, c1 in zip(cuts, (*cuts[1:], other.size), strict=True):
                band_runs = other[c0:c1]
                u0 = int(start[band_runs[0]])
                u1 = int(start[band_runs[-1]] + size[band_runs[-1]])
                ones = np.zeros((c1 - c0, u1 - u0), dtype=dtype)
                ones[np.repeat(np.arange(c1 - c0), size[band_runs]), np.arange(u1 - u0)] = 1
                ones.flags.writeable = False  # kept across calls (`_deberta_row_sums`)
                steps.append(("runs", u0, u1, ones, rows[band_runs]))
        if rows.size and rows[-1] - rows[0] + 1 > rows.size:  # rows no run reaches
            steps.append(("gaps", np.setdiff1d(np.arange(rows[0], rows[-1] + 1), rows)))
        return steps

    def span(self, w: int, length: int) -> tuple[int, int]:
        """The table rows that distances ``w .. w + length - 1`` read: ``lo .. hi - 1``."""
        return int(self.row_of[w]), int(self.row_of[w + length - 1]) + 1

    def add(self, x: np.ndarray, w: int, out: np.ndarray, *, assign: bool = False) -> None:
        """``out[..., m, :] +=`` the rows of `x` (``(..., length, R)``) of table row ``m``.

        With `assign`, ``=`` instead of ``+=`` for rows ``lo .. hi - 1`` (`span`).
        """
        # the constants too: a plan made under other ones (the tests patch them) is not
        # this one
        key = (w, x.shape[-2], x.dtype, END_RUN, SINGLE_ROWS, RUN_ROWS)
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = self._plan(*key)
        for step in plan:
            if step[0] == "gaps":
                if assign:
                    out[..., step[1], :] = 0
                continue
            if step[0] == "rows":
                _, u0, u1, m = step
                if assign:
                    out[..., m : m + u1 - u0, :] = x[..., u0:u1, :]
                else:
                    out[..., m : m + u1 - u0, :] += x[..., u0:u1, :]
                continue
            if step[0] == "sum":
                _, u0, u1, m = step
                rows: Any = m
                # assigned: the sum straight into `out`
                target = out[..., m, :] if assign else None
                sums = x[..., u0:u1, :].sum(axis=-2, out=target)
            else:
                _, u0, u1, ones, rows = step
                target = None
                if rows[-1] - rows[0] == rows.size - 1:  # consecutive table rows
                    rows = slice(int(rows[0]), int(rows[-1]) + 1)
                    target = out[..., rows, :] if assign else None
                sums = np.matmul(ones, x[..., u0:u1, :], out=target)
            if not assign:
                out[..., rows, :] += sums
            elif target is None:
                out[..., rows, :] = sums


@functools.lru_cache(maxsize=16)
def _deberta_row_sums(span: int, max_position: int | None, r_min: int, n: int) -> _RowSums:
    # DeBERTa's table row per distance r_min .. r_min + n - 1, with its sums' plans: made
    # once per geometry and kept across calls (a plan per window cost 2 to 4 ms a call at
    # t = 1024, 2 % of the backward pass). Read-only; a plan added twice by two threads at
    # once is the same plan.
    import array_api_compat.numpy as xp

    row_of = np.asarray(deberta.deberta_rows(xp.asarray(np.arange(r_min, r_min + n)),
                                             span=span, max_position=max_position))
    row_of.flags.writeable = False
    return _RowSums(row_of)


class _DebertaTables(Term):
    """DeBERTa's c2p and p2c, inside the scale: ``q_i . K[row(r)]`` and ``k_j . Q[row(r)]``.

    The scores get both as the forward kernel's gathers from ``s q K^T`` and
    ``s Q k^T``, their indices shared by the heads of a block. The gradients are
    the sums of :math:`\\bar{l}` by table row, per query for c2p (``G``, per
    block: ``dq_B += G K``, ``dK += G^T q_B``) and per key for p2c (``Z``, over
    every block: ``dk = s Z Q`` and ``dQ = s Z^T k`` at the end). Both come
    from one copy of each block, *diagonal-major*: the core writes
    :math:`\\bar{l}` skewed into the term's tile (`logits_view`: its columns are
    distances), which is copied transposed, so that row ``c`` holds distance
    ``first + c`` for every query of the block (the diagonals of
    :math:`\\bar{l}`). Summing whole rows by table row (`_RowSums`) gives c2p's
    sums for every query at once; p2c reads the same copy key by key: over a
    group of `GROUP_ROWS` rows, a view whose row ``c`` starts ``c`` entries
    earlier (every row padded with at least ``GROUP_ROWS`` zeros) has one key per
    column, and its rows summed by table row are p2c's sums for those keys.
    The copies of up to `DIAGONAL_BYTES` worth of a block's heads are summed
    together. The transposed copy is the one pass p2c cannot do without (the
    tile's width is odd for it); with the sums along whole rows, every
    other pass reads contiguous rows, and the logarithmic buckets' short runs
    are small GEMMs with 0/1 matrices.
    """

    def __init__(self, q, k, key_table, query_table, call: Call, max_position) -> None:
        self.q, self.k, self.call = q, k, call
        self.tables = {name: t for name, t in (("key_table", key_table),
                                               ("query_table", query_table)) if t is not None}
        span = next(iter(self.tables.values())).shape[-2] // 2
        self.n_rows = 2 * span
        self.sums = _deberta_row_sums(
            span, None if max_position is None else int(max_position), *_distances(call))
        self.row_of = self.sums.row_of
        self.batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2],
                                         *(t.shape[:-2] for t in self.tables.values()))
        scale = q.dtype.type(call.scale)
        if key_table is not None:  # (..., t_q * 2S), as the forward kernel's
            by_query = np.matmul(q * scale, np.swapaxes(key_table, -1, -2))
            self.by_query = by_query.reshape(*by_query.shape[:-2], call.t_q * self.n_rows)
        if query_table is not None:  # (..., 2S * t_k)
            by_key = np.matmul(query_table, np.swapaxes(k * scale, -1, -2))
            self.by_key = by_key.reshape(*by_key.shape[:-2], self.n_rows * call.t_k)
            self.row_starts = self.row_of * call.t_k
        self.buffers: dict[str, dict[str, np.ndarray]] = {}
        self.block: tuple[int, int, int] | None = None
        self.geometry: tuple[int, int] | None = None
        self.layout: int | None = None

    def _buffer(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        # a buffer of its own per name, reused from block to block
        return _scratch(self.buffers.setdefault(name, {}), shape, self.dtype)

    def start(self, batch: tuple[int, ...], dtype: Any) -> None:
        self.dtype, self.batch_shape = dtype, batch
        self.groups = {group: i for i, group in enumerate(np.ndindex(*batch))}
        if "key_table" in self.tables:
            self.d_key = np.zeros(self.tables["key_table"].shape, dtype=dtype)
        if "query_table" in self.tables:  # per batch entry, table row and key: p2c's sums
            self.by_key_row = np.zeros((len(self.groups), self.n_rows, self.call.t_k),
                                       dtype=dtype)
        self.pending: list[tuple[tuple[int, ...], np.ndarray, np.ndarray]] = []

    def select(self, group: tuple[int, ...]) -> None:
        self.group = group

    def _block(self, block: Block) -> None:
        # what the heads of one block share: the gathers' indices, and buffers (zeroed
        # when their shapes move)
        n, width = block.b - block.a, block.width
        if (block.a, block.b, width) == self.block:
            return
        self.block = (block.a, block.b, width)
        self.first = block.first
        length = width + n - 1
        if "key_table" in self.tables:
            window = self.row_of[block.first : block.first + length]
            self.c2p_index = (distance_view(window, n, width)
                              + (np.arange(block.a, block.b) * self.n_rows)[:, None])
        if "query_table" in self.tables:
            window = self.row_starts[block.first : block.first + length]
            self.p2c_index = distance_view(window, n, width) + np.arange(width)
        if (n, width) == self.geometry:
            return
        self.geometry = (n, width)
        self.values = self._buffer("values", (n, width))
        # the block skewed (column c: distance index first + c), one zero column more
        # where the width would be even: NumPy's transposed copy reads the tile a column
        # at a time, and rows 2^k bytes apart share cache sets (an even width, 1280
        # columns, ran 1.6 to 1.8 times slower than 1279 or 1281)
        rows = length + 1 - length % 2
        self.tile = self._buffer("tile", (n, rows))
        self.tile.fill(0)
        if n == self.layout:
            return
        # per head (G = GROUP_ROWS): rows of n entries and at least G zeros each (p2c's
        # views read a row's zeros where they run past its entries; with G - 1 of them a
        # view's rows, G - 1 + n entries each, would overlap, and NumPy's matmul then
        # leaves BLAS for its own loop, 1.4 times slower), an odd number of entries in
        # all (the transposed copies write rows 2^k bytes apart otherwise), as many
        # rows as the widest block's tile has columns; laid out once per block height
        # (a causal call's blocks widen, its copies' rows stay put)
        self.layout, self.group_rows, slot = n, GROUP_ROWS, self.call.t_k + n + 1
        self.line = n + self.group_rows + 1 - (n + self.group_rows) % 2
        self.head_size = slot * self.line
        heads = min(len(self.groups),
                    max(1, DIAGONAL_BYTES // (self.head_size * self.dtype.itemsize)))
        self.capacity = heads
        self.diagonals = self._zero_padded(heads, slot, n)
        if "key_table" in self.tables:  # c2p's sums, by head, table row and query
            self.by_query_row = self._buffer("by query row", (heads, self.n_rows, n))

    def _zero_padded(self, heads: int, rows: int, n: int) -> np.ndarray:
        # the copies' buffer with zeros wherever no copy writes (a new one all zeros, its
        # pages untouched until the copies write them; a reused one zeroed there alone)
        store, size = self.buffers.setdefault("diagonals", {}), heads * self.head_size
        buffer = store.get("buffer")
        if buffer is None or buffer.size < size:
            buffer = store["buffer"] = np.zeros(size, dtype=self.dtype)
            return buffer
        buffer, step = buffer[:size], buffer.itemsize
        np.lib.stride_tricks.as_strided(
            buffer[n:], (heads, rows, self.line - n),
            (self.head_size * step, self.line * step, step)).fill(0)
        return buffer

    def _diagonal_view(self, head: int, row: int, shape: tuple[int, int], shift: int,
                       heads: int = 1) -> Any:
        # rows `row ..` of the diagonal-major copies of heads `head .. head + heads - 1`,
        # each row starting `shift` entries further than a plain row (-1: p2c's view)
        step = self.diagonals.itemsize
        return np.lib.stride_tricks.as_strided(
            self.diagonals[head * self.head_size + row * self.line :], shape=(heads, *shape),
            strides=(self.head_size * step, (self.line + shift) * step, step))

    def position(self, block: Block, scores: np.ndarray) -> None:
        self._block(block)
        for name, table, index in (("key_table", "by_query", "c2p_index"),
                                   ("query_table", "by_key", "p2c_index")):
            if name in self.tables:
                np.take(at(getattr(self, table), self.group, 1), getattr(self, index),
                        out=self.values, mode="clip")
                scores += self.values

    def logits_view(self, block: Block) -> np.ndarray:
        # the core writes the block's gradient straight into the skewed tile
        n, width = block.b - block.a, block.width
        return skew_view(self.tile[:, : width + n - 1], width)

    def d_logits(self, block: Block, d_logits: np.ndarray) -> None:
        n = d_logits.shape[0]  # already in the tile (`logits_view`)
        copy = self._diagonal_view(len(self.pending), 0, (self.tile.shape[1], n), 0)[0]
        np.copyto(copy, self.tile.T)
        self.pending.append((self.group, block.q, block.dq))
        if len(self.pending) == self.capacity:
            self._sum_pending()

    def finish(self, a: int, b: int, width: int) -> None:
        if self.pending:
            self._sum_pending()

    def _sum_pending(self) -> None:
        # the pending heads' copies summed by table row: c2p's by query (then two GEMMs
        # per head), p2c's by key into `by_key_row`
        (a, b, width), first = self.block, self.first
        n, length, heads = b - a, width + b - a - 1, len(self.pending)
        if "key_table" in self.tables:
            lo, hi = self.sums.span(first, length)
            sums = self.by_query_row[:heads]
            self.sums.add(self._diagonal_view(0, 0, (length, n), 0, heads), first, sums,
                          assign=True)
            table = self.tables["key_table"]
            for (group, q, dq), by_row in zip(self.pending, sums[:, lo:hi], strict=True):
                dq += by_row.T @ at(table, group, 2)[lo:hi]
                at(self.d_key, group, 2)[lo:hi] += by_row @ q
        if "query_table" in self.tables:
            index = self.groups[self.pending[0][0]]  # the heads are consecutive
            out = self.by_key_row[index : index + heads]
            for c0 in range(0, length, self.group_rows):
                g = min(self.group_rows, length - c0)
                # column y of rows c0 .. c0 + g - 1 is key c0 + y - (n - 1): keys 0 .. width - 1
                y0, y1 = max(0, n - 1 - c0), min(n + g - 1, length - c0)
                view = self._diagonal_view(0, c0, (g, y1), -1, heads)[..., y0:]
                self.sums.add(view, first + c0, out[..., c0 + y0 - n + 1 : c0 + y1 - n + 1])
        self.pending = []

    def gradients(self, scale: float) -> tuple[np.ndarray | None, dict[str, np.ndarray]]:
        """p2c's share of dk (over the scores' batch), and the tables' gradients."""
        grads, dk = {}, None
        if "key_table" in self.tables:
            grads["key_table"] = self.d_key * scale
        if "query_table" in self.tables:
            table = self.tables["query_table"]
            sums = self.by_key_row.reshape(*self.batch_shape, self.n_rows, self.call.t_k)
            dk = np.matmul(np.swapaxes(sums, -1, -2), table) * scale
            grads["query_table"] = sum_to(np.matmul(sums, self.k), table.shape) * scale
        return dk, grads


@_register("deberta")
def deberta_attention_vjp(
    q, k, v, key_table=None, query_table=None, /, *, d_output, max_position=None, scale=None,
    mask=None, causal=None, q_offset=None,
):
    if not _ndarrays(q, k, v, key_table, query_table, d_output, mask):
        return NotImplemented
    call = deberta.deberta_call(
        q, k, v, key_table, query_table, max_position=max_position, scale=scale, mask=mask,
        causal=causal, q_offset=q_offset, method="efficient",
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    if not _covered("deberta", q, call, mask, k, v, d_output, key_table=key_table,
                    query_table=query_table):
        return NotImplemented
    tables = {name: t for name, t in (("key_table", key_table), ("query_table", query_table))
              if t is not None}
    term = (_DebertaTables(q, k, key_table, query_table, call, max_position)
            if tables and call.t_q and call.t_k else None)
    core = backward(q, k, v, d_output, call, mask=mask, term=term)
    if term is None or math.prod(core.batch) == 0:  # no block ran: no term's gradient
        return _grads(q, k, v, core, **{name: np.zeros_like(t) for name, t in tables.items()})
    dk, grads = term.gradients(call.scale)
    return {"q": sum_to(core.dq, q.shape),
            "k": sum_to(core.dk if dk is None else core.dk + dk, k.shape),
            "v": sum_to(core.dv, v.shape), **grads}
