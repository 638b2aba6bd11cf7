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

__all__ = ["add_pairs", "pairs_backward", "structure"]


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
