r"""NumPy building blocks of the kernels: row blocks in cache, strided views.

The specification (`relpos_ref.compose_logits` then
`relpos_ref.masked_softmax`) makes one pass through memory per operation and
allocates a new ``(..., t_q, t_k)`` array for most of them. Here the score
matrix is the kernel's own, so it is overwritten block by block: each block
of query rows (`BLOCK_BYTES`, 4 MiB) is composed, masked, exponentiated and
normalized while it stays in cache.

- `softmax_in_place`: the specification's operations on every entry, in its
  order (add, scale, add, mask, subtract the row maximum, exponentiate,
  divide by the row sum), so the result is equal bit for bit, but for the
  weights below ``e n tiny``, which are zero (below). Under
  ``causal`` the terms of keys no row of a block may see are not computed
  (the entries are masked anyway).
- `clipped_table_softmax`: the softmax of ``s (content + P)`` for a two-sided
  table clipped at ``K`` (Shaw et al.), with ``P`` never laid out beyond one
  small tile per block, and the weights binned by distance on the way.
- `block_logits`: a per-distance table's term for one block of queries at a
  time, from the table rows that block reaches (one GEMM per block).
- `distance_view`: a term of the distance alone as a Toeplitz view of one row.
- `flush_subnormals`: keeps subnormal weights out of every product (below).

**Subnormal weights.** A softmax over strongly decaying logits (ALiBi's
steepest heads: ``-|r| / 2`` over a thousand keys) has weights below the
smallest normal number (``tiny``, ``2^-126 = 1.18e-38`` in float32): 2.6 % of
ALiBi's at t = 1024, 8 heads, 5 to 8 % in its steepest heads. Each such
operand of a product costs a microcode assist on Intel CPUs: ``weights @ v``
ran three times slower, ALiBi 1.6 to 2.0 times plain attention (issue 30;
this machine's AMD EPYC showed none of it). Every kernel therefore sets to
``-inf`` the exponents ``x`` (row maximum subtracted) below
``log(n tiny) + 1``, ``n`` the keys of the row, before the exponential: the
exponential is then ``0`` or at least ``e n tiny``, and the weight, that
divided by a row sum of at most ``n``, ``0`` or at least ``tiny``. A weight so
set to zero was below ``e n tiny``; the output of a row changes by at most
``2 e n^2 tiny max|v|`` (the weights left out, and their share of the row
sum), below one unit in the last place of ``max|v|`` for ``n < 2^49``
(float32; float64: ``tiny = 2^-1022``). The other weights are the
specification's: their row sum lost terms below ``e n tiny`` each, at most a
rounding in its last place. The check costs one read of a block (a masked
block is read before its mask, whose ``-inf`` would count as small), and a
second pass only where some entry lies below the cut.

Nothing here validates its arguments: the kernels of `relpos_ref.kernels.numpy`
call these after the specification's own validation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "KERNEL_DTYPES",
    "block_logits",
    "causal_width",
    "clipped_table_softmax",
    "distance_view",
    "flush_subnormals",
    "kernel_arrays",
    "mask_block",
    "rows_per_block",
    "softmax_in_place",
]

#: The floating dtypes the NumPy kernels compute in; any other (long double) goes to the
#: specification.
KERNEL_DTYPES = (np.float16, np.float32, np.float64)


def kernel_arrays(*arrays: Any) -> bool:
    """Whether every array (``None`` skipped) is a NumPy ndarray the kernels take.

    Exactly `numpy.ndarray` (not a subclass, not another library's array),
    and of a dtype in `KERNEL_DTYPES` where floating (masks and indices are
    not). A call of long doubles goes to the specification, which computes
    in them (the kernels' `math` on their limits raised a domain error).

    Examples
    --------
    >>> kernel_arrays(np.zeros(2), None, np.ones(2, dtype=bool))
    True
    >>> kernel_arrays(np.zeros(2, dtype=np.longdouble))
    False
    """
    return all(a is None or (type(a) is np.ndarray
                             and (a.dtype.kind != "f" or a.dtype in KERNEL_DTYPES))
               for a in arrays)

#: Bytes of scores per row block: large enough that the NumPy calls per block are few
#: (each costs microseconds), small enough to stay in the last-level cache.
BLOCK_BYTES = 2**22

#: ``add(live, a)``: adds a term into ``live``, the scores of query rows
#: ``a .. a + live.shape[-2] - 1`` and keys ``0 .. live.shape[-1] - 1``, in place.
AddRows = Callable[[np.ndarray, int], None]


def rows_per_block(content: np.ndarray, cap: int | None = None) -> int:
    """Query rows per block so that one block of `content` is about `BLOCK_BYTES`."""
    t_q = content.shape[-2]
    per_row = max(1, content.size // max(t_q, 1)) * content.itemsize
    rows = max(1, BLOCK_BYTES // per_row)
    return rows if cap is None else min(rows, cap)


def causal_width(b: int, t_k: int, *, causal: bool, q_offset: int) -> int:
    """Keys that rows ``.. b - 1`` may see: ``0 .. width - 1`` (all when not causal)."""
    if not causal:
        return t_k
    return min(max(b + q_offset, 0), t_k)


def mask_block(
    block: np.ndarray, a: int, b: int, *, mask: Any, causal: bool, q_offset: int
) -> None:
    """Set ``-inf`` where rows ``a .. b - 1`` of `block` (every key) may not attend.

    `mask` broadcasts to the full ``(..., t_q, t_k)``; `causal` forbids
    ``j > i + q_offset``: every key past the block's `causal_width`, and one
    small triangle before it.
    """
    t_k = block.shape[-1]
    if mask is not None:
        rows = mask if mask.ndim < 2 or mask.shape[-2] == 1 else mask[..., a:b, :]
        np.copyto(block, -np.inf, where=~rows)
    if causal:
        width = causal_width(b, t_k, causal=True, q_offset=q_offset)
        block[..., width:] = -np.inf
        first = min(max(a + q_offset + 1, 0), width)  # the first key some row may not see
        if first < width:
            keys = np.arange(first, width)[None, :]
            limit = np.arange(a, b)[:, None] + q_offset
            np.copyto(block[..., first:width], -np.inf, where=keys > limit)


def flush_subnormals(exponents: np.ndarray, keys: int, *, least: float | None = None) -> None:
    """In place: ``-inf`` for the exponents whose weight could be subnormal.

    Parameters
    ----------
    exponents : float array ``(..., keys)``
        Those of a softmax, each ``<= 0`` (the row maximum subtracted) or at
        most ``EXP_LIMIT`` (`relpos_ref.kernels._numpy_vjp`, which multiplies
        the exponentials themselves). Entries below ``log(keys * tiny) + 1``
        become ``-inf``, so that ``exp`` of every entry is ``0`` or at least
        ``e * keys * tiny``, and that divided by a row sum of at most ``keys``
        (each term at most 1) still normal.
    keys : int
        The entries of a row.
    least : float, optional
        A lower bound on the exponents of the allowed entries, read before the
        masked ones became ``-inf`` (the smallest score, less the largest row
        maximum): at or above the cut, nothing is read. Without it, one read
        of `exponents` decides, in which a masked entry counts as small. A
        second pass sets the entries, when some may be small.
    """
    if exponents.size == 0:
        return
    cut = math.log(np.finfo(exponents.dtype).tiny) + math.log(max(keys, 1)) + 1
    if (least if least is not None else np.min(exponents)) < cut:
        np.copyto(exponents, -np.inf, where=exponents < cut)


def _normalize_rows(block: np.ndarray, low: float | None = None) -> None:
    # In place: exp(x - row max) / row sum; a row with no allowed key becomes 0. `low`:
    # the smallest allowed score, read before the mask (`flush_subnormals`).
    row_max = np.max(block, axis=-1, keepdims=True)
    row_max[row_max == -np.inf] = 0
    block -= row_max
    least = None if low is None else low - float(np.max(row_max))
    flush_subnormals(block, block.shape[-1], least=least)
    np.exp(block, out=block)
    total = np.sum(block, axis=-1, keepdims=True)
    total[total == 0] = 1
    block /= total


def _rows(term: Any, shape: tuple[int, ...], a: int, b: int, width: int) -> Any:
    return np.broadcast_to(term, shape)[..., a:b, :width]


def softmax_in_place(
    content: np.ndarray,
    /,
    *,
    scale: float,
    position: Any = None,
    add_position: AddRows | None = None,
    bias: Any = None,
    add_bias: AddRows | None = None,
    mask: Any = None,
    causal: bool = False,
    q_offset: int = 0,
) -> np.ndarray:
    """``masked_softmax(compose_logits(content, ...))`` in `content`, one row block at a time.

    `content` is a writeable C-contiguous array the caller owns, of the full
    broadcast shape of every term. `add_position` / `add_bias`, in place of
    `position` / `bias`, add the term of one block into it when it is
    reached. Returns `content`, overwritten.
    """
    *_, t_q, t_k = content.shape
    if content.size == 0:
        return content
    shape = content.shape
    step = rows_per_block(content)
    for a in range(0, t_q, step):
        b = min(a + step, t_q)
        width = causal_width(b, t_k, causal=causal, q_offset=q_offset)
        block = content[..., a:b, :]
        live = block[..., :width]  # the keys some row of the block may see
        if add_position is not None:
            add_position(live, a)
        elif position is not None:
            live += _rows(position, shape, a, b, width)
        block *= scale
        if add_bias is not None:
            add_bias(live, a)
        elif bias is not None:
            live += _rows(bias, shape, a, b, width)
        low = None  # masked keys become -inf, which would count as small: read them first
        if mask is not None or causal:
            low = float(np.min(live)) if live.size else math.inf
        mask_block(block, a, b, mask=mask, causal=causal, q_offset=q_offset)
        _normalize_rows(block, low)
    return content


def clipped_table_softmax(
    content: np.ndarray,
    table_logits: np.ndarray,
    /,
    *,
    max_distance: int,
    max_past: int | None = None,
    q_offset: int,
    scale: float,
    mask: Any = None,
    causal: bool = False,
    bins: bool = False,
) -> tuple[np.ndarray, np.ndarray | None] | None:
    r"""Softmax of ``s (content + P)`` with ``P`` from a clipped table, in `content`.

    ``P[..., i, j] = x[..., i, clip(r_ij, -L, K) + L]`` with
    ``r_ij = j - (i + q_offset)``, ``L`` = `max_past` (default ``K``) and
    ``x = table_logits`` (``(..., t_q, n)``, ``n = L + K + 1``, broadcastable
    to ``content.shape[:-1]``): the Shaw et al. key term. Per block of ``B``
    query rows, keys left of the tile ``[a + q_offset - L, a + q_offset + B + K)``
    all read column 0 and keys right of it column ``n - 1``. Shifting every
    row by its column ``n - 1`` (softmax is invariant to a per-row
    constant), keys on the right need nothing and keys on the left
    need one constant, which goes into the row maximum and the subtraction
    before the exponential instead of into the scores. Only the tile gets
    ``P`` added, from a ``B x (B + n - 1)`` buffer filled through a strided
    view.

    With ``bins=True`` the weights are also summed by table row on the way
    (the efficient relative-values term, `distance_bins` with clipping): the
    band through a strided view of the tile, the clipped ends from the row
    sums of the two rectangles, which the normalization computes anyway.

    Returns ``(weights, bins or None)``, `weights` being `content`
    overwritten, or ``None`` (having changed nothing) when the band
    ``n`` is wider than the keys or the shifted table logits are not
    all finite. `content` must be writeable, C-contiguous and of the full
    broadcast shape; `mask` broadcasts to it.
    """
    k = max_distance
    past = k if max_past is None else max_past
    n = past + k + 1
    *batch, t_q, t_k = content.shape
    if n > t_k or table_logits.shape[-1] != n or content.size == 0:
        return None
    x = np.broadcast_to(table_logits, (*batch, t_q, n))
    half = np.finfo(x.dtype).max / 2
    if not (-half < np.min(x) and np.max(x) < half):
        return None  # not finite, or differences of its entries could overflow
    groups = int(np.prod(batch, dtype=np.int64))
    scores = content.reshape(groups, t_q, t_k)
    x = x.reshape(groups, t_q, n)
    dtype = content.dtype
    block = min(rows_per_block(content, cap=64), t_q)
    width = block + n - 1
    # Tile column c' of row i' lies at r = c' - i' - L, whatever block it is in.
    columns, rows_in_tile = np.arange(width)[None, :], np.arange(block)[:, None]
    before = (columns < rows_in_tile).astype(dtype)  # r < -L: clipped to the first row
    after = (columns > rows_in_tile + n - 1).astype(dtype)  # r > K: clipped to the last row
    tile = np.empty((groups, block, width), dtype=dtype)
    tile_band = _band(tile, n)
    if bins:
        out = np.empty((groups, t_q, n), dtype=dtype)
        ends_mask = np.stack([before, after], axis=-1)  # (B, W, 2)
        ones = np.ones(t_k, dtype=dtype)
        padded = np.empty_like(tile)
        padded_band = _band(padded, n)
        # Rows whose whole band has keys: their bins are a strided view of the weights.
        first = min(max(past - q_offset, 0), t_q)
        last = max(min(t_k - q_offset - k, t_q), first)
        if last > first:
            weights_band = _band(scores[:, first:last, first + q_offset - past :], n)
    for a in range(0, t_q, block):
        b = min(a + block, t_q)
        start = a + q_offset - past  # key column of the tile's first column
        end = start + (b - a) + n - 1
        lo, hi = min(max(start, 0), t_k), min(max(end, 0), t_k)
        rows = scores[:, a:b, :]
        # Each row shifted by the table column of its larger rectangle (softmax does not
        # change): that rectangle then needs nothing, the smaller one `const`.
        if lo <= t_k - hi:
            shifted = x[:, a:b] - x[:, a:b, n - 1 :]
            const, small, rest = shifted[..., :1], slice(0, lo), slice(lo, t_k)
            triangle = before  # the other triangle, like the right rectangle, gets 0
        else:
            shifted = x[:, a:b] - x[:, a:b, :1]
            const, small, rest = shifted[..., n - 1 :], slice(hi, t_k), slice(0, hi)
            triangle = after
        if hi > lo:
            part = tile[:, : b - a]
            np.multiply(const, triangle[: b - a], out=part)
            tile_band[:, : b - a] = shifted
            rows[..., lo:hi] += part[..., lo - start : hi - start]
        rows *= scale
        const = const * scale
        low = None  # the smallest allowed exponent before the row maximum, read before the mask
        if mask is not None or causal:
            low = float(np.min(rows)) + min(0.0, float(np.min(const)))
        # the same memory as `rows`, in the batch's shape
        mask_block(content[..., a:b, :], a, b, mask=mask, causal=causal, q_offset=q_offset)
        _exp_shifted(rows, const, small, rest, low)
        if not bins:
            total = np.sum(rows, axis=-1, keepdims=True)
            total[total == 0] = 1
            rows /= total
            continue
        # Row sums in three parts (left rectangle, tile, right rectangle): matrix-vector
        # products with ones (BLAS), three times faster than np.sum over such slices.
        ends = rows[..., :lo] @ ones[:lo], rows[..., hi:] @ ones[hi:]
        total = ends[0] + rows[..., lo:hi] @ ones[lo:hi] + ends[1]
        total[total == 0] = 1
        rows /= total[..., None]
        binned = out[:, a:b]
        if lo == start and hi == end:  # the band lies inside the keys
            weights = rows[..., lo:hi]
            binned[...] = weights_band[:, a - first : b - first]
        else:  # the tile hangs over the first or last key: read it from a zero-padded copy
            weights = padded[:, : b - a, : end - start]
            weights[...] = 0
            weights[..., lo - start : hi - start] = rows[..., lo:hi]
            binned[...] = padded_band[:, : b - a]
        # The two clipped ends: triangles inside the tile plus the rectangles' sums.
        # (B, groups, W) @ (B, W, 2): one batched product per block (np.einsum over the
        # same operands was 17 times slower here)
        triangles = np.matmul(np.swapaxes(weights, 0, 1), ends_mask[: b - a, : end - start])
        binned[..., 0] += triangles[..., 0].T + ends[0] / total
        binned[..., n - 1] += triangles[..., 1].T + ends[1] / total
    return content, out.reshape(*batch, t_q, n) if bins else None


def _band(tile: np.ndarray, n: int) -> np.ndarray:
    # (..., B, n) view of a (..., B, W) array: entry (i', c) is tile[..., i', i' + c].
    *outer, rows, _ = tile.shape
    step_row, step_col = tile.strides[-2:]
    return np.lib.stride_tricks.as_strided(
        tile, (*outer, rows, n), (*tile.strides[:-2], step_row + step_col, step_col)
    )


def _exp_shifted(rows: np.ndarray, const: np.ndarray, small: slice, rest: slice,
                 low: float | None = None) -> None:
    # In place: exp of rows[..., small] + const and rows[..., rest], less their joint
    # row maximum (0 for a row with no allowed key). The two slices split the keys.
    # `low`: a bound below every allowed exponent before the row maximum, or None.
    has_small, has_rest = small.stop > small.start, rest.stop > rest.start
    if has_rest:
        row_max = np.max(rows[..., rest], axis=-1, keepdims=True)
        if has_small:
            np.maximum(
                row_max, np.max(rows[..., small], axis=-1, keepdims=True) + const, out=row_max
            )
    else:
        row_max = np.max(rows, axis=-1, keepdims=True) + const
    row_max[row_max == -np.inf] = 0
    rows -= row_max
    if has_small:
        rows[..., small] += const
    least = None if low is None else low - float(np.max(row_max))
    flush_subnormals(rows, rows.shape[-1], least=least)
    np.exp(rows, out=rows)


def block_logits(q: np.ndarray, table: np.ndarray, *, q_offset: int, low: int) -> AddRows:
    """``add(live, a)``: adds ``P[..., i, j] = q_i . table[r_ij - low]`` for the block's rows.

    `table` (``(n, d)`` or ``(h, n, d)``) holds one row per distance, row
    ``c`` for ``r = low + c``, and reaches every distance of the grid (the
    caller checks). This is the library-native form beside the stacked
    diagonals of the full ``q table^T`` (``t_q x n``, twice the work of
    ``q k^T`` when ``n = 2t - 1``): ``B`` query rows and ``W`` keys need only
    the ``W + B - 1`` table rows their distances reach, so one
    ``B x (W + B - 1)`` product does it (one GEMM for every head when the
    table is shared), and row ``i'`` reads that product from column
    ``B - 1 - i'`` on (a strided view). Equal to the specification up to the
    rounding of the products.
    """

    def add(live: np.ndarray, a: int) -> None:
        n, width = live.shape[-2:]
        b = a + n
        first = -(b - 1) - q_offset - low  # the table row of (i, j) = (b - 1, 0)
        window = table[..., first : first + width + n - 1, :]
        block = q[..., a:b, :]
        if window.ndim == 2:  # a shared table: one GEMM for every head (faster than one each)
            rows = math.prod(block.shape[:-1])  # not -1: an empty feature axis has no size
            flat = np.reshape(block, (rows, block.shape[-1])) @ window.T
            logits = np.reshape(flat, (*block.shape[:-1], window.shape[0]))
        else:
            logits = np.matmul(block, np.swapaxes(window, -1, -2))  # (..., n, width + n - 1)
        step_row, step_col = logits.strides[-2:]
        live += np.lib.stride_tricks.as_strided(
            logits[..., n - 1 :],
            shape=(*logits.shape[:-1], width),
            strides=(*logits.strides[:-2], step_row - step_col, step_col),
            writeable=False,
        )

    return add


def distance_view(row: np.ndarray, t_q: int, t_k: int) -> np.ndarray:
    """``out[..., i, j] = row[..., j - i + t_q - 1]`` as a read-only strided view.

    The layout of a term that depends on the distance alone (a scalar bias):
    `row` holds its values for ``r = r_min .. r_max``, the ``t_q + t_k - 1``
    distances of the grid in order, and row ``i`` of the result starts ``i``
    entries earlier in it (a Toeplitz matrix, no copy). ``t_q, t_k >= 1``.
    """
    row = np.ascontiguousarray(row)
    step = row.itemsize
    return np.lib.stride_tricks.as_strided(
        row[..., t_q - 1 :],
        shape=(*row.shape[:-1], t_q, t_k),
        strides=(*row.strides[:-1], -step, step),
        writeable=False,
    )
