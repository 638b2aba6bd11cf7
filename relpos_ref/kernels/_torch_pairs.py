"""Terms by coordinates in the torch block engine: grid2d's rows and columns, Swin's bias.

A term whose map is not by distance (`relpos_ref.lowering.IndexMap` with
``query`` and ``key`` coordinates) is read pair by pair: row
``rows[key[j] - query[i] - low]`` of its product (``(L, t_q, m + 1)``, a query
side term) or of its bias table (``(L, m + 1)``). Where the keys' coordinate
is constant on runs of equal length (grid2d's row of a token) or periodic
(its column) the term depends on ``j`` only through that coordinate: it is
read once per distinct coordinate and spread over the keys by a view
(`structure`), so no ``(r, t_k)`` index is built. Blocks hold the keys
reversed (`relpos_ref.kernels._torch_form`), and so does `structure`.
"""

from __future__ import annotations

from typing import Any

import torch

from ..lowering import IndexMap

__all__ = ["add_grid", "add_pairs", "grid_backward", "grid_table", "pairs_backward", "structure"]


def structure(key: Any) -> tuple[str, int, Any] | None:
    """``("runs", w, values)``: coordinates constant on runs of ``w``; ``("period", w, values)``:
    periodic with period ``w``; ``None``: neither. Of the keys reversed, as blocks hold them.

    Examples
    --------
    >>> import torch
    >>> structure(torch.tensor([0, 0, 1, 1, 2, 2]))
    ('runs', 2, tensor([2, 1, 0]))
    >>> structure(torch.tensor([0, 1, 2, 0, 1, 2]))[:2], structure(torch.tensor([0, 1, 1]))
    (('period', 3), None)
    """
    keys = key.flip(0)
    host = keys.tolist()
    n = len(host)
    w = next((j for j in range(1, n) if host[j] != host[0]), n)
    if w > 1 and n % w == 0 and all(host[j] == host[j - j % w] for j in range(n)):
        return ("runs", w, keys[::w])
    w = next((j for j in range(1, n) if host[j] == host[0]), n)
    if w < n and n % w == 0 and all(host[j] == host[j % w] for j in range(n)):
        return ("period", w, keys[:w])
    return None


def _rows(index: IndexMap, keys: Any, a: int, b: int, m: int) -> Any:
    # the table row of rows a .. b - 1 against `keys` (coordinates), -1 as m: (r, len(keys))
    found = index.rows[keys[None, :] - (index.query[a:b, None] + index.low)]
    return torch.where(found < 0, m, found)


def _read(x: Any, rows: Any, a: int, b: int, *, bias: bool) -> Any:
    # the term at rows (r, c) of its table, for query rows a .. b - 1: (L, r, c)
    if bias:
        return x[:, rows]
    x = x[:, a:b]
    return torch.gather(x, -1, rows.expand(x.shape[0], *rows.shape))


def add_pairs(scores: Any, x: Any, index: IndexMap, keys: tuple[str, int, Any] | None,
              a: int, b: int, *, bias: bool) -> None:
    """Add a term by coordinates to the scores ``(L, r, width)`` of rows ``a .. b - 1``
    (keys ``width - 1 .. 0``); `keys` is the keys' `structure` (used when the block has
    every key)."""
    width, t_k, m = scores.shape[-1], index.key.shape[0], x.shape[-1] - 1
    if keys is not None and width == t_k:
        kind, w, values = keys
        found = _read(x, _rows(index, values, a, b, m), a, b, bias=bias)  # (L, r, u)
        spread = scores.unflatten(-1, (t_k // w, w))
        spread += found[..., None] if kind == "runs" else found[..., None, :]
        return
    rows = _rows(index, index.key.flip(0)[t_k - width:], a, b, m)
    scores += _read(x, rows, a, b, bias=bias)


def pairs_backward(acc: Any, grad: Any, index: IndexMap, keys: tuple[str, int, Any] | None,
                   a: int, b: int, *, bias: bool) -> None:
    """The transpose of `add_pairs`: ``grad`` ``(L, r, width)`` summed into ``acc`` by the row
    each pair read (``acc`` ``(L, t_q, m + 1)``, or ``(L, m + 1)`` for a bias)."""
    width, t_k, m = grad.shape[-1], index.key.shape[0], acc.shape[-1] - 1
    if keys is not None and width == t_k:
        kind, w, values = keys
        rows = _rows(index, values, a, b, m)
        per = grad.unflatten(-1, (t_k // w, w))
        per = per.sum(-1) if kind == "runs" else per.sum(-2)  # (L, r, u)
    else:
        rows = _rows(index, index.key.flip(0)[t_k - width:], a, b, m)
        per = grad
    if bias:
        acc.scatter_add_(-1, rows.reshape(1, -1).expand(acc.shape[0], -1),
                         per.reshape(acc.shape[0], -1))
    else:
        acc[:, a:b].scatter_add_(-1, rows.expand(*per.shape[:-1], rows.shape[-1]), per)


def grid_table(x: Any, index: IndexMap) -> tuple[Any, Any] | None:
    """A bias by coordinates that lie on a row-major ``H x W`` grid, as one 2-D table.

    When queries and keys share their coordinates and those are
    ``c0 + A y + B x`` for token ``y W + x`` (Swin's ``y (2 W_w - 1) + x``),
    the bias of a pair depends on ``(dy, dx)`` alone: ``F[dy + H - 1, dx + W - 1]``.
    Returns ``(F flipped in both axes, rows)`` (``(L, 2H - 1, 2W - 1)``, and
    the rows of `x` it reads, for the backward pass), or ``None``. Keys
    reversed, query ``(y, x)`` reads ``F~[y + y~, x + x~]``: a view
    (`add_grid`).
    """
    if index.query is not index.key or index.key.shape[0] < 2:
        return None
    c = index.key.tolist()
    n, step = len(c), c[1] - c[0]
    w = next((j for j in range(1, n) if c[j] - c[j - 1] != step), n)
    if n % w:
        return None
    a = c[w] - c[0] if w < n else 0
    if any(c[j] != c[0] + a * (j // w) + step * (j % w) for j in range(n)):
        return None
    h, device = n // w, index.rows.device
    dy = torch.arange(-(h - 1), h, device=device)[:, None]
    dx = torch.arange(-(w - 1), w, device=device)[None, :]
    at = a * dy + step * dx - index.low
    if int(at.min()) < 0 or int(at.max()) >= index.rows.shape[0]:
        return None
    rows = index.rows[at]
    rows = torch.where(rows < 0, x.shape[-1] - 1, rows)
    return x[:, rows].flip(-1, -2).contiguous(), rows


def _groups(a: int, b: int, w: int) -> list[tuple[int, int, int]]:
    # (first row, grid row y, column x0) of each run of queries a .. b - 1 on one grid row
    out, i = [], a
    while i < b:
        y, x0 = divmod(i, w)
        out.append((i, y, x0))
        i += min(w - x0, b - i)
    return out


def add_grid(scores: Any, table: Any, w: int, a: int, b: int) -> None:
    """Add `grid_table`'s bias to the scores ``(L, r, H W)`` of rows ``a .. b - 1``."""
    lanes, width = scores.shape[0], scores.shape[-1]
    h, span = width // w, table.shape[-1]
    for i, y, x0 in _groups(a, b, w):
        count = min(w - x0, b - i)
        view = table.as_strided((lanes, count, h, w), (table.stride(0), 1, span, 1),
                                table.storage_offset() + y * span + x0)
        scores[:, i - a:i - a + count].view(lanes, count, h, w).add_(view)


def grid_backward(acc: Any, grad: Any, w: int, a: int, b: int) -> None:
    """The transpose of `add_grid`: ``grad`` summed into ``acc`` (``(L, 2H - 1, 2W - 1)``)."""
    lanes, width = grad.shape[0], grad.shape[-1]
    h = width // w
    for i, y, x0 in _groups(a, b, w):
        count = min(w - x0, b - i)
        part = grad[:, i - a:i - a + count].view(lanes, count, h, w).transpose(1, 2)
        # (L, H, count, count + W - 1): entry (y~, x', x' + x~), summed over x'
        laid = grad.new_zeros((lanes, h, count, count + w - 1))
        laid.as_strided(part.shape, (*laid.stride()[:2], count + w, 1)).copy_(part)
        acc[:, y:y + h, x0:x0 + count + w - 1] += laid.sum(-2)
