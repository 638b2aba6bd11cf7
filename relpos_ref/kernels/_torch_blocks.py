r"""Building blocks of the torch block engine: a block's window of distances, its runs.

The engine (`relpos_ref.kernels._torch_form`) holds a block of ``r`` query
rows against ``w`` keys with the keys reversed, so that pair ``(i', j~)``
reads the window's distance ``u = i' + j~`` (``r + w - 1`` of them, largest
first). Everything here works on ``(L, r, w)`` blocks (``L`` the flattened
leading axes) and their windows:

- `Arena`: one buffer per call from which every block's temporaries are
  carved (a fresh ``(L, r, w)`` array per block made the kernel page-fault
  its way through every call on a Linux VM: glibc returns large blocks to
  the system when they are freed, and takes them back page by page);
- `hankel`: a view of positive strides reading entry ``i' a + j~ b``;
- `Runs` and `pieces`: a map's distances grouped into runs that read one
  table row (a clipped end is one run: Shaw's, Music's), so that a term or
  a sum over a run is one rectangle and two small triangles of the block
  (`region`), not a window laid out in full;
- `add_rows`, `add_constant`, `region_sums`, `laid_piece`: a term laid out
  by distance added to a block, a constant per row added over a run, a
  block summed over a run, a block's entries laid out by distance.

Nothing here validates its arguments.
"""

from __future__ import annotations

import bisect
import functools
import math
import threading
from typing import Any, NamedTuple

import torch

__all__ = [
    "KEPT_BYTES", "Arena", "Runs", "add_by_rows", "add_constant", "add_rows", "binned",
    "extended", "flat", "hankel", "kept_array", "laid_piece", "laid_rows", "piece_count", "pieces",
    "region", "region_sums", "runs_of_map", "select", "times_rows",
]


class Arena:
    """Temporaries carved from one flat buffer: `take` a contiguous view, `reset` per block.

    The buffer grows (a new one) when a block needs more; views already
    taken keep the old one alive.

    Examples
    --------
    >>> import torch
    >>> arena = Arena(torch.zeros(()), 16)
    >>> a, b = arena.take(2, 3), arena.take(4)
    >>> a.shape, b.shape, arena.used
    (torch.Size([2, 3]), torch.Size([4]), 10)
    """

    def __init__(self, like: Any, size: int) -> None:
        self.buffer = like.new_empty(max(size, 1))
        self.used = 0

    def take(self, *shape: int) -> Any:
        """A contiguous array of `shape` (uninitialized) from the buffer."""
        n = math.prod(shape)
        if self.used + n > self.buffer.numel():
            self.buffer = self.buffer.new_empty(max(2 * self.buffer.numel(), self.used + n))
        out = self.buffer[self.used:self.used + n].view(shape)
        self.used += n
        return out

    def zeros(self, *shape: int) -> Any:
        """`take`, filled with zeros."""
        return self.take(*shape).zero_()

    def reset(self, mark: int = 0) -> None:
        """Every view taken since `mark` (a past `used`) may be overwritten from now on."""
        self.used = mark


#: On the CPU, `kept_array` keeps one array of at most this many bytes per thread for the
#: next call: glibc's allocator gives an array of 32 MiB or more fresh pages on every call
#: (t = 1024, 8 heads: general through `terms_attention` 62 ms a call against 49 with its
#: array kept).
KEPT_BYTES = 2**26

_KEPT = threading.local()


def kept_array(like: Any, shape: tuple[int, ...], slot: int = 0) -> Any:
    """An uninitialized array of `shape`, of `like`'s dtype and device: on the CPU, the
    thread's kept one of `slot` where it is large enough (each slot holds one of at most
    `KEPT_BYTES`).

    For a ``(t_q, t_k)``-sized array a kernel fills and reads within one call (terms, a
    dense bias in slot 0, its gradient in slot 1): the next call of the thread overwrites
    it, so no caller may hold it past its call. Not kept on other devices (a stream could
    still read it). Made outside `torch.inference_mode`, so that a call in that mode and
    one outside it share it. A thread holds at most two such arrays until it ends.

    Examples
    --------
    >>> import torch
    >>> a = kept_array(torch.zeros(()), (2, 3))
    >>> b = kept_array(torch.zeros(()), (3, 2))
    >>> a.shape, b.shape, a.data_ptr() == b.data_ptr()
    (torch.Size([2, 3]), torch.Size([3, 2]), True)
    """
    n = math.prod(shape)
    arrays = _KEPT.__dict__.setdefault("arrays", {})
    kept = arrays.get(slot)
    if (kept is not None and kept.dtype == like.dtype and kept.device == like.device
            and kept.numel() >= n):
        return kept[:n].view(shape)
    if like.device.type != "cpu" or n * like.element_size() > KEPT_BYTES:
        return like.new_empty(shape)
    with torch.inference_mode(False):  # a normal tensor: written later outside that mode too
        arrays[slot] = like.new_empty(n)
    return arrays[slot].view(shape)


def flat(x: Any, lead: tuple[int, ...], tail: int = 2) -> Any:
    """`x` broadcast to `lead` (its last `tail` axes kept) as ``(L, ...)``.

    Examples
    --------
    >>> import torch
    >>> flat(torch.zeros(3, 4, 5), (2, 3)).shape
    torch.Size([6, 4, 5])
    """
    return x.expand(*lead, *x.shape[x.dim() - tail:]).reshape(-1, *x.shape[x.dim() - tail:])


def extended(x: Any, axis: int) -> Any:
    """`x` with a zero entry appended along `axis` (row ``m``, which a map's ``-1`` reads).

    Examples
    --------
    >>> import torch
    >>> extended(torch.ones(2, 1), -2)
    tensor([[1.],
            [1.],
            [0.]])
    """
    shape = list(x.shape)
    shape[axis] = 1
    return torch.cat([x, x.new_zeros(shape)], dim=axis)


def hankel(x: Any, r: int, width: int, *, row: int, col: int, offset: int = 0,
           axes: int = 2) -> Any:
    """The ``(..., r, width)`` view ``x[.., offset + i' row + j~ col]`` over the last `axes` axes.

    Examples
    --------
    >>> import torch
    >>> hankel(torch.arange(5.0), 2, 4, row=1, col=1, axes=1)  # entry i' + j~
    tensor([[0., 1., 2., 3.],
            [1., 2., 3., 4.]])
    """
    lead = x.shape[:-axes]
    return x.as_strided((*lead, r, width), (*x.stride()[:len(lead)], row, col),
                        x.storage_offset() + offset)


class Runs(NamedTuple):
    """A map's distances grouped into runs that read one row (``rows`` in the map's order).

    A ``summed`` run is two or more distances reading one row; the others
    are stretches of distances each reading a row of its own; rows of
    ``-1`` belong to none.
    """

    starts: list[int]
    ends: list[int]
    summed: list[bool]
    rows: list[int]  # a summed run's row (-1 for the others)

    @classmethod
    def of(cls, rows: list[int] | tuple[int, ...]) -> Runs:
        """The runs of a map's ``rows`` (host integers), in order.

        Examples
        --------
        >>> Runs.of([0, 0, 0, 1, 2, 3, 3, -1])
        Runs(starts=[0, 3, 5], ends=[3, 5, 7], summed=[True, False, True], rows=[0, -1, 3])
        """
        out: tuple[list[Any], ...] = ([], [], [], [])
        c, n = 0, len(rows)
        while c < n:
            e = c + 1
            while e < n and rows[e] == rows[c]:
                e += 1
            if rows[c] >= 0:
                if e - c > 1:
                    _append(out, (c, e, True, rows[c]))
                elif out[1] and not out[2][-1] and out[1][-1] == c:
                    out[1][-1] = e
                else:
                    _append(out, (c, e, False, -1))
            c = e
        return cls(*out)


@functools.lru_cache(maxsize=64)
def _runs_of(rows: tuple[int, ...]) -> Runs:
    return Runs.of(rows)


def runs_of_map(rows: Any) -> Runs:
    """`Runs.of` a map's rows (an integer tensor), remembered for the next calls with that map
    (a call of a long sequence spends about 0.6 ms on each; read-only, shared).

    Examples
    --------
    >>> import torch
    >>> runs_of_map(torch.tensor([0, 0, 1])) is runs_of_map(torch.tensor([0, 0, 1]))
    True
    """
    return _runs_of(tuple(rows.tolist()))


def _append(parts: tuple[list[Any], ...], values: tuple[Any, ...]) -> None:
    for part, value in zip(parts, values, strict=True):
        part.append(value)


def piece_count(runs: Runs, n_all: int, start: int, n: int) -> int:
    """How many runs `pieces` finds in the window, by bisection (no list made).

    Examples
    --------
    >>> runs = Runs.of([0, 0, 0, 1, 2, 3, 3])  # distances 0 .. 6: three runs
    >>> piece_count(runs, 7, 0, 7), piece_count(runs, 7, 0, 2), piece_count(runs, 7, 4, 3)
    (3, 1, 1)
    """
    c_lo, c_hi = n_all - start - n, n_all - start
    return max(0, bisect.bisect_left(runs.starts, c_hi) - bisect.bisect_right(runs.ends, c_lo))


def pieces(runs: Runs, n_all: int, start: int, n: int) -> list[tuple[int, int, bool, int]]:
    """``(u_lo, u_hi, summed, row)``: the runs within a window, in the window's coordinates.

    The window holds entries ``start .. start + n - 1`` of the reversed map
    (`relpos_ref.kernels._torch_plan.window`): ``u`` is the distance
    ``c = n_all - 1 - start - u`` of the map. Ordered by ``u``.
    """
    c_lo, c_hi = n_all - start - n, n_all - start  # the window's distances, map order
    out = []
    for t in range(bisect.bisect_right(runs.ends, c_lo), len(runs.starts)):
        if runs.starts[t] >= c_hi:
            break
        lo, hi = max(runs.starts[t], c_lo), min(runs.ends[t], c_hi)
        out.append((n_all - start - hi, n_all - start - lo, runs.summed[t], runs.rows[t]))
    return out[::-1]


def region(u_lo: int, u_hi: int, r: int, width: int) -> list[tuple[int, int, Any]]:
    """The pairs ``u_lo <= i' + j~ < u_hi`` of an ``(r, width)`` block, as column ranges.

    ``(c0, c1, band)``: columns ``c0 .. c1 - 1``, every row (``band`` None:
    a rectangle), or only the pairs of ``band = (u_lo, u_hi)`` (two small
    triangles, or the whole region when it is narrower than a block).

    Examples
    --------
    >>> import torch
    >>> [(c0, c1, m is None) for c0, c1, m in region(3, 9, 3, 10)]
    [(1, 3, False), (3, 7, True), (7, 9, False)]
    """
    parts = []
    a, b = u_lo, u_hi - r + 1  # columns every row's pairs cover
    if a < b:
        for c0, c1, rect in ((u_lo - r + 1, a, False), (a, b, True), (b, u_hi, False)):
            c0, c1 = max(c0, 0), min(c1, width)
            if c0 < c1:
                parts.append((c0, c1, None if rect else (u_lo, u_hi)))
    else:
        c0, c1 = max(u_lo - r + 1, 0), min(u_hi, width)
        if c0 < c1:
            parts.append((c0, c1, (u_lo, u_hi)))
    return parts


def _band(block: Any, u_lo: int, u_hi: int, c0: int, c1: int) -> Any:
    # (r, c1 - c0) view: 1 where u_lo <= c + i' < u_hi (a Hankel view of one row)
    r = block.shape[-2]
    row = block.new_zeros(c1 - c0 + r - 1)
    row[max(u_lo - c0, 0):max(u_hi - c0, 0)] = 1
    return hankel(row, r, c1 - c0, row=1, col=1, axes=1)


def add_constant(block: Any, values: Any, u_lo: int, u_hi: int) -> None:
    """``block[:, i', j~] += values[:, i']`` where ``u_lo <= i' + j~ < u_hi``."""
    r, width = block.shape[-2:]
    column = values[..., None]
    for c0, c1, band in region(u_lo, u_hi, r, width):
        if band is None:
            block[..., c0:c1] += column
        else:
            block[..., c0:c1].addcmul_(column, _band(block, *band, c0, c1))


def region_sums(block: Any, u_lo: int, u_hi: int) -> Any:
    """``sum_j~ block[:, i', j~]`` over ``u_lo <= i' + j~ < u_hi``: ``(L, r)``."""
    r, width = block.shape[-2:]
    total = block.new_zeros(block.shape[:-1])
    for c0, c1, band in region(u_lo, u_hi, r, width):
        part = block[..., c0:c1]
        total += part.sum(-1) if band is None else (part * _band(block, *band, c0, c1)).sum(-1)
    return total


def add_rows(block: Any, rows: Any, u_lo: int, arena: Arena) -> None:
    """``block[:, i', j~] += rows[:, i' + j~ - u_lo, i']`` where that row exists.

    `rows` is ``(L, m, r)``: a term laid out by distance (``u = u_lo ..
    u_lo + m - 1``), each distance a row holding every query row's value.
    Padded with zero rows from `arena` where the block reaches beyond them.
    """
    r, width = block.shape[-2:]
    m = rows.shape[-2]
    c0, c1 = max(u_lo - r + 1, 0), min(u_lo + m, width)
    if c0 >= c1:
        return
    top = max(0, u_lo - c0)  # rows of zeros before and after `rows`
    bottom = max(0, c1 + r - 2 - u_lo - (m - 1))
    if top or bottom:
        padded = arena.zeros(rows.shape[0], top + m + bottom, r)
        padded[:, top:top + m] = rows
        rows, u_lo = padded, u_lo - top
    block[..., c0:c1] += hankel(rows, r, c1 - c0, row=r + 1, col=r,
                                offset=(c0 - u_lo) * r)


def laid_piece(block: Any, u_lo: int, u_hi: int, arena: Arena) -> Any:
    """``out[:, i', u - u_lo] = block[:, i', u - i']``, 0 where no such key.

    ``(L, r, u_hi - u_lo)``: a block's pairs laid out by distance over ``u_lo .. u_hi - 1``, as a
    view of a zero-padded copy of the columns they come from.
    """
    r, width = block.shape[-2:]
    m = u_hi - u_lo
    c0, c1 = u_lo - r + 1, u_hi  # the columns reached, before clipping
    padded = arena.zeros(block.shape[0], r, c1 - c0)
    lo, hi = max(c0, 0), min(c1, width)
    if lo < hi:
        padded[..., lo - c0:hi - c0] = block[..., lo:hi]
    return hankel(padded, r, m, row=c1 - c0 - 1, col=1, offset=r - 1)


def laid_rows(block: Any, u_lo: int, u_hi: int, arena: Arena) -> Any:
    """``out[:, u - u_lo, i'] = block[:, i', u - i']``, 0 where no such key: ``(L, m, r)``.

    The transpose of `add_rows`: a block's pairs laid out by distance, one
    row per distance ``u_lo .. u_hi - 1`` (``m`` of them), contiguous.
    """
    r, width = block.shape[-2:]
    m = u_hi - u_lo
    c0, c1 = max(u_lo - r + 1, 0), min(u_hi, width)
    top = max(0, u_lo - c0)
    bottom = max(0, c1 + r - 2 - u_lo - (m - 1))
    out = arena.zeros(block.shape[0], top + m + bottom, r)
    if c0 < c1:
        hankel(out, r, c1 - c0, row=r + 1, col=r,
               offset=(c0 - u_lo + top) * r).copy_(block[..., c0:c1])
    return out[:, top:top + m]


def select(x: Any, rows: Any, arena: Arena) -> Any:
    """``x[:, rows, :]`` of a 3-D `x` by ``index_select`` (whole rows copied), into `arena`."""
    return torch.index_select(x, 1, rows, out=arena.take(x.shape[0], rows.shape[0],
                                                          x.shape[-1]))


def add_by_rows(block: Any, x: Any, rows: Any, runs: Runs, start: int, n_all: int,
                arena: Arena, *, max_pieces: int) -> None:
    """``block[:, i', j~] += x[:, row(i' + j~), i']``: a term read from ``x`` ``(L, m + 1, r)``
    at the rows of the block's window of distances (from `start` of the reversed `rows`).

    A map of few runs in the window (Shaw's clipped ends): a constant per row
    over each summed run, the rows of the others picked; past `max_pieces` runs,
    every distance's row picked (`select`).
    """
    r, width = block.shape[-2:]
    n = r + width - 1
    if piece_count(runs, n_all, start, n) > max_pieces:
        add_rows(block, select(x, rows[start:start + n], arena), 0, arena)
        return
    for u_lo, u_hi, summed, row in pieces(runs, n_all, start, n):
        if summed:
            add_constant(block, x[:, row], u_lo, u_hi)
        else:
            add_rows(block, select(x, rows[start + u_lo:start + u_hi], arena), u_lo, arena)


def binned(values: Any, w: Any, start: int, n_all: int, arena: Arena, *,
           max_pieces: int) -> tuple[Any, Any]:
    """``(columns (L, r, c), rows (c,))``: a block's weights summed by the table row each pair
    reads (per run of the map), or laid out one column per distance past `max_pieces` runs.

    `values` has ``rows`` (the map's rows per distance, reversed, ``-1`` as
    the table's zero row) and ``runs`` (the map's `Runs`).
    """
    r, width = w.shape[-2:]
    n = r + width - 1
    if piece_count(values.runs, n_all, start, n) > max_pieces:
        return laid_piece(w, 0, n, arena), values.rows[start:start + n]
    columns, rows = [], []
    for u_lo, u_hi, summed, row in pieces(values.runs, n_all, start, n):
        if summed:
            columns.append(region_sums(w, u_lo, u_hi)[..., None])
            rows.append(values.rows.new_full((1,), row))
        else:
            columns.append(laid_piece(w, u_lo, u_hi, arena))
            rows.append(values.rows[start + u_lo:start + u_hi])
    if not columns:
        return w[..., :0], values.rows[:0]
    return torch.cat(columns, -1), torch.cat(rows)


def times_rows(columns: Any, table: Any, rows: Any) -> Any:
    """``columns @ table[:, rows]``: ``(L, r, c)`` times ``(1 or L, m, d)`` read at ``rows``."""
    picked = table[:, rows]
    if columns.shape[-1] == 0:
        return columns.new_zeros((*columns.shape[:-1], table.shape[-1]))
    if picked.shape[0] == 1:  # one table for every head: one product
        flat = columns.reshape(-1, columns.shape[-1]) @ picked[0]
        return flat.view(*columns.shape[:-1], picked.shape[-1])
    return torch.bmm(columns, picked)
