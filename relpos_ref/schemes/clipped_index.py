"""The two-sided clipped index of Shaw's tables and of the bias scheme's.

A table of ``P + K + 1`` rows (``2K + 1`` when symmetric) holds the distances
``r = -P .. K``; a pair at distance ``r`` reads row ``clip(r, -P, K) + P``
(`shaw_index`), and beyond the table it is clipped, zero or an error
(`relpos_ref.positions.BEYOND_POLICIES`). `two_sided_extent` reads ``(P, K)``
from a table's rows and checks them.
"""

from __future__ import annotations

from typing import Any

from .._validate import check_choice, nonnegative_int
from ..positions import (
    BEYOND_POLICIES,
    TableIndex,
    check_distances_in_table,
    extent_text,
    relative_positions,
    table_index,
)

__all__ = ["shaw_index", "two_sided_extent"]


def two_sided_extent(name: str, rows: int, shape: tuple[int, ...], max_past: int | None,
                     *, unit: str = "rows") -> tuple[int, int]:
    """``(P, K)``: the largest past and future distances with a row, from a table's rows.

    Without `max_past` the table is symmetric, ``2K + 1`` rows (an odd
    number); with it, ``P + K + 1`` rows, ``0 <= P <= rows - 1``. Errors name
    the table (`name`, of shape `shape`, whose `unit` are "rows" or, for a
    scalar table, "entries") and the parameter.

    Examples
    --------
    >>> two_sided_extent("key_table", 5, (5, 8), None), two_sided_extent("table", 6, (6,), 4)
    ((2, 2), (4, 1))
    """
    if max_past is None:
        if rows % 2 != 1:
            msg = (
                f"`{name}` must have 2K + 1 {unit} (an odd number), got {rows} (shape "
                f"{tuple(shape)}); pass `max_past` for a table of P + K + 1 {unit}"
            )
            raise ValueError(msg)
        return (rows - 1) // 2, (rows - 1) // 2
    past = nonnegative_int("max_past", max_past)
    if past > rows - 1:
        msg = (f"`max_past` must be at most {rows - 1} (`{name}` has {rows} {unit}, "
               f"shape {tuple(shape)}), got {past}")
        raise ValueError(msg)
    return past, rows - 1 - past


def shaw_index(
    t_q: int,
    t_k: int,
    /,
    *,
    max_distance: int,
    q_offset: int = 0,
    beyond: str = "clip",
    max_past: int | None = None,
    xp: Any,
    device: Any = None,
) -> TableIndex:
    """Table row and validity for every (query, key) pair; ``"error"`` checked on the host.

    Parameters
    ----------
    t_q, t_k : int
        Number of queries and keys.
    max_distance : int
        ``K``; the table has ``2K + 1`` rows (``P + K + 1`` with `max_past`).
    q_offset : int, optional
        Position of query 0.
    beyond : {"clip", "zero", "error"}, optional
        Policy for ``|r| > K`` (``r < -P`` or ``r > K``).
    max_past : int, optional
        ``P``, the largest past distance with a row; default ``K``.
    xp : namespace
        Array API namespace of the result.
    device : optional
        Device of the result.

    Returns
    -------
    TableIndex
        ``index = clip(r, -P, K) + P`` and ``valid``, each ``(t_q, t_k)``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> shaw_index(1, 5, max_distance=1, xp=xp).index
    Array([[1, 2, 2, 2, 2]], dtype=array_api_strict.int64)
    >>> shaw_index(2, 3, max_distance=1, max_past=0, xp=xp).index
    Array([[0, 1, 1],
           [0, 0, 1]], dtype=array_api_strict.int64)
    """
    k = nonnegative_int("max_distance", max_distance)
    past = k if max_past is None else nonnegative_int("max_past", max_past)
    check_choice("beyond", beyond, BEYOND_POLICIES)
    if beyond == "error":
        check_distances_in_table(t_q, t_k, q_offset=q_offset, low=-past, high=k,
                                 what=extent_text(past, k, max_past))
        beyond = "clip"
    r = relative_positions(t_q, t_k, q_offset=q_offset, xp=xp, device=device)
    return table_index(r, k, beyond=beyond, max_past=max_past)
