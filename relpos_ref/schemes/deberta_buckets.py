r"""DeBERTa's relative buckets and table rows (He et al. 2021), for `relpos_ref.schemes.deberta`.

Buckets: without `max_position`, ``b = r`` (DeBERTa v1). With it, log
buckets of size ``S`` (DeBERTa v2 and v3, ``position_buckets``): with
``m = S // 2``, distances ``|r| <= m`` are exact and larger ones are
``sign(r) (m + ceil(log(|r| / m) / log((max_position - 1) / m) (m - 1)))``.
The ceiling is evaluated exactly, by integer comparisons on the host, so no
logarithm is taken on the arrays.

A distance ``r`` reads the table row ``row(b) = clamp(b, -(S - 1), S) + S - 1``
(`deberta_rows`); `deberta_index` lays the rows out per query and key.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from .. import _xp
from .._validate import as_int, nonnegative_int, positive_int
from ..positions import check_integer_array, relative_positions
from ._tables import count_reached

__all__ = [
    "deberta_bucket",
    "deberta_bucket_boundaries",
    "deberta_index",
    "deberta_rows",
]


def _bucket_parameters(bucket_size: int, max_position: int) -> tuple[int, int]:
    bucket_size = positive_int("bucket_size", bucket_size)
    max_position = positive_int("max_position", max_position)
    mid = bucket_size // 2
    if mid < 1:
        msg = f"`bucket_size` must be >= 2 for log buckets, got {bucket_size}"
        raise ValueError(msg)
    if max_position - 1 <= mid:
        msg = (
            f"`max_position` must exceed bucket_size // 2 + 1 = {mid + 1} "
            f"(bucket_size={bucket_size}), got {max_position}"
        )
        raise ValueError(msg)
    return mid, max_position - 1


@lru_cache(maxsize=64)
def deberta_bucket_boundaries(bucket_size: int, max_position: int) -> tuple[int, ...]:
    """Smallest ``|r|`` that reaches each log bucket from ``m + 1`` to ``bucket_size``.

    ``bucket(a) >= m + t`` holds when
    ``a^(m-1) m^(t-1) > (max_position - 1)^(t-1) m^(m-1)``, the ceiling in
    DeBERTa's formula written without logarithms; it is decided with Python
    integers, exactly.

    Parameters
    ----------
    bucket_size, max_position : int
        As in `deberta_bucket`.

    Returns
    -------
    tuple of int
        ``boundaries[t - 1]`` is the smallest ``a > m`` with bucket at least
        ``m + t``, for ``t = 1 .. bucket_size - m``; empty when ``m = 1``
        (every ``a > 1`` shares bucket 1).

    Examples
    --------
    >>> deberta_bucket_boundaries(8, 32)  # m = 4: exact up to 4, then 5 .. 8
    (5, 8, 16, 32)
    """
    mid, top = _bucket_parameters(bucket_size, max_position)
    if mid == 1:
        return ()
    out = []
    a = mid + 1
    for t in range(1, bucket_size - mid + 1):
        rhs = top ** (t - 1) * mid ** (mid - 1)
        step = mid ** (t - 1)

        def reached(x: int, rhs: int = rhs, step: int = step) -> bool:
            return x ** (mid - 1) * step > rhs

        low, high = a, a
        while not reached(high):
            low, high = high + 1, 2 * high
        while low < high:
            middle = (low + high) // 2
            if reached(middle):
                high = middle
            else:
                low = middle + 1
        a = low
        out.append(a)
    return tuple(out)


def deberta_bucket(r: Any, /, *, bucket_size: int, max_position: int) -> Any:
    """DeBERTa's log bucket of each distance, an odd function of `r`.

    Parameters
    ----------
    r : integer array
        Distances (either sign convention: ``bucket(-r) = -bucket(r)``).
    bucket_size : int
        ``S``, DeBERTa's ``position_buckets`` (>= 2): distances up to
        ``S // 2`` are exact.
    max_position : int
        DeBERTa's ``max_relative_positions``: where the log spacing reaches
        bucket ``S - 1``.

    Returns
    -------
    array
        Same shape and dtype as `r`. Magnitudes are capped at `bucket_size`:
        every larger bucket lands on the end rows of the tables just as
        ``±bucket_size`` does, so nothing downstream changes.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> deberta_bucket(xp.asarray([-40, -9, -5, -4, 0, 3, 4, 5, 7, 8, 15, 16, 31, 32]),
    ...                bucket_size=8, max_position=32)
    Array([-8, -6, -5, -4,  0,  3,  4,  5,  5,
            6,  6,  7,  7,  8], dtype=array_api_strict.int64)
    """
    xp = _xp.array_namespace(r)
    check_integer_array(xp, "r", r)
    mid, _ = _bucket_parameters(bucket_size, max_position)
    bounds = deberta_bucket_boundaries(bucket_size, max_position)
    dev = _xp.device(r)
    a = xp.abs(r)
    steps = count_reached(a, bounds) if bounds else xp.zeros((), dtype=r.dtype, device=dev)
    magnitude = xp.where(a <= mid, a, mid + steps)
    return xp.where(r < 0, -magnitude, magnitude)


def _span(name: str, table: Any) -> int:
    rows = table.shape[-2]
    if rows == 0 or rows % 2:
        msg = f"`{name}` must have 2 S rows (even, S >= 1), got shape {tuple(table.shape)}"
        raise ValueError(msg)
    return rows // 2


def deberta_index(
    t_q: int,
    t_k: int,
    /,
    *,
    span: int,
    max_position: int | None = None,
    q_offset: int = 0,
    xp: Any,
    device: Any = None,
) -> Any:
    r"""Canonical table row of every (query, key) pair, for both c2p and p2c.

    .. math:: \text{row}_{ij} = \operatorname{clamp}(b_{ij}, -(S-1), S) + S - 1,
              \qquad b_{ij} = \text{bucket}(r_{ij})

    Parameters
    ----------
    t_q, t_k : int
        Number of queries and keys.
    span : int
        ``S``: the tables have ``2 S`` rows.
    max_position : int, optional
        Log buckets of size `span` up to `max_position`; ``None`` for none
        (``b = r``).
    q_offset : int, optional
        Position of query 0.
    xp : namespace
        Array API namespace of the result.
    device : optional
        Device of the result.

    Returns
    -------
    array, shape ``(t_q, t_k)``
        Integer rows in ``0 .. 2S - 1``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> deberta_index(3, 3, span=2, xp=xp)  # rows for u = -1, 0, 1, 2
    Array([[1, 2, 3],
           [0, 1, 2],
           [0, 0, 1]], dtype=array_api_strict.int64)
    """
    span = positive_int("span", span)
    t_q = nonnegative_int("t_q", t_q)
    t_k = nonnegative_int("t_k", t_k)
    r = relative_positions(t_q, t_k, q_offset=as_int("q_offset", q_offset), xp=xp, device=device)
    return deberta_rows(r, span=span, max_position=max_position)


def deberta_rows(r: Any, /, *, span: int, max_position: int | None = None) -> Any:
    r"""Canonical table row of each distance: the bucket, clamped to the ``2 S`` rows.

    .. math:: \text{row}(r) = \operatorname{clamp}(\text{bucket}(r), -(S-1), S) + S - 1

    Parameters
    ----------
    r : integer array
        Key-minus-query distances.
    span : int
        ``S``: the tables have ``2 S`` rows.
    max_position : int, optional
        Log buckets of size `span` up to `max_position`; ``None`` for none.

    Returns
    -------
    array
        Same shape and dtype as `r`, values in ``0 .. 2S - 1``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> deberta_rows(xp.asarray([-3, -1, 0, 1, 3]), span=2)  # rows for u = -1 .. 2
    Array([0, 0, 1, 2, 3], dtype=array_api_strict.int64)
    """
    xp = _xp.array_namespace(r)
    check_integer_array(xp, "r", r)
    span = positive_int("span", span)
    b = r if max_position is None else deberta_bucket(
        r, bucket_size=span, max_position=max_position
    )
    return xp.clip(b, -(span - 1), span) + (span - 1)
