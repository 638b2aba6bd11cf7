r"""FIRE's MLP as the piecewise-linear function it is, for the lowering (`relpos_ref._lowerings`).

One hidden layer of ReLUs on a scalar input is linear between the
breakpoints ``z_{hn} = -b_{1hn} / w_{1hn}`` of its units:

.. math:: f_h(x) = A_{hs}\, x + B_{hs}, \qquad
          A_{hs} = \sum_{n \in S_{hs}} w^{(h)}_{2n} w_{1hn}, \quad
          B_{hs} = b^{(h)}_2 + \sum_{n \in S_{hs}} w^{(h)}_{2n} b_{1hn}

with ``S_{hs}`` the units live on segment ``s``: a rising unit (``w_1 > 0``)
is live where ``z < x``, a falling one where ``z > x``, each strictly (at its
breakpoint a unit is 0 and passes no gradient, as the specification's), and
a unit of slope 0 is the constant ``relu(b_1)``. The segments are those of
every head's breakpoints together, sorted, ``u_0 <= u_1 <= ... <= u_{n-1}``
(``n = H m``, repeats kept): the segment of ``x`` is
``s(x) = #(u < x) + #(u <= x)`` (two binary searches), even inside an
interval between breakpoints and odd at one. ``s`` is monotone and tells
``z < x`` from ``z = x`` and ``z > x`` for every breakpoint ``z``, so a
rising unit is live on the segments after ``s(z)`` and a falling one on those
before it. One segment index per pair serves every head, and the heads'
coefficients are one column of a ``(2H, 2n + 1)`` table.

The specification (`relpos_ref.schemes._fire_mlp`) evaluates the ``m``
hidden units of every pair and head; this reads two coefficients, so the
lowering's dense bias costs ``O(t_q t_k (log(H m) + H))`` instead of
``O(t_q t_k H m)``. ``f`` is continuous (a unit is 0 at its breakpoint);
the sums by segment differ from the unit sums by rounding only
(tests/test_fire.py and tests/test_lowering.py prove it), and each sums
live units only (a sum of every unit less the dead ones cancelled: 0.5
for 0.25 with ``w1 = -1e8`` in float32). One difference is not rounding of
the sum: at an input within rounding of a breakpoint the specification's
``w1 x + b1`` may round to either sign, where the segments compare ``x``
with ``-b1 / w1``, so such a unit's gradient may be passed by one and not
the other.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from . import _xp
from .schemes import _fire_inputs, fire
from .schemes._fire_mlp import _tables, mlp_output

__all__ = ["InputFactors", "Units", "broadcast_tables", "call_options", "input_factors",
           "live_sums", "mlp_by_pieces", "pieces", "segment_coefficients", "segments", "units"]


def _prefix(xp: Any, x: Any) -> Any:
    # (H, N + 1): [0, x_0, x_0 + x_1, ...] along the last axis
    zeros = xp.zeros((x.shape[0], 1), dtype=x.dtype, device=_xp.device(x))
    return xp.concat([zeros, xp.cumulative_sum(x, axis=1)], axis=1)


def _sum_where(xp: Any, key: Any, chosen: Any, coefficient: Any, segments: Any, *,
               after: bool) -> Any:
    # (H, S): for each segment s, the sum of the chosen units' coefficients (H, N) whose key
    # is below s (after) or above it (not after), from prefix sums in the order the live
    # units come first (no sum of dead units taken away: no cancellation)
    n_seg = segments.shape[0]
    if not after:  # keys above s: below -s, counted the same way
        key, segments = -key, -segments
    key = xp.where(chosen, key, xp.full_like(key, n_seg))
    order = xp.argsort(key)
    zero = xp.zeros((), dtype=coefficient.dtype, device=_xp.device(coefficient))
    prefix = _prefix(xp, xp.take(xp.where(chosen, coefficient, zero), order, axis=1))
    return xp.take(prefix, xp.searchsorted(xp.take(key, order), segments, side="left"), axis=1)


class Units(NamedTuple):
    """An MLP's hidden units as the segments see them (`units`); ``n = H' m`` units."""

    u: Any  # (n,) every unit's breakpoint, sorted (slope 0: +inf)
    own: Any  # (n,) the segment of each unit's breakpoint, units in (g, i) order
    rise: Any  # (n,) bool, w1 > 0
    fall: Any  # (n,) bool, w1 < 0
    flat: Any  # (n,) bool, w1 = 0 and b1 > 0: live everywhere (relu(b1))
    slope: Any  # (H, n) w2[h, i] w1[g, i], 0 where g != h for one MLP per head
    intercept: Any  # (H, n) w2[h, i] b1[g, i], likewise
    segments: Any  # (2n + 1,) 0 .. 2n


def units(w1: Any, b1: Any, w2: Any) -> Units:
    """`w1`, `b1` ``(H', m)`` (``H'`` 1 or ``H``) and `w2` ``(H, m)``, finite, as `Units`."""
    xp = _xp.array_namespace(w1, b1, w2)
    dev = _xp.device(w1)
    heads, hidden = w2.shape[0], w1.shape[0]
    zero = xp.zeros((), dtype=w1.dtype, device=dev)
    rise, fall = w1 > zero, w1 < zero
    moving = rise | fall
    z = -b1 / xp.where(moving, w1, zero + 1.0)
    # every unit's breakpoint, repeats kept (no shape read from values); a unit of slope 0
    # at +inf, which no finite x reaches
    u = xp.sort(xp.reshape(xp.where(moving, z, zero + float("inf")), (-1,)))
    own = xp.reshape(segments(xp, u, xp.where(moving, z, zero)), (-1,))
    # coefficients (H, n) of unit (g, i) for head h: w2[h, i] times w1[g, i] (or b1[g, i]),
    # where g = h for one MLP per head
    linked = xp.eye(heads, dtype=w1.dtype, device=dev)[:, :, None] if hidden > 1 else zero + 1.0
    slope, intercept = (xp.reshape(w2[:, None, :] * t[None, :, :] * linked, (heads, -1))
                        for t in (w1, b1))
    flat = xp.reshape((~moving) & (b1 > zero), (-1,))
    return Units(u, own, xp.reshape(rise, (-1,)), xp.reshape(fall, (-1,)), flat, slope,
                 intercept, xp.arange(2 * u.shape[0] + 1, dtype=own.dtype, device=dev))


def segment_coefficients(w1: Any, b1: Any, w2: Any, b2: Any) -> tuple[Any, Any, Any]:
    """The sorted breakpoints ``u`` ``(n,)`` and the coefficients ``A``, ``B`` ``(H, 2n + 1)``.

    `w1`, `b1` ``(H', m)`` with ``H'`` 1 (one hidden layer for every head) or
    ``H`` (one MLP per head), `w2` ``(H, m)``, `b2` ``(H,)``, finite;
    ``n = H' m``. On segment ``s`` (see the module docstring) head ``h`` is
    ``A[h, s] x + B[h, s]``. A unit of slope 0 adds its ``w2 w1 = 0`` to ``A``
    where it is live, so that its ``w1`` gets the specification's gradient.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> u, a, b = segment_coefficients(xp.ones((1, 1)), xp.asarray([[-0.5]]),
    ...                                xp.ones((1, 1)), xp.zeros(1))  # relu(x - 1/2)
    >>> u  # one breakpoint: three segments, below 1/2, at it and above it
    Array([0.5], dtype=array_api_strict.float64)
    >>> xp.concat([a, b])  # the slope, then the intercept, on each segment
    Array([[ 0. ,  0. ,  1. ],
           [ 0. ,  0. , -0.5]], dtype=array_api_strict.float64)
    """
    found = units(w1, b1, w2)
    return (found.u, live_sums(found, found.slope),
            live_sums(found, found.intercept) + b2[:, None])


def live_sums(found: Units, coefficient: Any) -> Any:
    r"""``(H, 2n + 1)``: per segment, the sum of `coefficient` ``(H, n)`` over the live units.

    A rising unit is live on the segments after its own, a falling one on those
    before it, a unit of slope 0 with ``b1 > 0`` on every one:
    :math:`\sum_{n \text{ live on } s} c_{hn}`.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> found = units(xp.asarray([[1.0, -1.0]]), xp.zeros((1, 2)),
    ...               xp.ones((1, 2)))  # relu(x) and relu(-x): both break at 0
    >>> live_sums(found, xp.asarray([[1.0, 10.0]]))  # the falling one below 0, rising above
    Array([[10., 10.,  0.,  1.,  1.]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(coefficient)
    zero = xp.zeros((), dtype=coefficient.dtype, device=_xp.device(coefficient))
    live = (_sum_where(xp, found.own, found.rise, coefficient, found.segments, after=True)
            + _sum_where(xp, found.own, found.fall, coefficient, found.segments, after=False))
    return live + xp.sum(xp.where(found.flat, coefficient, zero), axis=1)[:, None]


def segments(xp: Any, u: Any, x: Any) -> Any:
    """The segment ``#(u < x) + #(u <= x)`` of each input `x` among the sorted breakpoints `u`.

    Even inside an interval, odd at a breakpoint; of `xp`'s index dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> segments(xp, xp.asarray([0.0, 1.0]), xp.asarray([-1.0, 0.0, 0.5, 1.0, 2.0]))
    Array([0, 1, 2, 3, 4], dtype=array_api_strict.int64)
    """
    # one search where the namespace has nextafter (array API 2024.12): u <= x exactly when the
    # float just below u is < x (u = +inf: never, x finite); two searches before it
    if u.shape[0] == 0:
        return xp.zeros(x.shape, dtype=_xp.index_dtype(xp, _xp.device(x)), device=_xp.device(x))
    if getattr(xp, "__array_api_version__", "2021.12") < "2024.12":
        return xp.searchsorted(u, x, side="left") + xp.searchsorted(u, x, side="right")
    below = xp.nextafter(u, xp.full_like(u, -math.inf))
    return xp.searchsorted(xp.sort(xp.concat([u, below])), x, side="left")


def pieces(w1: Any, b1: Any, w2: Any, b2: Any) -> tuple[Any, Any]:
    """The sorted breakpoints ``u`` ``(n,)`` and one column per segment ``(2H, 2n + 1)``.

    Of the specification's tables (`relpos_ref.schemes.fire`: any of their
    shapes, finite; `b2` may be ``None``): every head's ``A``, then every
    head's ``B`` (`segment_coefficients`), so that a pair in segment ``s``
    reads one column, ``A[h, s] x + B[h, s]``. ``H`` is 1 where no table has a
    head axis.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> u, ab = pieces(xp.ones((1, 1)), xp.asarray([-0.5]), xp.ones((1, 1)), None)
    >>> u, ab  # relu(x - 1/2): A and B below 1/2, at it and above it
    (Array([0.5], dtype=array_api_strict.float64), Array([[ 0. ,  0. ,  1. ],
           [ 0. ,  0. , -0.5]], dtype=array_api_strict.float64))
    """
    xp = _xp.array_namespace(w1, b1, w2)
    u, a, b = segment_coefficients(*broadcast_tables(w1, b1, w2, b2))
    return u, xp.concat([a, b], axis=0)


def broadcast_tables(w1: Any, b1: Any, w2: Any, b2: Any) -> tuple[Any, Any, Any, Any]:
    """The specification's tables as `units` takes them (`w1`, `b1`, `w2`, `b2` of any shape).

    Returns ``(H', m)``, ``(H', m)``, ``(H, m)`` and ``(H,)`` (``b2`` ``None``: zeros).

    ``H'`` is 1 for one hidden layer shared by the heads, ``H`` for one MLP per
    head; ``H`` is 1 where no table has a head axis. Views where they can be.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> [t.shape for t in broadcast_tables(xp.ones((3, 1)), xp.ones(3), xp.ones((2, 3)), None)]
    [(1, 3), (1, 3), (2, 3), (2,)]
    """
    xp = _xp.array_namespace(w1, b1, w2)
    tw1, tb1, tw2, tb2 = _tables(w1, b1, w2, b2)
    heads = max(tw1.shape[0], tb1.shape[0], tw2.shape[0], tb2.shape[0])
    hidden, m = max(tw1.shape[0], tb1.shape[0]), tw1.shape[-1]
    return (xp.broadcast_to(tw1, (hidden, m)), xp.broadcast_to(tb1, (hidden, m)),
            xp.broadcast_to(tw2, (heads, m)), xp.broadcast_to(tb2, (heads,)))


def mlp_by_pieces(x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
    """FIRE's MLP output ``(H, t_q, t_k)`` at the inputs `x` ``(t_q, t_k)``, by its pieces.

    Tables or inputs that are not all finite are evaluated unit by unit
    (`relpos_ref.schemes._fire_mlp.mlp_output`): a NaN weight makes the bias NaN,
    and an infinite input (``L = eps = 0`` before position 0) reads relu's 0, as
    the specification's.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> x = xp.reshape(xp.arange(6.0), (2, 3)) / 4  # f(x) = relu(x - 1/2)
    >>> mlp_by_pieces(x, xp.ones((1, 1)), xp.asarray([-0.5]), xp.ones((1, 1)), None)
    Array([[[0.  , 0.  , 0.  ],
            [0.25, 0.5 , 0.75]]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(x, w1)
    tables = [t for t in (w1, b1, w2, b2) if t is not None]
    if not all(bool(xp.all(xp.isfinite(t))) for t in (*tables, x)):
        return mlp_output(x, w1, b1, w2, b2)  # A x + B would make an infinite x's 0 slope NaN
    u, columns = pieces(w1, b1, w2, b2)
    heads = columns.shape[0] // 2
    flat = xp.reshape(x, (-1,))
    # one column of the (2H, 2n + 1) table per pair: every head's A, then every head's B
    found = xp.take(columns, segments(xp, u, flat), axis=1)
    out = found[:heads, :] * flat + found[heads:, :]
    return xp.reshape(out, (heads, *x.shape))


class InputFactors(NamedTuple):
    """FIRE's input as a row of distances over a column of normalisers (`input_factors`)."""

    distances: Any  # (t_q + t_k - 1,) |m|, m = n - (t_q - 1 + q_offset), in the wide dtype
    logs: Any  # (t_q + t_k - 1,) psi(|m|)
    rows: dict[str, Any]  # the specification's row parts (t_q,): p, m, n (the normaliser), ...
    shared: int  # the first rows, whose normaliser is psi(|L|) + eps (p_i <= |L|)

    @property
    def norms(self) -> Any:
        """``(t_q,)`` each row's normaliser :math:`\\psi(\\max(|L|, p_i)) + \\epsilon`."""
        return self.rows["n"]


def call_options(named: dict[str, Any]) -> tuple[Any, Any, float]:
    """``(c, L, eps)`` from the options given in `named`; the specification's defaults else.

    Examples
    --------
    >>> call_options({"L": 4.0})
    (0.1, 4.0, 1e-06)
    """
    return named.get("c", 0.1), named.get("L", 512.0), float(named.get("eps", fire.EPS))


def input_factors(t_q: int, t_k: int, *, c: Any, L: Any, eps: float, q_offset: int, xp: Any,
                  dtype: Any, device: Any) -> InputFactors | None:
    r"""FIRE's input ``x[i, j] = logs[j - i + t_q - 1] / norms[i]``, or ``None`` if not finite.

    The specification's `relpos_ref.schemes.fire.fire_inputs` before its
    rounding to `dtype` (computed in the same wide dtype, by the same
    operations): :math:`\psi(|p_i - j|)` depends on the pair through the
    distance alone, one entry per distance, and the normaliser on the row
    alone. The first `shared` rows have one normaliser, :math:`\psi(|L|) +
    \epsilon`: their inputs are a function of the distance. ``None`` where an
    input is not finite in `dtype` (a normaliser of 0, or one so small that an
    input overflows: the specification's NaN and infinite inputs, which the
    kernels leave to it).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> f = input_factors(2, 3, c=1.0, L=1.0, eps=0.0, q_offset=1, xp=xp, dtype=xp.float64,
    ...                   device=None)
    >>> f.shared, float(f.logs[2] / f.norms[1])  # query 1 (position 2), key 2: distance 0 ...
    (1, 0.0)
    >>> float(f.logs[0] / f.norms[1])  # ... and key 0 at distance 2: log 3 / log 3
    1.0
    """
    wide = _fire_inputs._wide(xp, dtype, device, t_q, t_k, q_offset)
    idx = _xp.index_dtype(xp, device)
    rows = _fire_inputs._row_parts(xp, t_q, c, L, eps, q_offset, wide, device)
    offset = xp.astype(xp.arange(t_q + t_k - 1, dtype=idx, device=device)
                       - (t_q - 1 + q_offset), wide)
    distances = xp.abs(offset)
    logs = xp.log1p(rows["u"] * distances)
    norms = rows["n"]
    # every |x| is at most the largest log over the smallest |normaliser|, rounded to `dtype`
    # as x is: finite there, every x is (a tiny normaliser makes x overflow, not only 0)
    if not bool(xp.all(xp.isfinite(logs)) & xp.all(xp.isfinite(norms))):
        return None
    if t_q and t_k and not bool(xp.isfinite(xp.astype(xp.max(logs) / xp.min(xp.abs(norms)),
                                                      dtype))):
        return None
    shared = int(xp.sum(xp.astype(rows["p"] <= rows["big_l"], idx)))
    return InputFactors(distances, logs, rows, shared)
