r"""NumPy backward passes: the engine every VJP kernel runs, one row block at a time.

The specification (`relpos_ref.gradients`) recomputes the weights of the
whole ``(..., t_q, t_k)`` grid, then makes one pass through memory per
operation, each allocating a new array of that shape, and guards every
product against non-finite rows (`masked_product`, `dot_rows`). The kernels
take the call only when every array it reads is finite (then those guards
change nothing: a masked pair has weight 0 and contributes ``0`` to every
gradient), and run `backward`: per block of ``B`` query rows, in two
block-sized buffers that stay in cache,

.. math::
    w = \operatorname{softmax}(s\,(q_B k^\top + P_B) + B_B), \qquad
    \bar{v} \mathrel{+}= w^\top \bar{o}_B, \qquad
    g = \bar{o}_B\, v^\top\ (+\ \bar{w}^\text{term}),

    \bar{l} = w \odot (g - \operatorname{rowsum}(w \odot g)), \qquad
    \bar{q}_B = s\,\bar{l}\, k, \qquad \bar{k} \mathrel{+}= s\,\bar{l}^\top q_B,

in place (the weights become :math:`\bar{l}`), five GEMMs and four
elementwise passes per block besides the softmax; under ``causal`` only the
keys some row of the block may see. Extra memory is two blocks and the
``O((t_q + t_k) d)`` results, whatever ``t_q t_k``.

A scheme's term comes in through a `Term`. Relative terms use the *skewed*
layout: a block's ``(B, W)`` entries laid out in a ``(B, W + B - 1)`` tile whose
column ``c`` is one distance for every row, ``r = c - (B - 1) - a -
q_offset`` (entry ``(i', j)`` at column ``j + B - 1 - i'``, `skew_view`; the
two triangles outside are zero). In it a distance-only term is a column
constant, a clipped table's term three column ranges, a per-distance table's
term the product ``q_B window^T``, each added to the scores through the view;
the transposes, from :math:`\bar{l}` copied into the tile, are column sums and
the products ``tile window`` and ``tile^T q_B`` (what
`relpos_ref.gradients.by_distance` lays out, without the ``(t_q, t_q + t_k -
1)`` array). The scores themselves stay contiguous: NumPy's elementwise loops
on the skewed view (rows at unaligned offsets) ran up to ten times slower.

Nothing here validates its arguments: the kernels of `relpos_ref.kernels.numpy`
call it after the specification's own validation.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from ..calls import Call
from ._numpy_blocks import causal_width

__all__ = [
    "VJP_BLOCK_BYTES",
    "Block",
    "Core",
    "Term",
    "backward",
    "column_ranges",
    "finite",
    "skew_view",
    "sum_to",
]

#: Bytes of one block buffer (the weights; the cotangent ``g`` is another). Smaller
#: blocks stay in cache, larger ones make fewer and larger GEMMs: on the 2-core
#: benchmark machine, loaded by other processes, 8 MiB (256 rows of 8 heads x 1024
#: keys) ran plain, bias, Shaw and general 1.3 to 5 times faster than 2 MiB (many
#: small GEMMs, whose BLAS threads wait on each other) and than 32 MiB.
VJP_BLOCK_BYTES = 2**23


def finite(*arrays: Any) -> bool:
    """Whether every given array (``None`` skipped) holds only finite values.

    Examples
    --------
    >>> finite(np.ones(2), None), finite(np.array([1.0, np.inf]))
    (True, False)
    """
    return all(a is None or bool(np.isfinite(a).all()) for a in arrays)


def sum_to(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`x` summed over the axes it was broadcast along from `shape` (NumPy `sum_to_shape`).

    Examples
    --------
    >>> sum_to(np.ones((2, 3, 4)), (3, 1)).ravel()
    array([8., 8., 8.])
    """
    lead = x.ndim - len(shape)
    if lead:
        x = x.sum(axis=tuple(range(lead)))
    ones = tuple(i for i, (n, m) in enumerate(zip(shape, x.shape, strict=True))
                 if n == 1 and m != 1)
    if ones:
        x = x.sum(axis=ones, keepdims=True)
    return x


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


def column_ranges(first: int, n_cols: int, rows: int, *, clip: bool) -> tuple[int, int, int, int]:
    """Where a clipped table lies in tile columns ``0 .. n_cols - 1``.

    Table row ``m`` (of `rows`) is read by column ``first + m``; with `clip`
    every column before reads row 0, every column after the last row.
    Returns ``(left, lo, hi, right)``: columns ``< left`` read row 0,
    ``lo .. hi - 1`` read row ``c - first``, ``>= right`` read the last row
    (``left = 0`` and ``right = n_cols`` without `clip`).

    Examples
    --------
    >>> column_ranges(-1, 6, 3, clip=True)
    (0, 0, 2, 2)
    """
    lo = min(max(first, 0), n_cols)
    hi = min(max(first + rows, 0), n_cols)
    if not clip:
        return 0, lo, hi, n_cols
    return lo, lo, hi, hi


class Block(NamedTuple):
    """One row block of `backward`, as a `Term` sees it.

    Attributes
    ----------
    a, b : int
        Query rows ``a .. b - 1``.
    width : int
        Keys ``0 .. width - 1`` (fewer than ``t_k`` only under ``causal``).
    q, d_output : arrays
        The block's rows of ``q`` ``(..., B, d)`` and of the output's
        cotangent ``(..., B, d_v)``.
    dq : array
        ``(*batch, B, d)``: the block's rows of ``dq`` before the scale; a
        term adds its ``\\bar{l}``-linear share here.
    tile, scratch : arrays or None
        When the term is `Term.skewed`, two ``(*batch, B, width + B - 1)``
        tiles: `tile` with zero triangles, which holds :math:`\\bar{l}`
        (`skew_view`) when `Term.d_logits` runs and is the term's to fill
        through `skew_view` before; `scratch`, the term's for anything.
    first : int
        The distance index (``r + t_q - 1 + q_offset``) of tile column 0: ``t_q - b``.
    """

    a: int
    b: int
    width: int
    q: np.ndarray
    d_output: np.ndarray
    dq: np.ndarray
    tile: np.ndarray | None
    scratch: np.ndarray | None
    first: int


class Term:
    """A scheme's part of `backward`; every method is a no-op here.

    Attributes
    ----------
    skewed : bool
        Whether the blocks need the skewed tiles (`Block.tile`).
    batch : tuple of int
        Leading axes the term adds to the scores (ALiBi's heads, a plain bias's).
    """

    skewed = False
    batch: tuple[int, ...] = ()

    def position(self, block: Block, scores: np.ndarray) -> None:
        """Add the term inside the scale into the block's ``(*batch, B, W)`` `scores`."""

    def bias(self, block: Block, scores: np.ndarray) -> None:
        """Add the term outside the scale into the block's scaled `scores`."""

    def d_weights(self, block: Block, weights: np.ndarray, g: np.ndarray) -> None:
        """Add a value term's :math:`\\bar{w}` into `g` (``(*batch, B, W)``)."""

    def d_logits(self, block: Block, d_logits: np.ndarray) -> None:
        """Take the block's :math:`\\bar{l}` (unscaled; skewed in `Block.tile`)."""


class Core(NamedTuple):
    """`backward`'s results over the scores' batch (``(*batch, t, d)``), scale applied."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    batch: tuple[int, ...]


def _matmul_into(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    # out[...] = a @ b, straight into `out` when the product has its shape.
    shape = (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
    if shape == out.shape:
        np.matmul(a, b, out=out)
    else:
        out[...] = np.matmul(a, b)


def _mask_live(scores: np.ndarray, a: int, b: int, *, mask: Any, causal: bool,
               q_offset: int) -> None:
    # -inf where rows a .. b - 1, keys 0 .. width - 1 may not attend.
    width = scores.shape[-1]
    if mask is not None:
        rows = mask if mask.ndim < 2 or mask.shape[-2] == 1 else mask[..., a:b, :]
        if rows.ndim and rows.shape[-1] != 1:
            rows = rows[..., :width]
        np.copyto(scores, -np.inf, where=~rows)
    if causal:
        first = min(max(a + q_offset + 1, 0), width)
        if first < width:
            keys = np.arange(first, width)[None, :]
            limit = np.arange(a, b)[:, None] + q_offset
            np.copyto(scores[..., first:width], -np.inf, where=keys > limit)


def _softmax_rows(scores: np.ndarray) -> None:
    # In place: exp(x - row max) / row sum; a row with no allowed key becomes 0.
    row_max = np.max(scores, axis=-1, keepdims=True)
    row_max[row_max == -np.inf] = 0
    scores -= row_max
    np.exp(scores, out=scores)
    total = np.sum(scores, axis=-1, keepdims=True)
    total[total == 0] = 1
    scores /= total


def _row_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # sum_j a[..., j] b[..., j], no temporary (np.vecdot from NumPy 2.0 on)
    vecdot = getattr(np, "vecdot", None)
    if vecdot is not None:
        return vecdot(a, b)
    return np.einsum("...j,...j->...", a, b)


def backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    d_output: np.ndarray,
    call: Call,
    *,
    mask: Any = None,
    term: Term | None = None,
) -> Core:
    r"""``(dq, dk, dv)`` of attention with a scheme's `term`, one row block at a time.

    .. math::
        \bar{l} = w \odot (\bar{o} v^\top + \bar{w}^\text{term}
                  - \operatorname{rowsum}(w \odot (\bar{o} v^\top + \bar{w}^\text{term}))),
        \quad \bar{q} = s\,\bar{l}\,k + s\,\bar{q}^\text{term},
        \quad \bar{k} = s\,\bar{l}^\top q, \quad \bar{v} = w^\top \bar{o}

    Parameters
    ----------
    q, k, v : float arrays ``(..., t_q, d)``, ``(..., t_k, d)``, ``(..., t_k, d_v)``
        Finite, of one dtype (the kernel checked).
    d_output : array, broadcastable to ``(*batch, t_q, d_v)``
        The output's cotangent, finite.
    call : Call
        The validated call (scale, causal, q_offset).
    mask : bool array, optional
        Broadcastable to the scores.
    term : Term, optional
        The scheme's term; its methods see every block.

    Returns
    -------
    Core
        Over the scores' batch (that of ``q, k, v``, the mask and the term);
        the caller sums each to its argument's shape.
    """
    term = term if term is not None else Term()
    t_q, t_k, scale = call.t_q, call.t_k, call.scale
    batch = np.broadcast_shapes(
        tuple(call.batch), tuple(mask.shape[:-2]) if mask is not None and mask.ndim > 2 else (),
        tuple(term.batch),
    )
    dtype = q.dtype
    d, d_v = q.shape[-1], v.shape[-1]
    dq = np.zeros((*batch, t_q, d), dtype=dtype)
    dk = np.zeros((*batch, t_k, d), dtype=dtype)
    dv = np.zeros((*batch, t_k, d_v), dtype=dtype)
    if t_q == 0 or t_k == 0:
        return Core(dq, dk, dv, batch)
    groups = math.prod(batch)
    step = max(1, VJP_BLOCK_BYTES // max(1, groups * t_k * dtype.itemsize))
    step = min(step, t_q)
    weights_buffer = np.empty(groups * step * t_k, dtype=dtype)
    grad_buffer = np.empty(groups * step * t_k, dtype=dtype)
    if term.skewed:
        tile_buffer = np.zeros(groups * step * (t_k + step - 1), dtype=dtype)
        scratch_buffer = np.empty(groups * step * (t_k + step - 1), dtype=dtype)
    geometry = None
    dk_part = np.empty((*batch, t_k, d), dtype=dtype)
    dv_part = np.empty((*batch, t_k, d_v), dtype=dtype)
    k_t, v_t = np.swapaxes(k, -1, -2), np.swapaxes(v, -1, -2)
    d_out = np.broadcast_to(d_output, (*np.broadcast_shapes(batch, d_output.shape[:-2]),
                                       t_q, d_v))
    for a in range(0, t_q, step):
        b = min(a + step, t_q)
        n = b - a
        width = causal_width(b, t_k, causal=call.causal, q_offset=call.q_offset)
        if width == 0:
            continue  # no row of the block sees a key: every gradient of it is 0
        tile = scratch = None
        if term.skewed:
            size = groups * n * (width + n - 1)
            tile = tile_buffer[:size].reshape(*batch, n, width + n - 1)
            scratch = scratch_buffer[:size].reshape(tile.shape)
            if geometry != (n, width):  # the triangles move: zero them (written nowhere else)
                tile.fill(0)
                geometry = (n, width)
        scores = weights_buffer[: groups * n * width].reshape(*batch, n, width)
        g = grad_buffer[: groups * n * width].reshape(scores.shape)
        block = Block(a, b, width, q[..., a:b, :], d_out[..., a:b, :], dq[..., a:b, :],
                      tile, scratch, t_q - b)
        _matmul_into(block.q, k_t[..., :width], scores)
        term.position(block, scores)
        scores *= scale
        term.bias(block, scores)
        _mask_live(scores, a, b, mask=mask, causal=call.causal, q_offset=call.q_offset)
        _softmax_rows(scores)
        # dv += w^T dO
        part = dv_part[..., :width, :]
        _matmul_into(np.swapaxes(scores, -1, -2), block.d_output, part)
        dv[..., :width, :] += part
        # g = dO v^T (+ the term's), then the softmax's backward in place: w -> dl
        _matmul_into(block.d_output, v_t[..., :width], g)
        term.d_weights(block, scores, g)
        inner = _row_dot(scores, g)
        g -= inner[..., None]
        scores *= g
        _matmul_into(scores, k[..., :width, :], block.dq)
        if tile is not None:
            skew_view(tile, width)[...] = scores
        term.d_logits(block, scores)
        part = dk_part[..., :width, :]
        _matmul_into(np.swapaxes(scores, -1, -2), block.q, part)
        dk[..., :width, :] += part
    dq *= scale
    dk *= scale
    return Core(dq, dk, dv, batch)
