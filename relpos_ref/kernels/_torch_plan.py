r"""What the torch block engine reads of a call: its plan, computed once per call.

`plan` takes a `relpos_ref.lowering.DistanceForm` of torch tensors and
returns a `Plan`: the contents with the keys reversed (``k~``, ``v~``), each
term in the form its blocks read (a `Term`: a product per call or per block,
a table by reversed distance, a key product, pairs or a 2-D table), the
biases by distance summed into one row, the relative values with their runs,
a dense term, and the blocks of query rows (`rows_per_block`: about
`BLOCK_BYTES` of scores; under causal structure only the keys some row of a
block may see). `relpos_ref.kernels._torch_form` evaluates the blocks
forward, `relpos_ref.kernels._torch_form_vjp` backward. Nothing here
validates.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from ..lowering import DistanceForm, IndexMap
from . import _torch_key_terms
from ._torch_blocks import Runs, extended, flat, runs_of_map
from ._torch_key_terms import key_product
from ._torch_pairs import grid_table, structure

__all__ = [
    "BLOCK_BYTES", "GATHER_SHARE", "MIN_ROWS", "Plan", "Term", "Values", "dense_term", "fits",
    "key_spans", "lead_axes", "plan", "row_spans", "rows_per_block", "window",
]

#: Bytes of a block's scores (all leading axes): a block's work stays in cache.
BLOCK_BYTES = 2**21

#: Fewest query rows in a block (products of fewer rows are slow).
MIN_ROWS = 16

#: A by-distance table with at most this share of the keys' count in rows is read from one
#: product ``(s A) a^T`` per call; a longer one per block from the window's rows ("dense").
GATHER_SHARE = 0.5


def rows_per_block(lead: tuple[int, ...], t_k: int, itemsize: int,
                   block_bytes: int | None = None) -> int:
    """Query rows per block: about `block_bytes` (`BLOCK_BYTES`) of scores, at least `MIN_ROWS`.

    Examples
    --------
    >>> rows_per_block((1, 8), 1024, 4)
    64
    """
    size = BLOCK_BYTES if block_bytes is None else block_bytes
    return max(MIN_ROWS, size // max(1, math.prod(lead) * t_k * itemsize))


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
    spans: Any = None  # gather: {a: (lo, hi)}, the rows block a's window reads; keys: a list,
    # per tile of keys, of the rows its blocks read (`row_spans`, `key_spans`)


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
    return torch.where(index.rows < 0, m, index.rows).flip(0).to(torch.int64)


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
         dense: Any = None, block_bytes: int | None = None) -> Plan:
    """What a call's blocks read: the contents with the keys reversed, one product per term.

    `flipped`: ``k'`` and ``v`` with their keys already reversed (a blocked
    call reverses them once for all its tiles). `dense`: a dense term
    ``(..., t_q, t_k)`` with its keys already reversed, added to the scores
    as the form's own dense terms are (a kernel that makes its bias in that
    order: no copy to reverse it); a causal call reads only the keys each
    block of rows may see. `block_bytes`: about how many bytes of scores a block holds
    (`BLOCK_BYTES` if not given).
    """
    call, s = form.call, form.call.scale
    lead = lead_axes(form, dense)
    q = flat(form.q * s, lead).contiguous()
    flipped = (form.k.flip(-2), form.v.flip(-2)) if flipped is None else flipped
    k, v = (flat(x, lead).contiguous() for x in flipped)
    rows = max(1, rows_per_block(lead, call.t_k, q.element_size(), block_bytes))
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
            reversed_rows = _reversed_rows(term.index, m)
            terms.append(Term("gather", flat(term.vectors, lead), table=table,
                              rows=reversed_rows, runs=runs_of_map(term.index.rows),
                              spans=row_spans(reversed_rows, call, blocks)))
        else:
            by_distance = table[..., torch.where(term.index.rows < 0, m, term.index.rows), :]
            by_distance = by_distance.flip(-2)
            if by_distance.dim() > 2:
                by_distance = flat(by_distance, lead).contiguous()
            terms.append(Term("dense", flat(term.vectors, lead), table=by_distance))
    for term in form.key_terms:
        reversed_rows = _reversed_rows(term.index, term.table.shape[-2])
        spans = key_spans(reversed_rows, call, blocks)
        terms.append(Term("keys", key_product(term, lead, s, spans), rows=reversed_rows,
                          runs=runs_of_map(term.index.rows), spans=spans))
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
                             runs_of_map(term.index.rows)))
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


def row_spans(rows: Any, call: Any, blocks: Any) -> dict[int, tuple[int, int]]:
    """``{a: (lo, hi)}``: the first and last table row the window of block ``(a, b, width)``
    reads in the reversed map `rows` (`window`).

    A block's product with a table needs only those rows: DeBERTa's first and
    last blocks of rows reach about 320 of its 512 (t = 1024, span 256).

    Examples
    --------
    >>> import torch
    >>> from relpos_ref.calls import Call
    >>> rows = torch.tensor([4, 4, 3, 2, 1, 0, 0])  # four positions, clipped at both ends
    >>> row_spans(rows, Call(None, (), 4, 4, 1, 1.0, False, 0), ((0, 2, 4), (2, 4, 4)))
    {0: (1, 4), 2: (0, 3)}
    """
    host = rows.cpu().numpy()
    out = {}
    for a, b, width in blocks:
        start, n = window(call, a, b, width)
        seen = host[start:start + n]
        out[a] = (int(seen.min()), int(seen.max()))
    return out


def key_spans(rows: Any, call: Any, blocks: Any) -> list[tuple[int, int] | None]:
    """Per tile of `KEY_TILE` keys (reversed), the first and last table row its blocks read in
    the reversed map `rows` (``None``: no block reads the tile).

    Pair ``(i, g)`` (query ``i``, reversed key ``g``) reads entry ``i + g``;
    the blocks of rows a tile meets read one run of entries.

    Examples
    --------
    >>> import torch
    >>> from relpos_ref.calls import Call
    >>> rows = torch.tensor([4, 4, 3, 2, 1, 0, 0])
    >>> key_spans(rows, Call(None, (), 4, 4, 1, 1.0, True, 0), ((0, 2, 2), (2, 4, 4)))
    [(0, 4)]
    """
    tile = _torch_key_terms.KEY_TILE
    count = -(-call.t_k // tile)
    first: list[int | None] = [None] * count
    last: list[int | None] = [None] * count
    for a, b, width in blocks:
        for t in range((call.t_k - width) // tile, count):
            g0, g1 = max(t * tile, call.t_k - width), min((t + 1) * tile, call.t_k)
            first[t] = a + g0 if first[t] is None else min(first[t], a + g0)
            last[t] = b + g1 - 2 if last[t] is None else max(last[t], b + g1 - 2)
    host = rows.cpu().numpy()
    return [None if lo is None else (int(host[lo:hi + 1].min()), int(host[lo:hi + 1].max()))
            for lo, hi in zip(first, last, strict=True)]


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
