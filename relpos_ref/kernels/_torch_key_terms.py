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

from ._torch_blocks import Arena, extended, flat, hankel, select

__all__ = ["KEY_TILE", "add_keys", "key_product", "key_tiles", "keys_backward"]

#: Keys per tile of a key-side term.
KEY_TILE = 128


def key_product(term: Any, lead: tuple[int, ...], s: float) -> Any:
    """``(tiles, L, m + 1, KEY_TILE)``: ``(s B) b^T`` of each tile of keys (reversed), contiguous.

    `term` is a `relpos_ref.lowering.SideTerm` (``vectors`` the keys, ``table``
    ``B``), `lead` the call's broadcast batch, `s` the scale; row ``m`` is
    zeros (what the map's ``-1`` reads).
    """
    table = extended(term.table * s, -2)
    keys = flat(term.vectors.flip(-2), lead)
    lanes, t_k = keys.shape[0], keys.shape[-2]
    count = -(-t_k // KEY_TILE)
    table = table.expand(lanes, *table.shape[-2:]) if table.dim() == 2 else flat(table, lead)
    out = keys.new_empty((count, lanes, table.shape[-2], KEY_TILE))
    for tile in range(count):
        part = keys[:, tile * KEY_TILE:(tile + 1) * KEY_TILE]
        if part.shape[-2] == KEY_TILE:
            torch.bmm(table, part.mT, out=out[tile])
        else:  # the last tile, in part (its other columns are never read)
            out[tile, ..., :part.shape[-2]] = torch.bmm(table, part.mT)
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


def add_keys(scores: Any, term: Any, start: int, width: int, t_k: int, arena: Arena) -> None:
    """``scores[..., i', jj] +=`` the term, per tile of keys: ``(L, r + tile - 1, tile)`` rows
    of the key product picked by the block's window (from `start`), entry ``(i' + jj, jj)``."""
    r = scores.shape[-2]
    for tile, t0, t1 in key_tiles(width, t_k):
        size = t1 - t0
        x = term.x[tile]
        offset = t0 + t_k - width - tile * KEY_TILE
        if size < KEY_TILE:
            x = x[..., offset:offset + size]
        mark = arena.used
        found = select(x, term.rows[start + t0:start + t1 + r - 1], arena)
        scores[..., t0:t1] += hankel(found, r, size, row=size, col=size + 1)
        arena.reset(mark)


def keys_backward(acc: Any, grad: Any, term: Any, start: int, width: int, t_k: int,
                  arena: Arena) -> None:
    """The block's logit gradient `grad` added into the key product's gradient `acc` where
    `add_keys` read the term: pair ``(i', jj)`` of a tile at its row of the window
    (``i' + jj``) and its key's column, one scatter-add per tile."""
    r, lanes, tile_width = grad.shape[-2], grad.shape[0], acc.shape[-1]
    for tile, t0, t1 in key_tiles(width, t_k):
        size = t1 - t0
        offset = t0 + t_k - width - tile * tile_width
        rows = hankel(term.rows[start + t0:start + t1 + r - 1], r, size, row=1, col=1, axes=1)
        index = rows * tile_width + torch.arange(offset, offset + size, device=rows.device)
        mark = arena.used
        part = arena.take(lanes, r, size).copy_(grad[..., t0:t1])
        acc[tile].view(acc.shape[1], -1).scatter_add_(
            1, index.reshape(1, -1).expand(lanes, -1), part.view(lanes, -1))
        arena.reset(mark)
