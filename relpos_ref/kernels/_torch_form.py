r"""A distance form on torch, a block of query rows at a time: the torch kernels' engine.

`form_attention` evaluates a `relpos_ref.lowering.DistanceForm` whose arrays
are torch tensors one block of ``r`` query rows at a time (its `plan`,
`relpos_ref.kernels._torch_plan`: about ``BLOCK_BYTES`` of scores a block),
so that no ``(t_q, t_k)`` array of the call exists, only a block's ``(r, w)``
against the ``w`` keys it may see:

.. math::
    L_b = (s q'_b) \tilde k^\top + \sum_t \text{terms}, \qquad
    \text{out}_b = \operatorname{softmax}(L_b)\, \tilde v
                   + \sum_t \operatorname{bins}_t(w_b)\, V_t

**Keys reversed.** A block holds key ``w - 1 - j`` in its column ``j~``
(``k~`` and ``v~`` are flipped once per call), so that a term of the distance
``r = j - i - q_offset`` depends on ``u = i' + j~``, the block's window of
``r + w - 1`` distances, largest first (``window``): a strided view with
positive strides reads it (`relpos_ref.kernels._torch_blocks.hankel`; torch
has no negative strides).

- Query-side terms by distance: ``"gather"`` reads ``(s A) a_b^T``, the
  block's product with the table (a zero row for "no term"). Where the
  block's window crosses few runs of the map (Shaw's, clipped at both
  ends), a clipped end is a constant per row added over a rectangle and two
  triangles (`relpos_ref.kernels._torch_blocks.add_constant`) and the
  band's rows are picked by ``index_select`` (whole rows copied); across
  more (DeBERTa's c2p, log buckets) the product is made query by query and
  read pair by pair with one ``torch.gather`` (`add_picked`). ``"dense"``
  multiplies ``s a_b`` with the window's table rows, one per distance
  (general, music, Transformer-XL: tables of about as many rows as keys).
- Key-side terms by distance (DeBERTa's p2c): rows of ``(s B) b^T`` picked
  per tile of keys (`relpos_ref.kernels._torch_key_terms`).
- Biases by distance: one row of the window, read through a view.
- Terms by coordinates (grid2d, Swin): a key coordinate constant on runs
  of equal length (grid2d's row) or periodic (its column) is read once per
  distinct coordinate and spread by a view; any other pair by pair.
- Relative values: the block's weights summed over each run of distances
  that read one table row (a clipped end: a rectangle's row sums and two
  triangles), the band laid out by distance, then one product with those
  table rows (`relpos_ref.kernels._torch_blocks.region_sums`, ``laid_piece``).

Every block's temporaries come from one `relpos_ref.kernels._torch_blocks.Arena`
per call. Causal calls compute only the keys some row of a block may see,
and skip the rows that see none; a row with no allowed key gets zeros.
Nothing here validates: `relpos_ref.kernels.torch` calls it for calls the
scheme's own checks accepted, with finite arrays whose logits cannot
overflow (`relpos_ref.kernels._overflow`). Equal to the specification up to
the rounding of reordered sums (``s (q k)`` is computed as ``(s q) k``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..lowering import DistanceForm
from ._torch_blocks import Arena, add_by_rows, binned, hankel, piece_count, times_rows
from ._torch_key_terms import add_keys
from ._torch_pairs import add_grid, add_pairs
from ._torch_plan import Plan, Term, plan, window

__all__ = [
    "MAX_PIECES", "add_picked", "add_terms", "arena_for", "form_attention", "gather_product",
    "logits", "picked_index", "read_by_pairs", "weights",
]

#: A window crossing more runs of a map than this reads it distance by distance.
MAX_PIECES = 8


def logits(p: Plan, block: int, arena: Arena) -> Any:
    """Scores of block `block` (rows ``a .. b - 1``, keys ``width - 1 .. 0``), ``-inf``
    where a row may not attend: ``(L, r, width)`` from `arena`."""
    a, b, width = p.blocks[block]
    t_k = p.form.call.t_k
    scores = arena.take(p.q.shape[0], b - a, width)
    torch.bmm(p.q[:, a:b], p.k[:, t_k - width:].mT, out=scores)
    add_terms(scores, p, a, b, width, arena)
    _mask(scores, p, a, b, width)
    return scores


def add_terms(scores: Any, p: Plan, a: int, b: int, width: int, arena: Arena, *,
              fresh: bool = False) -> None:
    """Every term of the plan added to the ``(L, r, width)`` `scores` of rows ``a .. b - 1``
    (keys reversed), before the mask; `arena` for the temporaries. `fresh`: `scores` holds
    nothing yet (the sum of the terms is written: by the first term where it can, else on
    zeros)."""
    call, r = p.form.call, b - a
    t_k, n_all = call.t_k, call.t_q + call.t_k - 1
    start, n = window(call, a, b, width)
    picked = [term.kind == "gather" and read_by_pairs(term, n_all, start, n)
              for term in p.terms]
    written = fresh and bool(picked) and picked[0]  # the first term writes the scores
    if fresh and not written:
        scores.zero_()
    for t, (term, pick) in enumerate(zip(p.terms, picked, strict=True)):
        if term.kind == "gather":
            if pick:
                add_picked(scores, term, a, b, start, arena, write=written and t == 0)
            else:
                add_by_rows(scores, gather_product(term, a, b, arena), term.rows, term.runs,
                            start, n_all, arena, max_pieces=MAX_PIECES)
        elif term.kind == "dense":
            scores += hankel(_dense(term, a, b, start, n, arena), r, width, row=n + 1, col=1)
        elif term.kind == "keys":
            add_keys(scores, term, start, width, t_k, arena)
        elif term.kind == "grid_bias":
            add_grid(scores, term.table, term.keys[1], a, b)
        else:
            add_pairs(scores, term.x, term.index, term.keys, a, b, bias=term.kind == "pair_bias")
    if p.bias is not None:
        scores += hankel(p.bias[:, start:start + n], r, width, row=1, col=1, axes=1)
    if p.dense is not None:
        scores += p.dense[:, a:b, t_k - width:]


def read_by_pairs(term: Term, n_all: int, start: int, n: int) -> bool:
    """Whether a "gather" term's window ``start .. start + n - 1`` crosses more than
    `MAX_PIECES` runs of its map, so that a block reads it pair by pair (`add_picked`), not
    run by run (`relpos_ref.kernels._torch_blocks.add_by_rows`)."""
    return piece_count(term.runs, n_all, start, n) > MAX_PIECES


def gather_product(term: Term, a: int, b: int, arena: Arena) -> Any:
    """``(s A) a_b^T`` of a "gather" term for rows ``a .. b - 1``: ``(L, m + 1, r)``."""
    vectors = term.x[:, a:b]
    out = arena.take(vectors.shape[0], term.table.shape[-2], b - a)
    return torch.bmm(term.table.expand(vectors.shape[0], *term.table.shape[-2:]), vectors.mT,
                     out=out)


def add_picked(scores: Any, term: Term, a: int, b: int, start: int, arena: Arena, *,
               write: bool = False) -> None:
    """``scores[:, i', j~] += (s a_i) . A[row(start + i' + j~)]`` of a "gather" term, pair by pair
    (`write`: ``=``, not ``+=``).

    The product ``(s a_b) A^T`` is made query by query, ``(L, r, hi + 1)``, its
    columns ``lo .. hi`` the rows the block's window reads (``term.spans``), and
    each row reads its window of distances with one ``torch.gather``: a row's
    entries are in order along the keys. Picking whole rows of the product by
    distance (`relpos_ref.kernels._torch_blocks.add_by_rows`) leaves the band
    along a diagonal, a strided read: DeBERTa's c2p, t = 1024, 8 heads, one
    thread, 12.5 -> 9.0 ms over a call's blocks.
    """
    vectors, table = term.x[:, a:b], term.table
    lanes, r, width = scores.shape
    lo, hi = term.spans[a]
    x = arena.take(lanes, r, hi + 1)  # (its columns before lo are never read)
    torch.bmm(vectors, table[:, lo:hi + 1].expand(lanes, -1, -1).mT, out=x[..., lo:])
    index = picked_index(term, start, r, width)
    if write:
        torch.gather(x, 2, index.expand(lanes, r, width), out=scores)
        return
    found = arena.take(lanes, r, width)
    torch.gather(x, 2, index.expand(lanes, r, width), out=found)
    scores += found


def picked_index(term: Term, start: int, r: int, width: int) -> Any:
    """``(r, width)``, a view: the table row of pair ``(i', j~)``, ``row(start + i' + j~)``."""
    return hankel(term.rows[start:start + r + width - 1], r, width, row=1, col=1, axes=1)


def _dense(term: Term, a: int, b: int, start: int, n: int, arena: Arena) -> Any:
    # (L, r, n): s a_i . A[row of u] for the window's distances
    vectors = term.x[:, a:b]
    out = arena.take(vectors.shape[0], b - a, n)
    if term.table.dim() == 2:  # one table for every head: one product
        torch.mm(vectors.reshape(-1, vectors.shape[-1]), term.table[start:start + n].T,
                 out=out.view(-1, n))
    else:
        torch.bmm(vectors, term.table[:, start:start + n].mT, out=out)
    return out


def _mask(scores: Any, p: Plan, a: int, b: int, width: int) -> None:
    # -inf where rows a .. b - 1 may not attend (the mask, the causal triangle)
    call, t_k = p.form.call, p.form.call.t_k
    if p.mask is not None:
        rows = p.mask if p.mask.shape[-2] == 1 else p.mask[..., a:b, :]
        scores.view(*p.lead, b - a, width).masked_fill_(~rows[..., t_k - width:], -math.inf)
    if call.causal:
        first = max(a + call.q_offset + 1, 0)  # the first key some row of the block may not see
        if first < width:
            i = torch.arange(a, b, device=scores.device)[:, None] + call.q_offset
            j = torch.arange(width - 1 - first, -1, -1, device=scores.device)[None, :] + first
            scores[..., : width - first].masked_fill_(j > i, -math.inf)


def weights(p: Plan, block: int, arena: Arena) -> Any:
    """The softmax of a block's scores, keys reversed; rows with no allowed key are zeros."""
    scores = logits(p, block, arena)
    torch.ops.aten._softmax.out(scores, -1, False, out=scores)
    if p.mask is not None or p.dense is not None:  # a row with no allowed key (a mask, or a
        torch.nan_to_num_(scores, nan=0.0)  # dense term of -inf: a bias that masks): 0 wanted
    return scores


def form_attention(form: DistanceForm, flipped: tuple[Any, Any] | None = None,
                   dense: Any = None) -> Any:
    """Attention of a call in the distance form, a block of query rows at a time.

    Returns ``(..., t_q, d_v)``, the broadcast batch of every array of the
    form; `flipped` and `dense` as `plan` takes them. See the module docstring.

    Examples
    --------
    >>> import torch
    >>> import relpos_ref as rp
    >>> from relpos_ref.lowering import lower
    >>> q = k = v = torch.eye(4, dtype=torch.float64)[None]
    >>> table = torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(3, 4)
    >>> out = form_attention(lower("shaw", q, k, v, table, table, causal=True))
    >>> with rp.kernels.disabled():
    ...     bool(torch.allclose(out, rp.shaw_attention(q, k, v, table, table, causal=True)))
    True
    """
    p = plan(form, flipped, dense)
    call = form.call
    out = p.v.new_zeros((p.v.shape[0], call.t_q, p.v.shape[-1]))
    arena = arena_for(p)
    n_all = call.t_q + call.t_k - 1
    for block, (a, b, width) in enumerate(p.blocks):
        arena.reset()
        w = weights(p, block, arena)
        part = torch.bmm(w, p.v[:, call.t_k - width:])
        start, _ = window(call, a, b, width)
        for values in p.values:
            columns, rows = binned(values, w, start, n_all, arena, max_pieces=MAX_PIECES)
            part += times_rows(columns, values.table, rows)
        out[:, a:b] = part
    return out.reshape(*p.lead, call.t_q, p.v.shape[-1])


def arena_for(p: Plan) -> Arena:
    """An `Arena` for the blocks of a call: room for a few windows of its largest block."""
    if not p.blocks:
        return Arena(p.q, 0)
    rows = max(b - a for a, b, _ in p.blocks)
    return Arena(p.q, 4 * p.q.shape[0] * rows * (p.form.call.t_k + 2 * rows))
