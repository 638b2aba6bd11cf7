"""The dtypes a golden case can be stored in, by name.

A case's *dtype under test* is one of `FLOAT_DTYPES`; its inputs are stored
in that dtype, bit-exact, and its goldens in float64. ``bfloat16`` comes from
``ml_dtypes`` (NumPy has no bfloat16 of its own).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "FLOAT_DTYPES",
    "SIXTEEN_BIT",
    "dtype_name",
    "numpy_dtype",
    "ulp",
]

FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")
SIXTEEN_BIT = ("float16", "bfloat16")
_OTHER = ("int64", "bool")


def numpy_dtype(name: str) -> np.dtype:
    """NumPy dtype for a stored dtype name (``"bfloat16"`` via ml_dtypes)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if name in FLOAT_DTYPES or name in _OTHER:
        return np.dtype(name)
    msg = f"unknown dtype {name!r}; expected one of {', '.join(FLOAT_DTYPES + _OTHER)}"
    raise ValueError(msg)


def dtype_name(dtype: Any) -> str:
    """Stored name of a NumPy dtype (the inverse of `numpy_dtype`)."""
    name = np.dtype(dtype).name
    if name not in FLOAT_DTYPES and name not in _OTHER:
        msg = f"arrays of dtype {name} cannot be stored in a golden suite"
        raise TypeError(msg)
    return name


def _mantissa_bits(name: str) -> tuple[int, int]:
    """(explicit mantissa bits, minimum normal exponent) of a float dtype."""
    if name == "bfloat16":
        return 7, -126
    info = np.finfo(np.dtype(name))
    return int(info.nmant), int(info.minexp)


def ulp(value: float, dtype: str) -> float:
    """Unit in the last place of `value` in float dtype `dtype`, as a Python float.

    ``ulp(x) = 2**(e - p)`` where ``2**e <= |x| < 2**(e+1)`` and ``p`` is the
    number of explicit mantissa bits; below the normal range the subnormal
    spacing ``2**(e_min - p)`` is used (also for ``x = 0``).

    Examples
    --------
    >>> ulp(1.0, "float32") == 2.0**-23
    True
    >>> ulp(3.0, "bfloat16")
    0.015625
    """
    p, e_min = _mantissa_bits(dtype)
    x = abs(float(value))
    e = e_min if x == 0.0 else max(math.frexp(x)[1] - 1, e_min)
    return float(2.0 ** (e - p))
