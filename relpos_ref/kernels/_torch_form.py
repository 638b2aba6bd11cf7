r"""A distance form on torch, a block of query rows at a time: the torch kernels' engine.

`form_attention` evaluates a `relpos_ref.lowering.DistanceForm` whose arrays
are torch tensors one block of ``r`` query rows at a time (`rows_per_block`:
about `BLOCK_BYTES` of scores), so that no ``(t_q, t_k)`` array of the call
exists, only a block's ``(r, w)`` against the ``w`` keys it may see:

.. math::
    L_b = (s q'_b) \tilde k^\top + \sum_t \text{terms}, \qquad
    \text{out}_b = \operatorname{softmax}(L_b)\, \tilde v
                   + \sum_t \operatorname{bins}_t(w_b)\, V_t

**Keys reversed.** A block holds key ``w - 1 - j`` in its column ``j~``
(``k~`` and ``v~`` are flipped once per call), so that a term of the distance
``r = j - i - q_offset`` depends on ``u = i' + j~``, the block's window of
``r + w - 1`` distances, largest first (`window`): a strided view with
positive strides reads it (`relpos_ref.kernels._torch_blocks.hankel`; torch
has no negative strides).

- Query-side terms by distance: ``"gather"`` reads rows of ``(s A) a^T``
  (one product per call, ``(m + 1, t_q)`` with a zero row for "no term",
  arranged block by block) picked by ``index_select``, which copies whole
  rows: for a map of few runs (Shaw's, clipped at both ends) a clipped end
  is a constant per row added over a rectangle and two triangles
  (`relpos_ref.kernels._torch_blocks.add_constant`), and only the band is
  picked; ``"dense"`` multiplies ``s a_b`` with the window's table rows,
  one per distance (general, music, Transformer-XL: tables of about as many
  rows as keys).
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
from typing import Any, NamedTuple

import torch

from ..lowering import DistanceForm, IndexMap
from ._torch_blocks import (
    Arena,
    Runs,
    add_by_rows,
    binned,
    extended,
    flat,
    hankel,
    times_rows,
)
from ._torch_key_terms import add_keys, key_product
from ._torch_pairs import add_grid, add_pairs, grid_table, structure

__all__ = [
    "BLOCK_BYTES", "Plan", "add_terms", "arena_for", "fits", "form_attention", "gather_product",
    "lead_axes",
    "plan", "rows_per_block", "weights", "window",
]

#: Bytes of a block's scores (all leading axes): a block's work stays in cache.
BLOCK_BYTES = 2**21

#: Fewest query rows in a block (products of fewer rows are slow).
MIN_ROWS = 16

#: A by-distance table with at most this share of the keys' count in rows is read from one
#: product ``(s A) a^T`` per call; a longer one per block from the window's rows ("dense").
GATHER_SHARE = 0.5

#: A window crossing more runs of a map than this reads it distance by distance.
MAX_PIECES = 8

def rows_per_block(lead: tuple[int, ...], t_k: int, itemsize: int) -> int:
    """Query rows per block: about `BLOCK_BYTES` of scores, at least `MIN_ROWS`.

    Examples
    --------
    >>> import torch
    >>> rows_per_block((1, 8), 1024, 4)
    64
    """
    return max(MIN_ROWS, BLOCK_BYTES // max(1, math.prod(lead) * t_k * itemsize))


def window(call: Any, a: int, b: int, width: int) -> tuple[int, int]:
    """``(start, n)``: rows ``a .. b - 1`` against ``width`` keys read the ``n = r + width - 1``
    distances ``start .. start + n - 1`` of the reversed map (largest distance first).

    Entry ``start + i' + j~`` is the distance of row ``a + i'`` and key
    ``width - 1 - j~``.

    Examples
    --------
    >>> import torch
    >>> from relpos_ref.calls import Call
    >>> window(Call(None, (), 4, 4, 1, 1.0, False, 0), 2, 4, 4)  # r = 3 .. -3; 1 .. -3 reached
    (2, 5)
    """
    n = b - a + width - 1
    return call.t_q + call.t_k - 1 - (call.t_q - b) - n, n


class Term(NamedTuple):
    """A term as the blocks read it (`plan`); see the module docstring for the kinds."""

    kind: str  # "gather", "dense", "keys", "pairs", "pair_bias", "grid_bias"
    x: Any  # gather, dense: vectors (L, t_q, d); keys: (tiles, L, m + 1, tile), the product;
    # pairs: (L, t_q, m + 1), the product; pair_bias, grid_bias: (L, m + 1), the table
    table: Any = None  # gather: (1 or L, m + 1, d) times the scale; dense: the same table's
    # rows by reversed distance, (n, d) or (L, n, d); grid_bias: its 2-D table (`grid_table`)
    rows: Any = None  # by distance: reversed rows (-1 as m)
    runs: Runs | None = None  # gather: the map's runs
    index: IndexMap | None = None  # pairs
    keys: tuple[str, int, Any] | None = None  # pairs: the keys' `structure`


class Values(NamedTuple):
    """A relative-value term: ``table`` ``(1 or L, m + 1, d_v)`` (a zero row last), its
    reversed rows per distance (``-1`` as ``m``) and its map's `Runs`."""

    table: Any
    rows: Any
    runs: Runs


class Plan(NamedTuple):
    """What the blocks of a call read, computed once (`plan`)."""

    form: DistanceForm
    lead: tuple[int, ...]
    q: Any  # (L, t_q, d) times the scale
    k: Any  # (L, t_k, d) keys reversed
    v: Any  # (L, t_k, d_v) keys reversed
    mask: Any  # (..., t_q or 1, t_k) keys reversed, or None
    terms: tuple[Term, ...]
    bias: Any  # the biases by distance, summed, reversed: (L, n), or None
    values: tuple[Values, ...]
    blocks: tuple[tuple[int, int, int], ...]  # (a, b, width)
    dense: Any = None  # s P + B of the form's dense terms, keys reversed: (1 or L, t_q, t_k)


def fits(form: DistanceForm) -> bool:
    """Whether `plan` takes the form: key-side terms and relative values by distance."""
    return all(t.index.by_distance for t in (*form.key_terms, *form.values))


def _reversed_rows(index: IndexMap, m: int) -> Any:
    return torch.where(index.rows < 0, m, index.rows).flip(0)


def lead_axes(form: DistanceForm, dense: Any = None) -> tuple[int, ...]:
    """The call's batch: every array of the form (and `dense`) broadcast, but their last axes.

    Examples
    --------
    >>> import torch
    >>> from relpos_ref.lowering import lower
    >>> x = torch.zeros(3, 2)
    >>> lead_axes(lower("shaw", x, x, x, x, mask=torch.ones(5, 3, 3, dtype=torch.bool)))
    (5,)
    """
    shapes = [form.q.shape[:-2], form.k.shape[:-2], form.v.shape[:-2]]
    shapes += [t.vectors.shape[:-2] for t in (*form.query_terms, *form.key_terms)]
    shapes += [t.table.shape[:-2] for t in (*form.query_terms, *form.key_terms, *form.values)]
    shapes += [t.table.shape[:-1] for t in form.biases]
    if form.mask is not None:
        shapes.append(form.mask.shape[:-2])
    shapes += [x.shape[:-2] for x in (*form.dense, dense) if x is not None]
    return tuple(torch.broadcast_shapes(*shapes))


def plan(form: DistanceForm, flipped: tuple[Any, Any] | None = None,
         dense: Any = None) -> Plan:
    """What a call's blocks read: the contents with the keys reversed, one product per term.

    `flipped`: ``k'`` and ``v`` with their keys already reversed (a blocked
    call reverses them once for all its tiles). `dense`: a dense term
    ``(..., t_q, t_k)`` with its keys already reversed, added to the scores
    as the form's own dense terms are (a kernel that makes its bias in that
    order: no copy to reverse it); a causal call reads only the keys each
    block of rows may see.
    """
    call, s = form.call, form.call.scale
    lead = lead_axes(form, dense)
    q = flat(form.q * s, lead).contiguous()
    flipped = (form.k.flip(-2), form.v.flip(-2)) if flipped is None else flipped
    k, v = (flat(x, lead).contiguous() for x in flipped)
    rows = max(1, rows_per_block(lead, call.t_k, q.element_size()))
    blocks = _blocks(call, rows)
    terms, bias = [], None
    for term in form.query_terms:
        m = term.table.shape[-2]
        table = extended(term.table * s, -2)
        if not term.index.by_distance:
            x = flat(torch.matmul(term.vectors, table.mT), lead).contiguous()
            terms.append(Term("pairs", x, index=term.index, keys=structure(term.index.key)))
        elif m <= GATHER_SHARE * call.t_k:  # its product with a block's vectors, per block
            table = table[None] if table.dim() == 2 else flat(table, lead).contiguous()
            terms.append(Term("gather", flat(term.vectors, lead), table=table,
                              rows=_reversed_rows(term.index, m),
                              runs=Runs.of(term.index.rows.tolist())))
        else:
            by_distance = table[..., torch.where(term.index.rows < 0, m, term.index.rows), :]
            by_distance = by_distance.flip(-2)
            if by_distance.dim() > 2:
                by_distance = flat(by_distance, lead).contiguous()
            terms.append(Term("dense", flat(term.vectors, lead), table=by_distance))
    for term in form.key_terms:
        terms.append(Term("keys", key_product(term, lead, s),
                          rows=_reversed_rows(term.index, term.table.shape[-2])))
    for term in form.biases:
        table = extended(term.table, -1)
        if term.index.by_distance:
            row = table[..., torch.where(term.index.rows < 0, term.table.shape[-1],
                                         term.index.rows)]
            bias = row if bias is None else bias + row
        else:
            table = flat(table, lead, 1)
            grid = None if call.causal else grid_table(table, term.index)
            if grid is None:
                terms.append(Term("pair_bias", table, index=term.index,
                                  keys=structure(term.index.key)))
            else:  # Swin's: a window of one 2-D table per query
                width = call.t_k // (grid[0].shape[-2] // 2 + 1)
                terms.append(Term("grid_bias", table, table=grid[0], rows=grid[1],
                                  index=term.index, keys=("grid", width, None)))
    values = []
    for term in form.values:
        table = extended(term.table, -2)
        table = table[None] if table.dim() == 2 else flat(table, lead)
        values.append(Values(table, _reversed_rows(term.index, term.table.shape[-2]),
                             Runs.of(term.index.rows.tolist())))
    mask = form.mask
    if mask is not None:  # (..., t_q or 1, t_k), keys reversed
        mask = mask.reshape((1,) * (2 - mask.dim()) + tuple(mask.shape))
        mask = mask.expand(*mask.shape[:-1], call.t_k).flip(-1)
    if bias is not None:
        bias = flat(bias.flip(-1), lead, 1).contiguous()
    if dense is None:
        dense = dense_term(form, lead)
    elif any(x is not None for x in form.dense):
        raise ValueError("`dense` is for a form without dense terms of its own")
    else:
        dense = _lanes(dense, lead)
    return Plan(form, lead, q, k, v, mask, tuple(terms), bias, tuple(values), blocks, dense)


def _lanes(term: Any, lead: tuple[int, ...]) -> Any:
    # (..., t_q, t_k) as (1, t_q, t_k) where it has no batch, else (L, t_q, t_k)
    if math.prod(term.shape[:-2]) == 1:
        return term.reshape(1, *term.shape[-2:])
    return flat(term, lead).contiguous()


def dense_term(form: DistanceForm, lead: tuple[int, ...]) -> Any:
    """``s P + B`` of the form's dense ``position`` ``P`` and ``bias`` ``B``, keys reversed:
    ``(1, t_q, t_k)`` where it has no batch, else ``(L, t_q, t_k)`` (one copy); or ``None``.

    Examples
    --------
    >>> import torch
    >>> from relpos_ref.lowering import lower
    >>> q, k = torch.zeros(2, 4), torch.zeros(3, 4)  # two queries, three keys
    >>> form = lower("plain", q, k, k, bias=torch.arange(6.0).reshape(2, 3))
    >>> dense_term(form, ())
    tensor([[[2., 1., 0.],
             [5., 4., 3.]]])
    """
    position, bias = form.dense
    if position is None and bias is None:
        return None
    term = None if position is None else position * form.call.scale
    if bias is not None:
        term = bias if term is None else term + bias
    call = form.call
    term = term.reshape((1,) * (2 - term.dim()) + tuple(term.shape))
    return _lanes(term.expand(*term.shape[:-2], call.t_q, call.t_k).flip(-1), lead)


def _blocks(call: Any, rows: int) -> tuple[tuple[int, int, int], ...]:
    # (a, b, width): rows a .. b - 1 against keys 0 .. width - 1; under causal, rows that
    # see no key are left out, and a block reads only the keys some of its rows may see
    first = min(max(-call.q_offset, 0), call.t_q) if call.causal else 0
    out = []
    for a in range(first, call.t_q, rows):
        b = min(a + rows, call.t_q)
        out.append((a, b, min(call.t_k, b + call.q_offset) if call.causal else call.t_k))
    return tuple(out)


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


def add_terms(scores: Any, p: Plan, a: int, b: int, width: int, arena: Arena) -> None:
    """Every term of the plan added to the ``(L, r, width)`` `scores` of rows ``a .. b - 1``
    (keys reversed), before the mask; `arena` for the temporaries."""
    call, r = p.form.call, b - a
    t_k, n_all = call.t_k, call.t_q + call.t_k - 1
    start, n = window(call, a, b, width)
    for term in p.terms:
        if term.kind == "gather":
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


def gather_product(term: Term, a: int, b: int, arena: Arena) -> Any:
    """``(s A) a_b^T`` of a "gather" term for rows ``a .. b - 1``: ``(L, m + 1, r)``."""
    vectors = term.x[:, a:b]
    out = arena.take(vectors.shape[0], term.table.shape[-2], b - a)
    return torch.bmm(term.table.expand(vectors.shape[0], *term.table.shape[-2:]), vectors.mT,
                     out=out)


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
