"""Host-side validation of Python integers and options.

These run before any array work, on plain Python values, so they are safe
under jit tracing and lazy backends: nothing here touches array values.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable
from typing import Any

__all__ = [
    "as_float",
    "as_int",
    "broadcast_shapes",
    "check_bool",
    "check_choice",
    "nonnegative_int",
    "positive_int",
]


#: Integers the index arithmetic can hold: every distance is computed in int64 at most.
INT64_LIMIT = 2**62


def as_int(name: str, value: Any) -> int:
    """`value` as a Python ``int``; a `ValueError` naming `name` otherwise.

    Accepts anything with ``__index__`` (``int``, ``numpy.int64``) but not
    ``bool``, floats or arrays, whose conversion would hide a mistake, nor
    magnitudes of ``2**62`` or more, which distances in int64 cannot hold.
    """
    if isinstance(value, bool):
        msg = f"`{name}` must be an integer, got the bool {value!r}"
        raise ValueError(msg)
    try:
        out = operator.index(value)
    except TypeError:
        msg = f"`{name}` must be an integer, got {value!r} of type {type(value).__name__}"
        raise ValueError(msg) from None
    if not -INT64_LIMIT < out < INT64_LIMIT:
        msg = f"`{name}` must be smaller than 2**62 in magnitude (int64 distances), got {out}"
        raise ValueError(msg)
    return out


def nonnegative_int(name: str, value: Any) -> int:
    """`value` as an ``int`` that is ``>= 0``; a `ValueError` naming `name` otherwise."""
    out = as_int(name, value)
    if out < 0:
        msg = f"`{name}` must be >= 0, got {out}"
        raise ValueError(msg)
    return out


def positive_int(name: str, value: Any) -> int:
    """`value` as an ``int`` that is ``>= 1``; a `ValueError` naming `name` otherwise."""
    out = as_int(name, value)
    if out < 1:
        msg = f"`{name}` must be >= 1, got {out}"
        raise ValueError(msg)
    return out


def check_bool(name: str, value: Any) -> bool:
    """`value` as a Python ``bool``; a `ValueError` naming `name` otherwise.

    Accepts ``True``, ``False`` and NumPy's bool scalars, nothing else: a
    string such as ``"no"`` or a number would otherwise be read as true.
    """
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    msg = f"`{name}` must be True or False, got {value!r} of type {type(value).__name__}"
    raise ValueError(msg)


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """`value` if it is one of `choices`; a `ValueError` listing them otherwise."""
    options = tuple(choices)
    if value not in options:
        listed = ", ".join(repr(c) for c in options)
        msg = f"`{name}` must be one of {listed}, got {value!r}"
        raise ValueError(msg)
    return value


def broadcast_shapes(**named: tuple[int, ...]) -> tuple[int, ...]:
    """Broadcast the named shapes by the array API rules, on the host.

    A `ValueError` names every shape when two of them do not broadcast.
    """
    result: list[int] = []
    for shape in named.values():
        shape = tuple(shape)
        n = max(len(result), len(shape))
        a = [1] * (n - len(result)) + result
        b = [1] * (n - len(shape)) + list(shape)
        merged = []
        for x, y in zip(a, b, strict=True):
            if x == y or y == 1:
                merged.append(x)
            elif x == 1:
                merged.append(y)
            else:
                listing = ", ".join(f"`{k}` {tuple(v)}" for k, v in named.items())
                msg = f"shapes do not broadcast: {listing}"
                raise ValueError(msg)
        result = merged
    return tuple(result)


def as_float(name: str, value: Any) -> float:
    """`value` as a finite Python ``float``; a `ValueError` naming `name` otherwise.

    Arrays are refused (reading them would need their values on the host).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        msg = f"`{name}` must be a real number, got {value!r} of type {type(value).__name__}"
        raise ValueError(msg)
    out = float(value)
    if not math.isfinite(out):
        msg = f"`{name}` must be finite, got {out}"
        raise ValueError(msg)
    return out
