r"""Relative-logit layouts mapped to absolute ``(t_q, t_k)`` layouts.

A relative layout ``x`` has shape ``(..., t_q, n_rel)``: row ``i`` holds one
value per relative distance, column ``c`` standing for the distance
``r = c - offset`` (``offset`` is the column of ``r = 0``). Each function here
returns ``out`` of shape ``(..., t_q, t_k)`` with

.. math:: \text{out}[..., i, j] = x[..., i, r(i, j) + \text{offset}],
          \qquad r(i, j) = j - (i + q_\text{offset}),

on its valid region. `gather` is this definition, element by element;
the others are the reshape tricks of the literature, which avoid building an
index array but are exact only on their valid region (each docstring says
where, and what fills the rest).
"""

from __future__ import annotations

from typing import Any

from . import _xp
from ._validate import as_int, check_choice, nonnegative_int
from .positions import check_distances_in_table, distance_range, relative_positions

__all__ = [
    "TABLE_ORDERS",
    "gather",
    "pad_flatten_reshape",
    "rel_shift",
    "skew",
    "stacked_diagonals",
    "take_per_row",
    "to_relative",
]

TABLE_ORDERS = ("past_to_future", "future_to_past")


def _relative_layout(name: str, x: Any) -> tuple[Any, tuple[int, ...], int, int]:
    xp = _xp.array_namespace(x)
    if x.ndim < 2:
        msg = f"`{name}` must have shape (..., t_q, n_rel), got shape {tuple(x.shape)}"
        raise ValueError(msg)
    *batch, t_q, n_rel = x.shape
    return xp, tuple(batch), t_q, n_rel


def _zeros(xp: Any, x: Any, shape: tuple[int, ...]) -> Any:
    return xp.zeros(shape, dtype=x.dtype, device=_xp.device(x))


def gather(x: Any, /, t_k: int, *, offset: int, q_offset: int = 0) -> Any:
    r"""Relative layout to absolute layout by gathering: the definition.

    .. math:: \text{out}[..., i, j] =
              x[..., i, j - (i + q_\text{offset}) + \text{offset}]

    Parameters
    ----------
    x : array, shape ``(..., t_q, n_rel)``
        Column ``c`` holds the value for distance ``r = c - offset``.
    t_k : int
        Number of keys.
    offset : int
        Column of distance 0.
    q_offset : int, optional
        Position of query 0 (``t_k - t_q`` for end-aligned decoding).

    Returns
    -------
    out : array, shape ``(..., t_q, t_k)``
        Same dtype and device as `x`. Valid everywhere: where the distance
        has no column (``r + offset`` outside ``[0, n_rel)``) it is ``0``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> x = xp.asarray([[10, 11, 12, 13, 14]] * 3)  # columns: r = -2 .. 2
    >>> gather(x, 4, offset=2)
    Array([[12, 13, 14,  0],
           [11, 12, 13, 14],
           [10, 11, 12, 13]], dtype=array_api_strict.int64)
    """
    xp, batch, t_q, n_rel = _relative_layout("x", x)
    t_k = nonnegative_int("t_k", t_k)
    offset = as_int("offset", offset)
    q_offset = as_int("q_offset", q_offset)
    if t_q == 0 or t_k == 0 or n_rel == 0:
        return _zeros(xp, x, (*batch, t_q, t_k))
    dev = _xp.device(x)
    column = relative_positions(t_q, t_k, q_offset=q_offset, xp=xp, device=dev) + offset
    valid = (column >= 0) & (column < n_rel)
    out = _take_per_row(x, xp.clip(column, 0, n_rel - 1))
    return xp.where(valid, out, _zeros(xp, x, ()))


def take_per_row(x: Any, index: Any, /) -> Any:
    r"""Pick, in each row, the columns an index matrix names.

    .. math:: \text{out}[..., i, j] = x[..., i, \text{index}[i, j]]

    The gather behind `gather` and behind clipped tables: with the indices
    of `relpos_ref.positions.table_index` it lays per-distance logits out
    as ``(t_q, t_k)``, reading each of the ``t_q t_k`` entries once.

    Parameters
    ----------
    x : array, shape ``(..., t_q, n)``
    index : integer array, shape ``(t_q, t_k)``
        Values in ``[0, n)``; others are refused (a negative index would
        wrap). The range is read back to the host on eager arrays; under jit
        (lazy arrays) it cannot be, and the values must be in range.

    Returns
    -------
    out : array, shape ``(..., t_q, t_k)``
        Same dtype and device as `x`.

    Raises
    ------
    ValueError
        An index outside ``[0, n)``, or the wrong shape.
    TypeError
        A non-integer index.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> x = xp.asarray([[10, 11, 12], [20, 21, 22]])
    >>> take_per_row(x, xp.asarray([[2, 2, 0, 1], [0, 0, 1, 1]]))
    Array([[12, 12, 10, 11],
           [20, 20, 21, 21]], dtype=array_api_strict.int64)
    >>> take_per_row(x, xp.asarray([[-1, 0], [0, 0]]))
    Traceback (most recent call last):
    ...
    ValueError: `index` must lie in [0, 3) (the columns of `x`), got values from -1 to 0
    """
    xp, _, t_q, n = _relative_layout("x", x)
    _xp.array_namespace(x, index)
    if not xp.isdtype(index.dtype, "integral"):
        msg = f"`index` must have an integer dtype, got {index.dtype}"
        raise TypeError(msg)
    if index.ndim != 2 or index.shape[0] != t_q:
        msg = f"`index` must have shape (t_q, t_k) with t_q = {t_q}, got shape {tuple(index.shape)}"
        raise ValueError(msg)
    if _xp.size(index) and not _xp.is_lazy(index):
        low, high = int(xp.min(index)), int(xp.max(index))
        if low < 0 or high >= n:
            msg = (f"`index` must lie in [0, {n}) (the columns of `x`), got values from {low} "
                   f"to {high}")
            raise ValueError(msg)
    return _take_per_row(x, index)


def _take_per_row(x: Any, index: Any) -> Any:
    # take_per_row for indices known to be in range (the library's own).
    xp, batch, t_q, n = _relative_layout("x", x)
    t_k = index.shape[1]
    if t_q == 0 or t_k == 0:
        return _zeros(xp, x, (*batch, t_q, t_k))
    row_start = xp.arange(t_q, dtype=index.dtype, device=_xp.device(index))[:, None] * n
    flat_index = xp.reshape(index + row_start, (t_q * t_k,))
    flat_x = xp.reshape(x, (*batch, t_q * n))
    out = xp.take(flat_x, flat_index, axis=len(batch))
    return xp.reshape(out, (*batch, t_q, t_k))


def to_relative(x: Any, /, n_rel: int, *, offset: int, q_offset: int = 0) -> Any:
    r"""Absolute layout back to a relative one: the inverse of `gather`.

    .. math:: \text{out}[..., i, c] = x[..., i, c - \text{offset} + i + q_\text{offset}]

    Column ``c`` of the result holds the entry of the key at distance
    ``r = c - offset`` from query ``i``; ``0`` where that key does not exist.
    Used to bin attention weights by distance (Shaw's relative values).

    Parameters
    ----------
    x : array, shape ``(..., t_q, t_k)``
    n_rel : int
        Number of distance columns.
    offset : int
        Column of distance 0.
    q_offset : int, optional
        Position of query 0.

    Returns
    -------
    out : array, shape ``(..., t_q, n_rel)``

    Examples
    --------
    >>> import array_api_strict as xp
    >>> w = xp.asarray([[1, 2, 3], [4, 5, 6]])
    >>> to_relative(w, 3, offset=1)  # columns r = -1, 0, 1
    Array([[0, 1, 2],
           [4, 5, 6]], dtype=array_api_strict.int64)
    """
    xp, batch, t_q, t_k = _relative_layout("x", x)
    n_rel = nonnegative_int("n_rel", n_rel)
    offset = as_int("offset", offset)
    q_offset = as_int("q_offset", q_offset)
    if t_q == 0 or t_k == 0 or n_rel == 0:
        return _zeros(xp, x, (*batch, t_q, n_rel))
    dev = _xp.device(x)
    idx = _xp.index_dtype(xp, dev)
    c = xp.arange(n_rel, dtype=idx, device=dev)
    i = xp.arange(t_q, dtype=idx, device=dev)
    key = c[None, :] - offset + i[:, None] + q_offset
    valid = (key >= 0) & (key < t_k)
    out = _take_per_row(x, xp.clip(key, 0, t_k - 1))
    return xp.where(valid, out, _zeros(xp, x, ()))


def pad_flatten_reshape(x: Any, /, t_k: int, *, offset: int, q_offset: int = 0) -> Any:
    r"""Relative to absolute by the zero-column / flatten / pad / reshape / slice trick.

    The "relative to absolute" trick of the Music Transformer and the
    Bottleneck Transformer code, generalized to any ``t_q``, ``t_k``,
    ``offset`` and ``q_offset``. With ``s = offset - q_offset``:

    1. append a zero column: ``(..., t_q, n_rel + 1)``;
    2. flatten the last two axes: ``(..., t_q (n_rel + 1))``;
    3. pad ``n_rel - t_q`` zeros at the end (or cut as many elements when
       that is negative): ``(..., (t_q + 1) n_rel)``;
    4. reshape to ``(..., t_q + 1, n_rel)``; row ``i`` is now row ``i`` of
       `x` shifted right by ``i`` columns;
    5. keep rows ``:t_q`` and columns ``s : s + t_k``.

    Parameters
    ----------
    x : array, shape ``(..., t_q, n_rel)``
        Column ``c`` holds the value for distance ``r = c - offset``.
    t_k : int
        Number of keys.
    offset : int
        Column of distance 0.
    q_offset : int, optional
        Position of query 0.

    Returns
    -------
    out : array, shape ``(..., t_q, t_k)``
        Equal to `gather` where ``r(i, j) + offset >= 0``. Where the
        distance lies beyond the past end of the table
        (``r + offset < 0``) the entry is not the definition's zero: it is
        ``0`` (the padding column) at ``r + offset = -1`` and a value wrapped
        in from row ``i - 1`` further out; mask it.

    Raises
    ------
    ValueError
        If the table does not reach the future end of every row
        (``s < 0`` or ``s + t_k > n_rel``): the trick cannot express it.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> x = xp.asarray([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]])
    >>> pad_flatten_reshape(x, 3, offset=2)  # t = 3, columns r = -2 .. 2
    Array([[ 3,  4,  5],
           [ 7,  8,  9],
           [11, 12, 13]], dtype=array_api_strict.int64)
    """
    xp, batch, t_q, n_rel = _relative_layout("x", x)
    t_k = nonnegative_int("t_k", t_k)
    offset = as_int("offset", offset)
    q_offset = as_int("q_offset", q_offset)
    start = offset - q_offset
    if t_q == 0 or t_k == 0:
        return _zeros(xp, x, (*batch, t_q, t_k))
    if start < 0 or start + t_k > n_rel:
        msg = (
            "pad_flatten_reshape needs the table to cover every future distance: "
            f"0 <= offset - q_offset and offset - q_offset + t_k <= n_rel, got "
            f"offset={offset}, q_offset={q_offset}, t_k={t_k}, n_rel={n_rel}"
        )
        raise ValueError(msg)
    padded = xp.concat([x, _zeros(xp, x, (*batch, t_q, 1))], axis=-1)
    flat = xp.reshape(padded, (*batch, t_q * (n_rel + 1)))
    extra = n_rel - t_q
    if extra >= 0:
        flat = xp.concat([flat, _zeros(xp, x, (*batch, extra))], axis=-1)
    else:
        flat = flat[..., : (t_q + 1) * n_rel]
    shifted = xp.reshape(flat, (*batch, t_q + 1, n_rel))
    return shifted[..., :t_q, start : start + t_k]


def _left_pad_shift(xp: Any, x: Any, batch: tuple[int, ...], t_q: int, t_k: int) -> Any:
    # Pad one zero column on the left, read the buffer back with rows of
    # t_q elements, drop the first of them: row i moves left by t_q - 1 - i.
    # Reshapes go through the flat buffer, one merge then one split, so that
    # chunked libraries (dask) that cannot merge and split at once follow.
    padded = xp.concat([_zeros(xp, x, (*batch, t_q, 1)), x], axis=-1)
    flat = xp.reshape(padded, (*batch, t_q * (t_k + 1)))
    rows = xp.reshape(flat[..., t_q:], (*batch, t_k, t_q))
    return xp.reshape(xp.reshape(rows, (*batch, t_k * t_q)), (*batch, t_q, t_k))


def skew(x: Any, /) -> Any:
    r"""The causal "skew" of Huang et al. (2018) for self-attention.

    `x` is ``Q E^T`` for a one-sided table of ``L`` rows, column ``c``
    standing for distance ``r = c - (L - 1)`` (most distant past first,
    ``r = 0`` last). The skew

    1. pads a zero column on the left: ``(..., L, L + 1)``;
    2. reshapes to ``(..., L + 1, L)``;
    3. drops the first row,

    so that ``out[..., i, j] = x[..., i, j - i + L - 1]`` for ``j <= i``.

    Parameters
    ----------
    x : array, shape ``(..., L, L)``
        Relative logits, past to present.

    Returns
    -------
    out : array, shape ``(..., L, L)``
        Equal to ``gather(x, L, offset=L - 1)`` on the causal region
        ``j <= i``. Above the diagonal: ``0`` at ``j = i + 1`` (the pad) and
        values of row ``i + 1`` further right; a causal mask removes them.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> x = xp.asarray([[1, 2, 3], [4, 5, 6], [7, 8, 9]])  # r = -2, -1, 0
    >>> skew(x)
    Array([[3, 0, 4],
           [5, 6, 0],
           [7, 8, 9]], dtype=array_api_strict.int64)
    """
    xp, batch, t_q, n_rel = _relative_layout("x", x)
    if t_q != n_rel:
        msg = f"`x` must be square (..., L, L) for the skew, got shape {tuple(x.shape)}"
        raise ValueError(msg)
    if t_q == 0:
        return _zeros(xp, x, tuple(x.shape))
    return _left_pad_shift(xp, x, batch, t_q, n_rel)


def rel_shift(x: Any, /) -> Any:
    r"""Transformer-XL's ``rel_shift`` (Dai et al. 2019), end-aligned.

    `x` has one column per key, column ``c`` standing for distance
    ``r = c - (t_k - 1)`` (Transformer-XL's position sequence
    ``t_k - 1, ..., 0`` of query-minus-key distances, read in our sign). The
    queries are the last ``t_q`` positions (``q_offset = t_k - t_q``, a
    memory of ``t_k - t_q`` earlier positions). Pad a zero column on the
    left, view as ``(..., t_k + 1, t_q)``, drop the first row, view as
    ``(..., t_q, t_k)``.

    Parameters
    ----------
    x : array, shape ``(..., t_q, t_k)``, ``t_k >= t_q``
        Relative logits, past to present.

    Returns
    -------
    out : array, shape ``(..., t_q, t_k)``
        Equal to ``gather(x, t_k, offset=t_k - 1, q_offset=t_k - t_q)`` on
        the causal region ``j <= i + t_k - t_q``. Beyond it: ``0`` on the
        first diagonal past the region, values of row ``i + 1`` further
        right; Transformer-XL's causal mask removes them.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> x = xp.asarray([[1, 2, 3, 4], [5, 6, 7, 8]])  # r = -3 .. 0, memory 2
    >>> rel_shift(x)
    Array([[2, 3, 4, 0],
           [5, 6, 7, 8]], dtype=array_api_strict.int64)
    """
    xp, batch, t_q, t_k = _relative_layout("x", x)
    if t_k < t_q:
        msg = f"`x` must have t_k >= t_q for rel_shift, got shape {tuple(x.shape)}"
        raise ValueError(msg)
    if t_q == 0:
        return _zeros(xp, x, tuple(x.shape))
    return _left_pad_shift(xp, x, batch, t_q, t_k)


def stacked_diagonals(
    x: Any, /, t_k: int, *, q_offset: int = 0, order: str = "past_to_future"
) -> Any:
    r"""Full-table relative logits for any attention, as stacked diagonals.

    `x` is ``Q E^T`` for a table of ``2 t_max - 1`` rows that covers every
    distance between sequences of up to ``t_max`` positions. Each diagonal
    ``j - i = \delta`` of the output is one column of `x`:

    .. math::

        \text{out}[..., i, j] = x[..., i, c(r)],

        c(r) = \begin{cases} r + t_\max - 1 & \text{past to future} \\
                             t_\max - 1 - r & \text{future to past}
               \end{cases}

    Self or cross attention, full or causal, ``t_q != t_k`` and any
    ``q_offset`` work as long as every distance lies in the table. Only the
    ``t_q + t_k - 1`` columns that occur are read (sliced, flipped for the
    future-to-past order, then laid out by `pad_flatten_reshape`).

    Parameters
    ----------
    x : array, shape ``(..., t_q, 2 t_max - 1)``
        Relative logits; the width must be odd.
    t_k : int
        Number of keys.
    q_offset : int, optional
        Position of query 0 (``t_k - t_q`` for end-aligned decoding).
    order : {"past_to_future", "future_to_past"}, optional
        Row order of the table: ``"past_to_future"`` (canonical: row 0 is
        ``r = -(t_max - 1)``) or ``"future_to_past"`` (row 0 is
        ``r = t_max - 1``, the most distant future first).

    Returns
    -------
    out : array, shape ``(..., t_q, t_k)``
        Valid everywhere.

    Raises
    ------
    ValueError
        If the width is even, or some distance lies outside
        ``[-(t_max - 1), t_max - 1]``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> x = xp.asarray([[-3, -2, -1, 0, 1, 2, 3]] * 2)  # t_max = 4
    >>> stacked_diagonals(x, 4)
    Array([[ 0,  1,  2,  3],
           [-1,  0,  1,  2]], dtype=array_api_strict.int64)
    >>> stacked_diagonals(x, 4, order="future_to_past")
    Array([[ 0, -1, -2, -3],
           [ 1,  0, -1, -2]], dtype=array_api_strict.int64)
    """
    xp, batch, t_q, n_rel = _relative_layout("x", x)
    t_k = nonnegative_int("t_k", t_k)
    q_offset = as_int("q_offset", q_offset)
    check_choice("order", order, TABLE_ORDERS)
    if n_rel % 2 != 1:
        msg = f"`x` must have an odd width 2 t_max - 1, got {n_rel} columns"
        raise ValueError(msg)
    t_max = (n_rel + 1) // 2
    span = distance_range(t_q, t_k, q_offset=q_offset)
    if span is None:
        return _zeros(xp, x, (*batch, t_q, t_k))
    check_distances_in_table(
        t_q,
        t_k,
        q_offset=q_offset,
        low=-(t_max - 1),
        high=t_max - 1,
        what=f"t_max={t_max}",
        hint="use a table with a larger t_max",
    )
    r_min, r_max = span
    if order == "past_to_future":
        window = x[..., r_min + t_max - 1 : r_max + t_max]
    else:
        window = xp.flip(x[..., t_max - 1 - r_max : t_max - r_min], axis=-1)
    return pad_flatten_reshape(window, t_k, offset=-r_min, q_offset=q_offset)
