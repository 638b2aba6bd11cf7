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
specification keys them. Every scheme of the catalog has one but FoX (the
specification's runs there): the terms add
what the forward kernels add (the same views and gathers, or a GEMM per
block) and take their transposes per row block: column sums and products of
the skewed tile for tables by distance, Shaw's clipped tables through the
band of each block and one constant per row beyond it (never a tile of the
block's width), DeBERTa's buckets as sums by table row (its p2c from the
keys' side, through the block transposed), Swin's window bias and the grid's
row and column tables through their 2-D offsets.

The kernels live by family: this module (plain attention, the schemes that
change ``q`` and ``k``, the scalar biases, the 2-D schemes, Transformer-XL),
`relpos_ref.kernels._numpy_vjp_tables` (Shaw, general, Music),
`relpos_ref.kernels._numpy_vjp_deberta`, `relpos_ref.kernels._numpy_vjp_biases`
(KERPLE, Sandwich, xPos), `relpos_ref.kernels._numpy_vjp_fire`,
`relpos_ref.kernels._numpy_vjp_swinv2` (Swin v1's at the cosine operands),
`relpos_ref.kernels._numpy_cope`;
all register in `VJP_KERNELS`
(`relpos_ref.kernels._numpy_vjp_common`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..calls import Call, check_terms, resolve_call
from ..gradients import check_d_output
from ..schemes import (
    absolute,
    alibi,
    bias,
    grid2d,
    rope,
    shaw,
    swin,
    t5,
    transformer_xl,
)
from ..schemes.rope_learned import call_frequency_gradient
from . import _numpy_vjp_deberta, _numpy_vjp_tables  # noqa: F401  (they register)
from ._numpy_terms import grid_terms, window_bias
from ._numpy_vjp import (
    Block,
    Term,
    at,
    backward,
    sum_to,
)
from ._numpy_vjp_common import (
    VJP_KERNELS,
    _by_distance_row,
    _covered,
    _DistanceBias,
    _DistanceRows,
    _distances,
    _FullTerms,
    _grads,
    _ndarrays,
    _onehot,
    _register,
    _scratch,
    _vector_gradient,
)

__all__ = ["VJP_KERNELS"]


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
    dq, dk = rope.rope_pair(core.dq, core.dk, call, inverse=True, **rotation)  # then summed
    dq, dk = sum_to(dq, q.shape), sum_to(dk, k.shape)
    grads = {"q": dq, "k": dk, "v": sum_to(core.dv, v.shape)}
    learned = call_frequency_gradient(
        q, call, [(core.dq, q_rot, call.q_offset), (core.dk, k_rot, 0)], rotation)
    if learned is not None:
        grads["frequencies"] = learned
    return grads


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


