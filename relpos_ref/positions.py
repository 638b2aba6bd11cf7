"""Index transforms: integers in, integers out.

The canonical conventions (see ``docs/conventions``) are fixed here:

* query ``i`` sits at position ``i + q_offset``, key ``j`` at position ``j``;
* the relative distance is key minus query, ``r = j - (i + q_offset)``, so
  ``r < 0`` means the key lies in the past;
* a two-sided table of maximum distance ``K`` has ``2K + 1`` rows for
  ``r = -K .. +K``, row ``r + K``;
* a one-sided (causal) table of length ``M`` has rows for
  ``r = -(M-1) .. 0``, row ``r + M - 1``;
* a distance beyond the table follows an explicit policy: ``"clip"`` to the
  last row, ``"zero"`` (flagged invalid so its term becomes zero) or
  ``"error"``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from . import _xp
from ._validate import as_int, check_choice, nonnegative_int, positive_int

__all__ = [
    "BEYOND_POLICIES",
    "TableIndex",
    "causal_table_index",
    "check_distances_in_table",
    "check_integer_array",
    "distance_range",
    "grid_positions",
    "relative_positions",
    "table_index",
]

BEYOND_POLICIES = ("clip", "zero", "error")
_ERROR_POLICY_HINT = "`beyond='error'` refuses it: use a larger table or 'clip' / 'zero'"


class TableIndex(NamedTuple):
    """Row of a relative table for each distance, and whether that row applies.

    Attributes
    ----------
    index : array of the index dtype
        Row to read for each distance; always inside ``[0, n_rows)`` so that
        it is safe to gather with, whatever the policy.
    valid : bool array
        ``False`` where the distance has no row of its own and the policy
        says its term is zero (``"zero"``), or where a one-sided table has no
        row at all (future distances).
    """

    index: Any
    valid: Any


def relative_positions(
    t_q: int, t_k: int, /, *, q_offset: int = 0, xp: Any, device: Any = None
) -> Any:
    r"""Key-minus-query distance matrix.

    .. math:: r_{ij} = j - (i + q_\text{offset})

    Parameters
    ----------
    t_q, t_k : int
        Number of queries and keys, ``>= 0``.
    q_offset : int, optional
        Position of query 0. ``0`` is start-aligned; ``t_k - t_q`` is
        end-aligned (decoding with a cache: the last query sits at the last
        key).
    xp : namespace
        Array API namespace to build the result in.
    device : optional
        Device of the result.

    Returns
    -------
    r : array, shape ``(t_q, t_k)``
        Distances in the namespace's default indexing dtype; negative entries
        are keys in the past of their query.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> relative_positions(3, 4, xp=xp)
    Array([[ 0,  1,  2,  3],
           [-1,  0,  1,  2],
           [-2, -1,  0,  1]], dtype=array_api_strict.int64)
    >>> relative_positions(2, 4, q_offset=2, xp=xp)  # end-aligned
    Array([[-2, -1,  0,  1],
           [-3, -2, -1,  0]], dtype=array_api_strict.int64)
    """
    t_q = nonnegative_int("t_q", t_q)
    t_k = nonnegative_int("t_k", t_k)
    q_offset = as_int("q_offset", q_offset)
    idx = _xp.index_dtype(xp, device)
    _check_fits(xp, idx, t_q, t_k, q_offset)
    i = xp.arange(t_q, dtype=idx, device=device)
    j = xp.arange(t_k, dtype=idx, device=device)
    return j[None, :] - (i[:, None] + q_offset)


def _check_fits(xp: Any, idx: Any, t_q: int, t_k: int, q_offset: int) -> None:
    # Every distance, and every position, must fit the index dtype (int32 on JAX without
    # x64): a value that does not would wrap silently.
    largest = max(abs(q_offset) + t_q + t_k, t_q + abs(q_offset))
    top = xp.iinfo(idx).max
    if largest > top:
        msg = (f"`q_offset` = {q_offset} with t_q = {t_q} and t_k = {t_k} gives distances beyond "
               f"the index dtype {idx} (at most {top})")
        raise ValueError(msg)


def distance_range(t_q: int, t_k: int, /, *, q_offset: int = 0) -> tuple[int, int] | None:
    """Smallest and largest distance that occurs, computed on the host.

    Parameters
    ----------
    t_q, t_k : int
        Number of queries and keys, ``>= 0``.
    q_offset : int, optional
        Position of query 0.

    Returns
    -------
    (r_min, r_max) or None
        ``r_min = -(t_q - 1 + q_offset)``, ``r_max = t_k - 1 - q_offset``;
        ``None`` when there is no query or no key.

    Examples
    --------
    >>> distance_range(3, 5)
    (-2, 4)
    >>> distance_range(2, 5, q_offset=3)
    (-4, 1)
    >>> distance_range(0, 5) is None
    True
    """
    t_q = nonnegative_int("t_q", t_q)
    t_k = nonnegative_int("t_k", t_k)
    q_offset = as_int("q_offset", q_offset)
    if t_q == 0 or t_k == 0:
        return None
    return -(t_q - 1 + q_offset), t_k - 1 - q_offset


def check_distances_in_table(
    t_q: int,
    t_k: int,
    /,
    *,
    q_offset: int = 0,
    low: int,
    high: int,
    what: str,
    hint: str = _ERROR_POLICY_HINT,
) -> None:
    """Raise a `ValueError` if some distance of the grid lies outside ``[low, high]``.

    A host-side check (no array values are read) used to apply the
    ``"error"`` policy before any array work.

    Parameters
    ----------
    t_q, t_k, q_offset : int
        The attention grid, as in `relative_positions`.
    low, high : int
        Smallest and largest distance the table has a row for.
    what : str
        Description of the table for the message, e.g. ``"max_distance=4"``.
    hint : str, optional
        What the user can do, appended to the message.

    Examples
    --------
    >>> check_distances_in_table(3, 3, low=-2, high=2, what="max_distance=2")
    >>> check_distances_in_table(4, 4, low=-2, high=2, what="max_distance=2")
    Traceback (most recent call last):
    ...
    ValueError: distance -3 is beyond the table (max_distance=2, rows for r = -2 .. 2); ...
    """
    span = distance_range(t_q, t_k, q_offset=q_offset)
    if span is None:
        return
    _raise_if_outside(*span, low, high, what, hint)


def _raise_if_outside(r_min: int, r_max: int, low: int, high: int, what: str, hint: str) -> None:
    bad = r_min if r_min < low else (r_max if r_max > high else None)
    if bad is not None:
        msg = f"distance {bad} is beyond the table ({what}, rows for r = {low} .. {high}); {hint}"
        raise ValueError(msg)


def _check_array_in_table(xp: Any, r: Any, low: int, high: int, what: str) -> None:
    # The "error" policy on an array of distances is data dependent: it reads
    # the extreme values back to the host. It cannot run under jit tracing;
    # schemes call `check_distances_in_table` on the host instead.
    if _xp.size(r) == 0:
        return
    _raise_if_outside(int(xp.min(r)), int(xp.max(r)), low, high, what, _ERROR_POLICY_HINT)


def check_integer_array(xp: Any, name: str, r: Any) -> None:
    """A `TypeError` naming `name` unless `r` has an integer dtype (distances are integers)."""
    if not xp.isdtype(r.dtype, "integral"):
        msg = f"`{name}` must have an integer dtype, got {r.dtype}"
        raise TypeError(msg)


def extent_text(past: int, k: int, max_past: int | None) -> str:
    """How the ``"error"`` policy names a two-sided table's extent (`max_past` as given).

    Examples
    --------
    >>> extent_text(2, 2, None), extent_text(3, 1, 3)
    ('max_distance=2', 'max_past=3, max_distance=1')
    """
    return f"max_distance={k}" if max_past is None else f"max_past={past}, max_distance={k}"


def table_index(
    r: Any, /, max_distance: int, *, beyond: str = "clip", max_past: int | None = None
) -> TableIndex:
    r"""Row of a two-sided relative table for each distance.

    The table has ``2K + 1`` rows for distances ``r = -K .. +K``:

    .. math:: \text{index}(r) = \operatorname{clip}(r, -K, K) + K

    or, with `max_past` ``P`` (asymmetric clipping, left and right maxima
    that differ, as wav2vec2-BERT's ``relative_key``), ``P + K + 1`` rows for
    ``r = -P .. +K``:

    .. math:: \text{index}(r) = \operatorname{clip}(r, -P, K) + P

    Parameters
    ----------
    r : integer array, any shape
        Key-minus-query distances, e.g. from `relative_positions`.
    max_distance : int
        ``K >= 0``, the largest distance with a row of its own (the largest
        future one when `max_past` is given).
    beyond : {"clip", "zero", "error"}, optional
        What a distance with ``|r| > K`` (``r < -P`` or ``r > K``) gets.
        ``"clip"`` (Shaw et al.): the row of ``-P`` or ``K``, valid.
        ``"zero"``: flagged invalid, so the caller zeroes its term (the
        index still points at the clipped row, so gathering with it is
        safe). ``"error"``: a `ValueError`; this reads
        ``min(r)`` and ``max(r)`` back to the host, so under jit use
        `check_distances_in_table` on the host instead.
    max_past : int, optional
        ``P >= 0``, the largest past distance ``-r`` with a row of its own;
        default ``K``.

    Returns
    -------
    TableIndex
        ``index`` (same shape and dtype as `r`, values in ``[0, P + K]``) and
        ``valid`` (bool, same shape).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> r = relative_positions(1, 7, q_offset=3, xp=xp)
    >>> r
    Array([[-3, -2, -1,  0,  1,  2,  3]], dtype=array_api_strict.int64)
    >>> table_index(r, 2).index
    Array([[0, 0, 1, 2, 3, 4, 4]], dtype=array_api_strict.int64)
    >>> table_index(r, 2, beyond="zero").valid
    Array([[False,  True,  True,  True,  True,
             True, False]], dtype=array_api_strict.bool)
    >>> table_index(r, 1, max_past=2).index  # rows for r = -2 .. 1
    Array([[0, 0, 1, 2, 3, 3, 3]], dtype=array_api_strict.int64)
    """
    xp = _xp.array_namespace(r)
    check_integer_array(xp, "r", r)
    k = nonnegative_int("max_distance", max_distance)
    past = k if max_past is None else nonnegative_int("max_past", max_past)
    check_choice("beyond", beyond, BEYOND_POLICIES)
    if beyond == "error":
        _check_array_in_table(xp, r, -past, k, extent_text(past, k, max_past))
    index = xp.clip(r, -past, k) + past
    if beyond == "zero":
        valid = (r >= -past) & (r <= k)
    else:
        valid = xp.ones(r.shape, dtype=xp.bool, device=_xp.device(r))
    return TableIndex(index, valid)


def causal_table_index(r: Any, /, length: int, *, beyond: str = "clip") -> TableIndex:
    r"""Row of a one-sided (causal) table for each distance (Huang et al. 2018).

    The table has ``M`` rows for distances ``r = -(M-1) .. 0``:

    .. math:: \text{index}(r) = \operatorname{clip}(r, -(M-1), 0) + M - 1

    Future distances ``r > 0`` have no row: they are always flagged invalid
    (a causal mask removes them), whatever the policy.

    Parameters
    ----------
    r : integer array, any shape
        Key-minus-query distances.
    length : int
        ``M >= 1``, the number of rows.
    beyond : {"clip", "zero", "error"}, optional
        What a past distance ``r < -(M-1)`` gets: the row of ``-(M-1)``
        (``"clip"``), invalid (``"zero"``), or a `ValueError` (``"error"``,
        which reads ``min(r)`` back to the host).

    Returns
    -------
    TableIndex
        ``index`` (values in ``[0, M-1]``) and ``valid`` (bool).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> r = relative_positions(1, 5, q_offset=3, xp=xp)
    >>> r
    Array([[-3, -2, -1,  0,  1]], dtype=array_api_strict.int64)
    >>> causal_table_index(r, 3).index
    Array([[0, 0, 1, 2, 2]], dtype=array_api_strict.int64)
    >>> causal_table_index(r, 3, beyond="zero").valid
    Array([[False,  True,  True,  True, False]], dtype=array_api_strict.bool)
    """
    xp = _xp.array_namespace(r)
    check_integer_array(xp, "r", r)
    m = positive_int("length", length)
    check_choice("beyond", beyond, BEYOND_POLICIES)
    low = -(m - 1)
    if beyond == "error":
        # Only the past end can be beyond the table; the future is masked.
        _check_array_in_table(xp, xp.clip(r, None, 0), low, 0, f"length={m}")
    index = xp.clip(r, low, 0) + (m - 1)
    valid = r <= 0
    if beyond == "zero":
        valid = valid & (r >= low)
    return TableIndex(index, valid)


def grid_positions(h: int, w: int, /, *, xp: Any, device: Any = None) -> tuple[Any, Any]:
    """Row and column of each token of an ``h x w`` grid in row-major order.

    Token ``n`` sits at row ``n // w`` and column ``n % w``, so the distance
    between tokens along each axis is the difference of these coordinates,
    key minus query, as for sequences.

    Parameters
    ----------
    h, w : int
        Grid height and width, ``>= 0``.
    xp : namespace
        Array API namespace to build the result in.
    device : optional
        Device of the result.

    Returns
    -------
    rows, cols : arrays, shape ``(h * w,)``
        Coordinates in the namespace's default indexing dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> rows, cols = grid_positions(2, 3, xp=xp)
    >>> rows
    Array([0, 0, 0, 1, 1, 1], dtype=array_api_strict.int64)
    >>> cols
    Array([0, 1, 2, 0, 1, 2], dtype=array_api_strict.int64)
    >>> rows[None, :] - rows[:, None]  # row distance, key minus query
    Array([[ 0,  0,  0,  1,  1,  1],
           [ 0,  0,  0,  1,  1,  1],
           [ 0,  0,  0,  1,  1,  1],
           [-1, -1, -1,  0,  0,  0],
           [-1, -1, -1,  0,  0,  0],
           [-1, -1, -1,  0,  0,  0]], dtype=array_api_strict.int64)
    """
    h = nonnegative_int("h", h)
    w = nonnegative_int("w", w)
    idx = _xp.index_dtype(xp, device)
    rows = xp.arange(h, dtype=idx, device=device)
    cols = xp.arange(w, dtype=idx, device=device)
    n_rows = xp.reshape(xp.broadcast_to(rows[:, None], (h, w)), (h * w,))
    n_cols = xp.reshape(xp.broadcast_to(cols[None, :], (h, w)), (h * w,))
    return n_rows, n_cols
