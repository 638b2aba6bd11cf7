r"""The backward pass of a distance form on torch, a block of query rows at a time.

`form_vjp` returns the gradient of ``sum(d_output * out)`` with respect to
every array of a `relpos_ref.lowering.DistanceForm` (its contents, each
term's vectors and table, each bias and value table), by the block engine of
`relpos_ref.kernels._torch_form`; `relpos_ref.kernels.torch` carries them
back through the lowering to the call's own arguments with autograd (the
lowering is small array work: a rotation, ``k + R``, ALiBi's rows). Per
block of rows the weights ``w`` are computed again as the forward computes
them; then, with ``G = w (dw - sum_j w dw)`` the gradient of the logits:

.. math::
    dw = dO\,\tilde v^\top + \sum_t dO\, V_t[\text{row}]^\top, \quad
    dq' = s\, G \tilde k, \quad d\tilde k \mathrel{+}= G^\top (s q'), \quad
    d\tilde v \mathrel{+}= w^\top dO, \quad dV_t \mathrel{+}= \operatorname{bins}_t(w)^\top dO

A relative-value term's ``dO V^T`` is read into ``dw`` as a query-side
term is into the scores; each term's gradient is ``G`` read the way the
forward wrote the term, backwards: summed over a run, laid out by distance
and added into the rows of its product with ``index_add_`` (whole rows), or
scattered back pair by pair. No ``(t_q, t_k)`` array exists (but a dense
term's gradient, which is one), as in the
forward.
"""

from __future__ import annotations

from typing import Any

import torch

from ..lowering import DistanceForm
from . import _torch_form
from ._torch_blocks import (
    Arena,
    add_by_rows,
    binned,
    hankel,
    kept_array,
    laid_rows,
    pieces,
    region_sums,
)
from ._torch_form import arena_for, picked_index, read_by_pairs, weights
from ._torch_key_terms import key_gradients, keys_backward
from ._torch_pairs import grid_backward, pairs_backward
from ._torch_plan import Plan, Term, plan, window

__all__ = ["form_vjp"]


def _sum_to(x: Any, shape: tuple[int, ...]) -> Any:
    """`x` summed over the axes it broadcast over from `shape`."""
    extra = x.dim() - len(shape)
    if extra > 0:  # (axes of one element: a view, not a sum's pass over the array)
        x = (x.reshape(x.shape[extra:]) if all(n == 1 for n in x.shape[:extra])
             else x.sum(dim=tuple(range(extra))))
    elif extra < 0:
        x = x.reshape((1,) * -extra + tuple(x.shape))
    return x.sum_to_size(shape) if tuple(x.shape) != tuple(shape) else x


class _Grads:
    """One call's gradient accumulators, each in the layout the plan holds its array."""

    def __init__(self, p: Plan) -> None:
        self.q = p.q.new_zeros(p.q.shape)
        # the keys' and values' gradients transposed, (L, d, t_k): a product into them ran
        # three times faster than into (L, t_k, d) on the CPU
        self.k, self.v = (x.new_zeros(x.mT.shape) for x in (p.k, p.v))
        with_table = ("gather", "dense", "grid_bias")
        self.terms = [t.x.new_zeros((t.table if t.kind in with_table else t.x).shape)
                      for t in p.terms]
        self.vectors = [t.x.new_zeros(t.x.shape) if t.kind in ("gather", "dense") else None
                        for t in p.terms]
        self.bias = None if p.bias is None else p.bias.new_zeros(p.bias.shape)
        self.values = [t.table.new_zeros(t.table.shape) for t in p.values]
        # written block by block (`_block`), the rows no block holds zeroed here; the thread's
        # kept array of slot 1 (`kept_array`: the gradient is read before the next call)
        self.dense = None if p.dense is None else kept_array(p.dense, p.dense.shape, slot=1)
        if self.dense is not None:
            self.dense[:, :p.blocks[0][0] if p.blocks else p.form.call.t_q].zero_()


def _gather_backward(acc: Any, grad: Any, term: Term, start: int, n: int, n_all: int,
                     arena: Arena) -> None:
    # acc (L, m + 1, r) += the block's G summed by the row each pair read, run by run (few
    # runs in the window: `_picked_backward` takes the others)
    for u_lo, u_hi, summed, row in pieces(term.runs, n_all, start, n):
        if summed:
            acc[:, row] += region_sums(grad, u_lo, u_hi)
        else:
            acc.index_add_(1, term.rows[start + u_lo:start + u_hi],
                           laid_rows(grad, u_lo, u_hi, arena))


def _block(p: Plan, g: _Grads, d_out: Any, block: int, arena: Arena) -> None:
    a, b, width = p.blocks[block]
    call, r = p.form.call, b - a
    t_k, s, n_all = call.t_k, call.scale, call.t_q + call.t_k - 1
    keys = slice(t_k - width, t_k)
    w = weights(p, block, arena)
    d_o = d_out[:, a:b]
    dw = arena.take(*w.shape)
    torch.bmm(d_o, p.v[:, keys].mT, out=dw)
    start, n = window(call, a, b, width)
    for values, acc in zip(p.values, g.values, strict=True):
        add_by_rows(dw, torch.matmul(values.table, d_o.mT), values.rows, values.runs, start,
                    n_all, arena, max_pieces=_torch_form.MAX_PIECES)
        columns, rows = binned(values, w, start, n_all, arena,
                               max_pieces=_torch_form.MAX_PIECES)
        part = torch.bmm(columns.mT, d_o)
        acc.index_add_(1, rows, part if acc.shape[0] > 1 else part.sum(0, keepdim=True))
    g.v[..., keys].baddbmm_(d_o.mT, w)
    grad = torch.mul(w, dw, out=arena.take(*w.shape))
    grad.addcmul_(w, grad.sum(-1, keepdim=True), value=-1)  # G = w (dw - sum_j w dw)
    g.q[:, a:b].baddbmm_(grad, p.k[:, keys], alpha=s)
    g.k[..., keys].baddbmm_(p.q[:, a:b].mT, grad)
    if g.dense is not None:  # each block's rows written once (summed where it has no batch)
        g.dense[:, a:b, keys] = grad if g.dense.shape[0] == grad.shape[0] else grad.sum(
            0, keepdim=True)
        g.dense[:, a:b, :t_k - width].zero_()  # keys none of the block's rows sees
    laid = None
    if g.bias is not None or any(t.kind == "dense" for t in p.terms):
        laid = arena.zeros(*grad.shape[:-1], n)  # (L, r, n): entry (i', i' + j~)
        hankel(laid, r, width, row=n + 1, col=1).copy_(grad)
    for t, term in enumerate(p.terms):
        acc = g.terms[t]
        if term.kind == "gather":
            if read_by_pairs(term, n_all, start, n):
                by_row, lo = _picked_backward(grad, term, a, start, arena)
            else:
                lo = 0
                by_row = arena.zeros(grad.shape[0], term.table.shape[-2], r)
                _gather_backward(by_row, grad, term, start, n, n_all, arena)
            _product_backward(term, acc, g.vectors[t], by_row, a, b, lo)
        elif term.kind == "dense":
            _dense_backward(term, acc, g.vectors[t], laid, a, b, start, n)
        elif term.kind == "keys":
            keys_backward(acc, grad, term, start, width, t_k, arena)
        elif term.kind == "grid_bias":
            grid_backward(acc, grad, term.keys[1], a, b)
        else:
            pairs_backward(acc, grad, term.index, term.keys, a, b,
                           bias=term.kind == "pair_bias")
    if g.bias is not None:
        g.bias[:, start:start + n] += laid.sum(-2)


def _picked_backward(grad: Any, term: Term, a: int, start: int,
                     arena: Arena) -> tuple[Any, int]:
    # the gradient of the product `add_picked` read pair by pair: G scattered into each query's
    # row of the product, (L, r, hi + 1); returned for the rows lo .. hi block a reads as
    # (L, hi + 1 - lo, r) (a transposed view), with lo
    lanes, r, width = grad.shape
    lo, hi = term.spans[a]
    by_query = arena.zeros(lanes, r, hi + 1)
    index = picked_index(term, start, r, width)
    by_query.scatter_add_(2, index.expand(lanes, r, width), grad)
    return by_query[..., lo:].mT, lo


def _product_backward(term: Term, acc: Any, d_vectors: Any, by_row: Any, a: int,
                      b: int, lo: int = 0) -> None:
    # a "gather" term's product (s A) a_b^T = x (L, m + 1, r) with gradient by_row, the
    # table's rows lo .. lo + len(by_row) - 1: the table's (acc) and the vectors' gradients
    vectors, hi = term.x[:, a:b], lo + by_row.shape[-2]
    table = term.table[:, lo:hi]
    d_vectors[:, a:b].baddbmm_(by_row.mT, table.expand(by_row.shape[0], *table.shape[1:]))
    if acc.shape[0] == 1:  # one table for every head
        acc[0, lo:hi] += by_row.transpose(0, 1).reshape(hi - lo, -1) \
            @ vectors.reshape(-1, vectors.shape[-1])
    else:
        acc[:, lo:hi].baddbmm_(by_row, vectors)


def _dense_backward(term: Term, acc: Any, d_vectors: Any, laid: Any, a: int, b: int,
                    start: int, n: int) -> None:
    # the window's table rows and the block's vectors: laid (L, r, n) = the product's gradient
    vectors = term.x[:, a:b]
    if term.table.dim() == 2:  # one table: the heads' products summed
        flat = laid.reshape(-1, n)
        acc[start:start + n] += flat.T @ vectors.reshape(-1, vectors.shape[-1])
        d_vectors[:, a:b] += (flat @ term.table[start:start + n]).view(*laid.shape[:-1], -1)
    else:
        acc[:, start:start + n] += torch.bmm(laid.mT, vectors)
        d_vectors[:, a:b] += torch.bmm(laid, term.table[:, start:start + n])


def form_vjp(form: DistanceForm, d_output: Any, dense: Any = None) -> dict[Any, Any]:
    """Gradients of ``sum(d_output * form_attention(form, dense=dense))`` by the form's arrays.

    Returns a dict: ``"q"``, ``"k"``, ``"v"`` (of the form's contents); for
    each term ``("query", t)`` and ``("key", t)``: ``(vectors, table)``;
    ``("bias", t)`` and ``("values", t)``: its table; ``"dense"``:
    ``(position, bias)`` of the form's dense terms (``None`` for one it has
    not), or the gradient of `dense` (keys reversed, as given: `plan`; on the
    CPU possibly a view of the thread's kept array,
    `relpos_ref.kernels._torch_blocks.kept_array`: read it before the next
    call); each summed to the shape of the array it is the gradient of.

    Examples
    --------
    >>> import torch
    >>> import relpos_ref as rp
    >>> from relpos_ref.lowering import lower
    >>> q = k = v = torch.eye(3, dtype=torch.float64)[None]
    >>> table = torch.linspace(-1, 1, 9, dtype=torch.float64).reshape(3, 3)
    >>> d_out = torch.ones(1, 3, 3, dtype=torch.float64)
    >>> grads = form_vjp(lower("shaw", q, k, v, table, table), d_out)
    >>> with rp.kernels.disabled():
    ...     want = rp.shaw_attention_vjp(q, k, v, table, table, d_output=d_out)
    >>> bool(torch.allclose(grads["values", 0], want["value_table"]))
    True
    """
    p = plan(form, dense=dense)
    call = form.call
    g = _Grads(p)
    d_out = d_output.expand(*p.lead, call.t_q, p.v.shape[-1]).reshape(p.v.shape[0], call.t_q,
                                                                     p.v.shape[-1])
    arena = arena_for(p)
    for block in range(len(p.blocks)):
        arena.reset()
        _block(p, g, d_out, block, arena)
    out = _collect(p, g)
    if dense is not None:
        out["dense"] = _sum_to(out["dense"], dense.shape)
    return out


def _collect(p: Plan, g: _Grads) -> dict[Any, Any]:
    form, lead = p.form, p.lead
    s = form.call.scale

    def shaped(x: Any) -> Any:
        return x.reshape(*lead, *x.shape[1:])

    out: dict[Any, Any] = {"q": _sum_to(shaped(g.q), form.q.shape),
                           "k": _sum_to(shaped(g.k.mT.flip(-2)), form.k.shape),
                           "v": _sum_to(shaped(g.v.mT.flip(-2)), form.v.shape)}
    terms = iter(zip(p.terms, g.terms, g.vectors, strict=True))
    for t, term in enumerate(form.query_terms):
        kept, acc, d_dense = next(terms)
        m, table = term.table.shape[-2], term.table * s
        if kept.kind == "gather":  # (s A) a^T per block: the gradients of s A and of a
            d_vec = shaped(d_dense)
            d_table = (acc[0] if term.table.dim() == 2 else shaped(acc))[..., :m, :] * s
        elif kept.kind == "pairs":  # x = a (s A)^T: (L, t_q, m + 1)
            acc = shaped(acc)[..., :m]
            d_vec, d_table = acc @ table, (acc.mT @ term.vectors) * s
        else:  # dense: the table's rows by reversed distance
            d_vec = shaped(d_dense)
            by_row = acc.flip(-2)
            rows = torch.where(term.index.rows < 0, m, term.index.rows)
            d_ext = by_row.new_zeros((*by_row.shape[:-2], m + 1, by_row.shape[-1]))
            d_ext.index_add_(-2, rows, by_row)
            d_table = (d_ext if d_ext.dim() == 2 else shaped(d_ext))[..., :m, :] * s
        out["query", t] = (_sum_to(d_vec, term.vectors.shape), _sum_to(d_table, term.table.shape))
    for t, term in enumerate(form.key_terms):
        _, acc, _ = next(terms)
        d_vec, d_table = key_gradients(acc, term, lead, s)
        out["key", t] = (_sum_to(d_vec, term.vectors.shape), _sum_to(d_table, term.table.shape))
    by_distance = None if g.bias is None else shaped(g.bias.flip(-1))
    for t, term in enumerate(form.biases):
        m = term.table.shape[-1]
        if term.index.by_distance:
            rows = torch.where(term.index.rows < 0, m, term.index.rows)
            d_ext = by_distance.new_zeros((*by_distance.shape[:-1], m + 1))
            d_ext.index_add_(-1, rows, by_distance)
        else:
            kept, d_ext, _ = next(terms)
            if kept.kind == "grid_bias":  # by (dy, dx): back to the table's rows
                d_grid = d_ext.flip(-1, -2)
                d_ext = d_grid.new_zeros(kept.x.shape)
                d_ext.index_add_(-1, kept.rows.reshape(-1), d_grid.reshape(d_grid.shape[0], -1))
            d_ext = shaped(d_ext)
        out["bias", t] = _sum_to(d_ext[..., :m], term.table.shape)
    for t, (term, acc) in enumerate(zip(form.values, g.values, strict=True)):
        acc = acc[0] if acc.shape[0] == 1 and term.table.dim() == 2 else shaped(acc)
        out["values", t] = _sum_to(acc[..., :term.table.shape[-2], :], term.table.shape)
    if g.dense is not None:  # the gradient of s P + B
        d_term = g.dense[0] if g.dense.shape[0] == 1 else shaped(g.dense)
        position, bias = form.dense
        if position is None and bias is None:  # a kernel's `dense`: keys reversed, as given
            out["dense"] = d_term
        else:  # the form's own: keys in order
            d_term = d_term.flip(-1)
            out["dense"] = (None if position is None else _sum_to(d_term * s, position.shape),
                            None if bias is None else _sum_to(d_term, bias.shape))
    return out
