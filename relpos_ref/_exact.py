"""Integer positions as floats, exactly: where ALiBi, RoPE and Transformer-XL leave integers.

A distance or position is an integer (`relpos_ref.positions`); ALiBi's bias
``-m |r|``, RoPE's angle ``p θ`` and Transformer-XL's sinusoid ``sin(δ ω)``
turn it into a float. A floating dtype with ``p`` significant bits holds
every integer up to ``2**p`` exactly (float32: ``2**24``, float64: ``2**53``)
and rounds larger ones: in float32, position ``2**24 + 1`` is ``2**24``. So
the conversion is made in a dtype that holds every integer the call
reaches, chosen on the host from Python integers (no array value is read):

- the call's own dtype where it holds them all (the result is then the
  same, bit for bit, as a conversion in that dtype);
- otherwise float64, where the array library has it on the arrays' device,
  the result being rounded once to the call's dtype;
- otherwise, or beyond ``2**53``, a `ValueError` that says which offsets
  are exact.

Angles (`float_dtype` with ``angles=True``) are computed in float64
wherever the device has it, whatever the positions: an angle ``p θ`` in
float32 carries the rounding of ``θ`` times ``p``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from . import _xp

__all__ = ["check_exact_distances", "exact_limit", "float_dtype", "shown_power"]


def exact_limit(xp: Any, dtype: Any) -> int:
    """``2**p``: every integer of magnitude up to it is exact in floating `dtype`.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> exact_limit(xp, xp.float32) == 2**24, exact_limit(xp, xp.float64) == 2**53
    (True, True)
    """
    return 2 ** (round(-math.log2(float(xp.finfo(dtype).eps))) + 1)


def shown_power(n: int) -> str:
    """``2**p = n`` for a power of two, for messages.

    Examples
    --------
    >>> shown_power(2**24)
    '2**24 = 16777216'
    """
    return f"2**{n.bit_length() - 1} = {n}"


def float_dtype(
    xp: Any,
    dtype: Any,
    *,
    device: Any,
    largest: int,
    name: str,
    value: int,
    what: str,
    allowed: Callable[[int], tuple[int, int]] | None,
    angles: bool = False,
) -> Any:
    r"""The floating dtype in which integers up to `largest` in magnitude are formed exactly.

    .. math:: \text{dtype} = \begin{cases}
              \text{dtype} & |x| \le 2^{p(\text{dtype})} \text{ (and not angles)} \\
              \text{float64} & |x| \le 2^{53}, \text{ where the device has it} \\
              \text{a ValueError} & \text{otherwise} \end{cases}

    Parameters
    ----------
    xp : namespace
    dtype : floating dtype
        The call's (compute) dtype.
    device : device
        Where the arrays live (float64 is looked up there).
    largest : int
        The largest magnitude of the integers the call converts.
    name, value : str, int
        The parameter that sets them (``"q_offset"``) and its value, for the message.
    what : str
        What the integers are (``"positions"``, ``"distances"``), for the message.
    allowed : callable or None
        ``limit -> (low, high)``: the values of `name` whose integers are all
        within ``limit``, for the message (``None``: no value of `name` is).
    angles : bool, optional
        Prefer float64 wherever the device has it (angles ``p θ``).

    Returns
    -------
    dtype
        `dtype` or ``xp.float64``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> float_dtype(xp, xp.float32, device=None, largest=2**30, name="q_offset", value=2**30,
    ...             what="distances", allowed=lambda n: (-n, n)) == xp.float64
    True
    >>> import array_api_strict as strict
    >>> float_dtype(strict, strict.float32, device=strict.Device("no_float64"), largest=2**30,
    ...             name="q_offset", value=2**30, what="distances",
    ...             allowed=lambda n: (-n, n))
    Traceback (most recent call last):
    ...
    ValueError: `q_offset` = 1073741824 gives distances ... beyond 2**24 = 16777216, ...
    ... must be in -16777216 .. 16777216 here
    """
    own = exact_limit(xp, dtype)
    wide = _xp.has_float64(xp, device)
    if wide and (angles or largest > own) and largest <= 2**53:
        return xp.float64
    if largest <= own:
        return dtype
    limit, held = (2**53, "float64") if wide else (own, _dtype_name(dtype))
    device_note = "" if wide else " (and these arrays' device has no float64)"
    msg = (f"`{name}` = {value} gives {what} up to {largest} in magnitude, beyond "
           f"{shown_power(limit)}, the largest integer {held} holds exactly{device_note}")
    if allowed is not None:
        low, high = allowed(limit)
        msg += f"; `{name}` must be in {low} .. {high} here"
    raise ValueError(msg)


def check_exact_distances(xp: Any, dtype: Any, device: Any, *, t_q: int, t_k: int,
                          q_offset: int, clamp_len: int | None) -> None:
    """A `ValueError` naming ``q_offset`` where a distance (clamped to `clamp_len`) is not exact.

    For sinusoids of the distance (Transformer-XL): exact means at most
    ``2**53`` in magnitude where `device` has float64, else what `dtype`
    holds (`float_dtype` with ``angles=True``). Host-side.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> check_exact_distances(xp, xp.float32, None, t_q=1, t_k=1, q_offset=2**60,
    ...                       clamp_len=None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: `q_offset` = 1152921504606846976 gives distances up to ...
    """
    if t_q == 0 or t_k == 0:
        return
    r_min, r_max = -(t_q - 1 + q_offset), t_k - 1 - q_offset
    largest = max(abs(r_min), abs(r_max))
    c = clamp_len

    def allowed(limit: int) -> tuple[int, int]:  # r_min >= -limit, r_max <= limit
        return t_k - 1 - limit, limit - t_q + 1

    float_dtype(xp, dtype, device=device, largest=largest if c is None else min(c, largest),
                name="q_offset", value=q_offset, what="distances", allowed=allowed,
                angles=True)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).rsplit(".", 1)[-1].strip("'>").replace("dtype(", "").strip("'")
