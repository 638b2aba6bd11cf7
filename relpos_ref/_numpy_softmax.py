r"""NumPy-only softmax fast paths over row blocks, in place.

The standard forms (`relpos_ref.compose_logits` then
`relpos_ref.masked_softmax`) make one pass through memory per operation and
allocate a new ``(..., t_q, t_k)`` array for most of them. On NumPy the
score matrix that `relpos_ref.attention` computes is its own, so these
functions overwrite it block by block: each block of query rows (about
1 MiB) is composed, masked, exponentiated and normalized while it stays in
cache. Both are private; the library calls them only on arrays it owns.

- `softmax_of_terms`: the same operations on every entry, in the same
  order, as the standard forms, so the result is equal bit for bit.
- `clipped_table_softmax`: the softmax of ``s (content + P)`` for a
  two-sided table clipped at ``K`` (Shaw et al.), with ``P`` never laid out
  beyond one small tile per block, and the weights binned by distance on the
  way. Equal to the standard forms up to rounding (a per-row constant moves
  from the logits into the row maximum, and row sums are taken in three
  parts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._xp import all_numpy

__all__ = ["clipped_table_softmax", "softmax_of_terms"]

_BLOCK_BYTES = 2**20


def _rows_per_block(content: Any, cap: int | None = None) -> int:
    t_q = content.shape[-2]
    per_row = max(1, content.size // max(t_q, 1)) * content.itemsize
    rows = max(1, _BLOCK_BYTES // per_row)
    return rows if cap is None else min(rows, cap)


def _owned(content: Any) -> bool:
    return all_numpy(content) and content.flags.writeable and content.flags.c_contiguous


def _fits(shape: tuple[int, ...], term: Any) -> bool:
    # `term` broadcasts to `shape` without making it larger.
    import numpy as np

    return term is None or np.broadcast_shapes(shape, term.shape) == shape


def softmax_of_terms(
    content: Any,
    /,
    *,
    scale: float,
    position: Any = None,
    bias: Any = None,
    allowed: Any = None,
    position_rows: Callable[[int, int], Any] | None = None,
) -> Any:
    """``masked_softmax(compose_logits(content, ...), allowed=allowed)``, in `content`.

    `position_rows(a, b)`, if given, computes the position term of query
    rows ``a .. b - 1`` (``(..., b - a, t_k)``) when their block is reached,
    in place of a whole `position` array.

    Returns the weights (`content` itself, overwritten) or ``None`` when the
    arrays are not NumPy, `content` is not a writeable C-contiguous array, or
    a term would broadcast it to a larger shape. Every entry goes through
    the standard forms' operations in their order (add, scale, add, mask,
    subtract the row maximum, exponentiate, divide by the row sum), and each
    row is reduced whole, so the result equals theirs bit for bit.
    """
    if not (_owned(content) and all_numpy(position, bias, allowed)):
        return None
    shape = content.shape
    if not all(_fits(shape, term) for term in (position, bias, allowed)):
        return None
    if content.size == 0:
        return content
    import numpy as np

    rows = _rows_per_block(content)
    for a in range(0, shape[-2], rows):
        b = min(a + rows, shape[-2])
        if position_rows is not None:
            added = position_rows(a, b)
        else:
            added = None if position is None else _rows(position, shape, a, b)
        block = _compose_and_mask(content, a, b, scale, added, bias, allowed)
        row_max = np.max(block, axis=-1, keepdims=True)
        row_max[row_max == -np.inf] = 0
        block -= row_max
        np.exp(block, out=block)
        total = np.sum(block, axis=-1, keepdims=True)
        total[total == 0] = 1
        block /= total
    return content


def _rows(term: Any, shape: tuple[int, ...], a: int, b: int) -> Any:
    import numpy as np

    return np.broadcast_to(term, shape)[..., a:b, :]


def _compose_and_mask(
    content: Any, a: int, b: int, scale: float, position: Any, bias: Any, allowed: Any
) -> Any:
    # Rows a .. b - 1 of s (content + position) + bias, masked; `position` holds only them.
    import numpy as np

    block = content[..., a:b, :]
    if position is not None:
        block += position
    block *= scale
    if bias is not None:
        block += _rows(bias, content.shape, a, b)
    if allowed is not None:
        np.copyto(block, -np.inf, where=~_rows(allowed, content.shape, a, b))
    return block


def clipped_table_softmax(
    content: Any,
    table_logits: Any,
    /,
    *,
    max_distance: int,
    q_offset: int,
    scale: float,
    allowed: Any = None,
    bins: bool = False,
) -> tuple[Any, Any] | None:
    r"""Softmax of ``s (content + P)`` with ``P`` from a clipped table, in `content`.

    ``P[..., i, j] = x[..., i, clip(r_ij, -K, K) + K]`` with
    ``r_ij = j - (i + q_offset)`` and ``x = table_logits`` (``(..., t_q, 2K + 1)``,
    broadcastable to ``content.shape[:-1]``): the Shaw et al. key term. Per
    block of ``B`` query rows, keys left of the tile ``[a + q_offset - K,
    a + q_offset + B + K)`` all read column 0 and keys right of it column
    ``2K``. Shifting every row by its column ``2K`` (softmax is invariant to
    a per-row constant), keys on the right need nothing and keys on the left
    need one constant, which goes into the row maximum and the subtraction
    before the exponential instead of into the scores. Only the tile gets
    ``P`` added, from a ``B x (B + 2K)`` buffer filled through a strided view.

    With ``bins=True`` the weights are also summed by table row on the way
    (the efficient relative-values term, `distance_bins` with clipping): the
    band through a strided view of the tile, the clipped ends from the row
    sums of the two rectangles, which the normalization computes anyway.

    Returns ``(weights, bins or None)``, `weights` being `content`
    overwritten, or ``None`` (having changed nothing) when the arrays are
    not NumPy, `content` is not writeable and C-contiguous, a term would
    broadcast it larger, the band ``2K + 1`` is wider than the keys, or the
    shifted table logits are not all finite.
    """
    import numpy as np

    k = max_distance
    n = 2 * k + 1
    if not (_owned(content) and all_numpy(table_logits, allowed)) or content.ndim < 2:
        return None
    *batch, t_q, t_k = content.shape
    if n > t_k or not _fits(content.shape, allowed) or table_logits.shape[-1] != n:
        return None
    if not _fits((*batch, t_q, n), table_logits) or content.size == 0:
        return None
    x = np.broadcast_to(table_logits, (*batch, t_q, n))
    half = np.finfo(x.dtype).max / 2
    if not (-half < np.min(x) and np.max(x) < half):
        return None  # not finite, or differences of its entries could overflow
    groups = int(np.prod(batch, dtype=np.int64))
    scores = content.reshape(groups, t_q, t_k)
    x = x.reshape(groups, t_q, n)
    mask = None if allowed is None else np.broadcast_to(allowed, content.shape)
    dtype = content.dtype
    block = min(_rows_per_block(content, cap=64), t_q)
    width = block + 2 * k
    # Tile column c' of row i' lies at r = c' - i' - K, whatever block it is in.
    columns, rows_in_tile = np.arange(width)[None, :], np.arange(block)[:, None]
    before = (columns < rows_in_tile).astype(dtype)  # r < -K: clipped to the first row
    after = (columns > rows_in_tile + 2 * k).astype(dtype)  # r > K: clipped to the last row
    tile = np.empty((groups, block, width), dtype=dtype)
    tile_band = _band(tile, n)
    if bins:
        out = np.empty((groups, t_q, n), dtype=dtype)
        ends_mask = np.stack([before, after], axis=-1)  # (B, W, 2)
        ones = np.ones(t_k, dtype=dtype)
        padded = np.empty_like(tile)
        padded_band = _band(padded, n)
        # Rows whose whole band has keys: their bins are a strided view of the weights.
        first = min(max(k - q_offset, 0), t_q)
        last = max(min(t_k - q_offset - k, t_q), first)
        if last > first:
            weights_band = _band(scores[:, first:last, first + q_offset - k :], n)
    for a in range(0, t_q, block):
        b = min(a + block, t_q)
        start = a + q_offset - k  # key column of the tile's first column
        end = start + (b - a) + 2 * k
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
        if mask is not None:  # the same memory as `rows`, in the batch's shape
            np.copyto(content[..., a:b, :], -np.inf, where=~mask[..., a:b, :])
        _exp_shifted(rows, const * scale, small, rest)
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


def _band(tile: Any, n: int) -> Any:
    # (..., B, n) view of a (..., B, W) array: entry (i', c) is tile[..., i', i' + c].
    import numpy as np

    *outer, rows, _ = tile.shape
    step_row, step_col = tile.strides[-2:]
    return np.lib.stride_tricks.as_strided(
        tile, (*outer, rows, n), (*tile.strides[:-2], step_row + step_col, step_col)
    )


def _exp_shifted(rows: Any, const: Any, small: slice, rest: slice) -> None:
    # In place: exp of rows[..., small] + const and rows[..., rest], less their joint
    # row maximum (0 for a row with no allowed key). The two slices split the keys.
    import numpy as np

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
    np.exp(rows, out=rows)
