"""Tolerances derived from the naive pipeline's measured error.

For every float golden array ``g`` of a case in dtype ``T``, with ``n`` the
same array from the naive pipeline (`relpos_ref.golden.pipeline`):

.. math::

    e_\\max = \\max |n - g|, \\qquad e_\\text{mean} = \\operatorname{mean} |n - g|,

    \\text{atol} = \\max\\bigl(k\\, e_\\max,\\; 2\\,\\operatorname{ulp}_T(\\max |g|)\\bigr),
    \\qquad k = 2 \\text{ for 16-bit } T, \\quad k = 10 \\text{ for float32 and float64}.

An obtained array ``o`` matches when ``|o - g| <= atol`` everywhere (``rtol`` is 0).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .dtypes import SIXTEEN_BIT, ulp

__all__ = ["RULE", "derive_tolerance", "safety_factor"]

RULE = "atol = max(k * e_max, 2 * ulp(max|golden|)); k = 2 for 16-bit dtypes, 10 otherwise"


def safety_factor(dtype: str) -> float:
    """``k`` of the rule: 2 for float16 and bfloat16, 10 for float32 and float64."""
    return 2.0 if dtype in SIXTEEN_BIT else 10.0


def derive_tolerance(golden: np.ndarray, naive: np.ndarray, dtype: str) -> dict[str, Any]:
    """The tolerance of one array, with its inputs and provenance.

    Parameters
    ----------
    golden : ndarray
        The float64 golden.
    naive : ndarray
        The naive pipeline's result, same shape.
    dtype : str
        The dtype under test.

    Returns
    -------
    dict
        ``atol``, ``rtol`` (0), ``k``, ``e_max``, ``e_mean``,
        ``max_abs_golden``, ``ulp_floor`` (``2 ulp(max|golden|)``) and ``rule``.

    Examples
    --------
    >>> import numpy as np
    >>> tol = derive_tolerance(np.array([1.0, 2.0]), np.array([1.0, 2.001]), "float32")
    >>> round(tol["atol"], 6), tol["k"]
    (0.01, 10.0)
    """
    err = np.abs(np.asarray(naive, dtype=np.float64) - np.asarray(golden, dtype=np.float64))
    e_max = float(err.max()) if err.size else 0.0
    e_mean = float(err.mean()) if err.size else 0.0
    top = float(np.abs(golden).max()) if golden.size else 0.0
    k = safety_factor(dtype)
    floor = 2.0 * ulp(top, dtype)
    return {
        "atol": max(k * e_max, floor),
        "rtol": 0.0,
        "k": k,
        "e_max": e_max,
        "e_mean": e_mean,
        "max_abs_golden": top,
        "ulp_floor": floor,
        "rule": RULE,
    }
