"""Tolerances derived from the naive pipeline's measured error.

For every float golden array ``g`` of a case in dtype ``T``, with ``n`` the
same array from the naive pipeline (`relpos_ref.golden.pipeline`):

.. math::

    e_\\max = \\max |n - g|, \\qquad e_\\text{mean} = \\operatorname{mean} |n - g|,

    \\text{atol} = \\max\\bigl(k\\, e_\\max,\\; m\\,\\operatorname{ulp}_T(\\max |g|)\\bigr),
    \\qquad k = 3 \\text{ for 16-bit } T, \\quad k = 10 \\text{ for float32 and float64},

with :math:`m = 2`, except for the gradients (``dq``, ``dk``, ``dv``,
``d_<table>``): :math:`m = 8` in a 16-bit ``T`` and :math:`m = 64` in
float64. An obtained array ``o`` matches when ``|o - g| <= atol``
everywhere (``rtol`` is 0).

Why 64 for float64 gradients: the naive backward in float64 is the golden's
own computation, so its error is 0 and the floor is all there is; two
float64 evaluations of a backward pass in different summation orders (a
kernel's, another library's) differ by a few ulps of ``max |g|``, and 64
ulps is the agreement `relpos_ref.golden.verify` already asks of float64
goldens recomputed on another backend.

Why 8 for 16-bit gradients: the naive backward rounds only its results to 16
bits, while a backward pass written with 16-bit operations rounds after each
one. Over the default suite, PyTorch autograd through every scheme with
every operation in float16 or bfloat16 lands at most 2.0 times
``max(2 e_max, 2 ulp)`` from the goldens (Transformer-XL's ``d_position_bias``
in float16, ``d_w_r`` in bfloat16); ``m = 8`` passes it with a factor of 2 to
spare, while a gradient from a convention bug is off by a sizeable fraction
of ``max |g|`` (``tests/test_golden_gradients.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .dtypes import SIXTEEN_BIT, ulp

__all__ = ["RULE", "derive_tolerance", "safety_factor", "ulp_multiple"]

RULE = (
    "atol = max(k * e_max, m * ulp(max|golden|)); k = 3 for 16-bit dtypes, 10 otherwise; "
    "m = 8 for gradients in 16-bit dtypes, 64 for gradients in float64, 2 otherwise"
)


def safety_factor(dtype: str) -> float:
    """``k`` of the rule: 3 for float16 and bfloat16, 10 for float32 and float64.

    Why 3 in 16 bits: over the default suite, legitimate 16-bit forward
    passes (PyTorch eager with 16-bit matmuls and ``torch.softmax``, PyTorch
    ``scaled_dot_product_attention`` with the bias as a float mask, every
    operation of the specification in 16 bits on PyTorch and on JAX) reach
    at most 2.2 times the naive pipeline's ``e_max``, while the convention
    mistakes that change a case's output at all reach at least 5.1 times it
    (``tests/test_golden_tolerance.py``).
    """
    return 3.0 if dtype in SIXTEEN_BIT else 10.0


def ulp_multiple(dtype: str, *, gradient: bool = False) -> float:
    """``m`` of the rule: for a gradient 8 in float16 and bfloat16, 64 in float64; else 2.

    Examples
    --------
    >>> ulp_multiple("bfloat16", gradient=True), ulp_multiple("bfloat16")
    (8.0, 2.0)
    >>> ulp_multiple("float64", gradient=True), ulp_multiple("float32", gradient=True)
    (64.0, 2.0)
    """
    if not gradient:
        return 2.0
    if dtype in SIXTEEN_BIT:
        return 8.0
    return 64.0 if dtype == "float64" else 2.0


def derive_tolerance(
    golden: np.ndarray, naive: np.ndarray, dtype: str, *, gradient: bool = False
) -> dict[str, Any]:
    """The tolerance of one array, with its inputs and provenance.

    Parameters
    ----------
    golden : ndarray
        The float64 golden.
    naive : ndarray
        The naive pipeline's result, same shape.
    dtype : str
        The dtype under test.
    gradient : bool
        Whether the array is a gradient (``dq``, ``dk``, ``dv``, ``d_<table>``).

    Returns
    -------
    dict
        ``atol``, ``rtol`` (0), ``k``, ``e_max``, ``e_mean``,
        ``max_abs_golden``, ``ulp_floor`` (``m ulp(max|golden|)``) and ``rule``.

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
    floor = ulp_multiple(dtype, gradient=gradient) * ulp(top, dtype)
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
