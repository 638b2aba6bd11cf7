r"""Any scheme over query and key blocks, with an online softmax, in bounded memory.

`blocked_attention` never holds more than one ``(block, block)`` tile of
logits per head. For each block of queries it walks the key blocks, keeping
per query the running maximum ``m``, the running normalizer ``l`` and the
running weighted sum ``a`` (Milakov and Gimelshein 2018; the FlashAttention
recurrence):

.. math::
    m' = \max(m, \max_j s_{ij}),\quad
    l' = e^{m - m'} l + \sum_j e^{s_{ij} - m'},\quad
    a' = e^{m - m'} a + \sum_j e^{s_{ij} - m'} (v_j + \text{value term}_{ij}),

and returns ``a / l`` (zero for a query with no allowed key). Each tile's
positional terms come from the scheme's own functions: relative positions
depend only on ``r = j - (i + q_offset)``, so the tile at query ``i0`` and key
``j0`` is the scheme evaluated with ``q_offset + i0 - j0``; the catalog's
`relpos_ref.catalog.Scheme.terms` says how each scheme evaluates a tile, and
`relpos_ref.catalog.Scheme.check_call` validates the whole call first, with the
scheme's own defaults for ``scale``, ``causal`` and ``q_offset``.

Peak memory is ``O(block (t_k + d + n_rows))`` beyond the inputs and the
output, against ``O(t_q t_k)`` for the unblocked functions.

Lazy, chunked arrays (Dask) are not walked tile by tile in their own graph,
which would hold ``(t_q / block) (t_k / block)`` small tasks and gather
through integer arrays of the library: `blocked_attention` validates the
call as for any library, then hands it to a private module of this package
(``_CHUNKED``, by the arrays' library; imported only when such an array
arrives) that maps the same loop (``_attend_rows``) over the chunks of
queries, one task per chunk, each with whole ``k``, ``v`` and tables and
the chunk's rows of the mask. A worker then holds ``k`` and ``v`` once and,
per running task, one chunk of queries, its output and one tile per head;
`relpos_ref._blocked_dask` states the bound.
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from . import _xp
from ._catalog_types import Scheme
from ._progress import Progress
from ._validate import broadcast_shapes, check_bool, check_choice, positive_int
from .attention import allowed_keys, compose_logits, weighted_sum
from .calls import Call, computes_in_float32
from .catalog import get, names, tables_by_name

__all__ = [
    "BLOCKED_SCHEMES", "BlockedCall", "blocked_attention", "check_blocked_call", "key_blocks",
    "mask_tile", "output_batch",
]

#: Schemes `blocked_attention` evaluates: the catalog's (``"plain"`` is attention without
#: positions) but CoPE, whose positions sum the gates of every later key of a row, so that
#: a tile of keys has no term of its own (`cope_attention` holds O(t_q t_k) instead).
BLOCKED_SCHEMES = tuple(n for n in names(plain=True) if n != "cope")

#: Array library (the top-level module of its array type) -> the private module that
#: evaluates `blocked_attention` one task per chunk of queries over its lazy, chunked
#: arrays (``blocked_attention_chunked``). The one place that chooses it.
_CHUNKED: Mapping[str, str] = {"dask": "relpos_ref._blocked_dask"}


@computes_in_float32
def blocked_attention(
    q: Any,
    k: Any,
    v: Any,
    /,
    *tables: Any,
    scheme: str = "plain",
    block_size: int = 1024,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
    progress: bool = False,
    **params: Any,
) -> Any:
    r"""Attention with any scheme, evaluated tile by tile with an online softmax.

    .. math:: \text{out}_i = \frac{\sum_j e^{s_{ij} - m_i} (v_j + \text{value term}_{ij})}
                                  {\sum_j e^{s_{ij} - m_i}}

    equal, within float rounding, to the scheme's ``*_attention``.

    Parameters
    ----------
    q, k, v : floating arrays ``(..., t_q, d)``, ``(..., t_k, d)``, ``(..., t_k, d_v)``
    *tables : floating arrays
        The scheme's tables, in the order of its ``*_attention`` function
        (``key_table, value_table`` for shaw; ``w_r, content_bias,
        position_bias`` for transformer_xl; none for plain, alibi, rope).
    scheme : str, optional
        One of `BLOCKED_SCHEMES`.
    block_size : int, optional
        Queries and keys per tile. Peak memory grows with it (about
        ``block_size * (t_k + d)`` elements per head); so does speed.
    scale, mask
        As in `relpos_ref.attention`; the default (``None``) is the scheme's
        scale (``1`` for t5, ``1 / sqrt(d f)`` for deberta).
    causal : bool, optional
        Default (``None``): the scheme's, ``catalog.get(scheme).defaults``
        (the conventions page's table of defaults lists every scheme's). Key
        tiles wholly in the future of a query tile are skipped.
    q_offset : int, optional
        Default (``None``): the scheme's, ``0`` (start-aligned) or
        ``t_k - t_q`` (end-aligned), as for `causal`.
    progress : bool, optional
        Draw a progress bar over the query blocks (only on a terminal; not
        for Dask arrays, whose evaluation is lazy: use Dask's diagnostics).
    **params
        The scheme's options (`relpos_ref.catalog.Scheme.options`: ``beyond``,
        ``order``, ``max_distance``, ``clamp_len``, ``max_position``, ...).

    Returns
    -------
    out : array, shape ``(..., t_q, d_v)``
        Same dtype and device as `q`. For Dask arrays a lazy Dask array, one
        task per chunk of `q`'s query axis, with `q`'s query chunks and its
        other axes in one chunk each; each task gets the whole `k`, `v`
        and tables and its rows of `mask`, so a worker holds `k` and `v`
        once (``itemsize h t_k (d + d_v)`` for ``h`` heads; twice while they
        are merged from their chunks) plus, per task
        running, its chunk of queries, its output and one tile per head;
        nothing of size ``t_q t_k`` (`relpos_ref._blocked_dask` derives the
        bound). Other chunks of `k`, `v`, tables and `mask` are merged.

    Notes
    -----
    On Dask the call is validated first, on the host, with the same errors
    as on NumPy; nothing is computed until the result is.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((3, 2, 50, 8))
    >>> key_table, value_table = rng.standard_normal((2, 9, 8))  # K = 4
    >>> out = blocked_attention(q, k, v, key_table, value_table, scheme="shaw", block_size=16)
    >>> from relpos_ref import shaw_attention
    >>> bool(np.allclose(out, shaw_attention(q, k, v, key_table, value_table)))
    True
    """
    entry, block, named, call, options, enabled, lead = check_blocked_call(
        q, k, v, tables, scheme=scheme, block_size=block_size, scale=scale, mask=mask,
        causal=causal, q_offset=q_offset, progress=progress, params=params)
    chunked = _CHUNKED.get(_xp.library_name(q))
    if chunked is not None:
        # A lazy, chunked library: one task per chunk of queries (see the module docstring).
        evaluate = importlib.import_module(chunked).blocked_attention_chunked
        return evaluate(q, k, v, named, scheme=scheme, block=block, lead=lead, scale=call.scale,
                        causal=call.causal, q_offset=call.q_offset, options=options, mask=mask)
    if entry.rotate is not None:
        q, k = entry.rotate(q, k, q_offset=call.q_offset, options=options)
    with Progress(-(-call.t_q // block), f"blocked {scheme}", enabled=enabled) as bar:
        return _attend_rows(q, k, v, named, scheme=scheme, block=block, lead=lead,
                            scale=call.scale, causal=call.causal, q_offset=call.q_offset,
                            options=options, mask=mask, bar=bar)


class BlockedCall(NamedTuple):
    """A validated `blocked_attention` call (`check_blocked_call`)."""

    entry: Scheme
    block: int
    tables: dict[str, Any]  # by name
    call: Call
    options: dict[str, Any]  # the scheme's, completed by its checks
    progress: bool | None  # ``None``: a bar where there is a terminal; ``False``: none
    lead: tuple[int, ...]  # the output's leading shape (`output_batch`)


def check_blocked_call(
    q: Any, k: Any, v: Any, tables: tuple[Any, ...], /, *, scheme: str, block_size: int,
    scale: float | None, mask: Any, causal: bool | None, q_offset: int | None,
    progress: bool, params: Mapping[str, Any],
) -> BlockedCall:
    """The checks of a `blocked_attention` call, in its order; its defaults resolved.

    Every evaluation of a blocked call (the loop here, Dask's chunks, a kernel
    of `relpos_ref.kernels`) starts with these, so bad input gets one error
    whichever evaluates it.

    Examples
    --------
    >>> import numpy as np
    >>> q = np.zeros((2, 5, 4))
    >>> checked = check_blocked_call(q, q, q, (np.zeros(32),), scheme="t5", block_size=2,
    ...                              scale=None, mask=None, causal=None, q_offset=None,
    ...                              progress=False, params={})
    >>> checked.block, checked.call.scale, checked.lead
    (2, 1.0, (2,))
    """
    if scheme == "cope":
        msg = ("blocked attention cannot evaluate `scheme` 'cope': a contextual position sums "
               "the gates of every later key of its row, so a tile of keys has no term of its "
               "own (use cope_attention, O(t_q t_k) memory)")
        raise ValueError(msg)
    check_choice("scheme", scheme, BLOCKED_SCHEMES)
    entry = get(scheme)
    for name in ("logit_scale", "mask_penalty") if scheme == "swinv2" else ():
        if params.get(name) is not None:  # a tile reads neither; one window fits in memory
            msg = (f"blocked swinv2 takes neither cosine attention nor an additive mask: "
                   f"`{name}` must be None, got {params[name]!r} (use swinv2_attention)")
            raise ValueError(msg)
    block = positive_int("block_size", block_size)
    named = tables_by_name(entry, tables)
    call, options = entry.check_call(
        q, k, v, named, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
        options=dict(params)
    )
    enabled = None if check_bool("progress", progress) else False
    lead = output_batch(entry, call, named, options, mask=mask)
    return BlockedCall(entry, block, named, call, dict(options), enabled, lead)


def output_batch(entry: Scheme, call: Call, tables: Mapping[str, Any],
                 options: Mapping[str, Any], *, mask: Any = None) -> tuple[int, ...]:
    """The output's leading shape: ``q, k, v``'s batch, the mask's, and the per-head axes.

    A table's axes before its rows (and its width) are per-head axes; an
    array option (ALiBi's slopes, ``(h,)``) holds one value per head. All
    broadcast with the batch, as in the scheme's ``*_attention``, so a tile
    with no key gets zeros of the output's shape.

    Examples
    --------
    >>> import numpy as np
    >>> q = np.zeros((5, 4))  # no head axis
    >>> entry = get("alibi")
    >>> call, options = entry.check_call(q, q, q, {}, options={"slopes": np.ones(3)})
    >>> output_batch(entry, call, {}, options)
    (3,)
    """
    shapes = {"batch": tuple(call.batch)}
    if mask is not None:
        shapes["mask"] = tuple(mask.shape[:-2])
    for table in entry.tables:
        if table.name in tables:
            own = 1 if table.width is None else 2  # rows, and a row's width
            shapes[table.name] = tuple(tables[table.name].shape[:-own])
    for name, value in options.items():
        if name == "positions" and hasattr(value, "shape"):  # RoPE's (n_axes, ..., L)
            shapes[name] = tuple(value.shape[1:-1])
        elif name == "axes" and hasattr((value or {}).get("frequencies"), "shape"):
            shapes[name] = tuple(value["frequencies"].shape[:-2])  # learned (..., R/2, n)
        elif hasattr(value, "shape") and hasattr(value, "dtype"):
            shapes[name] = tuple(value.shape)
    return broadcast_shapes(**shapes)


def mask_tile(mask: Any, i0: int, i1: int, j0: int, j1: int) -> Any:
    """The part of `mask` (broadcastable to ``(..., t_q, t_k)``) for rows i0..i1, keys j0..j1.

    Axes of length 1, or missing (a 0-d or 1-d mask), broadcast as they are.

    Examples
    --------
    >>> import numpy as np
    >>> mask_tile(np.eye(4, dtype=bool), 1, 3, 0, 2).tolist()
    [[False, True], [False, False]]
    >>> mask_tile(np.ones((4, 1), dtype=bool), 1, 3, 0, 2).shape
    (2, 1)
    """
    if mask is None or mask.ndim == 0:
        return mask
    cols = slice(j0, j1) if mask.shape[-1] != 1 else slice(None)
    if mask.ndim == 1:
        return mask[cols]
    rows = slice(i0, i1) if mask.shape[-2] != 1 else slice(None)
    return mask[..., rows, cols]


def key_blocks(
    last_row: int, t_k: int, /, *, block: int, causal: bool, q_offset: int
) -> Iterator[tuple[int, int]]:
    """``(j0, j1)`` of the key blocks a tile of queries up to `last_row` visits.

    Under `causal` none after the block of the last query's last allowed key:
    every key from there on is in the future of every query of the tile.

    Examples
    --------
    >>> list(key_blocks(1, 6, block=2, causal=True, q_offset=0))
    [(0, 2)]
    """
    for j0 in range(0, t_k, block):
        if causal and j0 > last_row + q_offset:
            break
        yield j0, min(j0 + block, t_k)


def _attend_rows(
    q: Any,
    k: Any,
    v: Any,
    tables: Mapping[str, Any],
    /,
    *,
    scheme: str,
    block: int,
    lead: tuple[int, ...],
    scale: float,
    causal: bool,
    q_offset: int,
    options: Mapping[str, Any],
    mask: Any = None,
    row0: int = 0,
    bar: Progress | None = None,
) -> Any:
    """The online-softmax loop over query rows ``row0 ..`` of a validated call.

    `q` holds the call's queries ``row0 .. row0 + q.shape[-2] - 1``, already
    rotated (RoPE); `mask` the same rows (or a row axis of length 1, or
    fewer than 2 axes); `k`, `v` and `tables` are whole; `scale`, `causal`,
    `q_offset` and `options` are resolved (`relpos_ref.catalog.Scheme.check_call`).
    Nothing is validated here: `blocked_attention` calls it on a whole call,
    the chunked evaluation of `relpos_ref._blocked_dask` on each chunk of
    queries with its `row0`. Tiles start at the multiples of `block` of the
    whole call, so a chunk's tiles are those of the whole call, cut at the
    chunk's ends.

    Examples
    --------
    >>> import numpy as np
    >>> q = k = v = np.eye(4)
    >>> out = _attend_rows(q[2:], k, v, {}, scheme="plain", block=2, lead=(), scale=0.5,
    ...                    causal=True, q_offset=0, options={}, row0=2)
    >>> bool(np.allclose(out, blocked_attention(q, k, v, scale=0.5, causal=True)[2:]))
    True
    """
    entry = get(scheme)
    xp = _xp.array_namespace(q, k, v)
    t_k = k.shape[-2]
    dev = _xp.device(q)
    d_v = v.shape[-1]
    neg_inf = xp.asarray(-xp.inf, dtype=q.dtype, device=dev)
    zero = xp.asarray(0.0, dtype=q.dtype, device=dev)
    one = xp.asarray(1.0, dtype=q.dtype, device=dev)
    pieces = []
    n = q.shape[-2]
    # tiles at the whole call's multiples of `block`, cut at this chunk's ends
    bounds = [0, *range((row0 // block + 1) * block - row0, n, block), n] if n else [0]
    for i0, i1 in itertools.pairwise(bounds):
        at, end = row0 + i0, row0 + i1  # the tile's rows in the whole call
        q_blk = q[..., i0:i1, :]
        rows = i1 - i0
        m = xp.full((*lead, rows, 1), -xp.inf, dtype=q.dtype, device=dev)
        total = xp.zeros((*lead, rows, 1), dtype=q.dtype, device=dev)
        acc = xp.zeros((*lead, rows, d_v), dtype=q.dtype, device=dev)
        for j0, j1 in key_blocks(end - 1, t_k, block=block, causal=causal, q_offset=q_offset):
            k_blk, v_blk = k[..., j0:j1, :], v[..., j0:j1, :]
            off = q_offset + at - j0
            position, bias = entry.attention_terms(q_blk, k_blk, tables, q_offset=q_offset,
                                                   i0=at, j0=j0, options=options,
                                                   method="efficient")
            content = xp.matmul(q_blk, xp.matrix_transpose(k_blk))
            logits = compose_logits(content, scale=scale, position=position, bias=bias)
            allowed = allowed_keys(rows, j1 - j0, mask=mask_tile(mask, i0, i1, j0, j1),
                                   causal=causal, q_offset=off, xp=xp, device=dev)
            if allowed is not None:
                logits = xp.where(allowed, logits, neg_inf)
            new_m = xp.maximum(m, xp.max(logits, axis=-1, keepdims=True))
            base = xp.where(new_m == neg_inf, zero, new_m)
            weights = xp.exp(logits - base)
            correction = xp.exp(m - base)
            total = total * correction + xp.sum(weights, axis=-1, keepdims=True)
            update = weighted_sum(weights, v_blk, used=allowed)
            if entry.values is not None:
                extra = entry.values(weights, tables, q_offset=off, options=options,
                                     method="efficient", allowed=allowed)
                if extra is not None:
                    update = update + extra
            acc = acc * correction + update
            m = new_m
        pieces.append(acc / xp.where(total == zero, one, total))
        if bar is not None:
            bar.advance(f"queries {at}..{end - 1}")
    if not pieces:
        return xp.zeros((*lead, 0, d_v), dtype=q.dtype, device=dev)
    return pieces[0] if len(pieces) == 1 else xp.concat(pieces, axis=-2)
