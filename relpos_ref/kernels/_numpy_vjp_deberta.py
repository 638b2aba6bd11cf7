"""NumPy VJP kernel of DeBERTa: its buckets as sums by table row.

The c2p term's gradient is summed by table row from the skewed tile, the
p2c term's from the keys' side, through the block transposed (`_DebertaTables`),
with the sums planned once per geometry (`_RowSums`, `_deberta_row_sums`).
Registered in `relpos_ref.kernels._numpy_vjp_common.VJP_KERNELS`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from ..calls import Call
from ..gradients import check_d_output
from ..schemes import (
    deberta,
)
from ._numpy_blocks import distance_view
from ._numpy_vjp import Block, Term, at, backward, sum_to
from ._numpy_vjp_common import (
    _covered,
    _distances,
    _grads,
    _ndarrays,
    _register,
    _scratch,
)
from ._numpy_vjp_tiles import skew_view

__all__: list[str] = []

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
