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
the skewed tile for tables by distance (DeBERTa's p2c from the keys' side, a
chunk of keys at a time), Swin's window bias and the grid's row and column
tables through their 2-D offsets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..calls import Call, check_terms, computes_in_float32, resolve_call
from ..gradients import check_d_output
from ..positions import check_distances_in_table
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
from ._numpy_terms import deberta_terms, grid_terms, one_sided_rows, window_bias
from ._numpy_vjp import Block, Term, backward, column_ranges, finite, skew_view, sum_to

__all__ = ["VJP_KERNELS"]

#: Scheme name (as in `relpos_ref.catalog`) -> its NumPy VJP kernel.
VJP_KERNELS: dict[str, Callable[..., Any]] = {}

#: Keys per chunk of DeBERTa's p2c backward (`_DebertaTables`): 32 to 256 ran alike at
#: t = 1024 (a chunk's skewed tile has ``C (B + C - 1)`` entries).
KEY_CHUNK = 64

#: DeBERTa's distances at either end of a tile that share one table row (the clipped
#: buckets) go through a row sum instead of the GEMMs when there are this many.
END_RUN = 16


def _register(scheme: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def add(kernel: Callable[..., Any]) -> Callable[..., Any]:
        VJP_KERNELS[scheme] = computes_in_float32(kernel)
        return kernel

    return add


def _ndarrays(*arrays: Any) -> bool:
    return all(a is None or type(a) is np.ndarray for a in arrays)


def _covered(q: np.ndarray, call: Call, mask: Any, *arrays: Any) -> bool:
    # float32 / float64, a mask of the whole grid, and finite everywhere: the products
    # need no guards
    if mask is not None and (mask.ndim < 2 or mask.shape[-2:] != (call.t_q, call.t_k)):
        return False
    return q.dtype in (np.float32, np.float64) and finite(q, *arrays)


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

    def __init__(self, position: Any, bias_term: Any) -> None:
        self.terms = {"position": position, "bias": bias_term}
        self.as2d = {name: None if t is None else t.reshape((1,) * (2 - t.ndim) + t.shape)
                     for name, t in self.terms.items()}
        self.batch = np.broadcast_shapes(*(t.shape[:-2] for t in self.as2d.values()
                                           if t is not None))
        self.sums = {name: None if t is None else np.zeros(t.shape, dtype=t.dtype)
                     for name, t in self.as2d.items()}

    @staticmethod
    def _rows(t: np.ndarray, block: Block) -> tuple[slice, slice]:
        rows = slice(None) if t.shape[-2] == 1 else slice(block.a, block.b)
        cols = slice(None) if t.shape[-1] == 1 else slice(0, block.width)
        return rows, cols

    def _add(self, name: str, block: Block, scores: np.ndarray) -> None:
        t = self.as2d[name]
        if t is not None:
            rows, cols = self._rows(t, block)
            scores += t[..., rows, cols]

    def position(self, block: Block, scores: np.ndarray) -> None:
        self._add("position", block, scores)

    def bias(self, block: Block, scores: np.ndarray) -> None:
        self._add("bias", block, scores)

    def d_logits(self, block: Block, d_logits: np.ndarray) -> None:
        for name, t in self.as2d.items():
            if t is None:
                continue
            part = d_logits
            if t.shape[-1] == 1:
                part = part.sum(axis=-1, keepdims=True)
            if t.shape[-2] == 1:
                part = part.sum(axis=-2, keepdims=True)
            rows, cols = self._rows(t, block)
            target = self.sums[name][..., rows, cols]
            target += sum_to(part, target.shape)

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
    the skewed tile.
    """

    skewed = True

    def __init__(self, row: np.ndarray) -> None:
        self.row = row
        self.batch = row.shape[:-1]
        self.sums = np.zeros(row.shape, dtype=row.dtype)

    def bias(self, block: Block, scores: np.ndarray) -> None:
        n, width = scores.shape[-2:]
        scores += distance_view(self.row[..., block.first : block.first + width + n - 1],
                                n, width)

    def d_logits(self, block: Block, d_logits: np.ndarray) -> None:
        length = block.tile.shape[-1]
        target = self.sums[..., block.first : block.first + length]
        target += sum_to(block.tile.sum(axis=-2), target.shape)


def _onehot(index: np.ndarray, valid: np.ndarray, rows: int, dtype: Any) -> np.ndarray:
    # (n, rows): 1 where distance n reads table entry `rows` (the specification's map)
    return ((index[:, None] == np.arange(rows)[None, :]) & valid[:, None]).astype(dtype)


class _ClippedTable(Term):
    """Shaw et al.'s two-sided tables of ``2K + 1`` rows, clipped (or zero) beyond ``K``.

    ``x = q a^K^T`` is ``(..., t_q, 2K + 1)``; in the tile, row ``m`` is read by
    column ``c_0 + m`` and, with ``clip``, every column before (after) by row 0
    (``2K``): three column ranges. The value table's share of ``g`` is the
    same layout of ``o a^V^T``; the bins of the weights are the same ranges
    summed.
    """

    skewed = True

    def __init__(self, q, key_table, value_table, call: Call, *, clip: bool,
                 past: int | None = None) -> None:
        self.key_table, self.value_table, self.call, self.clip = (key_table, value_table,
                                                                  call, clip)
        self.rows = key_table.shape[-2]
        self.past = (self.rows - 1) // 2 if past is None else past  # P: rows r = -P .. K
        self.x = table_logits(q, key_table)
        self.d_key = np.zeros(key_table.shape, dtype=key_table.dtype)
        self.d_value = None if value_table is None else np.zeros(value_table.shape,
                                                                 dtype=value_table.dtype)

    def _first(self, block: Block) -> int:
        # the column of r = -P: r(c) = c - (B - 1) - a - q_offset
        return block.b - block.a - 1 + block.a + self.call.q_offset - self.past

    def _add(self, block: Block, scores: np.ndarray, x: np.ndarray) -> None:
        # scores += the table's term read from `x` (..., B, 2K + 1), through the scratch
        first = self._first(block)
        tile = block.scratch
        length = tile.shape[-1]
        left, lo, hi, right = column_ranges(first, length, self.rows, clip=self.clip)
        if self.clip:
            tile[..., :left] = x[..., :1]
            tile[..., right:] = x[..., -1:]
        else:
            tile[..., :lo] = 0
            tile[..., hi:] = 0
        tile[..., lo:hi] = x[..., lo - first : hi - first]
        scores += skew_view(tile, scores.shape[-1])

    def _bins(self, block: Block, tile: np.ndarray) -> np.ndarray:
        first = self._first(block)
        left, lo, hi, right = column_ranges(first, tile.shape[-1], self.rows, clip=self.clip)
        out = np.zeros((*tile.shape[:-1], self.rows), dtype=tile.dtype)
        out[..., lo - first : hi - first] = tile[..., lo:hi]
        if left:
            out[..., 0] += tile[..., :left].sum(axis=-1)
        if right < tile.shape[-1]:
            out[..., -1] += tile[..., right:].sum(axis=-1)
        return out

    def position(self, block: Block, scores: np.ndarray) -> None:
        self._add(block, scores, self.x[..., block.a : block.b, :])

    def d_weights(self, block: Block, weights: np.ndarray, g: np.ndarray) -> None:
        if self.value_table is None:
            return
        self._add(block, g, table_logits(block.d_output, self.value_table))
        skew_view(block.tile, weights.shape[-1])[...] = weights
        bins = self._bins(block, block.tile)
        self.d_value += sum_to(np.matmul(np.swapaxes(bins, -1, -2), block.d_output),
                               self.d_value.shape)

    def d_logits(self, block: Block, d_logits: np.ndarray) -> None:
        dx = self._bins(block, block.tile)
        block.dq[...] += np.matmul(dx, self.key_table)
        self.d_key += sum_to(np.matmul(np.swapaxes(dx, -1, -2), block.q), self.d_key.shape)


class _DistanceRows(Term):
    """A table of one row per distance, inside the scale: ``P_ij = q_i . rows[r_ij - low]``.

    In the tile, columns ``0 .. L - 1`` are the table's rows ``start .. start + L - 1``
    (the `window`): the term is ``q_B window^T``, its transposes
    ``tile window`` (into dq) and ``tile^T q_B`` (into the rows).

    With `query` (Transformer-XL's ``q + v``, of ``(..., t_q, d)``), the term reads
    it in place of ``q``, and its share of dq goes to `dq` (``(*batch, t_q, d)``,
    made on first use) rather than into `Block.dq`.
    """

    skewed = True

    def __init__(self, rows: np.ndarray, low: int, call: Call,
                 query: np.ndarray | None = None) -> None:
        self.rows, self.low, self.call, self.query = rows, low, call, query
        self.d_rows = np.zeros(rows.shape, dtype=rows.dtype)
        self.store: dict[str, np.ndarray] = {}
        self.dq: np.ndarray | None = None
        if query is not None:
            self.batch = np.broadcast_shapes(query.shape[:-2], rows.shape[:-2])

    def _query(self, block: Block) -> np.ndarray:
        return block.q if self.query is None else self.query[..., block.a : block.b, :]

    def _dq(self, block: Block, tile: np.ndarray) -> np.ndarray:
        if self.query is None:
            return block.dq
        if self.dq is None:
            self.dq = np.zeros((*tile.shape[:-2], self.call.t_q, self.query.shape[-1]),
                               dtype=tile.dtype)
        return self.dq[..., block.a : block.b, :]

    def _start(self, block: Block) -> int:
        r_first = -(block.b - 1) - self.call.q_offset  # the distance of tile column 0
        return r_first - self.low

    def position(self, block: Block, scores: np.ndarray) -> None:
        length = block.scratch.shape[-1]
        start = self._start(block)
        window = self.rows[..., start : start + length, :]
        q_block = self._query(block)
        if window.ndim == 2:  # shared: one GEMM for every head
            shape = (*q_block.shape[:-1], length)
            out = _scratch(self.store, shape, scores.dtype)
            np.matmul(q_block.reshape(-1, q_block.shape[-1]), window.T,
                      out=out.reshape(-1, length))
        else:
            out = np.matmul(q_block, np.swapaxes(window, -1, -2))
        scores += skew_view(out, scores.shape[-1])

    def d_logits(self, block: Block, d_logits: np.ndarray) -> None:
        tile = block.tile
        length = tile.shape[-1]
        start = self._start(block)
        window = self.rows[..., start : start + length, :]
        target = self.d_rows[..., start : start + length, :]
        query = self._query(block)
        q_block = np.broadcast_to(query, (*tile.shape[:-2], *query.shape[-2:]))
        dq = self._dq(block, tile)
        if window.ndim == 2:
            flat = tile.reshape(-1, length)
            dq[...] += (flat @ window).reshape(dq.shape)
            target += flat.T @ q_block.reshape(-1, q_block.shape[-1])
        else:
            dq[...] += np.matmul(tile, window)
            target += sum_to(np.matmul(np.swapaxes(tile, -1, -2), q_block), target.shape)


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
    if not _covered(q, call, mask, k, v, d_output, bias, position):
        return NotImplemented
    term = None if bias is None and position is None else _FullTerms(position, bias)
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
    if not _covered(q, call, mask, k, v, d_output, table):
        return NotImplemented
    rows = table[..., : call.t_k, :]
    core = backward(q, k + rows, v, d_output, call, mask=mask)  # q . (k_j + R_j)
    d_table = np.zeros(table.shape, dtype=table.dtype)
    d_table[..., : call.t_k, :] = sum_to(core.dk, rows.shape)
    return _grads(q, k, v, core, table=d_table)


@_register("rope")
def rope_attention_vjp(
    q, k, v, /, *, d_output, base=10000.0, rotary_dim=None, layout="half", scale=None,
    mask=None, causal=None, q_offset=None,
):
    if not _ndarrays(q, k, v, d_output, mask):
        return NotImplemented
    call = rope.rope_call(
        q, k, v, base=base, rotary_dim=rotary_dim, layout=layout, scale=scale, mask=mask,
        causal=causal, q_offset=q_offset,
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    if not _covered(q, call, mask, k, v, d_output):
        return NotImplemented
    opts = {"base": base, "rotary_dim": rotary_dim, "layout": layout}
    q_rot = rope.rope_rotate(q, offset=call.q_offset, **opts)
    k_rot = rope.rope_rotate(k, offset=0, **opts)
    core = backward(q_rot, k_rot, v, d_output, call, mask=mask)
    dq = rope.rope_rotate(sum_to(core.dq, q.shape), offset=call.q_offset, inverse=True, **opts)
    dk = rope.rope_rotate(sum_to(core.dk, k.shape), offset=0, inverse=True, **opts)
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
    if not _covered(q, call, mask, k, v, d_output, table):
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
    if not _covered(q, call, mask, k, v, d_output, table):
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
    q, k, v, /, *, d_output, slopes=None, symmetric=True, scale=None, mask=None, causal=None,
    q_offset=None,
):
    if not _ndarrays(q, k, v, slopes, d_output, mask):
        return NotImplemented
    call, used = alibi.alibi_call(
        q, k, v, slopes=slopes, symmetric=symmetric, scale=scale, mask=mask, causal=causal,
        q_offset=q_offset,
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    if not _covered(q, call, mask, k, v, d_output, used):
        return NotImplemented
    row = _by_distance_row(
        lambda t_q, t_k, off: alibi.alibi_bias(used, t_q, t_k, q_offset=off,
                                               symmetric=symmetric),
        call,
    )
    term = _DistanceBias(row)
    core = backward(q, k, v, d_output, call, mask=mask, term=term)
    r_min, n = _distances(call)
    r = np.arange(r_min, r_min + n).astype(used.dtype)
    distance = -np.abs(r) if symmetric else r
    return _grads(q, k, v, core, slopes=term.sums @ distance)


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
        what = (f"max_distance={k_max}" if max_past is None
                else f"max_past={past}, max_distance={k_max}")
        check_distances_in_table(call.t_q, call.t_k, q_offset=call.q_offset, low=-past,
                                 high=k_max, what=what)
    if not _covered(q, call, mask, k, v, d_output, key_table, value_table):
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
    if not _covered(q, call, mask, k, v, d_output, table):
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
    if value_table is not None or not _covered(q, call, mask, k, v, d_output, table):
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
        self.add = window_bias(table, wh, ww)
        self.batch = table.shape[:-1]
        self.d_grid: np.ndarray | None = None
        self.tile: np.ndarray | None = None

    def bias(self, block: Block, scores: np.ndarray) -> None:
        self.add(scores, block.a)

    def d_logits(self, block: Block, d_logits: np.ndarray) -> None:
        wh, ww = self.wh, self.ww
        lead = d_logits.shape[:-2]
        if self.tile is None:  # zero outside the skewed band, written nowhere else
            self.tile = np.zeros((*lead, ww, wh, 2 * ww - 1), dtype=d_logits.dtype)
            self.d_grid = np.zeros((*lead, 2 * wh - 1, 2 * ww - 1), dtype=d_logits.dtype)
        tile = self.tile
        step_x, step_y, step_c = tile.strides[-3:]
        band = np.lib.stride_tricks.as_strided(  # band[..., x, ky, kx] = tile[.., ww-1-x+kx]
            tile[..., ww - 1 :], shape=(*lead, ww, wh, ww),
            strides=(*tile.strides[:-3], step_x - step_c, step_y, step_c))
        start, end = block.a, block.b
        while start < end:  # the block's queries, one grid row at a time
            y, x = divmod(start, ww)
            stop = min(end, (y + 1) * ww)
            rows = d_logits[..., start - block.a : stop - block.a, :]
            band[..., x : x + stop - start, :, :] = rows.reshape(*rows.shape[:-1], wh, ww)
            self.d_grid[..., wh - 1 - y : 2 * wh - 1 - y, :] += tile[
                ..., x : x + stop - start, :, :].sum(axis=-3)
            start = stop

    def gradient(self) -> np.ndarray:
        if self.d_grid is None:
            return np.zeros(self.table.shape, dtype=self.table.dtype)
        flat = self.d_grid.reshape(*self.d_grid.shape[:-2], -1)
        return sum_to(flat, self.table.shape)


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
    if not _covered(q, call, mask, k, v, d_output, table):
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

    def __init__(self, q, row_table, col_table, height: int, width: int, t_k: int) -> None:
        self.tables = (row_table, col_table)
        self.h, self.w, self.t_k = height, width, t_k
        self.add = grid_terms(q, row_table, col_table, height=height, width=width)
        self.batch = np.broadcast_shapes(row_table.shape[:-2], col_table.shape[:-2])
        self.grads = [np.zeros(t.shape, dtype=t.dtype) for t in self.tables]
        self.store: dict[str, np.ndarray] = {}

    def position(self, block: Block, scores: np.ndarray) -> None:
        self.add(scores, block.a)

    def d_logits(self, block: Block, d_logits: np.ndarray) -> None:
        h, w = self.h, self.w
        full = d_logits
        if block.width != self.t_k:  # causal: the keys no row of the block sees are 0
            full = _scratch(self.store, (*d_logits.shape[:-1], self.t_k), d_logits.dtype)
            full[..., : block.width] = d_logits
            full[..., block.width :] = 0
        grid = full.reshape(*full.shape[:-1], h, w)
        token = np.arange(block.a, block.b)
        at = np.arange(block.b - block.a)[:, None]
        for i, (sums, size, coordinate) in enumerate((
                (grid.sum(axis=-1), h, token // w), (grid.sum(axis=-2), w, token % w))):
            g = np.zeros((*sums.shape[:-1], 2 * size - 1), dtype=sums.dtype)
            g[..., at, (size - 1 - coordinate)[:, None] + np.arange(size)] = sums
            table = self.tables[i]
            block.dq[...] += np.matmul(g, table)
            q_block = np.broadcast_to(block.q, (*g.shape[:-2], *block.q.shape[-2:]))
            self.grads[i] += sum_to(np.matmul(np.swapaxes(g, -1, -2), q_block), table.shape)


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
    if not _covered(q, call, mask, k, v, d_output, row_table, col_table):
        return NotImplemented
    term = _GridTables(q, row_table, col_table, int(height), int(width), call.t_k)
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
    if not _covered(q, call, mask, k, v, d_output, w_r, content_bias, position_bias):
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


def _tile_products(tile, rows, first, row_of, side, d_side, d_rows) -> None:
    """The transposes of a per-distance table term through a skewed `tile` (``(..., R, L)``).

    Tile column ``c`` is distance ``first + c``, which reads ``rows[first + c]``
    (``(..., n, d)``); `side` (``(..., R, d)``) is what the rows meet (q, or k).
    ``d_side += tile rows_window`` and ``d_rows[window] += tile^T side``, except
    the runs of `END_RUN` or more columns at either end that read one table row
    (`row_of`): those add their row sums times that row, and the same sums
    times `side` into the run's first distance (the rows fold per table row).
    """
    length = tile.shape[-1]
    segment = row_of[first : first + length]
    lo = int(np.searchsorted(segment, segment[0], side="right"))
    hi = max(int(np.searchsorted(segment, segment[-1], side="left")), lo)
    lo = 0 if lo < END_RUN else lo
    hi = length if length - hi < END_RUN else hi
    if hi > lo:
        part = tile[..., lo:hi]
        d_side[...] += np.matmul(part, rows[..., first + lo : first + hi, :])
        d_rows[..., first + lo : first + hi, :] += np.matmul(np.swapaxes(part, -1, -2), side)
    for a, b in ((0, lo), (hi, length)):
        if b > a:
            sums = tile[..., a:b].sum(axis=-1)  # (..., R)
            d_side[...] += sums[..., None] * rows[..., first + a : first + a + 1, :]
            d_rows[..., first + a, :] += np.matmul(sums[..., None, :], side)[..., 0, :]


def _fold_rows(d_rows: np.ndarray, row_of: np.ndarray, n_rows: int) -> np.ndarray:
    # (..., n, d) per distance -> (..., n_rows, d): distance r into row row_of[r]
    # (non-decreasing, so the distances of a row are one run: one reduceat)
    starts = np.flatnonzero(np.concatenate(([True], row_of[1:] != row_of[:-1])))
    out = np.zeros((*d_rows.shape[:-2], n_rows, d_rows.shape[-1]), dtype=d_rows.dtype)
    out[..., row_of[starts], :] = np.add.reduceat(d_rows, starts, axis=-2)
    return out


class _DebertaTables(Term):
    """DeBERTa's c2p and p2c, inside the scale: ``q_i . K[row(r)]`` and ``k_j . Q[row(r)]``.

    Both read one row per distance of the grid (``K[row(r)]``, ``Q[row(r)]``).
    c2p is `_DistanceRows` of those rows. p2c, from the keys' side, takes a
    chunk of ``C`` keys at a time: the block's :math:`\bar{l}` transposed into a
    skewed ``(C, B + C - 1)`` tile (columns are distances again), then
    ``dk_C += tile window`` and ``d_window += tile^T k_C``. The scores get both
    terms through `deberta_terms`'s gathers, as in the forward kernel. The
    per-distance gradients fold into the table rows at the end (`row` is
    non-decreasing: each row's distances are one run, one `numpy.add.reduceat`).
    """

    skewed = True

    def __init__(self, q, k, key_table, query_table, call: Call, max_position) -> None:
        import array_api_compat.numpy as xp

        self.k, self.key_table, self.query_table, self.call = k, key_table, query_table, call
        span = (key_table if key_table is not None else query_table).shape[-2] // 2
        r_min, n = _distances(call)
        self.row_of = np.asarray(deberta.deberta_rows(xp.asarray(np.arange(r_min, r_min + n)),
                                                      span=span, max_position=max_position))
        tables = [t for t in (key_table, query_table) if t is not None]
        self.batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2],
                                         *(t.shape[:-2] for t in tables))
        if key_table is not None:
            self.k_rows = np.take(key_table, self.row_of, axis=-2)  # (..., n, d)
            self.d_k_rows: np.ndarray | None = None
        self.add = deberta_terms(q, k, key_table, query_table, call, max_position)
        if query_table is not None:
            self.q_rows = np.take(query_table, self.row_of, axis=-2)  # (..., n, d)
            self.d_q_rows: np.ndarray | None = None
            self.dk: np.ndarray | None = None
        self.tiles: dict[tuple[int, int], np.ndarray] = {}

    def position(self, block: Block, scores: np.ndarray) -> None:
        self.add(scores, block.a)

    def d_logits(self, block: Block, d_logits: np.ndarray) -> None:
        if self.key_table is not None:
            if self.d_k_rows is None:
                self.d_k_rows = np.zeros((*d_logits.shape[:-2], *self.k_rows.shape[-2:]),
                                         dtype=d_logits.dtype)
            q_block = np.broadcast_to(block.q, (*d_logits.shape[:-2], *block.q.shape[-2:]))
            _tile_products(block.tile, self.k_rows, block.first, self.row_of, q_block,
                           block.dq, self.d_k_rows)
        if self.query_table is not None:
            self._keys_side(block, d_logits)

    def _keys_side(self, block: Block, d_logits: np.ndarray) -> None:
        n, width = d_logits.shape[-2:]
        lead = d_logits.shape[:-2]
        d = self.k.shape[-1]
        if self.dk is None:
            self.dk = np.zeros((*lead, self.call.t_k, d), dtype=d_logits.dtype)
            self.d_q_rows = np.zeros((*lead, *self.q_rows.shape[-2:]), dtype=d_logits.dtype)
        keys = np.broadcast_to(self.k, (*lead, *self.k.shape[-2:]))
        reversed_rows = d_logits[..., ::-1, :]
        for j0 in range(0, width, KEY_CHUNK):
            j1 = min(j0 + KEY_CHUNK, width)
            c = j1 - j0
            tile = self.tiles.get((n, c))
            if tile is None:  # zero outside the band, written nowhere else
                tile = self.tiles[n, c] = np.zeros((*lead, c, n + c - 1), dtype=d_logits.dtype)
            step_row, step_col = tile.strides[-2:]
            # band[..., j', i''] = tile[..., j', j' + i'']: key j0 + j', query b - 1 - i''
            band = np.lib.stride_tricks.as_strided(
                tile, shape=(*lead, c, n), strides=(*tile.strides[:-2], step_row + step_col,
                                                    step_col))
            band[...] = np.swapaxes(reversed_rows[..., j0:j1], -1, -2)
            _tile_products(tile, self.q_rows, block.first + j0, self.row_of,
                           keys[..., j0:j1, :], self.dk[..., j0:j1, :], self.d_q_rows)

    def gradients(self, scale: float) -> tuple[np.ndarray | None, dict[str, np.ndarray]]:
        """The p2c term's share of dk (over the scores' batch) and the tables' gradients."""
        out, dk = {}, None
        for name, table, d_rows in (
                ("key_table", self.key_table, getattr(self, "d_k_rows", None)),
                ("query_table", self.query_table, getattr(self, "d_q_rows", None))):
            if table is None:
                continue
            if d_rows is None:  # no block saw a key
                out[name] = np.zeros(table.shape, dtype=table.dtype)
                continue
            per_head = sum_to(d_rows, (*table.shape[:-2], *d_rows.shape[-2:]))
            out[name] = _fold_rows(per_head, self.row_of, table.shape[-2]) * scale
        if self.query_table is not None and self.dk is not None:
            dk = self.dk * scale
        return dk, out


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
    if not _covered(q, call, mask, k, v, d_output, key_table, query_table):
        return NotImplemented
    tables = {name: t for name, t in (("key_table", key_table), ("query_table", query_table))
              if t is not None}
    if not tables or call.t_q == 0 or call.t_k == 0:
        core = backward(q, k, v, d_output, call, mask=mask)
        return _grads(q, k, v, core, **{name: np.zeros_like(t) for name, t in tables.items()})
    term = _DebertaTables(q, k, key_table, query_table, call, max_position)
    core = backward(q, k, v, d_output, call, mask=mask, term=term)
    dk, grads = term.gradients(call.scale)
    return {"q": sum_to(core.dq, q.shape),
            "k": sum_to(core.dk if dk is None else core.dk + dk, k.shape),
            "v": sum_to(core.dv, v.shape), **grads}
