r"""`relpos_ref.blocked.blocked_attention` over Dask arrays: one task per chunk of queries.

Private: `relpos_ref.blocked` imports this module the first time a Dask array
arrives (``_CHUNKED``), after it has validated the whole call, so Dask is
never imported with `relpos_ref`. Nothing here is a second specification:
each task runs the blocked loop of `relpos_ref.blocked` (``_attend_rows``,
the scheme's own terms per tile, an online softmax over the key blocks) on
the NumPy (or CuPy) blocks it receives, at the chunk's first query row, so
the result is the one `blocked_attention` computes on NumPy arrays, up to the
rounding of BLAS on other shapes; the tests check it for every scheme.

Why not the generic loop on Dask arrays: walked over Dask arrays, the loop
builds a graph of small tasks for each of the ``(t_q / block) (t_k / block)``
tiles (1768 tasks for plain attention at ``t = 2048``, block 256; 15 s of
the client's time and a 10 MiB graph at ``t = 32768``), and the terms of the
schemes with tables gather rows through integer Dask arrays, which Dask
plans as ``slice_with_int_dask_array`` tasks; issue 17 saw 1 GiB workers
killed at ``t = 32768`` (``KilledWorker``). Here the graph has one task per
chunk of queries, and every gather happens inside a task, on a NumPy block.

The graph (``da.blockwise``), for ``q`` with query chunks ``c_1, c_2, ...``:

- ``q``: its query axis keeps its chunks, its other axes become one chunk;
- ``k``, ``v`` and every table: one chunk each (RoPE rotates ``k`` once, in
  one task, before the chunks read it);
- ``mask``: a mask with a query axis (``mask.shape[-2] == t_q``) is cut into
  the same rows as ``q`` (each task reads its rows, never a gather); one
  that broadcasts along the queries is one chunk;
- the output ``(*lead, t_q, d_v)``: one chunk per chunk of queries.

Memory per worker
-----------------
Let ``s`` be the itemsize, ``h`` the product of the leading axes (batch and
heads), ``c`` the largest chunk of queries, ``B`` the block size and ``n``
the tasks a worker runs at once (its threads). A worker holds at most about

.. math::
    M_0 + s h \bigl(2 t_k (d + d_v) + t_q (d + d_v)\bigr) + |\text{tables}|
        + n \bigl(s h c (d + 2 d_v) + w\,s h B^2 + h c t_k [\text{dense mask}]\bigr)
        + R,

- ``M_0``: the worker process before the call (Python, NumPy, Dask; about
  90 MiB);
- ``2 s h t_k (d + d_v)``: ``k`` and ``v``, one copy per worker however many
  of its tasks read them (Dask keeps one copy of a task's input), twice while
  one worker merges them from their chunks;
- ``s h t_q (d + d_v)``: chunks of ``q`` waiting for their task and of the
  output waiting for the client, at most the whole of each (if one worker
  ran everything; nothing if the output streams to storage);
- per running task: its queries (``s h c d``), its output and accumulator
  (``2 s h c d_v``), its rows of a dense mask (``h c t_k`` bytes, only when
  one is given) and the loop's tile, ``w`` arrays of ``(h, B, B)``: logits,
  the tile's mask, weights, exponentials and the scheme's terms; tracemalloc
  measured ``w`` = 5.3 (RoPE), 7.5 (plain), 10.6 (Shaw, causal), 16.6 (T5),
  17.6 (DeBERTa) at ``B = 1024`` for a chunk of 4096 queries, output
  included;
- ``R``: free memory malloc keeps (its trim threshold: 64 KiB under Dask's
  nanny; the benchmark's tuned setting, 64 MiB).

Nothing grows with ``t_q t_k``. The terms that grow with the length are
``k``, ``v`` and the whole input and output; every worker needs ``k`` and
``v``. At ``t_q = t_k = 131072``, one head, ``d = d_v = 64``, float32,
``c = 4096``, ``B = 1024``, one thread per worker: 128 MiB for ``k`` and
``v`` (while merged), 64 MiB of chunks, 75 MiB per task with ``w = 18``,
about 420 MiB with ``M_0`` and ``R = 64`` MiB, against workers of 1 GiB;
``benchmarks/run.py --t-distributed`` measures it (``worker_memory_bound``
there is this formula).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import dask.array as da
from dask.array.utils import meta_from_array

from .blocked import _attend_rows, key_blocks
from .catalog import get

__all__ = ["blocked_attention_chunked"]


def _axes(label: str, n: int) -> tuple[str, ...]:
    # Index names of blockwise for axes that are one chunk each (contracted: every task
    # receives the whole block).
    return tuple(f"{label}{a}" for a in range(n))


def _whole(x: Any) -> Any:
    """`x` as one chunk."""
    return x.rechunk(dict.fromkeys(range(x.ndim), -1)) if x.ndim else x


def _check_known(**arrays: Any) -> None:
    for name, a in arrays.items():
        if a is not None and any(math.isnan(n) for n in a.shape):
            msg = (f"`{name}` has unknown chunk sizes (shape {a.shape}); call "
                   "`.compute_chunk_sizes()` on it first")
            raise ValueError(msg)


def _tiles(
    t_q: int, t_k: int, *, block: int, causal: bool, q_offset: int
) -> Iterator[tuple[int, int, int, int]]:
    """``(i0, i1, j0, j1)`` of each tile `relpos_ref.blocked.blocked_attention` visits, in order.

    Those of the whole call (causal: a row of tiles stops at the key block of
    its last query's last allowed key); a chunk of queries visits parts of
    them.

    Examples
    --------
    >>> list(_tiles(4, 4, block=2, causal=True, q_offset=0))
    [(0, 2, 0, 2), (2, 4, 0, 2), (2, 4, 2, 4)]
    """
    for i0 in range(0, t_q, block):
        i1 = min(i0 + block, t_q)
        for j0, j1 in key_blocks(i1 - 1, t_k, block=block, causal=causal, q_offset=q_offset):
            yield i0, i1, j0, j1


def _check_tiles(
    q: Any, k: Any, tables: Mapping[str, Any], *, scheme: str, lead: tuple[int, ...],
    block: int, causal: bool, q_offset: int, options: Mapping[str, Any],
) -> None:
    """Raise now what the tiles' own checks raise on NumPy, rather than in a task later.

    Beyond `relpos_ref.catalog.Scheme.check_call`, a scheme's terms check on
    the host that each tile's distances have table rows (``beyond="error"``:
    Shaw, bias, Music). The tiles run in the tasks here, so the scheme's terms
    and value terms are built lazily on one-query, one-key Dask slices at the
    pairs of the smallest and largest distance the tiles visit, and thrown
    away (the checks are on intervals of distances: if the extremes pass,
    every tile does). When one fails, the tiles are walked in NumPy's order,
    probing each distance not seen yet, so the error is the one of NumPy's
    first failing tile, message included.
    """
    entry = get(scheme)

    def probe(pairs: list[tuple[int, int]]) -> None:
        for i, j in pairs:
            entry.terms(q[..., i : i + 1, :], k[..., j : j + 1, :], tables, q_offset=q_offset,
                        i0=i, j0=j, options=options, method="efficient")
        if entry.values is not None:
            weights = da.zeros((*lead, 1, 1), dtype=q.dtype)
            for i, j in pairs:
                entry.values(weights, tables, q_offset=q_offset + i - j, options=options,
                             method="efficient", allowed=None)

    tiles = list(_tiles(q.shape[-2], k.shape[-2], block=block, causal=causal,
                        q_offset=q_offset))
    if not tiles:
        return
    # (query, key) pairs: the smallest distance of a tile at its last query and first key,
    # the largest at its first query and last key
    lowest = min(((i1 - 1, j0) for _, i1, j0, _ in tiles), key=lambda p: p[1] - p[0])
    highest = max(((i0, j1 - 1) for i0, _, _, j1 in tiles), key=lambda p: p[1] - p[0])
    try:
        probe([lowest, highest])
    except (TypeError, ValueError) as error:
        failed = error
    else:
        return
    seen_low = seen_high = None
    for i0, i1, j0, j1 in tiles:
        new = []
        if seen_low is None or j0 - (i1 - 1) < seen_low:
            new.append((i1 - 1, j0))
            seen_low = j0 - (i1 - 1)
        if seen_high is None or j1 - 1 - i0 > seen_high:
            new.append((i0, j1 - 1))
            seen_high = j1 - 1 - i0
        probe(new)
    raise failed


def _rotated_keys(k: Any, options: Mapping[str, Any], *, scheme: str) -> Any:
    # RoPE rotates keys by their positions only: rotate them once, not once per chunk.
    _, rotated = get(scheme).rotate(k[..., :0, :], k, q_offset=0, options=options)
    return rotated


def _chunk(
    rows: Any, q: Any, mask: Any, k: Any, v: Any, tables: Mapping[str, Any],
    options: Mapping[str, Any], *, scheme: str, block: int, lead: tuple[int, ...],
    scale: float, causal: bool, q_offset: int,
) -> Any:
    """One task: the queries ``rows`` of the call, on the blocks (NumPy, CuPy) it receives."""
    row0 = int(rows[0]) if rows.shape[0] else 0
    entry = get(scheme)
    if entry.rotate is not None:  # rotate the chunk's queries at their own positions
        q, _ = entry.rotate(q, k[..., :0, :], q_offset=q_offset + row0, options=options)
    return _attend_rows(q, k, v, tables, scheme=scheme, block=block, lead=lead, scale=scale,
                        causal=causal, q_offset=q_offset, options=options, mask=mask,
                        row0=row0)


def blocked_attention_chunked(
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
) -> Any:
    """A validated `relpos_ref.blocked.blocked_attention` call on Dask arrays, lazily.

    Parameters
    ----------
    q, k, v : dask arrays ``(..., t_q, d)``, ``(..., t_k, d)``, ``(..., t_k, d_v)``
        As given (``q`` not rotated).
    tables : mapping of str to dask array
        The scheme's tables by name.
    scheme, block
        The scheme's name and the block size of the tiles.
    lead : tuple of int
        The output's leading shape (batch and mask broadcast).
    scale, causal, q_offset, options
        Resolved by the scheme's `relpos_ref.catalog.Scheme.check_call`.
    mask : dask array, optional

    Returns
    -------
    dask array ``(*lead, t_q, d_v)``
        One chunk per chunk of `q`'s query axis; `q`'s dtype.

    Examples
    --------
    >>> import dask.array as da
    >>> import numpy as np
    >>> from relpos_ref.blocked import blocked_attention
    >>> x = np.random.default_rng(0).standard_normal((64, 8))
    >>> q = da.from_array(x, chunks=(16, 8))
    >>> out = blocked_attention(q, q, q, block_size=8, causal=True)  # comes here
    >>> out.chunks
    ((16, 16, 16, 16), (8,))
    >>> bool(np.allclose(out.compute(), blocked_attention(x, x, x, causal=True)))
    True
    """
    _check_known(q=q, k=k, v=v, mask=mask, **tables)
    _check_tiles(q, k, tables, scheme=scheme, lead=lead, block=block, causal=causal,
                 q_offset=q_offset, options=options)
    entry = get(scheme)
    query_axis = q.ndim - 2
    q = q.rechunk({a: -1 for a in range(q.ndim) if a != query_axis})
    query_chunks = q.chunks[query_axis]
    rows = da.arange(q.shape[query_axis], chunks=(query_chunks,))
    k, v = _whole(k), _whole(v)
    k_index, v_index = _axes("k", k.ndim), _axes("v", v.ndim)
    if entry.rotate is not None:
        k = da.blockwise(_rotated_keys, k_index, k, k_index, dict(options), None,
                         scheme=scheme, dtype=k.dtype, meta=meta_from_array(k),
                         token="relpos-rotated-keys")
    if mask is None:
        mask_arg: tuple[Any, Any] = (None, None)
    elif mask.ndim >= 2 and mask.shape[-2] != 1:
        rows_of_mask = {a: -1 for a in range(mask.ndim)}
        rows_of_mask[mask.ndim - 2] = query_chunks
        mask_arg = (mask.rechunk(rows_of_mask),
                    (*_axes("m", mask.ndim - 2), "rows", "keys"))
    else:
        mask = _whole(mask)
        mask_arg = (mask, _axes("m", mask.ndim))
    out_index = (*_axes("o", len(lead)), "rows", "features")
    return da.blockwise(
        _chunk, out_index,
        rows, ("rows",),
        q, (*_axes("q", q.ndim - 2), "rows", "d"),
        *mask_arg,
        k, k_index,
        v, v_index,
        {name: _whole(t) for name, t in tables.items()}, None,
        dict(options), None,
        new_axes={**dict(zip(_axes("o", len(lead)), lead, strict=True)), "features": v.shape[-1]},
        concatenate=True,
        dtype=q.dtype,
        meta=meta_from_array(q, ndim=len(out_index)),
        token="relpos-blocked-attention",
        scheme=scheme, block=block, lead=tuple(lead), scale=scale, causal=causal,
        q_offset=q_offset,
    )
