"""What the NumPy VJP kernels share: their registry, checks, and the generic terms.

`VJP_KERNELS` maps a scheme to its kernel (`relpos_ref.kernels._numpy_vjps`
and its family modules register there); `_covered` is the common part of
what a kernel takes (module docstring of `relpos_ref.kernels._numpy_vjps`).
The terms here serve several schemes: plain attention's dense arrays
(`_FullTerms`), a scalar per distance outside the scale (`_DistanceBias`:
bias, T5, ALiBi, KERPLE, Sandwich), and a table of one row per distance
inside it (`_DistanceRows`: general, Music, Transformer-XL).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..calls import Call, computes_in_float32
from ._numpy_blocks import distance_view, kernel_arrays
from ._numpy_vjp import Block, Term, at, finite, sum_to
from ._numpy_vjp_tiles import skew_view, tile_products, tile_rows
from ._overflow import bounded

__all__ = ["VJP_KERNELS"]

#: Scheme name (as in `relpos_ref.catalog`) -> its NumPy VJP kernel.
VJP_KERNELS: dict[str, Callable[..., Any]] = {}


def _register(scheme: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def add(kernel: Callable[..., Any]) -> Callable[..., Any]:
        VJP_KERNELS[scheme] = computes_in_float32(kernel)
        return kernel

    return add


def _ndarrays(*arrays: Any) -> bool:
    return kernel_arrays(*arrays)


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




def _vector_gradient(per_row: np.ndarray, vector: np.ndarray) -> np.ndarray:
    # a (d,) or per-head (h, d) vector added to every row of (..., t, d)
    if vector.ndim == 1:
        return sum_to(per_row, vector.shape)
    return sum_to(per_row, (vector.shape[0], 1, vector.shape[1])).reshape(vector.shape)


