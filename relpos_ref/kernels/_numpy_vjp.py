r"""NumPy backward passes: the engine every VJP kernel runs, one row block at a time.

The specification (`relpos_ref.gradients`) recomputes the weights of the
whole ``(..., t_q, t_k)`` grid, then makes one pass through memory per
operation, each allocating a new array of that shape, and guards every
product against non-finite rows (`masked_product`, `dot_rows`). The kernels
take the call only when every array it reads is finite (then those guards
change nothing: a masked pair has weight 0 and contributes ``0`` to every
gradient), and run `backward`: per block of ``B`` query rows, one entry of
the batch (one head) at a time, in two block-sized buffers that stay in the
core's own cache (`VJP_BLOCK_BYTES`),

.. math::
    e = \exp(s\,q_B k^\top + s P_B + B_B), \quad T = \operatorname{rowsum}(e), \quad
    \bar{o}' = \bar{o}_B / T, \quad \bar{v} \mathrel{+}= e^\top \bar{o}',
    \quad g = \bar{o}' v^\top\ (+\ \bar{w}^\text{term} / T),

    \bar{l} = e \odot (g - \operatorname{rowsum}(e \odot g) / T), \qquad
    \bar{q}_B = s\,\bar{l}\, k, \qquad \bar{k} \mathrel{+}= \bar{l}^\top (s\,q_B),

in place (the weights become :math:`\bar{l}`, or it goes to an array of the
term's own, `Term.logits_view`). The weights are never
divided by their row sums ``T``: ``w = e / T`` enters every product through
the block's ``B x d_v`` rows of :math:`\bar{o}` divided by ``T`` instead,
which saves a pass over the block. Nor is the row maximum subtracted before
the exponential when every row's maximum lies within `EXP_LIMIT` of 0 and
every row sees every key of the block (the maximum is still found, and
subtracted otherwise: a row that sees one key then has ``e = 1`` and exact
zeros for gradients, as the specification has), and the scale multiplies
``q`` (``t_q x d``) rather than the scores. No exponential is subnormal
(`relpos_ref.kernels._numpy_blocks.flush_subnormals`, issue 30: each such
operand of a product is slow on Intel CPUs). Five GEMMs per block and six
elementwise passes; under ``causal`` only the keys some row of the block may
see. Extra memory is two blocks and the ``O((t_q + t_k) d)`` results,
whatever ``t_q t_k``.

One head at a time (rather than every head of a row block at once) keeps a
block in the core's second-level cache and gives each GEMM ``B`` rows of
one head: on the benchmark machine 10 to 20 % faster than blocks of every
head, which made the backward pass 2.0 to 2.2 times the forward pass of
plain attention (its five GEMMs against the forward's two).

A scheme's term comes in through a `Term`: it sees each block of each head
(`Term.select`, then its methods), and each block once every head ran it
(`Term.finish`), where what it keeps per head can go through NumPy once for
all heads. Relative terms use the *skewed* layout: a block's ``(B, W)``
entries laid out in a ``(B, W + B - 1)`` tile whose column ``c`` is one
distance for every row, ``r = c - (B - 1) - a - q_offset`` (entry
``(i', j)`` at column ``j + B - 1 - i'``, `skew_view`; the two triangles
outside are zero). In it a distance-only term is a column constant, a
per-distance table's term the product ``q_B window^T`` (`tile_rows`), each
added to the scores through the view (`relpos_ref.kernels._numpy_vjp_tiles`); the
transposes, from :math:`\bar{l}` copied into the tile, are column sums and the
products ``tile window`` and
``tile^T q_B`` (`tile_products`; what `relpos_ref.gradients.by_distance` lays
out, without the ``(t_q, t_q + t_k - 1)`` array), both by sub-blocks of
`TILE_ROWS` rows, each over the ``W + S - 1`` columns it reaches. The scores
themselves stay contiguous: NumPy's elementwise loops on strided rows ran 3 to
5 times slower.

Nothing here validates its arguments: the kernels of `relpos_ref.kernels.numpy`
call it after the specification's own validation.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from ..calls import Call
from ._numpy_blocks import causal_width, flush_subnormals
from ._numpy_vjp_tiles import row_dot, skew_view

__all__ = [
    "EXP_LIMIT",
    "VJP_BLOCK_BYTES",
    "Block",
    "Core",
    "Term",
    "at",
    "backward",
    "finite",
    "sum_to",
]

#: Bytes of one block buffer (the weights; the cotangent ``g`` is another), for one
#: head. On the benchmark machine (1 MiB of second-level cache per core) 1 to 8 MiB
#: (256 to 2048 rows of 1024 keys in float32) ran alike, 7 % faster than 512 KiB and
#: 30 % faster than 128 KiB (small GEMMs); blocks of one head at a time, 10 to 20 %
#: faster than blocks of every head.
VJP_BLOCK_BYTES = 2**20

#: Largest ``|row maximum|`` of the logits for which the exponential runs without
#: subtracting it, per dtype. The weights are then ``e^s`` with row sums within
#: ``e^{-16}`` and ``t_k e^{16}`` (float32): no overflow, no underflow of an entry within
#: ``e^{-70}`` of its row's largest, and the cotangent divided by the row sums keeps its
#: precision down to ``1e-30``. Other rows subtract their maximum, as the forward does.
EXP_LIMIT = {np.dtype(np.float32): 16.0, np.dtype(np.float64): 300.0}


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


def at(x: Any, group: tuple[int, ...], core: int) -> Any:
    """The entry `group` of a batch that `x` broadcasts to: its last `core` axes.

    `x` is ``(*lead, *core_shape)`` with ``lead`` broadcastable to the batch
    that `group` indexes (right-aligned; an axis of size 1 is shared by every
    index). Returns a view (``None`` stays ``None``): adding into the view of
    an array that broadcasts sums over the batch entries that share it.

    Examples
    --------
    >>> x = np.arange(6).reshape(3, 1, 2)
    >>> at(x, (1, 2, 0), 1), at(np.ones(2), (1, 2, 0), 1).shape
    (array([4, 5]), (2,))
    """
    if x is None:
        return None
    lead = x.ndim - core
    if lead <= 0:
        return x
    shift = len(group) - lead
    return x[tuple(0 if n == 1 else group[shift + i] for i, n in enumerate(x.shape[:lead]))]


class Block(NamedTuple):
    """One row block of one batch entry (head) in `backward`, as a `Term` sees it.

    Attributes
    ----------
    a, b : int
        Query rows ``a .. b - 1``.
    width : int
        Keys ``0 .. width - 1`` (fewer than ``t_k`` only under ``causal``).
    group : tuple of int
        The batch entry (an index into the scores' batch, `Core.batch`).
    q, q_scaled : arrays ``(B, d)``
        The block's rows of ``q``, and the same times the scale.
    d_output : array ``(B, d_v)`` or None
        The block's rows of the output's cotangent, each divided by its row's
        sum of the unnormalized weights (``None`` until the weights exist).
    dq : array ``(B, d)``
        The block's rows of ``dq`` before the scale; a term adds its
        :math:`\\bar{l}`-linear share here.
    tile, scratch : arrays ``(B, width + B - 1)`` or None
        When the term is `Term.skewed`: `tile` with zero triangles, which
        holds :math:`\\bar{l}` (`skew_view`) when `Term.d_logits` runs and is
        the term's to fill through `skew_view` before; `scratch`, the term's
        for anything.
    first : int
        The distance index (``r + t_q - 1 + q_offset``) of tile column 0: ``t_q - b``.
    """

    a: int
    b: int
    width: int
    group: tuple[int, ...]
    q: np.ndarray
    q_scaled: np.ndarray
    d_output: np.ndarray | None
    dq: np.ndarray
    tile: np.ndarray | None
    scratch: np.ndarray | None
    first: int


class Term:
    """A scheme's part of `backward`; every method is a no-op here.

    Every array a `Block` hands over is two-dimensional (one head's rows); a
    term picks its own arrays' entry of the batch in `select` (`at`).

    Attributes
    ----------
    skewed : bool
        Whether the blocks need the skewed tiles (`Block.tile`).
    batch : tuple of int
        Leading axes the term adds to the scores (ALiBi's heads, a plain bias's).
    rows : int or None
        At most this many query rows per block (the term's per-block work grows
        faster than the block).
    """

    skewed = False
    batch: tuple[int, ...] = ()
    rows: int | None = None

    def start(self, batch: tuple[int, ...], dtype: Any) -> None:
        """Called once, with the scores' batch and dtype, before any block."""

    def select(self, group: tuple[int, ...]) -> None:
        """Called before each block of batch entry `group` (the blocks run row block by
        row block, every entry of the batch in turn)."""

    def position(self, block: Block, scores: np.ndarray) -> None:
        """Add the term inside the scale, times the scale, into the ``(B, W)`` `scores`."""

    def bias(self, block: Block, scores: np.ndarray) -> None:
        """Add the term outside the scale into the block's scaled `scores`."""

    def d_weights(self, block: Block, weights: np.ndarray, g: np.ndarray) -> None:
        """Add a value term's :math:`\\bar{w}` into `g` (``(B, W)``), over the row sums.

        `weights` are the block's unnormalized weights ``e`` (the weights times
        the row sums ``T``) and `g` holds :math:`\\bar{o} v^\\top / T`: the term
        adds its own :math:`\\bar{w} / T`, which it gets from `Block.d_output`.
        """

    def logits_view(self, block: Block) -> np.ndarray | None:
        """A writeable ``(B, W)`` array of the term's own for the block's :math:`\\bar{l}`.

        `backward` writes :math:`\\bar{l}` there (rather than over the weights) and
        runs its products from there; ``None`` (the default): over the weights.
        """
        return None

    def d_logits(self, block: Block, d_logits: np.ndarray) -> None:
        """Take the block's :math:`\\bar{l}` (``(B, W)``, unscaled; skewed in `Block.tile`)."""

    def finish(self, a: int, b: int, width: int) -> None:
        """Called once every batch entry's block of rows ``a .. b - 1`` (keys ``< width``) ran."""


class Core(NamedTuple):
    """`backward`'s results over the scores' batch (``(*batch, t, d)``), scale applied."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    batch: tuple[int, ...]


def _mask_rows(scores: np.ndarray, a: int, b: int, *, mask: Any, causal: bool,
               q_offset: int) -> None:
    # -inf where rows a .. b - 1, keys 0 .. width - 1 of one head may not attend.
    width = scores.shape[-1]
    if mask is not None:
        np.copyto(scores, -np.inf, where=~mask[a:b, :width])
    if causal:
        first = min(max(a + q_offset + 1, 0), width)
        if first < width:
            keys = np.arange(first, width)[None, :]
            limit = np.arange(a, b)[:, None] + q_offset
            np.copyto(scores[:, first:width], -np.inf, where=keys > limit)


def _exp_rows(scores: np.ndarray, ones: np.ndarray, limit: float,
              low: float | None = None) -> np.ndarray:
    # In place: exp(x - shift) with shift the row maximum, or 0 when every row's
    # maximum lies in [-limit, limit] (limit 0: always the maximum); returns the row
    # sums, 1 for a row with no allowed key (its entries are 0). No e is subnormal
    # (`flush_subnormals`; `low`: the smallest allowed score, read before the mask).
    row_max = np.max(scores, axis=-1)
    live = row_max[row_max > -np.inf]
    shift = 0.0
    if live.size and not (float(live.max()) <= limit and float(live.min()) >= -limit):
        row_max[row_max == -np.inf] = 0
        scores -= row_max[:, None]
        shift = float(row_max.max())
    flush_subnormals(scores, scores.shape[-1], least=None if low is None else low - shift)
    np.exp(scores, out=scores)
    total = scores @ ones[: scores.shape[-1]]
    total[total == 0] = 1
    return total


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
    r"""``(dq, dk, dv)`` of attention with a scheme's `term`, one head and row block at a time.

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
        The scheme's term; its methods see every head and block.

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
        tuple(term.batch), tuple(d_output.shape[:-2]),
    )
    dtype = q.dtype
    d, d_v = q.shape[-1], v.shape[-1]
    dq = np.zeros((*batch, t_q, d), dtype=dtype)
    dk = np.zeros((*batch, t_k, d), dtype=dtype)
    dv = np.zeros((*batch, t_k, d_v), dtype=dtype)
    if t_q == 0 or t_k == 0 or math.prod(batch) == 0:
        return Core(dq, dk, dv, batch)
    term.start(batch, dtype)
    step = max(1, VJP_BLOCK_BYTES // max(1, t_k * dtype.itemsize))
    step = min(step, t_q, term.rows or t_q)
    weights_buffer = np.empty(step * t_k, dtype=dtype)
    grad_buffer = np.empty(step * t_k, dtype=dtype)
    if term.skewed:
        tile_buffer = np.zeros(step * (t_k + step - 1), dtype=dtype)
        scratch_buffer = np.empty(step * (t_k + step - 1), dtype=dtype)
    geometry = None
    dk_part = np.empty((t_k, d), dtype=dtype)
    dv_part = np.empty((t_k, d_v), dtype=dtype)
    ones = np.ones(t_k, dtype=dtype)
    limit = EXP_LIMIT.get(dtype, 0.0)
    qb = np.broadcast_to(q, (*batch, t_q, d))
    kb = np.broadcast_to(k, (*batch, t_k, d))
    vb = np.broadcast_to(v, (*batch, t_k, d_v))
    ob = np.broadcast_to(d_output, (*batch, t_q, d_v))
    mb = None if mask is None else np.broadcast_to(mask, (*batch, t_q, t_k))
    qsb = np.broadcast_to(q * dtype.type(scale), (*batch, t_q, d))  # the scale on q
    groups = list(np.ndindex(*batch))
    for a in range(0, t_q, step):
        b = min(a + step, t_q)
        n = b - a
        width = causal_width(b, t_k, causal=call.causal, q_offset=call.q_offset)
        if width == 0:
            continue  # no row of the block sees a key: every gradient of it is 0
        for group in groups:
            q_g, q_s, k_g, v_g, o_g = qb[group], qsb[group], kb[group], vb[group], ob[group]
            mask_g = None if mb is None else mb[group]
            dq_g, dk_g, dv_g = dq[group], dk[group], dv[group]
            k_t, v_t = k_g.T, v_g.T
            term.select(group)
            tile = scratch = None
            if term.skewed:
                size = n * (width + n - 1)
                tile = tile_buffer[:size].reshape(n, width + n - 1)
                scratch = scratch_buffer[:size].reshape(tile.shape)
                if geometry != (n, width):  # the triangles move: zero them (written nowhere else)
                    tile.fill(0)
                    geometry = (n, width)
            scores = weights_buffer[: n * width].reshape(n, width)
            g = grad_buffer[: n * width].reshape(n, width)
            block = Block(a, b, width, group, q_g[a:b], q_s[a:b], None, dq_g[a:b], tile,
                          scratch, t_q - b)
            np.matmul(block.q_scaled, k_t[:, :width], out=scores)
            term.position(block, scores)
            term.bias(block, scores)
            masked = mask_g is not None or call.causal
            low = float(np.min(scores)) if masked else None  # read before the mask's -inf
            _mask_rows(scores, a, b, mask=mask_g, causal=call.causal, q_offset=call.q_offset)
            # the unnormalized weights e; a row that may see one key alone (a mask, causal,
            # one key) has e = 1 after its maximum, so that its gradients are exactly 0
            exact = masked or width == 1
            inverse = 1 / _exp_rows(scores, ones, 0.0 if exact else limit, low)
            block = block._replace(d_output=o_g[a:b] * inverse[:, None])
            # dv += w^T dO = e^T (dO / T)
            part = dv_part[:width]
            np.matmul(scores.T, block.d_output, out=part)
            dv_g[:width] += part
            # g = dO v^T / T (+ the term's), then the softmax's backward in place:
            # e -> e (g - rowsum(e g) / T) = dl
            np.matmul(block.d_output, v_t[:, :width], out=g)
            term.d_weights(block, scores, g)
            inner = row_dot(scores, g)
            inner *= inverse
            g -= inner[:, None]
            d_logits = term.logits_view(block)
            if d_logits is None:
                d_logits = np.multiply(scores, g, out=scores)
            else:  # written where the term keeps it (a pass saved)
                np.multiply(scores, g, out=d_logits)
            np.matmul(d_logits, k_g[:width], out=block.dq)
            if tile is not None:
                skew_view(tile, width)[...] = d_logits
            term.d_logits(block, d_logits)
            part = dk_part[:width]
            np.matmul(d_logits.T, block.q_scaled, out=part)
            dk_g[:width] += part
        term.finish(a, b, width)
    dq *= scale
    return Core(dq, dk, dv, batch)
