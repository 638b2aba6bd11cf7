r"""A key-side term by distance in the torch block engine (DeBERTa's p2c), forward and back.

A key-side term adds :math:`s\, b_j \cdot B[\text{row}(i, j)]` to the
scores. Its product ``(s B) b^T`` is made once per call, a tile of
`KEY_TILE` keys (reversed, as the engine holds them) at a time
(`key_product`); a block of rows reads, per tile, the rows of that product
its window of distances picks (whole rows copied), and adds the diagonal band
pair ``(i', jj)`` reads, entry ``(i' + jj, jj)``, through a strided view
(`add_keys`). The backward pass lays the block's logit gradient out the same
way and adds it into the rows of the product's gradient (`keys_backward`).
Nothing here validates.
"""

from __future__ import annotations

from typing import Any

import torch

from ._torch_blocks import Arena, extended, flat, hankel, piece_count, pieces, select

__all__ = ["KEY_TILE", "add_keys", "key_gradients", "key_product", "key_tiles",
           "keys_backward"]

#: Keys per tile of a key-side term.
KEY_TILE = 128


def key_product(term: Any, lead: tuple[int, ...], s: float,
                spans: list[tuple[int, int] | None] | None = None) -> Any:
    """``(tiles, L, m + 1, KEY_TILE)``: ``(s B) b^T`` of each tile of keys (reversed), contiguous.

    `term` is a `relpos_ref.lowering.SideTerm` (``vectors`` the keys, ``table``
    ``B``), `lead` the call's broadcast batch, `s` the scale; row ``m`` is
    zeros (what the map's ``-1`` reads). `spans`: per tile, the rows its
    blocks read (`relpos_ref.kernels._torch_plan.key_spans`), the only rows
    made (the others are never read; ``None``: every row of every tile).
    """
    table = extended(term.table * s, -2)
    keys = flat(term.vectors.flip(-2), lead)
    lanes, t_k = keys.shape[0], keys.shape[-2]
    count = -(-t_k // KEY_TILE)
    table = table.expand(lanes, *table.shape[-2:]) if table.dim() == 2 else flat(table, lead)
    out = keys.new_empty((count, lanes, table.shape[-2], KEY_TILE))
    for tile in range(count):
        lo, hi = (0, table.shape[-2] - 1) if spans is None else spans[tile] or (0, -1)
        if hi < lo:
            continue
        part = keys[:, tile * KEY_TILE:(tile + 1) * KEY_TILE]
        rows = table[:, lo:hi + 1]
        if part.shape[-2] == KEY_TILE:
            torch.bmm(rows, part.mT, out=out[tile, :, lo:hi + 1])
        else:  # the last tile, in part (its other columns are never read)
            out[tile, :, lo:hi + 1, :part.shape[-2]] = torch.bmm(rows, part.mT)
    return out


def key_tiles(width: int, t_k: int) -> list[tuple[int, int, int]]:
    """``(tile, t0, t1)``: the tiles of a block's keys, block columns ``t0 .. t1 - 1``.

    Examples
    --------
    >>> key_tiles(200, 300)  # reversed keys 100 .. 299 against tiles of 128
    [(0, 0, 28), (1, 28, 156), (2, 156, 200)]
    """
    out, first = [], t_k - width  # the block's first key, reversed
    for tile in range(first // KEY_TILE, -(-t_k // KEY_TILE)):
        g0, g1 = max(tile * KEY_TILE, first), min((tile + 1) * KEY_TILE, t_k)
        out.append((tile, g0 - first, g1 - first))
    return out


def _one_row(term: Any, n_all: int, start: int, n: int) -> int | None:
    # the table row every distance of the window start .. start + n - 1 reads, if one does
    if piece_count(term.runs, n_all, start, n) != 1:
        return None
    (u_lo, u_hi, summed, row), = pieces(term.runs, n_all, start, n)
    return row if summed and u_lo == 0 and u_hi == n else None


def add_keys(scores: Any, term: Any, start: int, width: int, t_k: int, arena: Arena) -> None:
    """``scores[..., i', jj] +=`` the term, per tile of keys: ``(L, r + tile - 1, tile)`` rows
    of the key product picked by the block's window (from `start`), entry ``(i' + jj, jj)``."""
    r = scores.shape[-2]
    n_all = term.rows.shape[0]
    for tile, t0, t1 in key_tiles(width, t_k):
        size = t1 - t0
        x = term.x[tile]
        offset = t0 + t_k - width - tile * KEY_TILE
        if size < KEY_TILE:
            x = x[..., offset:offset + size]
        row = _one_row(term, n_all, start + t0, size + r - 1)
        if row is not None:  # one table row for every pair (a clipped end): a row of the
            scores[..., t0:t1] += x[:, row, None]  # product, added to every row of the block
            continue
        mark = arena.used
        found = select(x, term.rows[start + t0:start + t1 + r - 1], arena)
        scores[..., t0:t1] += hankel(found, r, size, row=size, col=size + 1)
        arena.reset(mark)


def keys_backward(acc: Any, grad: Any, term: Any, start: int, width: int, t_k: int,
                  arena: Arena) -> None:
    """The block's logit gradient `grad` added into the key product's gradient `acc` where
    `add_keys` read the term: pair ``(i', jj)`` of a tile at its row of the window
    (``i' + jj``) and its key's column, one scatter-add per tile (a sum over the rows where
    every pair of the tile read one row)."""
    r, lanes, tile_width = grad.shape[-2], grad.shape[0], acc.shape[-1]
    n_all = term.rows.shape[0]
    for tile, t0, t1 in key_tiles(width, t_k):
        size = t1 - t0
        offset = t0 + t_k - width - tile * tile_width
        row = _one_row(term, n_all, start + t0, size + r - 1)
        if row is not None:  # every pair read one row (a clipped end): the rows' sums go there
            acc[tile, :, row, offset:offset + size] += grad[..., t0:t1].sum(-2)
            continue
        rows = hankel(term.rows[start + t0:start + t1 + r - 1], r, size, row=1, col=1, axes=1)
        index = rows * tile_width + torch.arange(offset, offset + size, device=rows.device)
        mark = arena.used
        part = arena.take(lanes, r, size).copy_(grad[..., t0:t1])
        acc[tile].view(acc.shape[1], -1).scatter_add_(
            1, index.reshape(1, -1).expand(lanes, -1), part.view(lanes, -1))
        arena.reset(mark)


def key_gradients(acc: Any, term: Any, lead: tuple[int, ...], s: float) -> tuple[Any, Any]:
    """The gradients of a key-side term's keys and table from its product's, `acc`
    ``(tiles, L, m + 1, KEY_TILE)`` (`keys_backward`), a tile at a time: ``(*lead, t_k, d)``
    (keys in order) and ``(*lead, m, d)``, before summing to their arrays' shapes.

    Examples
    --------
    >>> import torch
    >>> from types import SimpleNamespace
    >>> term = SimpleNamespace(vectors=torch.ones(3, 2), table=torch.ones(1, 2))  # 3 keys
    >>> acc = torch.zeros(1, 1, 2, KEY_TILE)
    >>> acc[0, 0, 0, :3] = torch.tensor([1.0, 2.0, 3.0])  # row 0 of keys 2, 1, 0
    >>> d_keys, d_table = key_gradients(acc, term, (), 0.5)
    >>> d_keys[:, 0].tolist(), d_table.tolist()
    ([1.5, 1.0, 0.5], [[3.0, 3.0]])
    """
    m = term.table.shape[-2]
    keys = flat(term.vectors.flip(-2), lead)
    table = flat(term.table * s, lead)
    lanes, t_k = keys.shape[0], keys.shape[-2]
    table = table.expand(lanes, *table.shape[-2:])
    d_keys = keys.new_empty(keys.shape)
    d_table = table.new_zeros(lanes, m, keys.shape[-1])
    for tile in range(acc.shape[0]):
        g0, g1 = tile * KEY_TILE, min((tile + 1) * KEY_TILE, t_k)
        part = acc[tile, :, :m, :g1 - g0]
        torch.bmm(part.mT, table, out=d_keys[:, g0:g1])
        d_table.baddbmm_(part, keys[:, g0:g1])
    return (d_keys.reshape(*lead, t_k, -1).flip(-2),
            (d_table * s).reshape(*lead, m, -1))
