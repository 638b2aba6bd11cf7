"""The skewed tile of the NumPy backward pass, and its products with tables by distance.

A block of ``B`` query rows and ``W`` keys lays its gradient out by distance in
a tile of ``B x (W + B - 1)`` columns (`skew_view`: entry ``(i', j)`` at column
``j + B - 1 - i'``); a term read by distance multiplies that tile with its rows
(`tile_rows`, `tile_products`), `TILE_ROWS` rows at a time so each product
only reaches the columns its rows do. `band_view` is the band of a clipped
table's distances. For `relpos_ref.kernels._numpy_vjp`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["TILE_ROWS", "band_view", "row_dot", "skew_view", "tile_products", "tile_rows"]

#: Rows per sub-block of a skewed tile's products (`tile_rows`, `tile_products`): a
#: block's ``B`` rows reach ``W + B - 1`` distances, ``B - 1`` more than its keys; each
#: sub-block of ``S`` rows only ``W + S - 1``. At t = 1024, 128 and 256 rows ran alike,
#: 32 rows 10 % slower (small GEMMs).
TILE_ROWS = 128


def row_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``sum_j a[..., j] b[..., j]`` without a temporary (`numpy.vecdot` from NumPy 2.0 on).

    Examples
    --------
    >>> row_dot(np.ones((2, 3)), np.arange(6.0).reshape(2, 3))
    array([ 3., 12.])
    """
    vecdot = getattr(np, "vecdot", None)
    if vecdot is not None:
        return vecdot(a, b)
    return np.einsum("...j,...j->...", a, b)  # pragma: no cover - NumPy < 2


def skew_view(tile: np.ndarray, width: int) -> np.ndarray:
    """The ``(..., B, width)`` scores inside a skewed ``(..., B, width + B - 1)`` tile.

    ``view[..., i', j] = tile[..., i', j + B - 1 - i']``: a writeable view
    whose rows do not overlap (each lies in its own tile row), so GEMMs and
    row operations write it like any matrix.

    Examples
    --------
    >>> tile = np.zeros((2, 4))
    >>> skew_view(tile, 3)[...] = [[1, 2, 3], [4, 5, 6]]
    >>> tile
    array([[0., 1., 2., 3.],
           [4., 5., 6., 0.]])
    """
    n = tile.shape[-2]
    step_row, step_col = tile.strides[-2:]
    return np.lib.stride_tricks.as_strided(
        tile[..., n - 1 :],
        shape=(*tile.shape[:-1], width),
        strides=(*tile.strides[:-2], step_row - step_col, step_col),
    )


def band_view(tile: np.ndarray, n: int) -> np.ndarray:
    """``(..., B, n)`` view of a ``(..., B, W)`` array: ``(i', c)`` is ``tile[..., i', i' + c]``.

    The band of a tile whose row ``i'`` starts ``i'`` columns later than row 0
    (``W >= B - 1 + n``); writeable, its rows do not overlap.

    Examples
    --------
    >>> band_view(np.arange(8).reshape(2, 4), 3)
    array([[0, 1, 2],
           [5, 6, 7]])
    """
    step_row, step_col = tile.strides[-2:]
    return np.lib.stride_tricks.as_strided(
        tile, (*tile.shape[:-1], n), (*tile.strides[:-2], step_row + step_col, step_col)
    )


def _sub_blocks(tile: np.ndarray) -> list[tuple[int, int, int]]:
    # (r0, r1, c0): rows r0 .. r1 - 1 of a skewed (R, W + R - 1) tile have their entries
    # in columns c0 .. c0 + W + (r1 - r0) - 2
    rows = tile.shape[0]
    step = max(1, min(TILE_ROWS, rows))
    out = []
    for r0 in range(0, rows, step):
        r1 = min(r0 + step, rows)
        out.append((r0, r1, rows - r1))
    return out


def tile_rows(tile: np.ndarray, side: np.ndarray, rows: np.ndarray, first: int) -> None:
    """``tile[i', c] = side[i'] . rows[first + c]``, within the band of a skewed tile.

    `tile` is ``(R, W + R - 1)`` (`skew_view`), `side` ``(R, d)``, `rows` one row
    per distance index (column ``c`` is distance index ``first + c``). Sub-blocks of
    `TILE_ROWS` rows each make one product over the ``W + S - 1`` columns they
    reach; the entries outside them (none of the band's) are left as they were.
    """
    width = tile.shape[1] - tile.shape[0] + 1
    for r0, r1, c0 in _sub_blocks(tile):
        length = width + r1 - r0 - 1
        np.matmul(side[r0:r1], rows[first + c0 : first + c0 + length].T,
                  out=tile[r0:r1, c0 : c0 + length])


def tile_products(tile: np.ndarray, rows: np.ndarray, first: int, side: np.ndarray,
                  d_side: np.ndarray, d_rows: np.ndarray) -> None:
    """The transposes of `tile_rows`: ``d_side += tile rows`` and ``d_rows += tile^T side``.

    `tile` is a skewed ``(R, W + R - 1)`` tile with zero triangles, column ``c``
    distance index ``first + c`` of `rows` and `d_rows` (``(n, d)``); `side` and
    `d_side` ``(R, d)``. By sub-blocks of `TILE_ROWS` rows, over the columns each
    reaches.
    """
    width = tile.shape[1] - tile.shape[0] + 1
    for r0, r1, c0 in _sub_blocks(tile):
        length = width + r1 - r0 - 1
        part = tile[r0:r1, c0 : c0 + length]
        d_side[r0:r1] += part @ rows[first + c0 : first + c0 + length]
        d_rows[first + c0 : first + c0 + length] += part.T @ side[r0:r1]
